//! The pool's books: what its blocks are for ([`Usage`]), the counters it keeps and the
//! [`PoolStats`] snapshot read from them.
//!
//! Invariant: every block or reservation handed out is counted once by [`Books::live`]
//! and, when it comes back, taken off once by [`Books::freed`], with the same bytes and
//! usage; so the live figure is the sum of the per-usage figures whenever no allocation or
//! free is in flight. Bytes freed are not counted but derived (`total - live`), which saves
//! a shared write per free. No atomic here is a lock or an invariant of the limit (that is
//! the budget's job): all are relaxed tallies.

use crate::counter::Counter;
use crate::error::Holders;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// What a block is for; the out-of-memory message breaks the used bytes down by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Usage {
    /// Tensor data outside workspaces.
    Tensor,
    /// Workspace buffers and their spills.
    Workspace,
    /// Host mirrors of device buffers.
    Mirror,
    /// Anything else.
    Other,
}

impl Usage {
    fn index(self) -> usize {
        self as usize
    }
}

/// Pool statistics (semantics §1). Bytes are block capacities: what the pool really holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolStats {
    /// Bytes of blocks handed out and not yet freed (including [`Reservation`]s).
    ///
    /// [`Reservation`]: crate::Reservation
    pub live_bytes: usize,
    /// Highest `live_bytes` since creation or [`Pool::reset_peak`].
    ///
    /// [`Pool::reset_peak`]: crate::Pool::reset_peak
    pub peak_bytes: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached_bytes: usize,
    /// `live_bytes + cached_bytes`: what counts against the limit.
    pub used_bytes: usize,
    /// Highest `used_bytes` since creation or [`Pool::reset_peak`].
    ///
    /// [`Pool::reset_peak`]: crate::Pool::reset_peak
    pub peak_used_bytes: usize,
    /// The off-heap limit (`max_bytes`), `None` when unlimited.
    pub limit_bytes: Option<usize>,
    /// Resident set size of the process now.
    pub physical_bytes: usize,
    /// The physical limit, `None` when unlimited.
    pub physical_limit_bytes: Option<usize>,
    /// Live bytes for tensors.
    pub tensor_bytes: usize,
    /// Live bytes for workspaces.
    pub workspace_bytes: usize,
    /// Live bytes for host mirrors.
    pub mirror_bytes: usize,
    /// Live bytes for other uses.
    pub other_bytes: usize,
    /// Bytes ever handed out (block capacities and [`Reservation`]s).
    ///
    /// [`Reservation`]: crate::Reservation
    pub total_allocated_bytes: u64,
    /// Bytes ever given back; `total_allocated_bytes - total_freed_bytes` is `live_bytes`
    /// whenever no allocation or free is in flight.
    pub total_freed_bytes: u64,
    /// Blocks (and [`Reservation`]s) handed out.
    ///
    /// [`Reservation`]: crate::Reservation
    pub allocations: u64,
    /// Blocks (and [`Reservation`]s) given back.
    ///
    /// [`Reservation`]: crate::Reservation
    pub deallocations: u64,
    /// Blocks handed out from the cache.
    pub cache_hits: u64,
    /// Times memory was obtained from the OS.
    pub os_allocations: u64,
    /// Times memory was returned to the OS.
    pub os_frees: u64,
    /// Requests refused at a limit.
    pub failed_allocations: u64,
}

/// The pool's counters (the budget and the limits aside).
#[derive(Debug)]
pub(super) struct Books {
    /// Live bytes: their peak, and the bytes ever handed out as the total.
    live: Counter,
    /// Bytes of freed blocks in the cache (raised before a block enters a slot, lowered
    /// after one leaves, so it never wraps).
    cached: AtomicUsize,
    by_usage: [AtomicUsize; 4],
    allocations: AtomicU64,
    deallocations: AtomicU64,
    cache_hits: AtomicU64,
    os_allocations: AtomicU64,
    os_frees: AtomicU64,
    failed: AtomicU64,
}

