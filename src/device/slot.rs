//! The device memory of one tensor: a `Full` mirror (a device buffer, a host copy made on
//! first host access) behind a lock, for the tensor layer's device home (semantics §5).
//!
//! Invariant: the mirror's stamps decide every copy (semantics §5.5), under the slot's
//! lock; the addresses handed out stay valid for the slot's life (the device buffer and,
//! once made, the host copy are never replaced). Who may touch the bytes behind them, and
//! when, is the home's to check: tensor data is written only by its only handle.

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::mirror::{HostAccess, Mirror};
use super::{Device, DeviceMemory, DeviceMemoryMut, Sealed};
use crate::error::Result;

pub(crate) use super::mirror::HostAccess as Access;

/// A tensor's bytes on a device, mirrored on the host on demand.
pub(crate) struct DeviceSlot {
    device: Device,
    len: usize,
    mirror: Mutex<Mirror>,
    /// The host copy's pool block capacity once it is made (0 before; the copy is never
    /// replaced), readable without the mirror's lock: what a scope holding this tensor
    /// holds of the host pool (semantics §7).
    host_held: AtomicUsize,
}

impl DeviceSlot {
    /// `len` bytes about to be written in full by a device operation.
    pub(crate) fn for_output(device: &Device, len: usize) -> Result<DeviceSlot> {
        Ok(DeviceSlot {
            device: device.clone(),
            len,
            mirror: Mutex::new(Mirror::for_device_output(device, len)?),
            host_held: AtomicUsize::new(0),
        })
    }

    /// A copy on `device` of the `len` bytes `fill` writes into its host side, uploaded
    /// now (one counted transfer). The host side is allocated before `fill` runs, the
    /// device side after it returns.
    pub(crate) fn upload_with(
        device: &Device,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<DeviceSlot> {
        let mut mirror = Mirror::from_host_with(device, len, crate::MirroringPolicy::Full, fill)?;
        mirror.device_ptr(false)?;
        Ok(DeviceSlot {
            device: device.clone(),
            len,
            host_held: AtomicUsize::new(mirror.pooled_host_bytes()),
            mirror: Mutex::new(mirror),
        })
    }

    fn mirror(&self) -> MutexGuard<'_, Mirror> {
        self.mirror.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the tensor's memory.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The host copy's address, prepared for `access` (downloaded first if stale).
    pub(crate) fn host_ptr(&self, access: HostAccess) -> Result<*mut u8> {
        let mut mirror = self.mirror();
        let ptr = mirror.host_ptr(access);
        self.host_held
            .store(mirror.pooled_host_bytes(), Ordering::Relaxed);
        ptr
    }

    /// What the host copy holds of the device's host pool (see the field).
    pub(crate) fn host_held(&self) -> usize {
        self.host_held.load(Ordering::Relaxed)
    }

    /// The device range, current (uploaded first if stale); the newest write if `write`.
    pub(crate) fn device_range(&self, write: bool) -> Result<RawRange> {
        let ptr = self.mirror().device_ptr(write)?;
        Ok(RawRange {
            ordinal: self.device.ordinal(),
            device_id: std::sync::Arc::as_ptr(&self.device.inner) as usize,
            ptr,
            len: self.len,
            // A tensor's mirror is `Full`: its device side is device memory.
            host: false,
        })
    }
}

impl fmt::Debug for DeviceSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSlot")
            .field("device", &self.device.ordinal())
            .field("len", &self.len)
            .finish()
    }
}

/// A device range of a tensor's memory, for device operations. Only the tensor layer makes
/// them, from a slot it holds for the operation's duration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRange {
    ordinal: u32,
    device_id: usize,
    ptr: u64,
    len: usize,
    /// Pinned host memory (see [`DeviceMemory::is_host_memory`]).
    host: bool,
}

impl RawRange {
    /// `len` bytes at `ptr` of the device with this ordinal and identity.
    pub(crate) fn new(ordinal: u32, device_id: usize, ptr: u64, len: usize) -> RawRange {
        RawRange {
            ordinal,
            device_id,
            ptr,
            len,
            host: false,
        }
    }

    /// The range, marked as pinned host memory if `host`.
    pub(crate) fn in_host_memory(self, host: bool) -> RawRange {
        RawRange { host, ..self }
    }

    /// All of `memory`.
    pub(crate) fn of<M: DeviceMemory + ?Sized>(memory: &M) -> RawRange {
        RawRange {
            ordinal: memory.ordinal(),
            device_id: memory.device_id(),
            ptr: memory.device_ptr(),
            len: memory.len(),
            host: memory.is_host_memory(),
        }
    }

    /// The part from byte `offset` on.
    pub(crate) fn offset(self, offset: usize) -> RawRange {
        let offset = offset.min(self.len);
        RawRange {
            ptr: self.ptr + offset as u64,
            len: self.len - offset,
            ..self
        }
    }
}

impl RawRange {
    /// The first `bytes` of the range (all of it if shorter).
    pub(crate) fn prefix(self, bytes: usize) -> RawRange {
        RawRange {
            len: self.len.min(bytes),
            ..self
        }
    }
}

impl Sealed for RawRange {}
impl DeviceMemoryMut for RawRange {}

impl DeviceMemory for RawRange {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device_id(&self) -> usize {
        self.device_id
    }
    fn is_host_memory(&self) -> bool {
        self.host
    }
}
