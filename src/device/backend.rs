//! The backend seam of the device layer: the few raw operations a device offers (allocate,
//! free, copy each way, set, synchronize, pinned host memory, events), over the `sim`
//! backend or the `cuda` one. Everything above this file is backend-neutral.
//!
//! Invariant: addresses here are raw (`u64` device addresses, `*mut u8` host ones); the
//! callers (`pool`, `pinned`, `transfer`) own the ranges and pass only ranges they hold.
//! Nothing here counts: the statistics are kept one level up, once for both backends.

#![allow(unsafe_code)]

use std::fmt;

use super::sim::{Sim, DEVICE_ALIGN};
use crate::error::{Error, Result};

/// Which kind of device a [`super::Device`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// A device simulated in host memory (always available; for tests and CI).
    Sim,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// The driver refused an allocation: its error, and whether for want of memory
/// (`CUDA_ERROR_OUT_OF_MEMORY`, or the simulated device full), which the pool reports as
/// an out-of-memory error of the device (semantics §5.2), not a device failure.
#[derive(Debug)]
pub(crate) struct DriverRefusal {
    /// Boxed: a refusal is rare, and the `Result` of every allocation stays small.
    pub(crate) error: Box<Error>,
    pub(crate) out_of_memory: bool,
}

/// One device's raw operations.
#[derive(Debug)]
pub(crate) enum Backend {
    Sim(Sim),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::Cuda),
}

/// A point in the device's queue of work; waiting on it waits for everything queued before.
#[derive(Debug)]
pub(crate) enum Fence {
    /// The sim backend runs everything at once: every fence is passed.
    Passed,
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaEvent),
}