impl Books {
    pub(super) fn new() -> Books {
        Books {
            live: Counter::new(),
            cached: AtomicUsize::new(0),
            by_usage: Default::default(),
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            os_allocations: AtomicU64::new(0),
            os_frees: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// A block or reservation of `bytes` was handed out for `usage`.
    #[inline]
    pub(super) fn live(&self, bytes: usize, usage: Usage) {
        self.live.add(bytes);
        self.by_usage[usage.index()].fetch_add(bytes, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// A block or reservation counted by [`Books::live`] came back.
    #[inline]
    pub(super) fn freed(&self, bytes: usize, usage: Usage) {
        self.live.sub(bytes);
        self.by_usage[usage.index()].fetch_sub(bytes, Ordering::Relaxed);
        self.deallocations.fetch_add(1, Ordering::Relaxed);
    }

    /// A block of `bytes` is about to be offered to the cache.
    #[inline]
    pub(super) fn caching(&self, bytes: usize) {
        self.cached.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A block of `bytes` left the cache (or was refused by it after [`Books::caching`]).
    #[inline]
    pub(super) fn uncached(&self, bytes: usize) {
        self.cached.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// A block of `bytes` left the cache to be handed out again.
    #[inline]
    pub(super) fn cache_hit(&self, bytes: usize) {
        self.uncached(bytes);
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn os_allocation(&self) {
        self.os_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn os_free(&self) {
        self.os_frees.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn failure(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes in the cache now.
    pub(super) fn cached(&self) -> usize {
        self.cached.load(Ordering::Relaxed)
    }

    fn usage(&self, usage: Usage) -> usize {
        self.by_usage[usage.index()].load(Ordering::Relaxed)
    }

    /// Who holds the pool's bytes, for an out-of-memory message.
    pub(super) fn holders(&self) -> Holders {
        Holders {
            workspaces: self.usage(Usage::Workspace),
            tensors: self.usage(Usage::Tensor),
            mirrors: self.usage(Usage::Mirror),
            other: self.usage(Usage::Other),
            cached: self.cached(),
        }
    }

    /// The figures these books keep; the budget and limit fields are left at their
    /// defaults for the pool to fill in.
    pub(super) fn stats(&self) -> PoolStats {
        // The total is read after the value: it only grows, so freed never goes negative.
        let live = self.live.read();
        PoolStats {
            live_bytes: live.value,
            peak_bytes: live.peak,
            cached_bytes: self.cached(),
            tensor_bytes: self.usage(Usage::Tensor),
            workspace_bytes: self.usage(Usage::Workspace),
            mirror_bytes: self.usage(Usage::Mirror),
            other_bytes: self.usage(Usage::Other),
            total_allocated_bytes: live.total,
            // Derived, not counted: one shared write less per free.
            total_freed_bytes: live.total.saturating_sub(live.value as u64),
            allocations: self.allocations.load(Ordering::Relaxed),
            deallocations: self.deallocations.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            os_allocations: self.os_allocations.load(Ordering::Relaxed),
            os_frees: self.os_frees.load(Ordering::Relaxed),
            failed_allocations: self.failed.load(Ordering::Relaxed),
            ..PoolStats::default()
        }
    }

    /// Restarts the live peak from the live bytes now.
    pub(super) fn reset_peak(&self) {
        self.live.reset_peak();
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn usage_indices_match_their_position() {
        let all = [Usage::Tensor, Usage::Workspace, Usage::Mirror, Usage::Other];
        for (i, usage) in all.iter().enumerate() {
            assert_eq!(usage.index(), i);
        }
    }

    #[test]
    fn the_books_add_up_by_usage_and_derive_the_freed_bytes() {
        let books = Books::new();
        books.live(100, Usage::Tensor);
        books.live(40, Usage::Workspace);
        books.freed(100, Usage::Tensor);
        books.caching(100);
        books.cache_hit(100);
        books.live(100, Usage::Mirror);
        let s = books.stats();
        assert_eq!((s.live_bytes, s.peak_bytes), (140, 140));
        assert_eq!(
            (
                s.tensor_bytes,
                s.workspace_bytes,
                s.mirror_bytes,
                s.other_bytes
            ),
            (0, 40, 100, 0)
        );
        assert_eq!((s.total_allocated_bytes, s.total_freed_bytes), (240, 100));
        assert_eq!((s.allocations, s.deallocations, s.cache_hits), (3, 1, 1));
        assert_eq!(s.cached_bytes, 0);
        let h = books.holders();
        assert_eq!(
            (h.tensors, h.workspaces, h.mirrors, h.cached),
            (0, 40, 100, 0)
        );
        books.freed(100, Usage::Mirror);
        books.reset_peak();
        assert_eq!(books.stats().peak_bytes, 40);
    }
}
