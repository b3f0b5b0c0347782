//! The device pool (one per device): size-classed caching of device buffers under an exact
//! budget, the device twin of the host pool (semantics §1, §5).
//!
//! Invariant: every device byte the pool holds, cached buffers included, was reserved in the
//! device's [`Budget`] before the driver was asked, so `live + cached <= limit` at every
//! instant, from any number of threads. A freed buffer goes back to its class's cache only
//! through epoch reclamation and after a fence on the device's queue (one event covers a
//! batch of frees), so no copy or kernel that used it may still run when it is reused or
//! freed. After warm-up an allocation of a shape seen before is a cache hit: no driver
//! call, no budget change.

#![allow(unsafe_code)]

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use ndmem_alloc::counter::Budget;
use ndmem_alloc::{AllocError, MemoryKind, Usage, RELIEF_ROUNDS};

use super::stats::{bump, usage_index};
use super::{DeviceMemory, Inner};
use crate::error::{Error, Result};

/// The smallest size class (and the driver's alignment).
const MIN_CLASS: usize = 512;
/// Buffers above this size are allocated exactly and never cached.
const MAX_CACHED: usize = 1 << 30;
/// Classes: one for `<= 512`, then four per power of two up to [`MAX_CACHED`].
const CLASSES: usize = 1 + 4 * (MAX_CACHED.trailing_zeros() as usize - 9);
/// Buffers kept per class.
pub(crate) const CACHED_PER_CLASS: usize = 32;

/// The class of a request: its index (`None`: not cached) and the bytes it holds.
pub(crate) fn size_class(bytes: usize) -> (Option<usize>, usize) {
    if bytes <= MIN_CLASS {
        return (Some(0), MIN_CLASS);
    }
    if bytes > MAX_CACHED {
        return (None, bytes.next_multiple_of(MIN_CLASS));
    }
    let k = (bytes - 1).ilog2() as usize; // 2^k < bytes <= 2^(k+1)
    let base = 1usize << k;
    let step = base / 4;
    let sub = (bytes - base).div_ceil(step); // 1..=4
    (Some(1 + (k - 9) * 4 + (sub - 1)), base + sub * step)
}

/// The cache and the budget of one device.
pub(crate) struct DevicePool {
    pub(crate) budget: Budget,
    classes: Box<[Mutex<Vec<u64>>]>,
}

