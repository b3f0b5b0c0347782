//! Mirrored buffers (semantics §5): one buffer's bytes on the host and on a device, each
//! side with the stamp of the last write it holds; a side is copied to only when it is
//! stale, so a workload that alternates host and device use shows the minimal transfers.
//!
//! Invariant: `writes` is the stamp of the newest write (on either side) and each side's
//! stamp is `<= writes`; a side is current iff its stamp equals `writes`. Every read makes
//! its side current first (one copy from the other side when it is stale), every write
//! makes its side the only current one. So stale bytes are never read. Accesses borrow the
//! mirror (`&mut`), so no write can happen while a read's borrow lives.
//!
//! `MirroringPolicy::Full`: a device buffer from the device's pool, the host copy made
//! lazily (pool memory counted as mirror memory) on first host access; transfers to and
//! from it go through the device's pinned staging buffer. `HostOnly`: pinned host memory
//! only, which the device reads in place (it is mapped): no device memory, no transfers.

#![forbid(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use ndmem_alloc::{Block, Usage};

use super::pinned::PinnedBuffer;
use super::pool::DeviceBuffer;
use super::slot::RawRange;
use super::{Device, DeviceMemory, DeviceMemoryMut};
use crate::error::Result;
use crate::workspace::MirroringPolicy;

/// A buffer with a host and a device side, copied only when stale (semantics §5).
///
/// ```
/// use ndmem::device::{self, Mirror, SimConfig};
/// use ndmem::MirroringPolicy;
///
/// let gpu = device::sim(SimConfig::new(0))?;
/// let mut m = Mirror::new(&gpu, 1024, MirroringPolicy::Full)?;
/// m.host_mut()?.fill(1);                 // host write: the device side is stale
/// let _ = m.device()?;                   // one upload
/// let _ = m.device()?;                   // still current: no copy
/// assert_eq!(m.host()?[0], 1);           // the host side is current: no copy
/// assert_eq!(gpu.stats().transfers(), 1);
/// # Ok::<(), ndmem::Error>(())
/// ```
pub struct Mirror {
    device: Device,
    len: usize,
    policy: MirroringPolicy,
    host: Option<HostCopy>,
    device_side: Option<DeviceBuffer>,
    writes: u64,
    host_stamp: u64,
    device_stamp: u64,
    /// A `HostOnly` mirror's memory was handed to the device since the host last waited
    /// for it: device work is queued, so the host waits for the device before it reads or
    /// writes the bytes (they are the same bytes, and the device's work is asynchronous).
    device_used: bool,
}

enum HostCopy {
    Pooled(Block<'static>),
    Pinned(PinnedBuffer),
}

impl HostCopy {
    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            HostCopy::Pooled(b) => &b.as_slice()[..len],
            HostCopy::Pinned(p) => &p.as_slice()[..len],
        }
    }

    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        match self {
            HostCopy::Pooled(b) => &mut b.as_slice_mut()[..len],
            HostCopy::Pinned(p) => &mut p.as_mut_slice()[..len],
        }
    }
}

/// A mirror of no bytes is refused as a device buffer of none is (an empty tensor's mirror,
/// made inside the crate, holds one element's byte instead).
fn refuse_empty(len: usize) -> Result<()> {
    super::refuse_zero_bytes(len, "a mirror holds at least 1 byte")
}

impl Mirror {
    /// A zeroed buffer of `len` bytes on `device`, mirrored by `policy`. `Full` takes its
    /// device buffer now (zeroed on the device, no transfer) and its host copy on first
    /// host access; `HostOnly` takes pinned host memory only.
    /// Zero bytes is `AllocError::InvalidLayout`, as a zero-byte device request.
    pub fn new(device: &Device, len: usize, policy: MirroringPolicy) -> Result<Mirror> {
        refuse_empty(len)?;
        Mirror::make(device, len, policy, true)
    }

    /// [`Mirror::new`]; `zero_device`: clear the device side (not needed when the host side
    /// is written next, which makes the device side stale anyway).
    fn make(
        device: &Device,
        len: usize,
        policy: MirroringPolicy,
        zero_device: bool,
    ) -> Result<Mirror> {
        let len = len.max(1);
        let (host, device_side) = match policy {
            MirroringPolicy::HostOnly => {
                (Some(HostCopy::Pinned(device.allocate_pinned(len)?)), None)
            }
            _ => {
                let mut buffer = device.allocate(len)?;
                if zero_device {
                    device.fill(&mut buffer, 0)?;
                }
                (None, Some(buffer))
            }
        };
        Ok(Mirror {
            device: device.clone(),
            len,
            policy,
            host,
            device_side,
            writes: 0,
            host_stamp: 0,
            device_stamp: 0,
            device_used: false,
        })
    }

    /// A buffer holding `data`, written on the host (the device side stale until used).
    /// Empty `data` is `AllocError::InvalidLayout`, as a zero-byte device request.
    pub fn from_host(device: &Device, data: &[u8], policy: MirroringPolicy) -> Result<Mirror> {
        refuse_empty(data.len())?;
        Mirror::from_host_with(device, data.len(), policy, |host| {
            host.copy_from_slice(data);
            Ok(())
        })
    }

