//! The figures of one device: what its pool holds (live, cached, by purpose), what it asked
//! the driver for, pinned host memory, and every transfer with its bytes, kept once for
//! both backends.
//!
//! Invariant: every figure only grows except the live/cached values, which are
//! [`Counter`]s (value, peak, total); a transfer is counted once per logical copy, however
//! many staging chunks it took.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ndmem_alloc::counter::Counter;
use ndmem_alloc::{Holders, Usage};

/// The running figures of one device.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) live: Counter,
    pub(crate) cached: Counter,
    pub(crate) pinned: Counter,
    /// Device and pinned bytes dropped and waiting for epoch reclamation.
    pub(crate) deferred: AtomicUsize,
    /// Live bytes by [`Usage`] (`Tensor`, `Workspace`, `Mirror`, `Other`).
    pub(crate) by_usage: [AtomicUsize; 4],
    pub(crate) driver_allocations: AtomicU64,
    pub(crate) driver_frees: AtomicU64,
    pub(crate) pinned_allocations: AtomicU64,
    pub(crate) pool_hits: AtomicU64,
    pub(crate) htod: AtomicU64,
    pub(crate) htod_bytes: AtomicU64,
    pub(crate) dtoh: AtomicU64,
    pub(crate) dtoh_bytes: AtomicU64,
    pub(crate) dtod: AtomicU64,
    pub(crate) dtod_bytes: AtomicU64,
    pub(crate) staged_bytes: AtomicU64,
    pub(crate) synchronizations: AtomicU64,
    pub(crate) fences_before_free: AtomicU64,
    pub(crate) kernel_launches: AtomicU64,
    pub(crate) graph_launches: AtomicU64,
    /// Allocations the pool refused (cold path only).
    pub(crate) failed_allocations: AtomicU64,
    /// Allocations the pool retried after relieving pressure (cold path only).
    pub(crate) alloc_retries: AtomicU64,
}

pub(crate) fn usage_index(usage: Usage) -> usize {
    match usage {
        Usage::Tensor => 0,
        Usage::Workspace => 1,
        Usage::Mirror => 2,
        _ => 3,
    }
}

pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn holders(&self) -> Holders {
        let get = |i: usize| self.by_usage[i].load(Ordering::Relaxed);
        Holders {
            tensors: get(0),
            workspaces: get(1),
            mirrors: get(2),
            other: get(3),
            cached: self.cached.value(),
        }
    }

    pub(crate) fn snapshot(&self) -> DeviceStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let live = self.live.read();
        DeviceStats {
            live_bytes: live.value,
            peak_live_bytes: live.peak,
            cached_bytes: self.cached.value(),
            used_bytes: 0,
            limit: None,
            holders: self.holders(),
            driver_allocations: get(&self.driver_allocations),
            driver_frees: get(&self.driver_frees),
            pool_hits: get(&self.pool_hits),
            pinned_bytes: self.pinned.value(),
            deferred_bytes: self.deferred.load(Ordering::Relaxed),
            pinned_allocations: get(&self.pinned_allocations),
            htod_transfers: get(&self.htod),
            htod_bytes: get(&self.htod_bytes),
            dtoh_transfers: get(&self.dtoh),
            dtoh_bytes: get(&self.dtoh_bytes),
            dtod_transfers: get(&self.dtod),
            dtod_bytes: get(&self.dtod_bytes),
            staged_bytes: get(&self.staged_bytes),
            synchronizations: get(&self.synchronizations),
            fences_before_free: get(&self.fences_before_free),
            kernel_launches: get(&self.kernel_launches),
            graph_launches: get(&self.graph_launches),
            failed_allocations: get(&self.failed_allocations),
            alloc_retries: get(&self.alloc_retries),
        }
    }
}