// SAFETY (for the `unsafe` blocks below that forward to a backend): each forwards the
// caller's contract unchanged to the backend function of the same name and contract.
impl Backend {
    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Backend::Sim(_) => BackendKind::Sim,
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => BackendKind::Cuda,
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Backend::Sim(_) => "simulated device".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.name(),
        }
    }

    /// `(free, total)` bytes of device memory.
    pub(crate) fn memory_info(&self) -> Result<(usize, usize)> {
        match self {
            Backend::Sim(s) => Ok(s.memory_info()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.memory_info(),
        }
    }

    /// Asks the driver for `bytes` of device memory, aligned to 256 bytes.
    pub(crate) fn malloc(&self, ordinal: u32, bytes: usize) -> Result<u64, DriverRefusal> {
        match self {
            Backend::Sim(s) => s
                .malloc(bytes, DEVICE_ALIGN)
                // The simulated device refuses only for want of memory.
                .map_err(|message| DriverRefusal {
                    error: Box::new(Error::Device {
                        device: ordinal,
                        message: format!("cuMemAlloc: {message}"),
                    }),
                    out_of_memory: true,
                }),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.malloc(bytes),
        }
    }

    /// Gives device memory back to the driver.
    ///
    /// # Safety
    /// `ptr` came from `malloc(_, bytes)` of this backend and nothing uses it any more.
    pub(crate) unsafe fn free(&self, ptr: u64, bytes: usize) -> Result<()> {
        match self {
            Backend::Sim(s) => {
                // SAFETY: see the impl's comment.
                unsafe { s.free(ptr, bytes, DEVICE_ALIGN) };
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.free(ptr) },
        }
    }

    /// Host to device.
    ///
    /// # Safety
    /// `src` readable and `dst` (a device range of this backend) writable for `bytes`.
    pub(crate) unsafe fn copy_htod(&self, src: *const u8, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            // Nothing to move: no driver call (an empty range's address may be dangling).
            return Ok(());
        }
        match self {
            Backend::Sim(_) => {
                // SAFETY: see the impl's comment; sim device memory is host memory.
                unsafe { std::ptr::copy(src, dst as *mut u8, bytes) };
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.copy_htod(src, dst, bytes) },
        }
    }

    /// Device to host.
    ///
    /// # Safety
    /// `src` (a device range of this backend) readable and `dst` writable for `bytes`.
    pub(crate) unsafe fn copy_dtoh(&self, src: u64, dst: *mut u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            // Nothing to move: no driver call (an empty range's address may be dangling).
            return Ok(());
        }
        match self {
            Backend::Sim(_) => {
                // SAFETY: see the impl's comment; sim device memory is host memory.
                unsafe { std::ptr::copy(src as *const u8, dst, bytes) };
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.copy_dtoh(src, dst, bytes) },
        }
    }

    /// Device to device.
    ///
    /// # Safety
    /// Both are device ranges of this backend, valid for `bytes`.
    pub(crate) unsafe fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            // Nothing to move: no driver call (an empty range's address may be dangling).
            return Ok(());
        }
        match self {
            Backend::Sim(_) => {
                // SAFETY: see the impl's comment; sim device memory is host memory.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.copy_dtod(src, dst, bytes) },
        }
    }

    /// Sets a device range to `value`.
    ///
    /// # Safety
    /// `dst` is a device range of this backend writable for `bytes`.
    pub(crate) unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            // Nothing to move: no driver call (an empty range's address may be dangling).
            return Ok(());
        }
        match self {
            Backend::Sim(_) => {
                // SAFETY: see the impl's comment; sim device memory is host memory.
                unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.memset(dst, value, bytes) },
        }
    }

    /// Waits for all queued work.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            Backend::Sim(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.synchronize(),
        }
    }

    /// Page-locked host memory; returns the host pointer and its device address.
    pub(crate) fn malloc_pinned(&self, ordinal: u32, bytes: usize) -> Result<(*mut u8, u64)> {
        match self {
            Backend::Sim(_) => {
                let layout = std::alloc::Layout::from_size_align(bytes.max(1), PINNED_ALIGN)
                    .map_err(|_| Error::Device {
                        device: ordinal,
                        message: format!("cuMemHostAlloc: invalid size {bytes}"),
                    })?;
                // SAFETY: non-zero size, power-of-two alignment.
                let ptr = unsafe { std::alloc::alloc(layout) };
                if ptr.is_null() {
                    return Err(Error::Device {
                        device: ordinal,
                        message: format!("cuMemHostAlloc: the host refused {bytes} bytes"),
                    });
                }
                Ok((ptr, ptr as u64))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                let ptr = c.malloc_pinned(bytes)?;
                match c.pinned_device_ptr(ptr) {
                    Ok(dptr) => Ok((ptr, dptr)),
                    Err(e) => {
                        // SAFETY: just allocated, never handed out.
                        let _ = unsafe { c.free_pinned(ptr) };
                        Err(e)
                    }
                }
            }
        }
    }

    /// Frees pinned memory.
    ///
    /// # Safety
    /// `ptr` came from `malloc_pinned(_, bytes)` of this backend and nothing uses it.
    pub(crate) unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        match self {
            Backend::Sim(_) => {
                if let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), PINNED_ALIGN)
                {
                    // SAFETY: see the impl's comment; allocated with this layout.
                    unsafe { std::alloc::dealloc(ptr, layout) };
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: see the impl's comment.
            Backend::Cuda(c) => unsafe { c.free_pinned(ptr) },
        }
    }

    /// A fence after all work queued so far.
    pub(crate) fn fence(&self) -> Result<Fence> {
        match self {
            Backend::Sim(_) => Ok(Fence::Passed),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.record_event().map(Fence::Cuda),
        }
    }

    /// Waits until `fence` is passed.
    pub(crate) fn wait(&self, fence: &Fence) -> Result<()> {
        match (self, fence) {
            (_, Fence::Passed) => Ok(()),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), Fence::Cuda(e)) => c.wait(e),
            #[cfg(feature = "cuda")]
            (Backend::Sim(_), Fence::Cuda(e)) => e.synchronize().map_err(|e| Error::NoDevice {
                reason: e.to_string(),
            }),
        }
    }

    /// Whether `fence` is passed, without waiting.
    pub(crate) fn is_passed(&self, fence: &Fence) -> Result<bool> {
        match (self, fence) {
            (_, Fence::Passed) => Ok(true),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), Fence::Cuda(e)) => c.is_complete(e),
            #[cfg(feature = "cuda")]
            (Backend::Sim(_), Fence::Cuda(e)) => Ok(e.is_complete()),
        }
    }
}

/// The alignment of pinned host buffers (a page).
pub(crate) const PINNED_ALIGN: usize = 4096;