    /// [`Mirror::from_host`] of the `len` bytes `fill` writes into the host side, which is
    /// allocated before `fill` runs (a tensor's upload pins the epoch in `fill` alone, to
    /// read its source, and allocates nothing under that pin).
    pub(crate) fn from_host_with(
        device: &Device,
        len: usize,
        policy: MirroringPolicy,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Mirror> {
        // The host write below makes the device side stale: it need not be cleared first.
        let mut mirror = Mirror::make(device, len, policy, false)?;
        fill(&mut mirror.host_overwrite()?[..len])?;
        Ok(mirror)
    }

    /// The device it mirrors to.
    pub fn device_handle(&self) -> &Device {
        &self.device
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// What its host copy holds of its host pool as a pool block (the block's capacity);
    /// 0 before the copy is made, and for a pinned copy.
    pub(crate) fn pooled_host_bytes(&self) -> usize {
        match &self.host {
            Some(HostCopy::Pooled(block)) => block.capacity(),
            _ => 0,
        }
    }

    /// Whether it is empty (never: at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its policy.
    pub fn policy(&self) -> MirroringPolicy {
        self.policy
    }

    /// `(newest write, host side's, device side's)` stamps.
    pub fn stamps(&self) -> (u64, u64, u64) {
        (self.writes, self.host_stamp, self.device_stamp)
    }

    /// Whether the host side holds the newest write.
    pub fn is_host_current(&self) -> bool {
        self.host_stamp == self.writes
    }

    /// Whether the device side holds the newest write.
    pub fn is_device_current(&self) -> bool {
        self.device_stamp == self.writes
    }

    fn host_only(&self) -> bool {
        self.device_side.is_none()
    }

    /// The host copy, made (zeroed, in the host pool as mirror memory) on first use.
    fn host_copy(&mut self) -> Result<&mut HostCopy> {
        if self.host.is_none() {
            let block = self.device.host_source().pool().allocate_zeroed_for(
                self.len,
                64,
                Usage::Mirror,
            )?;
            self.host = Some(HostCopy::Pooled(block));
        }
        match self.host.as_mut() {
            Some(host) => Ok(host),
            None => unreachable_host(),
        }
    }

    /// A `HostOnly` mirror whose memory the device may still be using: waits for the
    /// device's queued work first (semantics §5.5: stale bytes are never read, and a
    /// host write never races a kernel still reading).
    fn wait_for_device(&mut self) -> Result<()> {
        if self.device_used {
            self.device.synchronize()?;
            self.device_used = false;
        }
        Ok(())
    }

    /// Notes that the device is handed this mirror's memory (see `device_used`).
    fn lend_to_device(&mut self) {
        if self.host_only() {
            self.device_used = true;
        }
    }

    fn make_host_current(&mut self) -> Result<()> {
        self.wait_for_device()?;
        if self.host_only() || self.host_stamp == self.writes {
            return Ok(());
        }
        let len = self.len;
        let device = self.device.clone();
        self.host_copy()?;
        if let (Some(host), Some(buffer)) = (self.host.as_mut(), self.device_side.as_ref()) {
            device.download(buffer, host.bytes_mut(len))?;
        }
        self.host_stamp = self.writes;
        Ok(())
    }

    fn make_device_current(&mut self) -> Result<()> {
        if self.host_only() || self.device_stamp == self.writes {
            return Ok(());
        }
        let len = self.len;
        if let (Some(host), Some(buffer)) = (self.host.as_ref(), self.device_side.as_mut()) {
            self.device.upload(host.bytes(len), buffer)?;
        }
        self.device_stamp = self.writes;
        Ok(())
    }

    fn wrote_host(&mut self) {
        self.writes += 1;
        self.host_stamp = self.writes;
        if self.host_only() {
            self.device_stamp = self.writes;
        }
    }

    fn wrote_device(&mut self) {
        self.writes += 1;
        self.device_stamp = self.writes;
        if self.host_only() {
            self.host_stamp = self.writes;
        }
    }

    /// Reads on the host: copies from the device first if the host side is stale.
    pub fn host(&mut self) -> Result<&[u8]> {
        self.make_host_current()?;
        let len = self.len;
        Ok(self.host_copy()?.bytes(len))
    }

    /// Reads and writes on the host: copies from the device first if the host side is
    /// stale; the device side is stale afterwards.
    pub fn host_mut(&mut self) -> Result<&mut [u8]> {
        self.make_host_current()?;
        self.wrote_host();
        let len = self.len;
        Ok(self.host_copy()?.bytes_mut(len))
    }

    /// Writes every byte on the host without reading: no copy is made first, whatever is
    /// stale; the caller overwrites all of it. The device side is stale afterwards.
    pub fn host_overwrite(&mut self) -> Result<&mut [u8]> {
        self.wait_for_device()?;
        // The host copy first: a refused one leaves the newest bytes where they are.
        self.host_copy()?;
        self.wrote_host();
        let len = self.len;
        Ok(self.host_copy()?.bytes_mut(len))
    }

    /// Reads on the device: copies from the host first if the device side is stale.
    pub fn device(&mut self) -> Result<MirrorDevice<'_>> {
        self.make_device_current()?;
        self.lend_to_device();
        Ok(MirrorDevice {
            range: self.range(),
            _mirror: PhantomData,
        })
    }

    /// Reads and writes on the device: copies from the host first if the device side is
    /// stale; the host side is stale afterwards.
    pub fn device_mut(&mut self) -> Result<MirrorDeviceMut<'_>> {
        self.make_device_current()?;
        self.lend_to_device();
        self.wrote_device();
        Ok(MirrorDeviceMut {
            range: self.range(),
            _mirror: PhantomData,
        })
    }