/// A snapshot of one device's figures ([`super::Device::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DeviceStats {
    /// Device bytes handed out by its pool and not yet given back (size-class capacities).
    pub live_bytes: usize,
    /// The highest `live_bytes` so far.
    pub peak_live_bytes: usize,
    /// Freed device buffers the pool keeps for reuse.
    pub cached_bytes: usize,
    /// Bytes counted against the device's limit (`live + cached`).
    pub used_bytes: usize,
    /// The device's limit in bytes, `None` when unlimited.
    pub limit: Option<usize>,
    /// Live bytes by purpose, and the cache.
    pub holders: Holders,
    /// Device allocations asked of the driver (`cuMemAlloc`).
    pub driver_allocations: u64,
    /// Device buffers given back to the driver (`cuMemFree`).
    pub driver_frees: u64,
    /// Allocations served from the pool's cache (no driver call).
    pub pool_hits: u64,
    /// Pinned host bytes held (mirrors, staging).
    pub pinned_bytes: usize,
    /// Device and pinned bytes dropped and waiting for epoch reclamation (still counted
    /// as live; [`crate::reclaim::collect`] flushes them).
    pub deferred_bytes: usize,
    /// Pinned host allocations asked of the driver (`cuMemHostAlloc`).
    pub pinned_allocations: u64,
    /// Host-to-device copies.
    pub htod_transfers: u64,
    /// Bytes copied host to device.
    pub htod_bytes: u64,
    /// Device-to-host copies.
    pub dtoh_transfers: u64,
    /// Bytes copied device to host.
    pub dtoh_bytes: u64,
    /// Device-to-device copies (between buffers, or to another device).
    pub dtod_transfers: u64,
    /// Bytes copied device to device.
    pub dtod_bytes: u64,
    /// Bytes that went through the pinned staging buffer (pageable host memory).
    pub staged_bytes: u64,
    /// Explicit synchronizations ([`super::Device::synchronize`], event waits).
    pub synchronizations: u64,
    /// Fences waited on before a device or pinned buffer was reused or freed.
    pub fences_before_free: u64,
    /// Device operations launched (kernels and matrix products), those of graph replays
    /// included.
    pub kernel_launches: u64,
    /// Graph replays ([`super::GraphMemory::launch`]).
    pub graph_launches: u64,
    /// Allocations refused: at the device's limit, or by the driver (PyTorch's
    /// `num_ooms`).
    pub failed_allocations: u64,
    /// Allocations retried after relieving pressure (deferred frees flushed, the cache
    /// given back to the driver), whether the retry succeeded or not (PyTorch's
    /// `num_alloc_retries`).
    pub alloc_retries: u64,
}

impl DeviceStats {
    /// Transfers in both directions between host and device.
    pub fn transfers(&self) -> u64 {
        self.htod_transfers + self.dtoh_transfers
    }

    /// The figures since `earlier`: counts and bytes subtracted; live figures as now.
    pub fn since(&self, earlier: &DeviceStats) -> DeviceStats {
        DeviceStats {
            driver_allocations: self.driver_allocations - earlier.driver_allocations,
            driver_frees: self.driver_frees - earlier.driver_frees,
            pool_hits: self.pool_hits - earlier.pool_hits,
            pinned_allocations: self.pinned_allocations - earlier.pinned_allocations,
            htod_transfers: self.htod_transfers - earlier.htod_transfers,
            htod_bytes: self.htod_bytes - earlier.htod_bytes,
            dtoh_transfers: self.dtoh_transfers - earlier.dtoh_transfers,
            dtoh_bytes: self.dtoh_bytes - earlier.dtoh_bytes,
            dtod_transfers: self.dtod_transfers - earlier.dtod_transfers,
            dtod_bytes: self.dtod_bytes - earlier.dtod_bytes,
            staged_bytes: self.staged_bytes - earlier.staged_bytes,
            synchronizations: self.synchronizations - earlier.synchronizations,
            fences_before_free: self.fences_before_free - earlier.fences_before_free,
            kernel_launches: self.kernel_launches - earlier.kernel_launches,
            graph_launches: self.graph_launches - earlier.graph_launches,
            failed_allocations: self.failed_allocations - earlier.failed_allocations,
            alloc_retries: self.alloc_retries - earlier.alloc_retries,
            ..*self
        }
    }
}
