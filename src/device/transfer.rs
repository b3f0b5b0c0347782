//! Copies between host and device, and between device ranges (semantics §5): pageable host
//! memory goes through the device's pinned staging buffer, pinned memory goes directly.
//!
//! Invariant: a copy touches only ranges that belong to this device and that the borrow
//! checker says are live (the sealed [`DeviceMemory`] types hold their memory while
//! borrowed); lengths are checked before the driver is asked. Each logical copy is counted
//! once, with its bytes, whatever chunks the staging buffer cut it into.

#![allow(unsafe_code)]

use std::sync::PoisonError;

use ndmem_alloc::trace::{self, EventKind};

use super::pinned::{PinnedBuffer, Staging};
use super::stats::bump;
use super::{misuse, BackendKind, Device, DeviceMemory, DeviceMemoryMut};
use crate::error::Result;

/// The most a staging buffer holds; larger copies go in chunks.
pub const STAGING_BYTES: usize = 4 << 20;

impl Device {
    fn check<M: DeviceMemory + ?Sized>(&self, memory: &M, what: &str) -> Result<()> {
        if memory.device_id() != std::sync::Arc::as_ptr(&self.inner) as usize {
            return Err(misuse(
                self.ordinal(),
                format!(
                    "{what}: the memory lives on another device ({} {}); copy it to this one first",
                    if memory.ordinal() == self.ordinal() {
                        "a different"
                    } else {
                        "device"
                    },
                    memory.ordinal()
                ),
            ));
        }
        Ok(())
    }

    fn check_len(&self, what: &str, copy: usize, room: usize) -> Result<()> {
        if copy > room {
            return Err(misuse(
                self.ordinal(),
                format!("{what}: {copy} bytes do not fit in {room} bytes"),
            ));
        }
        Ok(())
    }

    /// Copies `src` (pageable host memory) to the start of `dst`, through the pinned
    /// staging buffer.
    pub fn upload<M: DeviceMemoryMut + ?Sized>(&self, src: &[u8], dst: &mut M) -> Result<()> {
        self.inner.refuse_while_capturing("a copy")?;
        self.check(dst, "upload")?;
        self.check_len("upload", src.len(), dst.len())?;
        self.staged_htod(src, dst.device_ptr())?;
        bump(&self.inner.counters.htod, 1);
        bump(&self.inner.counters.htod_bytes, src.len() as u64);
        trace::record_device(EventKind::Transfer, self.inner.ordinal, src.len(), 0);
        Ok(())
    }

    /// Copies the start of `src` into `dst` (pageable host memory), through the pinned
    /// staging buffer.
    pub fn download<M: DeviceMemory + ?Sized>(&self, src: &M, dst: &mut [u8]) -> Result<()> {
        self.inner.refuse_while_capturing("a copy")?;
        self.check(src, "download")?;
        self.check_len("download", dst.len(), src.len())?;
        self.staged_dtoh(src.device_ptr(), dst)?;
        bump(&self.inner.counters.dtoh, 1);
        bump(&self.inner.counters.dtoh_bytes, dst.len() as u64);
        trace::record_device(EventKind::Transfer, self.inner.ordinal, dst.len(), 0);
        Ok(())
    }

    /// Copies pinned host memory to the start of `dst`, directly.
    pub fn upload_pinned<M: DeviceMemoryMut + ?Sized>(
        &self,
        src: &PinnedBuffer,
        dst: &mut M,
    ) -> Result<()> {
        self.inner.refuse_while_capturing("a copy")?;
        self.check(dst, "upload")?;
        self.check(src, "upload")?;
        self.check_len("upload", src.len(), dst.len())?;
        // SAFETY: `src` is a live pinned buffer of `len` bytes (borrowed), `dst` a live
        // device range of this device with room for them (checked above).
        unsafe {
            self.inner
                .backend
                .copy_htod(src.host_ptr(), dst.device_ptr(), src.len())?
        };
        bump(&self.inner.counters.htod, 1);
        bump(&self.inner.counters.htod_bytes, src.len() as u64);
        trace::record_device(EventKind::Transfer, self.inner.ordinal, src.len(), 0);
        Ok(())
    }

    /// Copies the start of `src` into pinned host memory, directly.
    pub fn download_pinned<M: DeviceMemory + ?Sized>(
        &self,
        src: &M,
        dst: &mut PinnedBuffer,
    ) -> Result<()> {
        self.inner.refuse_while_capturing("a copy")?;
        self.check(src, "download")?;
        self.check(dst, "download")?;
        self.check_len("download", dst.len(), src.len())?;
        // SAFETY: `dst` is a live pinned buffer borrowed exclusively, `src` a live device
        // range of this device at least as long (checked above).
        unsafe {
            self.inner
                .backend
                .copy_dtoh(src.device_ptr(), dst.host_ptr(), dst.len())?
        };
        bump(&self.inner.counters.dtoh, 1);
        bump(&self.inner.counters.dtoh_bytes, dst.len() as u64);
        trace::record_device(EventKind::Transfer, self.inner.ordinal, dst.len(), 0);
        Ok(())
    }

