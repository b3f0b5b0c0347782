//! The pool's books: what its blocks are for ([`Usage`]), the counters it keeps and the
//! [`PoolStats`] snapshot read from them.
//!
//! Invariant: every block or reservation handed out is counted once as live and, when it
//! comes back, once as freed, with the same bytes and usage, either in the tally of the
//! thread that does it (`local`) or, for a thread without one, here; a thread that exits
//! folds its tally in here. The figures read are the sum of both ([`Figures`]), taken under
//! the registry's lock, so they are exact whenever no allocation or free is in flight. No
//! atomic here is a lock or an invariant of the limit (that is the budget's job): all are
//! relaxed tallies. The peak of live bytes is kept from what threads publish: exact for
//! one thread, within 4 MiB per other thread (`local`).

use crate::error::Holders;
use crate::sync::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};

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
    #[inline(always)]
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The usage of index `i` (`i & 3`).
    #[inline(always)]
    pub(super) fn from_index(i: usize) -> Usage {
        match i & 3 {
            0 => Usage::Tensor,
            1 => Usage::Workspace,
            2 => Usage::Mirror,
            _ => Usage::Other,
        }
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
    /// Bytes of freed blocks kept for reuse (in the shared classes and the threads' caches).
    pub cached_bytes: usize,
    /// The part of `cached_bytes` kept in threads' own caches.
    pub thread_cached_bytes: usize,
    /// `live_bytes + cached_bytes`: what counts against the limit.
    pub used_bytes: usize,
    /// Highest `used_bytes` since creation or [`Pool::reset_peak`].
    ///
    /// [`Pool::reset_peak`]: crate::Pool::reset_peak
    pub peak_used_bytes: usize,
    /// The off-heap limit (`max_bytes`), `None` when unlimited; `Some(0)` for the global
    /// pool while a variable it reads holds garbage (every allocation then fails with
    /// [`AllocError::Config`](crate::AllocError::Config), so it serves nothing).
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
    /// Requests that met a limit, relieved the pressure (deferred frees, cached blocks)
    /// and tried once more (this pool's part of PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
}

/// Counts summed from the books and the threads' tallies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Figures {
    pub(super) allocated: u64,
    pub(super) freed: u64,
    pub(super) allocations: u64,
    pub(super) deallocations: u64,
    pub(super) cache_hits: u64,
    /// Live bytes per usage (a part may be negative: a thread that frees what another
    /// allocated).
    pub(super) usage: [isize; 4],
    /// Bytes in the shared classes.
    pub(super) cached: usize,
    /// Bytes in threads' caches.
    pub(super) thread_cached: usize,
    /// The most the live bytes can be: the pool's used bytes less those cached
    /// ([`Figures::bound`]); `usize::MAX` until bounded.
    pub(super) room: usize,
}

impl Default for Figures {
    fn default() -> Figures {
        Figures {
            allocated: 0,
            freed: 0,
            allocations: 0,
            deallocations: 0,
            cache_hits: 0,
            usage: [0; 4],
            cached: 0,
            thread_cached: 0,
            room: usize::MAX,
        }
    }
}

impl Figures {
    pub(super) fn add(&mut self, other: &Figures) {
        self.allocated = self.allocated.wrapping_add(other.allocated);
        self.freed = self.freed.wrapping_add(other.freed);
        self.allocations = self.allocations.wrapping_add(other.allocations);
        self.deallocations = self.deallocations.wrapping_add(other.deallocations);
        self.cache_hits = self.cache_hits.wrapping_add(other.cache_hits);
        for (mine, theirs) in self.usage.iter_mut().zip(other.usage) {
            *mine = mine.wrapping_add(theirs);
        }
        self.cached += other.cached;
        self.thread_cached += other.thread_cached;
    }

    /// Bounds the live bytes by what the budget says: `used` (read after the sum) less the
    /// cached bytes summed. A thread's counts are read one after the other while it
    /// allocates and frees, its frees first: every allocation and free it completes
    /// between those reads counts its block live although it is not (a reader preempted
    /// there saw 150 MB live of a pool holding one 4 KiB block). Live plus cached bytes
    /// are the used bytes whenever nothing is in flight, and a block a thread cycles
    /// through its own cache never changes the used bytes, so the bound is exact at rest
    /// and cuts the phantom bytes off while threads run.
    /// The cached bytes are bounded by `used` too: blocks given back to the OS (a `trim`)
    /// between the sum and the read of `used` leave the pool's books before the figure.
    pub(super) fn bound(&mut self, used: usize) {
        let over = (self.cached + self.thread_cached).saturating_sub(used);
        let shared = over.min(self.cached);
        self.cached -= shared;
        self.thread_cached -= over - shared;
        self.room = used - (self.cached + self.thread_cached);
    }

