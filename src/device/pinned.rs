//! Pinned (page-locked) host buffers: the staging memory transfers go through, and the
//! only memory of a `HostOnly` mirror (semantics §5). On `sim` they are plain host memory
//! counted as pinned.
//!
//! Invariant: a pinned buffer's bytes are reserved in its device's host pool (as mirror
//! memory) before the driver is asked, are zeroed before they are handed out, and are freed
//! only through epoch reclamation after a fence, so no copy that reads or writes them may
//! still run. The device's own staging buffer ([`Staging`]) holds no handle to its device
//! (that would be a cycle that keeps both alive forever): the device frees it, when it
//! grows and when the device itself goes, after the synchronous copies that used it.

#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use ndmem_alloc::{Reservation, Usage};

use super::stats::bump;
use super::{Device, DeviceMemory, Inner};
use crate::error::Result;

/// Page-locked host memory of a device, mapped into its address space.
///
/// The device reads and writes it in place, and device work is asynchronous: before the
/// host reads what a device operation wrote, or writes what one may still read, wait for
/// the device ([`Device::synchronize`], or an event recorded after the work). A
/// `HostOnly` [`Mirror`](super::Mirror) waits by itself.
pub struct PinnedBuffer {
    device: Arc<Inner>,
    ptr: *mut u8,
    device_ptr: u64,
    len: usize,
    reservation: Option<Reservation<'static>>,
}

// SAFETY: the buffer owns its memory exclusively (like a `Box<[u8]>`); shared access only
// reads through `&self`, writes need `&mut self`.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above: `&PinnedBuffer` gives only reads.
unsafe impl Sync for PinnedBuffer {}

impl Device {
    /// `bytes` of pinned host memory, zeroed, counted in the host pool as mirror memory.
    /// Zero bytes is `AllocError::InvalidLayout`, as a zero-byte device request.
    pub fn allocate_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        super::refuse_zero_bytes(bytes, "pinned buffers hold at least 1 byte")?;
        PinnedBuffer::new(&self.inner, bytes)
    }
}

impl PinnedBuffer {
    pub(crate) fn new(device: &Arc<Inner>, bytes: usize) -> Result<PinnedBuffer> {
        let bytes = bytes.max(1);
        let reservation = device.host.reserve(bytes, Usage::Mirror)?;
        let (ptr, device_ptr) = device.backend.malloc_pinned(device.ordinal, bytes)?;
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes, owned by nobody else yet.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        device.counters.pinned.add(bytes);
        bump(&device.counters.pinned_allocations, 1);
        Ok(PinnedBuffer {
            device: Arc::clone(device),
            ptr,
            device_ptr,
            len: bytes,
            reservation: Some(reservation),
        })
    }

    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for the buffer's life, and
        // writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("device", &self.device.ordinal)
            .field("len", &self.len)
            .finish()
    }
}

impl super::Sealed for PinnedBuffer {}
impl super::DeviceMemoryMut for PinnedBuffer {}

impl DeviceMemory for PinnedBuffer {
    fn ordinal(&self) -> u32 {
        self.device.ordinal
    }
    fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device_id(&self) -> usize {
        Arc::as_ptr(&self.device) as usize
    }
    fn is_host_memory(&self) -> bool {
        true
    }
}

/// The raw parts of a pinned buffer on their way to a deferred free.
struct PinnedRaw {
    ptr: *mut u8,
}

// SAFETY: only the deferred free touches the pointer, once, on whichever thread collects.
unsafe impl Send for PinnedRaw {}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let raw = PinnedRaw { ptr: self.ptr };
        let len = self.len;
        let reservation = self.reservation.take();
        self.device.defer_free(len, move |device, passed| {
            let raw = raw;
            if passed {
                // SAFETY: `raw.ptr` came from `malloc_pinned(_, len)` of this backend; the
                // buffer was dropped and the fence after its last use has passed.
                let _ = unsafe { device.backend.free_pinned(raw.ptr, len) };
            }
            // A fence that failed leaves the memory leaked rather than freed under a copy.
            device.counters.pinned.sub(len);
            drop(reservation);
        });
    }
}

/// The device's staging buffer: pinned memory owned by the device itself, without a handle
/// back to it. Only synchronous copies use it, under the device's staging lock, so it may
/// be freed as soon as that lock is held.
pub(crate) struct Staging {
    ptr: *mut u8,
    len: usize,
    reservation: Option<Reservation<'static>>,
}

// SAFETY: the staging buffer owns its memory exclusively (like a `Box<[u8]>`) and is only
// reached under the device's staging lock.
unsafe impl Send for Staging {}

impl Staging {
    /// `bytes` (at least one) of pinned memory of `device`, counted in its host pool.
    pub(crate) fn new(device: &Inner, bytes: usize) -> Result<Staging> {
        let bytes = bytes.max(1);
        let reservation = device.host.reserve(bytes, Usage::Mirror)?;
        let (ptr, _) = device.backend.malloc_pinned(device.ordinal, bytes)?;
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes, owned by nobody else yet.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        device.counters.pinned.add(bytes);
        bump(&device.counters.pinned_allocations, 1);
        Ok(Staging {
            ptr,
            len: bytes,
            reservation: Some(reservation),
        })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Its host address (valid for [`Staging::len`] bytes until [`Staging::free`]).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed by `new`) bytes until
        // `free`, which takes the buffer by value; writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Gives the memory back to `device`'s driver and its reservation to the host pool.
    pub(crate) fn free(mut self, device: &Inner) {
        // SAFETY: `ptr` came from `malloc_pinned(_, len)` of this backend; every copy that
        // used it was synchronous and ended before the staging lock was released.
        let _ = unsafe { device.backend.free_pinned(self.ptr, self.len) };
        device.counters.pinned.sub(self.len);
        drop(self.reservation.take());
    }
}

impl fmt::Debug for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staging").field("len", &self.len).finish()
    }
}