    /// Copies `src` to the start of `dst`, both on this device.
    pub fn copy<S, D>(&self, src: &S, dst: &mut D) -> Result<()>
    where
        S: DeviceMemory + ?Sized,
        D: DeviceMemoryMut + ?Sized,
    {
        self.inner.refuse_while_capturing("a copy")?;
        self.check(src, "copy")?;
        self.check(dst, "copy")?;
        self.check_len("copy", src.len(), dst.len())?;
        // SAFETY: both are live ranges of this device (borrowed; `dst` exclusively), with
        // room checked above.
        unsafe {
            self.inner
                .backend
                .copy_dtod(src.device_ptr(), dst.device_ptr(), src.len())?
        };
        // A copy between device addresses returns before it is done; one that reads or
        // writes pinned host memory must be done when it returns (semantics §5.4: the
        // source may be reused, the destination holds the bytes).
        if src.is_host_memory() || dst.is_host_memory() {
            self.inner.backend.synchronize()?;
        }
        bump(&self.inner.counters.dtod, 1);
        bump(&self.inner.counters.dtod_bytes, src.len() as u64);
        trace::record_device(EventKind::Transfer, self.inner.ordinal, src.len(), 0);
        Ok(())
    }

    /// Sets every byte of `dst` to `value` on the device (a device operation).
    pub fn fill<M: DeviceMemoryMut + ?Sized>(&self, dst: &mut M, value: u8) -> Result<()> {
        self.inner.refuse_while_capturing("a fill")?;
        self.check(dst, "fill")?;
        // SAFETY: a live range of this device, borrowed exclusively.
        unsafe {
            self.inner
                .backend
                .memset(dst.device_ptr(), value, dst.len())?
        };
        // As for a copy: done when it returns if it wrote pinned host memory.
        if dst.is_host_memory() {
            self.inner.backend.synchronize()?;
        }
        Ok(())
    }

    /// On a simulated device, the bytes of a device range, readable from the host (how
    /// tests play the part of a kernel); `None` on a real GPU.
    pub fn sim_bytes<'a, M: DeviceMemory + ?Sized>(&self, memory: &'a M) -> Option<&'a [u8]> {
        if self.kind() != BackendKind::Sim || self.check(memory, "sim_bytes").is_err() {
            return None;
        }
        // SAFETY: on sim a device range is host memory, live while `memory` is borrowed,
        // and only read while this shared borrow lasts.
        Some(unsafe { std::slice::from_raw_parts(memory.device_ptr() as *const u8, memory.len()) })
    }

    /// On a simulated device, the bytes of a device range, writable from the host (a
    /// simulated kernel); `None` on a real GPU.
    pub fn sim_bytes_mut<'a, M: DeviceMemoryMut + ?Sized>(
        &self,
        memory: &'a mut M,
    ) -> Option<&'a mut [u8]> {
        if self.kind() != BackendKind::Sim || self.check(memory, "sim_bytes").is_err() {
            return None;
        }
        // SAFETY: on sim a device range is host memory, live while `memory` is borrowed;
        // the exclusive borrow makes this the only access to the range.
        Some(unsafe {
            std::slice::from_raw_parts_mut(memory.device_ptr() as *mut u8, memory.len())
        })
    }

    fn with_staging<R>(
        &self,
        bytes: usize,
        f: impl FnOnce(&mut Staging) -> Result<R>,
    ) -> Result<R> {
        let want = bytes.clamp(1, STAGING_BYTES);
        let mut staging = self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if staging.as_ref().map_or(true, |s| s.len() < want) {
            // Grow to the larger of what is asked and twice the old size, up to the cap.
            let old = staging.as_ref().map_or(0, Staging::len);
            let size = want.max(old.saturating_mul(2)).min(STAGING_BYTES);
            if let Some(old) = staging.take() {
                old.free(&self.inner);
            }
            *staging = Some(Staging::new(&self.inner, size)?);
        }
        match staging.as_mut() {
            Some(buffer) => f(buffer),
            None => Err(misuse(self.ordinal(), "no staging buffer".into())),
        }
    }

    fn staged_htod(&self, src: &[u8], dst: u64) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.with_staging(src.len(), |staging| {
            let chunk = staging.len();
            for (i, part) in src.chunks(chunk).enumerate() {
                staging.as_mut_slice()[..part.len()].copy_from_slice(part);
                // SAFETY: the staging buffer holds `part.len()` initialised bytes; `dst`
                // has room for all of `src` (checked by the caller).
                unsafe {
                    self.inner.backend.copy_htod(
                        staging.host_ptr(),
                        dst + (i * chunk) as u64,
                        part.len(),
                    )?
                };
            }
            bump(&self.inner.counters.staged_bytes, src.len() as u64);
            Ok(())
        })
    }

    fn staged_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let total = dst.len() as u64;
        self.with_staging(dst.len(), |staging| {
            let chunk = staging.len();
            for (i, part) in dst.chunks_mut(chunk).enumerate() {
                // SAFETY: the staging buffer has room for `part.len() <= chunk` bytes and
                // is borrowed exclusively; `src` is readable for all of `dst` (checked by
                // the caller).
                unsafe {
                    self.inner.backend.copy_dtoh(
                        src + (i * chunk) as u64,
                        staging.host_ptr(),
                        part.len(),
                    )?
                };
                part.copy_from_slice(&staging.as_slice()[..part.len()]);
            }
            bump(&self.inner.counters.staged_bytes, total);
            Ok(())
        })
    }
}