    /// Live bytes (0 while a free is counted before the allocation it frees), at most the
    /// [`Figures::bound`].
    pub(super) fn live(&self) -> usize {
        (self.allocated.saturating_sub(self.freed) as usize).min(self.room)
    }

    /// Live bytes of `usage`: at most the live bytes.
    fn usage(&self, usage: Usage) -> usize {
        (self.usage[usage.index()].max(0) as usize).min(self.live())
    }

    /// Who holds the pool's bytes, for an out-of-memory message.
    pub(super) fn holders(&self) -> Holders {
        Holders {
            workspaces: self.usage(Usage::Workspace),
            tensors: self.usage(Usage::Tensor),
            mirrors: self.usage(Usage::Mirror),
            other: self.usage(Usage::Other),
            cached: self.cached + self.thread_cached,
        }
    }
}

/// The pool's shared counters (the budget and the limits aside): the operations of
/// threads without a tally of their own, the tallies of threads that exited, the shared
/// classes' bytes, the OS calls and refusals, and the peak.
#[derive(Debug)]
pub(super) struct Books {
    allocated: AtomicU64,
    freed: AtomicU64,
    by_usage: [AtomicIsize; 4],
    allocations: AtomicU64,
    deallocations: AtomicU64,
    cache_hits: AtomicU64,
    /// Bytes of freed blocks in the shared classes (raised before a block enters a slot,
    /// lowered after one leaves, so it never wraps).
    cached: AtomicUsize,
    os_allocations: AtomicU64,
    os_frees: AtomicU64,
    failed: AtomicU64,
    retries: AtomicU64,
    /// The sum of the live bytes published so far (by threads, in batches).
    published: AtomicIsize,
    /// The highest `published` (or exact live figure read) since the last reset.
    peak: AtomicUsize,
}