impl DevicePool {
    pub(crate) fn new(limit: Option<usize>) -> DevicePool {
        DevicePool {
            budget: Budget::new(limit),
            classes: (0..CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn class(&self, index: usize) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.classes[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// A buffer of device memory from a device's pool. Dropping it hands it back through epoch
/// reclamation, after a fence (semantics §5).
pub struct DeviceBuffer {
    pub(crate) device: Arc<Inner>,
    pub(crate) ptr: u64,
    len: usize,
    capacity: usize,
    class: Option<usize>,
    usage: Usage,
}

impl DeviceBuffer {
    /// The bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: zero-byte requests are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes the pool holds for it (its size class).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Its device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The ordinal of its device.
    pub fn ordinal(&self) -> u32 {
        self.device.ordinal
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl super::Sealed for DeviceBuffer {}
impl super::DeviceMemoryMut for DeviceBuffer {}

impl DeviceMemory for DeviceBuffer {
    fn ordinal(&self) -> u32 {
        self.device.ordinal
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device_id(&self) -> usize {
        Arc::as_ptr(&self.device) as usize
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let (ptr, capacity, class, usage) = (self.ptr, self.capacity, self.class, self.usage);
        // Work queued so far may still use the buffer: wait for it before reuse.
        self.device.defer_free(capacity, move |device, passed| {
            device.give_back(ptr, capacity, class, usage, passed);
        });
    }
}

impl Inner {
    /// A buffer of `bytes` from this device's pool, counted as `usage` (semantics §5).
    pub(crate) fn allocate(self: &Arc<Self>, bytes: usize, usage: Usage) -> Result<DeviceBuffer> {
        self.refuse_while_capturing("allocating device memory")?;
        if bytes == 0 || bytes > isize::MAX as usize {
            return Err(Error::Alloc(AllocError::InvalidLayout {
                size: bytes,
                align: MIN_CLASS,
                reason: "device buffers hold between 1 and isize::MAX bytes",
            }));
        }
        if bytes >= ndmem_alloc::counter::UNLIMITED {
            // As the host pool (semantics §1): no budget reaches 4 EiB, so this is no
            // limit's refusal, and its advice could not be followed.
            return Err(Error::Alloc(AllocError::InvalidLayout {
                size: bytes,
                align: MIN_CLASS,
                reason: "more than any pool can hold (4 EiB, the largest budget)",
            }));
        }
        let (class, capacity) = size_class(bytes);
        let mut ptr = self.take_cached(class, capacity);
        if ptr.is_none() && class.is_some() && self.counters.deferred.load(Ordering::Relaxed) > 0 {
            // Buffers of this device wait for reclamation: flush them into the cache before
            // asking the driver, so a steady loop reuses its buffers.
            crate::reclaim::collect();
            ptr = self.take_cached(class, capacity);
        }
        let ptr = match ptr {
            Some(ptr) => ptr,
            None => self.allocate_new(bytes, capacity)?,
        };
        self.counters.live.add(capacity);
        self.counters.by_usage[usage_index(usage)].fetch_add(capacity, Ordering::Relaxed);
        Ok(DeviceBuffer {
            device: Arc::clone(self),
            ptr,
            len: bytes,
            capacity,
            class,
            usage,
        })
    }

    fn take_cached(&self, class: Option<usize>, capacity: usize) -> Option<u64> {
        let ptr = self.pool.class(class?).pop()?;
        self.counters.cached.sub(capacity);
        bump(&self.counters.pool_hits, 1);
        Some(ptr)
    }

    /// Reserves and asks the driver; at the limit, relieves in rounds (flushes deferred
    /// frees, then empties the cache, then tries again), for as long as a round freed
    /// something, at most [`RELIEF_ROUNDS`]: other threads go on deferring frees while a
    /// request relieves, and a request refused with those pending would be refused for
    /// bytes that are only waiting. Counts one relief per request (`alloc_retries`) and
    /// each failure (`failed_allocations`), on this cold path only.
    fn allocate_new(&self, bytes: usize, capacity: usize) -> Result<u64> {
        let class = size_class(bytes).0;
        let mut rounds = 0;
        let mut progress = true;
        let mut flushing = true;
        loop {
            match self.pool.budget.try_reserve(capacity) {
                Ok(_) => match self.backend.malloc(self.ordinal, capacity) {
                    Ok(ptr) => {
                        bump(&self.counters.driver_allocations, 1);
                        return Ok(ptr);
                    }
                    Err(refusal) => {
                        self.pool.budget.release(capacity);
                        // One retry, after what gives the driver memory back: the frees
                        // waiting for reclamation, then the cache.
                        if rounds == 0 {
                            let flushed = self.flush_deferred();
                            if self.trim() > 0 || flushed {
                                bump(&self.counters.alloc_retries, 1);
                                rounds = RELIEF_ROUNDS;
                                continue;
                            }
                        }
                        bump(&self.counters.failed_allocations, 1);
                        if !refusal.out_of_memory {
                            return Err(*refusal.error);
                        }
                        return Err(self.driver_out_of_memory(bytes, capacity));
                    }
                },
                Err(exhausted) => {
                    if rounds >= RELIEF_ROUNDS || !progress {
                        bump(&self.counters.failed_allocations, 1);
                        let error = AllocError::OutOfMemory {
                            kind: MemoryKind::Device(self.ordinal),
                            // The bytes asked for, as the host pool says (not the class).
                            requested: bytes,
                            needed: capacity,
                            thread: ndmem_alloc::os_thread_id(),
                            used: exhausted.used,
                            limit: exhausted.limit,
                            holders: self.counters.holders(),
                            variable: self.limit_variable(exhausted.limit),
                            report: None,
                        };
                        // Which device refused, for the report's advice (simulated devices
                        // may share an ordinal).
                        super::note_refusal(self);
                        // The timeline's OOM event and the `stats::on_oom` hooks.
                        ndmem_alloc::trace::refused_device(self.ordinal, exhausted.used, &error);
                        // A refusal inside a hook noted its own device: this error is ours.
                        super::note_refusal(self);
                        return Err(error.into());
                    }
                    if rounds == 0 {
                        // Relief, then retries (counted once, even when relief serves it).
                        bump(&self.counters.alloc_retries, 1);
                    }
                    rounds += 1;
                    // Flushed again only after a round whose flush freed something: a
                    // flush that freed nothing may have waited its second for a pinned
                    // thread, and the cache's churn must not make every round wait again.
                    let freed = flushing && self.flush_deferred();
                    flushing = freed;
                    if let Some(ptr) = self.take_cached(class, capacity) {
                        return Ok(ptr);
                    }
                    progress = self.trim() > 0 || freed;
                }
            }
        }
    }

    /// The driver had no memory for a request the budget allowed (other processes, or
    /// memory outside the pool, hold the rest): an out-of-memory error of the device
    /// (semantics §5.2), `used` and `limit` the device's memory in use and in total, as
    /// the driver says, with the report, the timeline's event and the `on_oom` hooks of
    /// any refusal at a limit.
    fn driver_out_of_memory(&self, bytes: usize, capacity: usize) -> Error {
        let (free, total) = self.backend.memory_info().unwrap_or((0, self.total_memory));
        let error = AllocError::OutOfMemory {
            kind: MemoryKind::Device(self.ordinal),
            requested: bytes,
            needed: capacity,
            thread: ndmem_alloc::os_thread_id(),
            used: total.saturating_sub(free),
            limit: total,
            holders: self.counters.holders(),
            variable: ndmem_alloc::DRIVER_REFUSED,
            report: None,
        };
        super::note_refusal(self);
        ndmem_alloc::trace::refused_device(self.ordinal, self.pool.budget.used(), &error);
        super::note_refusal(self);
        error.into()
    }

    /// Flushes deferred frees until some of this device's come back, or none are
    /// pending, for at most a second, as the host pool's reclaimer
    /// ([`crate::reclaim::collect_until_freed`]): a thread descheduled while pinned holds
    /// them back that long on a loaded machine (8 threads moving tensors to a device
    /// beside 8 more on two cores were refused with 11 MiB of the device's 16 MiB pending
    /// behind a pin after 100 ms). Whether any of this device's came back.
    fn flush_deferred(&self) -> bool {
        crate::reclaim::collect_until_freed(|| self.counters.deferred.load(Ordering::Relaxed)) > 0
    }

    /// Takes a buffer back (from a deferred free, its fence passed or not).
    fn give_back(
        &self,
        ptr: u64,
        capacity: usize,
        class: Option<usize>,
        usage: Usage,
        passed: bool,
    ) {
        self.counters.live.sub(capacity);
        self.counters.by_usage[usage_index(usage)].fetch_sub(capacity, Ordering::Relaxed);
        if !passed {
            // The device failed to pass the fence: work may still use the buffer, so it is
            // neither reused nor freed; its bytes stay reserved (lost with the context).
            return;
        }
        {
            if let Some(class) = class {
                let mut cache = self.pool.class(class);
                if cache.len() < CACHED_PER_CLASS {
                    cache.push(ptr);
                    self.counters.cached.add(capacity);
                    return;
                }
            }
        }
        self.free_to_driver(ptr, capacity);
    }

    fn free_to_driver(&self, ptr: u64, capacity: usize) {
        // SAFETY: `ptr` came from `malloc(_, capacity)` of this backend, is no longer handed
        // out (its buffer was dropped, or it sat in the cache), and its fence was waited on.
        let _ = unsafe { self.backend.free(ptr, capacity) };
        self.pool.budget.release(capacity);
        bump(&self.counters.driver_frees, 1);
    }

    /// Gives every cached buffer back to the driver; returns the bytes released.
    pub(crate) fn trim(&self) -> usize {
        if self.capturing_here() {
            // No driver frees inside a capture (they would end it).
            return 0;
        }
        let mut released = 0;
        for index in 0..CLASSES {
            let drained: Vec<u64> = std::mem::take(&mut *self.pool.class(index));
            let capacity = class_bytes(index);
            for ptr in drained {
                self.counters.cached.sub(capacity);
                self.free_to_driver(ptr, capacity);
                released += capacity;
            }
        }
        released
    }
}

/// The bytes of class `index`.
fn class_bytes(index: usize) -> usize {
    if index == 0 {
        return MIN_CLASS;
    }
    let k = (index - 1) / 4 + 9;
    let sub = (index - 1) % 4 + 1;
    (1usize << k) + sub * ((1usize << k) / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn the_thread_id_is_the_os_one() {
        let here = ndmem_alloc::os_thread_id();
        assert_ne!(here, 0);
        assert_eq!(here, ndmem_alloc::os_thread_id());
        // The main thread's id is the process id; every other thread's differs from it.
        let main = u64::from(std::process::id());
        let there = std::thread::spawn(ndmem_alloc::os_thread_id)
            .join()
            .unwrap();
        assert_ne!(there, 0);
        assert_ne!(there, here);
        assert_ne!(there, main);
    }

    #[test]
    fn classes_are_quarter_powers_of_two() {
        assert_eq!(size_class(1), (Some(0), 512));
        assert_eq!(size_class(512), (Some(0), 512));
        assert_eq!(size_class(513), (Some(1), 640));
        assert_eq!(size_class(1024), (Some(4), 1024));
        assert_eq!(size_class(1025), (Some(5), 1280));
        assert_eq!(size_class(MAX_CACHED), (Some(CLASSES - 1), MAX_CACHED));
        assert_eq!(size_class(MAX_CACHED + 1).0, None);
        for bytes in [1, 700, 4096, 5000, 1 << 20, (1 << 20) + 3, MAX_CACHED] {
            let (class, capacity) = size_class(bytes);
            assert!(capacity >= bytes && capacity - bytes <= capacity / 4 + 512);
            assert_eq!(class_bytes(class.unwrap()), capacity, "{bytes}");
        }
    }
}