    /// Writes every byte on the device without reading: no copy first. The host side is
    /// stale afterwards.
    pub fn device_overwrite(&mut self) -> MirrorDeviceMut<'_> {
        self.lend_to_device();
        self.wrote_device();
        MirrorDeviceMut {
            range: self.range(),
            _mirror: PhantomData,
        }
    }

    fn range(&self) -> RawRange {
        let (ptr, id, host) = match (&self.device_side, &self.host) {
            (Some(buffer), _) => (buffer.device_ptr(), buffer.device_id(), false),
            (None, Some(HostCopy::Pinned(p))) => (p.device_ptr(), p.device_id(), true),
            // A HostOnly mirror always has its pinned copy.
            (None, _) => (0, Arc::as_ptr(&self.device.inner) as usize, false),
        };
        RawRange::new(self.device.ordinal(), id, ptr, self.len).in_host_memory(host)
    }

    /// A copy of this buffer on `other` (with the same policy): the newest bytes, copied
    /// through the host and counted on both devices. A buffer is never read across devices
    /// by mistake: device operations refuse memory of another device.
    pub fn copy_to(&mut self, other: &Device) -> Result<Mirror> {
        self.make_host_current()?;
        let len = self.len;
        let bytes = self.host_copy()?.bytes(len).to_vec();
        let mut copy = Mirror::from_host(other, &bytes, self.policy)?;
        copy.make_device_current()?;
        Ok(copy)
    }
}

/// How the host side of a mirror is about to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostAccess {
    /// Read: made current first.
    Read,
    /// Read and written: made current first, the device side stale afterwards.
    ReadWrite,
    /// Written in full without reading: no copy first, the device side stale afterwards.
    Overwrite,
}

impl Mirror {
    /// A `Full` mirror whose device side is about to be written in full by a device
    /// operation: its device buffer is taken but not cleared, and counts as the newest
    /// write (the host side stale).
    pub(crate) fn for_device_output(device: &Device, len: usize) -> Result<Mirror> {
        let len = len.max(1);
        let buffer = device.allocate(len)?;
        Ok(Mirror {
            device: device.clone(),
            len,
            policy: MirroringPolicy::Full,
            host: None,
            device_side: Some(buffer),
            writes: 1,
            host_stamp: 0,
            device_stamp: 1,
            device_used: false,
        })
    }

    /// The host side's address, prepared for `access` (copied first when it must be).
    /// The address stays valid for the mirror's life: the host copy, once made, is kept.
    pub(crate) fn host_ptr(&mut self, access: HostAccess) -> Result<*mut u8> {
        if access != HostAccess::Overwrite {
            self.make_host_current()?;
        } else {
            self.wait_for_device()?;
            // The host copy before the stamp: a refused one leaves the newest bytes where
            // they are.
            self.host_copy()?;
        }
        if access != HostAccess::Read {
            self.wrote_host();
        }
        let len = self.len;
        Ok(self.host_copy()?.bytes_mut(len).as_mut_ptr())
    }

    /// The device side's address, current, and the newest write if `write` (the host side
    /// stale afterwards). Valid for the mirror's life.
    pub(crate) fn device_ptr(&mut self, write: bool) -> Result<u64> {
        self.make_device_current()?;
        self.lend_to_device();
        if write {
            self.wrote_device();
        }
        Ok(self.range().device_ptr())
    }
}

fn unreachable_host<T>() -> Result<T> {
    Err(crate::error::Error::Device {
        device: 0,
        message: "a mirror lost its host copy".into(),
    })
}

impl fmt::Debug for Mirror {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mirror")
            .field("device", &self.device.ordinal())
            .field("len", &self.len)
            .field("policy", &self.policy)
            .field("stamps", &self.stamps())
            .finish()
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Some(HostCopy::Pooled(block)) = self.host.take() {
            crate::reclaim::defer_free(block);
        }
    }
}

/// A mirror's device side, current, borrowed for reading.
#[derive(Debug)]
pub struct MirrorDevice<'a> {
    range: RawRange,
    _mirror: PhantomData<&'a Mirror>,
}

/// A mirror's device side, borrowed for writing (the host side is stale).
#[derive(Debug)]
pub struct MirrorDeviceMut<'a> {
    range: RawRange,
    _mirror: PhantomData<&'a mut Mirror>,
}

impl DeviceMemoryMut for MirrorDeviceMut<'_> {}
super::device_memory_by!(MirrorDevice<'_>, range);
super::device_memory_by!(MirrorDeviceMut<'_>, range);