impl Books {
    pub(super) fn new() -> Books {
        Books {
            allocated: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            by_usage: std::array::from_fn(|_| AtomicIsize::new(0)),
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cached: AtomicUsize::new(0),
            os_allocations: AtomicU64::new(0),
            os_frees: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            published: AtomicIsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// A block or reservation of `bytes` was handed out for `usage` by a thread without a
    /// tally of its own (`hit`: from a cache).
    pub(super) fn live(&self, bytes: usize, usage: Usage, hit: bool) {
        self.allocated.fetch_add(bytes as u64, Ordering::Relaxed);
        self.by_usage[usage.index()].fetch_add(bytes as isize, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
        if hit {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        self.publish(bytes as isize, true);
    }

    /// A block or reservation counted live came back to a thread without a tally.
    pub(super) fn freed(&self, bytes: usize, usage: Usage) {
        self.freed.fetch_add(bytes as u64, Ordering::Relaxed);
        self.by_usage[usage.index()].fetch_sub(bytes as isize, Ordering::Relaxed);
        self.deallocations.fetch_add(1, Ordering::Relaxed);
        self.publish(-(bytes as isize), false);
    }

    /// Adds `net` live bytes to the published sum; `rise`: the sum after it is a candidate
    /// for the peak.
    #[inline]
    pub(super) fn publish(&self, net: isize, rise: bool) {
        let after = self
            .published
            .fetch_add(net, Ordering::Relaxed)
            .wrapping_add(net);
        if rise && after > 0 && after as usize > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(after as usize, Ordering::Relaxed);
        }
    }

    /// A thread's tally, folded in when it exits.
    pub(super) fn fold(&self, f: &Figures) {
        self.allocated.fetch_add(f.allocated, Ordering::Relaxed);
        self.freed.fetch_add(f.freed, Ordering::Relaxed);
        self.allocations.fetch_add(f.allocations, Ordering::Relaxed);
        self.deallocations
            .fetch_add(f.deallocations, Ordering::Relaxed);
        self.cache_hits.fetch_add(f.cache_hits, Ordering::Relaxed);
        for (mine, theirs) in self.by_usage.iter().zip(f.usage) {
            mine.fetch_add(theirs, Ordering::Relaxed);
        }
    }

    /// A block of `bytes` is about to be offered to the shared classes.
    #[inline]
    pub(super) fn caching(&self, bytes: usize) {
        self.cached.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A block of `bytes` left the shared classes (or was refused after [`Books::caching`]).
    #[inline]
    pub(super) fn uncached(&self, bytes: usize) {
        self.cached.fetch_sub(bytes, Ordering::Relaxed);
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

    /// Counts a relief at a limit followed by a retry.
    pub(super) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// These books' own counts (the threads' tallies are added by the registry).
    pub(super) fn figures(&self) -> Figures {
        // Freed is read before allocated: a free follows its allocation, so live never
        // reads below what it is for want of an allocation read too early.
        let freed = self.freed.load(Ordering::Relaxed);
        Figures {
            allocated: self.allocated.load(Ordering::Relaxed),
            freed,
            allocations: self.allocations.load(Ordering::Relaxed),
            deallocations: self.deallocations.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            usage: std::array::from_fn(|i| self.by_usage[i].load(Ordering::Relaxed)),
            cached: self.cached.load(Ordering::Relaxed),
            thread_cached: 0,
            room: usize::MAX,
        }
    }

    /// The statistics from `f` (the sum of these books and the threads' tallies); the
    /// budget and limit fields are left at their defaults for the pool to fill in.
    pub(super) fn stats(&self, f: &Figures) -> PoolStats {
        let live = f.live();
        PoolStats {
            live_bytes: live,
            peak_bytes: self.peak.load(Ordering::Relaxed).max(live),
            cached_bytes: f.cached + f.thread_cached,
            thread_cached_bytes: f.thread_cached,
            tensor_bytes: f.usage(Usage::Tensor),
            workspace_bytes: f.usage(Usage::Workspace),
            mirror_bytes: f.usage(Usage::Mirror),
            other_bytes: f.usage(Usage::Other),
            total_allocated_bytes: f.allocated,
            total_freed_bytes: f.freed,
            allocations: f.allocations,
            deallocations: f.deallocations,
            cache_hits: f.cache_hits,
            os_allocations: self.os_allocations.load(Ordering::Relaxed),
            os_frees: self.os_frees.load(Ordering::Relaxed),
            failed_allocations: self.failed.load(Ordering::Relaxed),
            alloc_retries: self.retries.load(Ordering::Relaxed),
            ..PoolStats::default()
        }
    }

    /// Restarts the live peak from `live`, the exact live bytes now.
    pub(super) fn reset_peak(&self, live: usize) {
        self.peak.store(live, Ordering::Relaxed);
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
    fn the_books_add_up_by_usage_and_fold_thread_tallies() {
        let books = Books::new();
        books.live(100, Usage::Tensor, false);
        books.live(40, Usage::Workspace, false);
        books.freed(100, Usage::Tensor);
        books.caching(100);
        books.uncached(100);
        books.live(100, Usage::Mirror, true);
        let thread = Figures {
            allocated: 10,
            allocations: 1,
            usage: [10, 0, 0, 0],
            thread_cached: 64,
            ..Figures::default()
        };
        books.fold(&thread);
        let mut f = books.figures();
        assert_eq!(f.cached, 0);
        f.add(&Figures {
            thread_cached: 64,
            ..Figures::default()
        });
        let s = books.stats(&f);
        assert_eq!((s.live_bytes, s.peak_bytes), (150, 150));
        assert_eq!(
            (
                s.tensor_bytes,
                s.workspace_bytes,
                s.mirror_bytes,
                s.other_bytes
            ),
            (10, 40, 100, 0)
        );
        assert_eq!((s.total_allocated_bytes, s.total_freed_bytes), (250, 100));
        assert_eq!((s.allocations, s.deallocations, s.cache_hits), (4, 1, 1));
        assert_eq!((s.cached_bytes, s.thread_cached_bytes), (64, 64));
        let h = f.holders();
        assert_eq!(
            (h.tensors, h.workspaces, h.mirrors, h.cached),
            (10, 40, 100, 64)
        );
        books.freed(100, Usage::Mirror);
        books.reset_peak(50);
        assert_eq!(books.stats(&books.figures()).peak_bytes, 50);
    }
}
