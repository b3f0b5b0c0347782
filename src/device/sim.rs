//! The `sim` backend: a device whose memory is host memory, so that every rule of the
//! device layer (pools, limits, mirroring, workspaces, deferred frees) runs and is tested
//! on machines without a GPU (semantics §5).
//!
//! Invariant: a "device address" is the address of a live host allocation of at least
//! [`DEVICE_ALIGN`] alignment made here, and `allocated <= total` at every instant (the
//! simulated driver refuses what the device would not hold, as `cudaMalloc` does).

#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The alignment of device allocations, as `cudaMalloc` gives (256 bytes).
pub(crate) const DEVICE_ALIGN: usize = 256;

/// A simulated device: host memory behind a "driver" with a fixed amount of memory.
#[derive(Debug)]
pub(crate) struct Sim {
    total: usize,
    allocated: AtomicUsize,
}

impl Sim {
    /// A device with `total` bytes of memory.
    pub(crate) fn new(total: usize) -> Sim {
        Sim {
            total,
            allocated: AtomicUsize::new(0),
        }
    }

    /// `(free, total)` bytes of the simulated device.
    pub(crate) fn memory_info(&self) -> (usize, usize) {
        let used = self.allocated.load(Ordering::Relaxed);
        (self.total.saturating_sub(used), self.total)
    }

    fn layout(bytes: usize, align: usize) -> Option<Layout> {
        Layout::from_size_align(bytes.max(1), align).ok()
    }

    /// Allocates `bytes` of "device" memory, or says why not.
    pub(crate) fn malloc(&self, bytes: usize, align: usize) -> Result<u64, String> {
        let mut used = self.allocated.load(Ordering::Relaxed);
        loop {
            let next = used
                .checked_add(bytes)
                .filter(|n| *n <= self.total)
                .ok_or_else(|| {
                    format!(
                        "out of memory: {bytes} bytes requested, {} of {} bytes free",
                        self.total.saturating_sub(used),
                        self.total
                    )
                })?;
            match self.allocated.compare_exchange_weak(
                used,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        let Some(layout) = Self::layout(bytes, align) else {
            self.allocated.fetch_sub(bytes, Ordering::Relaxed);
            return Err(format!("invalid size {bytes}"));
        };
        // SAFETY: the layout has a non-zero size (`max(1)`) and a power-of-two alignment
        // (checked by `Layout::from_size_align`). Zeroed, so simulated kernels never read
        // uninitialised memory (a real device's fresh memory is merely unspecified).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            self.allocated.fetch_sub(bytes, Ordering::Relaxed);
            return Err(format!("the host refused {bytes} bytes"));
        }
        Ok(ptr as u64)
    }

    /// Frees what [`Sim::malloc`] returned.
    ///
    /// # Safety
    /// `ptr` was returned by `malloc(bytes, align)` of this device and is not used again.
    pub(crate) unsafe fn free(&self, ptr: u64, bytes: usize, align: usize) {
        if let Some(layout) = Self::layout(bytes, align) {
            // SAFETY: by the caller's contract, `ptr` came from `alloc` with this layout.
            unsafe { dealloc(ptr as *mut u8, layout) };
            self.allocated.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}
