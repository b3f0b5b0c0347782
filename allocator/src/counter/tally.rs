//! Per-thread batched accounting against a shared [`Budget`]: the lock-free core of the
//! tracking allocator, free of `GlobalAlloc`, thread-locals and libc so that loom runs the
//! same code (`loom-tests/tests/tracking.rs`).
//!
//! **Where a budget byte is.** Every byte reserved in a [`Ledger`]'s budget is, at each
//! instant, in exactly one of these places:
//! 1. a thread's *cell* ([`Tally`], plain `Cell`s): spent and refilled by that thread alone,
//!    with no atomic operation, which is what keeps the allocator's hot path cheap;
//! 2. a thread's *reserve* (a slot of [`Reserves`], one atomic word): its thread takes from
//!    it by compare-and-swap when its cell runs dry and puts its excess back there, and a
//!    thread refused by the budget *recalls* every reserve with a swap to zero;
//! 3. on a live block (spent), or in the hands of one of the moves above.
//!
//! A byte leaves a reserve only through an atomic read-modify-write of that reserve, and
//! the budget's headroom only through its compare-and-swap, so no byte is ever counted
//! twice and the limit stays exact under any interleaving.
//!
//! **What a refused allocation cannot recall** is the other threads' cells, which only their
//! owners may touch. A cell is kept small: a thread refills it to its *target*
//! `min(64 KiB, headroom / (256 x threads))` and gives back what passes twice that, so a
//! thread's cell holds at most `2 x target` as of its last refill (1/128 of the headroom
//! over all threads when they refilled at the same headroom; 128 KiB a thread at most).
//! The bulk of a thread's batch, `min(1 MiB, headroom / (4 x threads))`, sits in its
//! reserve, where it can be recalled.
//!
//! **Publication.** A thread's unpublished net bytes are `base - budget`: an allocation
//! takes from the cell what it adds to the net, a free the reverse, so `base` only moves
//! when budget enters or leaves the cell (refills, spills) or the net is published, and
//! the hot path keeps the cell alone. The high-water mark of the net is `base - low`, with
//! `low` the cell's lowest value since the last publication. Invariant: the unpublished
//! frees never exceed the cell (`-net <= budget`), so the published live figure never
//! exceeds the reserved total; budget leaves a cell only after the net it would cover is
//! published.
//!
//! The hot paths test the cell and two countdowns, nothing else: an allocation takes the
//! cold path when the cell runs dry, a free when the cell passes twice its target, and
//! either after 4096 operations of its kind (a full publication). The high-water mark is
//! kept by the frees: the cell only falls between two of them, so its lowest value since
//! a publication is its value just before one of them (or now), and a free notes it
//! (`low`) before it gives its bytes back; the allocation path does not touch it. Because
//! the cell holds at most `2 x target <= 128 KiB`, the net cannot move by more than that
//! between cold paths, which is where the net's own bounds (publish at 4 MiB, or at 256
//! KiB after 64 operations) are checked. The freed bytes are not counted on the hot path at all:
//! between publications they are `allocated - published net`.

use std::cell::Cell;
use std::fmt;

use crate::counter::{Budget, Counter};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Operations of each kind (allocations, frees, reallocations) after which a thread
/// publishes its whole tally.
const FLUSH_OPS: u32 = 4096;
/// Unpublished net bytes at which a thread publishes its live bytes at once.
const FLUSH_NET: usize = 4 << 20;
/// Unpublished net bytes at which a thread publishes its live bytes once
/// [`FLUSH_NET_OPS`] operations have passed since it last did.
const FLUSH_NET_SOON: usize = 256 << 10;
/// See [`FLUSH_NET_SOON`]: a thread that allocates and frees large blocks in a loop
/// publishes once per this many operations instead of at every one.
const FLUSH_NET_OPS: u32 = 64;
/// Largest batch a thread keeps in its reserve.
const MAX_BATCH: usize = 1 << 20;
/// Largest cell target (a thread's cell holds at most twice its target).
const MAX_CELL: usize = 64 << 10;
/// The cell target is at most `headroom / (CELL_SHARE x threads)`.
const CELL_SHARE: usize = 256;
/// Rounds of recall a refused reservation makes while recalls still find budget.
const RECALL_ROUNDS: usize = 4;

const NO_SLOT: usize = usize::MAX;
const NEW: u8 = 0;
const REGISTERED: u8 = 1;
const EXITED: u8 = 2;

/// One thread's reserve, alone on its cache line: its owner's compare-and-swaps do not
/// disturb the other threads'.
#[repr(align(64))]
struct Slot {
    reserve: AtomicUsize,
    owned: AtomicBool,
}

impl Slot {
    #[cfg(not(ndmem_loom))]
    const fn new() -> Slot {
        Slot {
            reserve: AtomicUsize::new(0),
            owned: AtomicBool::new(false),
        }
    }

    #[cfg(ndmem_loom)]
    fn new() -> Slot {
        Slot {
            reserve: AtomicUsize::new(0),
            owned: AtomicBool::new(false),
        }
    }
}

/// A fixed registry of `N` per-thread reserves of budget (no allocation: it lives in a
/// `static`). A thread claims a slot when it registers and frees it when it exits; threads
/// beyond `N` keep no reserve and reserve from the budget directly.
pub struct Reserves<const N: usize> {
    slots: [Slot; N],
    /// Slots ever claimed: a recall looks no further.
    used: AtomicUsize,
}

impl<const N: usize> Reserves<N> {
    /// `N` free, empty slots.
    #[cfg(not(ndmem_loom))]
    pub const fn new() -> Self {
        Reserves {
            slots: [const { Slot::new() }; N],
            used: AtomicUsize::new(0),
        }
    }

    /// `N` free, empty slots.
    #[cfg(ndmem_loom)]
    pub fn new() -> Self {
        Reserves {
            slots: std::array::from_fn(|_| Slot::new()),
            used: AtomicUsize::new(0),
        }
    }

    /// Claims a free slot, `None` when all are taken.
    pub fn claim(&self) -> Option<usize> {
        for (i, slot) in self.slots.iter().enumerate() {
            if !slot.owned.load(Ordering::Relaxed)
                && slot
                    .owned
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.used.fetch_max(i + 1, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Takes up to `want` bytes from reserve `slot`; returns what it took.
    #[inline]
    pub fn take(&self, slot: usize, want: usize) -> usize {
        let reserve = &self.slots[slot].reserve;
        let mut have = reserve.load(Ordering::Relaxed);
        loop {
            if have == 0 || want == 0 {
                return 0;
            }
            let took = have.min(want);
            match reserve.compare_exchange_weak(
                have,
                have - took,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return took,
                Err(now) => have = now,
            }
        }
    }

    /// Adds `bytes` (already reserved in the budget) to reserve `slot`.
    #[inline]
    pub fn put(&self, slot: usize, bytes: usize) {
        self.slots[slot].reserve.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Bytes in reserve `slot` now.
    pub fn held(&self, slot: usize) -> usize {
        self.slots[slot].reserve.load(Ordering::Relaxed)
    }

    /// Bytes in all reserves now (a sum of moments).
    pub fn total(&self) -> usize {
        let used = self.used.load(Ordering::Acquire).min(N);
        self.slots[..used]
            .iter()
            .map(|s| s.reserve.load(Ordering::Relaxed))
            .sum()
    }

    /// Empties every reserve into `budget`; returns the bytes recalled.
    pub fn recall(&self, budget: &Budget) -> usize {
        let used = self.used.load(Ordering::Acquire).min(N);
        let mut recalled = 0;
        for slot in &self.slots[..used] {
            if slot.reserve.load(Ordering::Relaxed) != 0 {
                let got = slot.reserve.swap(0, Ordering::AcqRel);
                if got != 0 {
                    budget.release(got);
                    recalled += got;
                }
            }
        }
        recalled
    }

    /// Empties reserve `slot` into `budget` and frees the slot for another thread.
    pub fn give_up(&self, slot: usize, budget: &Budget) {
        let got = self.slots[slot].reserve.swap(0, Ordering::AcqRel);
        if got != 0 {
            budget.release(got);
        }
        self.slots[slot].owned.store(false, Ordering::Release);
    }
}

impl<const N: usize> Default for Reserves<N> {
    fn default() -> Self {
        Reserves::new()
    }
}

/// The shared half of the accounting: the budget, the live counter (value, peak, bytes
/// ever allocated), the reserves and the published counts, for threads that each keep a
/// [`Tally`].
pub struct Ledger<const N: usize> {
    budget: Budget,
    live: Counter,
    reserves: Reserves<N>,
    freed: AtomicU64,
    allocations: AtomicU64,
    deallocations: AtomicU64,
    reallocations: AtomicU64,
    threads: AtomicUsize,
}

/// The published counts of a [`Ledger`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes ever freed (a reallocation counts its old size).
    pub freed_bytes: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Frees.
    pub deallocations: u64,
    /// Reallocations served.
    pub reallocations: u64,
}

impl<const N: usize> Ledger<N> {
    /// Nothing reserved or counted; `limit` as in [`Budget::new`].
    #[cfg(not(ndmem_loom))]
    pub const fn new(limit: Option<usize>) -> Self {
        Ledger {
            budget: Budget::new(limit),
            live: Counter::new(),
            reserves: Reserves::new(),
            freed: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            reallocations: AtomicU64::new(0),
            threads: AtomicUsize::new(0),
        }
    }

    /// Nothing reserved or counted; `limit` as in [`Budget::new`].
    #[cfg(ndmem_loom)]
    pub fn new(limit: Option<usize>) -> Self {
        Ledger {
            budget: Budget::new(limit),
            live: Counter::new(),
            reserves: Reserves::new(),
            freed: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            reallocations: AtomicU64::new(0),
            threads: AtomicUsize::new(0),
        }
    }

    /// The budget: reserved = live bytes + cells + reserves.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Live bytes as published, their peak, and the bytes ever allocated.
    pub fn live(&self) -> &Counter {
        &self.live
    }

    /// The reserves.
    pub fn reserves(&self) -> &Reserves<N> {
        &self.reserves
    }

    /// Threads registered and not yet retired.
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Relaxed)
    }

    /// The published counts.
    pub fn counts(&self) -> Counts {
        Counts {
            freed_bytes: self.freed.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            deallocations: self.deallocations.load(Ordering::Relaxed),
            reallocations: self.reallocations.load(Ordering::Relaxed),
        }
    }

    /// Reserves `bytes` from the budget, recalling the reserves if it is refused, as long
    /// as recalling finds budget (a few rounds at most).
    pub fn reserve_or_recall(&self, bytes: usize) -> bool {
        if self.budget.try_reserve(bytes).is_ok() {
            return true;
        }
        for _ in 0..RECALL_ROUNDS {
            let recalled = self.reserves.recall(&self.budget);
            if self.budget.try_reserve(bytes).is_ok() {
                return true;
            }
            if recalled == 0 {
                break;
            }
        }
        false
    }
}

/// One thread's share of a [`Ledger`]: its cell of budget and its unpublished statistics
/// (see the module documentation). Plain `Cell`s, no destructor, `const` to build: it can
/// be a `const` thread-local.
///
/// Protocol, per operation: an allocation calls [`Tally::try_alloc`], which does all of its
/// accounting before memory is obtained (so that nothing is left to do after the inner
/// allocator returns, unless it refuses: then [`Tally::unalloc`]). When that fails, the
/// allocation calls [`Tally::try_take`] (or, when that fails, [`Tally::take_slow`]) before
/// memory is obtained, then [`Tally::allocated`] or [`Tally::alloc_failed`]; a free calls
/// [`Tally::freed`]; a reallocation takes its growth with `try_take`/`take_slow` and ends
/// with [`Tally::reallocated`] or [`Tally::alloc_failed`]. Whenever one of the inline calls
/// returns `false`, the caller calls [`Tally::settle`] once the inner allocator is done.
pub struct Tally {
    /// Unspent budget in the cell (never negative).
    budget: Cell<isize>,
    /// The fast free path needs `budget + size <= ceiling` (twice the target).
    ceiling: Cell<isize>,
    /// `budget + unpublished net bytes`.
    base: Cell<isize>,
    /// Lowest `budget` since the live figure was published, as of the last time the cell
    /// rose (a free, a shrink) or the figure was published: the lowest value is
    /// `min(low, budget)`.
    low: Cell<isize>,
    /// The size and alignment of the last allocation [`Tally::try_alloc`] counted, for
    /// [`Tally::unalloc`] (kept here so that nothing stays in registers across the inner
    /// allocator's call).
    last: Cell<(usize, usize)>,
    /// Bytes allocated since the last full publication.
    allocated: Cell<u64>,
    /// Net bytes published to the live figure since the last full publication.
    published: Cell<i64>,
    allocs_left: Cell<u32>,
    frees_left: Cell<u32>,
    reallocs: Cell<u32>,
    /// Non-zero while a slow reservation has set `allocs_left` to 1 so that the operation
    /// ends in [`Tally::settle`]: the count it replaced.
    saved_allocs_left: Cell<u32>,
    /// `ops()` when the live figure was last published.
    live_ops: Cell<u32>,
    /// The cell target.
    target: Cell<isize>,
    slot: Cell<usize>,
    state: Cell<u8>,
    /// The live figure's [`Counter::resets`] when the high-water mark (`low`) restarted.
    epoch: Cell<u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
}

impl Tally {
    /// A thread that has not registered yet: every operation takes the cold path, which
    /// registers it.
    pub const fn new() -> Tally {
        Tally {
            budget: Cell::new(0),
            ceiling: Cell::new(0),
            base: Cell::new(0),
            low: Cell::new(0),
            last: Cell::new((0, 0)),
            allocated: Cell::new(0),
            published: Cell::new(0),
            allocs_left: Cell::new(FLUSH_OPS),
            frees_left: Cell::new(FLUSH_OPS),
            reallocs: Cell::new(0),
            saved_allocs_left: Cell::new(0),
            live_ops: Cell::new(0),
            target: Cell::new(0),
            slot: Cell::new(NO_SLOT),
            state: Cell::new(NEW),
            epoch: Cell::new(0),
        }
    }

    /// The whole accounting of an allocation of `size` bytes aligned to `align`, done before
    /// the inner allocator is called, if it needs no cold work: the cell covers it and no
    /// publication is due. `false`, with nothing done, otherwise. If the inner allocator
    /// then refuses, call [`Tally::unalloc`].
    #[inline]
    pub fn try_alloc(&self, size: usize, align: usize) -> bool {
        // No overflow: budget >= 0 and size <= isize::MAX (a `Layout`'s bound).
        let budget = self.budget.get() - size as isize;
        let left = self.allocs_left.get();
        if budget < 0 || left <= 1 {
            return false;
        }
        self.budget.set(budget);
        self.allocs_left.set(left - 1);
        self.allocated.set(self.allocated.get() + size as u64);
        self.last.set((size, align));
        true
    }

    /// Takes back the last [`Tally::try_alloc`], which the inner allocator refused; returns
    /// its size and alignment. The caller calls [`Tally::settle`] next.
    #[cold]
    pub fn unalloc(&self) -> (usize, usize) {
        let (size, align) = self.last.get();
        self.budget.set(self.budget.get() + size as isize);
        self.allocs_left.set(self.allocs_left.get() + 1);
        self.allocated.set(self.allocated.get() - size as u64);
        (size, align)
    }

    /// Takes `size` bytes from the cell if that needs no cold work; `false` otherwise (then
    /// call [`Tally::take_slow`]).
    #[inline]
    pub fn try_take(&self, size: usize) -> bool {
        // No overflow: budget >= 0 and size <= isize::MAX (a `Layout`'s bound).
        let budget = self.budget.get() - size as isize;
        if budget < 0 {
            return false;
        }
        self.budget.set(budget);
        true
    }

    /// Counts an allocation of `size` bytes that the inner allocator served; `false` when
    /// the thread must [`settle`](Tally::settle).
    #[inline]
    pub fn allocated(&self, size: usize) -> bool {
        self.allocated.set(self.allocated.get() + size as u64);
        let left = self.allocs_left.get() - 1;
        self.allocs_left.set(left);
        left != 0
    }

    /// Counts a free of `size` bytes and returns them to the cell; `false` when the
    /// thread must [`settle`](Tally::settle) (after the memory is given back).
    #[inline]
    pub fn freed<const N: usize>(&self, ledger: &Ledger<N>, size: usize) -> bool {
        let budget = self.note_low(ledger) + size as isize;
        self.budget.set(budget);
        let left = self.frees_left.get() - 1;
        self.frees_left.set(left);
        budget <= self.ceiling.get() && left != 0
    }

    /// The cold half of [`Tally::try_take`]: registers the thread if it is new (calling
    /// `register`, which may allocate), refills the cell (from the reserve, then the
    /// budget, then by recalling the reserves), and takes `size`. `false` if the budget
    /// truly cannot cover it. Either way the operation must end in
    /// [`Tally::allocated`]/[`Tally::reallocated`] or [`Tally::alloc_failed`], which then
    /// ask for [`Tally::settle`].
    #[cold]
    pub fn take_slow<const N: usize>(
        &self,
        ledger: &Ledger<N>,
        size: usize,
        register: impl FnOnce(),
    ) -> bool {
        self.register(ledger, register);
        let budget = self.budget.get();
        if budget < size as isize && !self.refill(ledger, size - budget as usize) {
            self.rethreshold();
            return false;
        }
        self.budget.set(self.budget.get() - size as isize);
        // End the operation in `settle` (which publishes if the net passed its bound and
        // sets the thresholds again), keeping the count of allocations.
        if self.saved_allocs_left.get() == 0 {
            self.saved_allocs_left.set(self.allocs_left.get());
            self.allocs_left.set(1);
        }
        true
    }

    /// Registers a new thread: counts it, claims a reserve slot, then calls `register`
    /// (which may allocate: the thread is registered by then). Nothing for a thread
    /// that registered or exited before.
    #[inline]
    pub fn register<const N: usize>(&self, ledger: &Ledger<N>, register: impl FnOnce()) {
        if self.state.get() == NEW {
            self.state.set(REGISTERED);
            self.epoch.set(ledger.live.resets());
            ledger.threads.fetch_add(1, Ordering::Relaxed);
            self.slot.set(ledger.reserves.claim().unwrap_or(NO_SLOT));
            register();
        }
    }

    /// Gives back the `size` bytes taken for an allocation the inner allocator refused.
    #[cold]
    pub fn alloc_failed<const N: usize>(&self, ledger: &Ledger<N>, size: usize) {
        self.budget.set(self.budget.get() + size as isize);
        self.settle(ledger);
    }

    /// Counts a reallocation from `old` to `new` bytes that the inner allocator served
    /// (its growth taken before, as for an allocation); gives back a shrink. `false` when
    /// the thread must [`settle`](Tally::settle).
    #[inline]
    pub fn reallocated<const N: usize>(&self, ledger: &Ledger<N>, old: usize, new: usize) -> bool {
        self.allocated.set(self.allocated.get() + new as u64);
        let budget = self.note_low(ledger) + old.saturating_sub(new) as isize;
        self.budget.set(budget);
        let reallocs = self.reallocs.get() + 1;
        self.reallocs.set(reallocs);
        reallocs < FLUSH_OPS && self.saved_allocs_left.get() == 0 && budget <= self.ceiling.get()
    }

    /// The cold end of an operation: publishes what passed its bound, gives back what the
    /// cell holds beyond twice its target, and sets the thresholds again.
    #[cold]
    pub fn settle<const N: usize>(&self, ledger: &Ledger<N>) {
        let saved = self.saved_allocs_left.replace(0);
        if saved != 0 {
            // `allocs_left` was 1; it is 0 if an allocation was counted since.
            self.allocs_left.set(saved - 1 + self.allocs_left.get());
        }
        let registered = self.state.get() == REGISTERED;
        if !registered
            || self.allocs_left.get() == 0
            || self.frees_left.get() == 0
            || self.reallocs.get() >= FLUSH_OPS
        {
            self.flush(ledger);
        } else {
            let net = self.net().unsigned_abs();
            if net >= FLUSH_NET
                || (net >= FLUSH_NET_SOON
                    && self.ops().wrapping_sub(self.live_ops.get()) >= FLUSH_NET_OPS)
            {
                // Only the net bytes passed their bound: publish the live figure alone
                // (one shared read-modify-write). Between FLUSH_NET_SOON and FLUSH_NET it
                // waits FLUSH_NET_OPS operations, so that a thread allocating and freeing
                // 1 MiB blocks in a loop does not write the shared line at every one.
                self.flush_live(ledger);
            }
        }
        let target = if registered { self.target.get() } else { 0 };
        let budget = self.budget.get();
        if budget > 2 * target {
            self.spill(ledger, budget - target);
        }
        self.rethreshold();
    }

    /// Publishes the whole tally (live bytes, peak, counts) to the ledger.
    pub fn flush<const N: usize>(&self, ledger: &Ledger<N>) {
        self.flush_live(ledger);
        let allocated = self.allocated.replace(0);
        let net = self.published.replace(0);
        ledger.live.add_total(allocated);
        // Between full publications, allocated - freed = the net bytes published.
        let freed = (allocated as i64).wrapping_sub(net) as u64;
        add(&ledger.freed, freed);
        add(
            &ledger.allocations,
            u64::from(FLUSH_OPS - self.allocs_left.get()),
        );
        add(
            &ledger.deallocations,
            u64::from(FLUSH_OPS - self.frees_left.get()),
        );
        add(&ledger.reallocations, u64::from(self.reallocs.get()));
        self.allocs_left.set(FLUSH_OPS);
        self.frees_left.set(FLUSH_OPS);
        self.reallocs.set(0);
        self.live_ops.set(0);
        self.rethreshold();
    }

    /// Publishes everything and returns the cell and the reserve to the budget (before a
    /// limit change). The thread stays registered.
    pub fn return_budget<const N: usize>(&self, ledger: &Ledger<N>) {
        self.flush(ledger);
        let budget = self.budget.get();
        self.shift(-budget);
        ledger.budget.release(budget as usize);
        let slot = self.slot.get();
        if slot != NO_SLOT {
            let took = ledger.reserves.take(slot, usize::MAX);
            if took != 0 {
                ledger.budget.release(took);
            }
        }
        self.rethreshold();
    }

    /// The thread is exiting: publishes everything, returns its budget, frees its slot, and
    /// from now on counts and publishes every operation alone.
    pub fn retire<const N: usize>(&self, ledger: &Ledger<N>) {
        self.return_budget(ledger);
        let slot = self.slot.replace(NO_SLOT);
        if slot != NO_SLOT {
            ledger.reserves.give_up(slot, &ledger.budget);
        }
        self.target.set(0);
        if self.state.replace(EXITED) == REGISTERED {
            ledger.threads.fetch_sub(1, Ordering::Relaxed);
        }
        self.rethreshold();
    }

    /// Unspent budget in the cell.
    pub fn cell(&self) -> usize {
        self.budget.get() as usize
    }

    /// Unpublished net bytes.
    fn net(&self) -> isize {
        self.base.get() - self.budget.get()
    }

    /// Operations since the last full publication.
    fn ops(&self) -> u32 {
        let allocs_left = match self.saved_allocs_left.get() {
            0 => self.allocs_left.get(),
            saved => saved,
        };
        (FLUSH_OPS - allocs_left) + (FLUSH_OPS - self.frees_left.get()) + self.reallocs.get()
    }

    /// `(cell target, reserve batch)` for the headroom and thread count of now.
    fn targets<const N: usize>(&self, ledger: &Ledger<N>) -> (usize, usize) {
        if self.state.get() != REGISTERED {
            return (0, 0);
        }
        let threads = ledger.threads.load(Ordering::Relaxed).max(1);
        let available = ledger.budget.available();
        let cell = (available / (CELL_SHARE * threads)).min(MAX_CELL);
        let batch = if self.slot.get() == NO_SLOT {
            0
        } else {
            (available / (4 * threads)).min(MAX_BATCH)
        };
        (cell, batch)
    }

    /// Adds `need` bytes and the cell target to the cell: from the reserve, else from the
    /// budget (with a new batch for the reserve), else the bare `need` after recalling
    /// every reserve. `false` (having given back what it got) when even that is refused.
    fn refill<const N: usize>(&self, ledger: &Ledger<N>, need: usize) -> bool {
        let (target, batch) = self.targets(ledger);
        self.target.set(target as isize);
        let slot = self.slot.get();
        let mut got = 0;
        if slot != NO_SLOT {
            got = ledger.reserves.take(slot, need + target);
        }
        let ok = got >= need || {
            let missing = need - got;
            if ledger.budget.try_reserve(missing + target + batch).is_ok() {
                got += missing + target;
                if batch != 0 {
                    ledger.reserves.put(slot, batch);
                }
                true
            } else if ledger.reserve_or_recall(missing) {
                got += missing;
                true
            } else {
                false
            }
        };
        if ok {
            self.shift(got as isize);
        } else if got != 0 {
            // Refused: what came from the reserve goes back to the budget rather than
            // stay in this cell, out of the other threads' reach.
            ledger.budget.release(got);
        }
        ok
    }

    /// Gives `bytes` of the cell back: to the reserve up to twice the batch, the rest to
    /// the budget. Publishes the live figure first if the unpublished frees need them.
    fn spill<const N: usize>(&self, ledger: &Ledger<N>, bytes: isize) {
        if -self.net() > self.budget.get() - bytes {
            self.flush_live(ledger);
        }
        self.shift(-bytes);
        let (target, batch) = self.targets(ledger);
        self.target.set(target as isize);
        let mut release = bytes as usize;
        let slot = self.slot.get();
        if slot != NO_SLOT {
            let keep = (2 * batch)
                .saturating_sub(ledger.reserves.held(slot))
                .min(release);
            if keep != 0 {
                ledger.reserves.put(slot, keep);
                release -= keep;
            }
        }
        if release != 0 {
            ledger.budget.release(release);
        }
    }

    /// Before the cell rises: notes its level as the low if it is one; returns the level.
    ///
    /// Between two rises the cell only falls (allocations take from it; refills move its
    /// low with it), so its level now is the lowest it reached since the last rise. If the
    /// peak was reset since (the reset count moved), the mark restarts from this level:
    /// the highest the thread's live bytes reached after the reset, exactly, whenever in
    /// that stretch the reset came. So a thread idle at a reset keeps its next excursion,
    /// and a high from before a reset never reaches the new peak.
    #[inline(always)]
    fn note_low<const N: usize>(&self, ledger: &Ledger<N>) -> isize {
        let budget = self.budget.get();
        let resets = ledger.live.resets();
        if resets != self.epoch.get() {
            self.restart_mark(budget, resets);
        } else if budget < self.low.get() {
            self.low.set(budget);
        }
        budget
    }

    /// The mark restarts from `budget` in reset generation `resets`.
    #[cold]
    fn restart_mark(&self, budget: isize, resets: u64) {
        self.epoch.set(resets);
        self.low.set(budget);
    }

    /// Moves `bytes` of budget into (positive) or out of the cell, leaving the net alone.
    fn shift(&self, bytes: isize) {
        self.budget.set(self.budget.get() + bytes);
        self.base.set(self.base.get() + bytes);
        self.low.set(self.low.get() + bytes);
    }

    /// Publishes the net bytes to the live figure, and their high-water mark since the
    /// last publication to the peak (see [`Counter::publish`]).
    fn flush_live<const N: usize>(&self, ledger: &Ledger<N>) {
        let budget = self.budget.get();
        let net = self.base.get() - budget;
        let resets = ledger.live.resets();
        let high = if resets == self.epoch.get() {
            self.base.get() - self.low.get().min(budget)
        } else {
            // The peak was reset since the cell last rose ([`Tally::note_low`] restarts
            // the mark at a rise): the cell has only fallen since, so its level now is
            // the highest after the reset.
            net
        };
        self.base.set(budget);
        self.low.set(budget);
        self.epoch.set(resets);
        self.published.set(self.published.get() + net as i64);
        self.live_ops.set(self.ops());
        // Live bytes never pass the limit (they are reserved first): the peak neither.
        let cap = ledger.budget.limit().unwrap_or(usize::MAX);
        ledger.live.publish_capped(net, high, resets, cap);
    }

    /// The calling thread published (a flush) just before the peak was reset: its mark,
    /// empty since, starts in the new epoch.
    pub fn restart_peak<const N: usize>(&self, ledger: &Ledger<N>) {
        self.epoch.set(ledger.live.resets());
    }

    /// Sets the threshold of the free path: twice the cell target. (The allocation path
    /// goes cold when the cell runs dry.) An unregistered or exited thread holds no
    /// budget, so every allocation and every free takes the cold path.
    fn rethreshold(&self) {
        let ceiling = if self.state.get() == REGISTERED {
            2 * self.target.get()
        } else {
            0
        };
        self.ceiling.set(ceiling);
    }
}

impl<const N: usize> fmt::Debug for Reserves<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserves")
            .field("slots", &N)
            .field("total", &self.total())
            .finish()
    }
}

impl<const N: usize> fmt::Debug for Ledger<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("budget", &self.budget)
            .field("live", &self.live)
            .field("reserves", &self.reserves)
            .field("counts", &self.counts())
            .field("threads", &self.threads())
            .finish()
    }
}

impl fmt::Debug for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tally")
            .field("cell", &self.budget.get())
            .field("target", &self.target.get())
            .field("net", &self.net())
            .field("state", &self.state.get())
            .finish_non_exhaustive()
    }
}

fn add(counter: &AtomicU64, n: u64) {
    if n != 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    /// An allocation as `Tracking::alloc` makes it.
    fn alloc(tally: &Tally, ledger: &Ledger<4>, size: usize) -> bool {
        if tally.try_alloc(size, 8) {
            return true;
        }
        if !tally.try_take(size) && !tally.take_slow(ledger, size, || {}) {
            return false;
        }
        if !tally.allocated(size) {
            tally.settle(ledger);
        }
        true
    }

    fn free(tally: &Tally, ledger: &Ledger<4>, size: usize) {
        if !tally.freed(ledger, size) {
            tally.settle(ledger);
        }
    }

    #[test]
    fn a_refusal_recalls_an_idle_threads_reserve() {
        const LIMIT: usize = 8 << 20;
        let ledger = Ledger::<4>::new(Some(LIMIT));
        let idle = Tally::new();
        assert!(alloc(&idle, &ledger, 100_000));
        free(&idle, &ledger, 100_000);
        assert!(ledger.reserves().total() > 0, "{ledger:?}");
        let stranded = idle.cell();
        assert!(stranded <= 2 * MAX_CELL, "{idle:?}");
        let tally = Tally::new();
        assert!(alloc(&tally, &ledger, LIMIT - stranded), "{ledger:?}");
        assert!(!alloc(&tally, &ledger, 1), "the limit holds");
        assert_eq!(ledger.reserves().total(), 0);
        free(&tally, &ledger, LIMIT - stranded);
        tally.flush(&ledger);
        idle.flush(&ledger);
        let live = ledger.live().read();
        assert_eq!(live.value, 0);
        assert_eq!(live.peak, LIMIT - stranded);
        let counts = ledger.counts();
        assert_eq!((counts.allocations, counts.deallocations), (2, 2));
        assert_eq!(counts.freed_bytes, live.total);
        tally.retire(&ledger);
        idle.retire(&ledger);
        assert_eq!(ledger.budget().used(), 0);
    }

    /// Allocations and frees of mixed sizes, in an order that makes and unmakes
    /// high-water marks between publications: the published peak is the true one, whether
    /// an allocation took the hot path or the cold one (a dry cell, a publication due).
    #[test]
    fn the_peak_of_one_thread_is_exact_whichever_path_counted_it() {
        let ledger = Ledger::<4>::new(None);
        let tally = Tally::new();
        let mut live: Vec<usize> = Vec::new();
        let (mut now, mut peak) = (0usize, 0usize);
        let (mut hot, mut cold) = (0u32, 0u32);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let grow = live.len() < 4 || (seed % 100) < 52;
            if grow {
                let size = 1 + (seed >> 20) as usize % 3000;
                if tally.try_alloc(size, 8) {
                    hot += 1;
                } else {
                    assert!(alloc(&tally, &ledger, size));
                    cold += 1;
                }
                live.push(size);
                now += size;
                peak = peak.max(now);
            } else {
                let size = live.swap_remove((seed >> 32) as usize % live.len());
                free(&tally, &ledger, size);
                now -= size;
            }
            if step % 997 == 0 {
                tally.flush(&ledger);
                let read = ledger.live().read();
                assert_eq!((read.value, read.peak), (now, peak), "step {step}");
            }
        }
        tally.flush(&ledger);
        let read = ledger.live().read();
        assert_eq!((read.value, read.peak), (now, peak));
        assert!(
            hot > 1000 && cold > 10,
            "both paths taken: {hot} hot, {cold} cold"
        );
    }

    /// An allocation the hot path counted and the inner allocator then refused leaves no
    /// trace once taken back: no live byte, no allocation, no peak.
    #[test]
    fn a_hot_allocation_taken_back_leaves_no_trace() {
        let ledger = Ledger::<4>::new(None);
        let tally = Tally::new();
        assert!(alloc(&tally, &ledger, 4096));
        free(&tally, &ledger, 4096);
        tally.flush(&ledger);
        let before = (ledger.live().read(), ledger.counts());
        // 5000 bytes, a new high-water mark, taken back: the peak stays 4096.
        assert!(tally.try_alloc(5000, 32), "the cell covers 5000 bytes");
        assert_eq!(tally.unalloc(), (5000, 32));
        tally.settle(&ledger);
        // A free after it does not see the taken-back bytes as a low of the cell.
        assert!(alloc(&tally, &ledger, 64));
        free(&tally, &ledger, 64);
        tally.flush(&ledger);
        let (live, counts) = (ledger.live().read(), ledger.counts());
        assert_eq!((live.value, live.peak), (before.0.value, before.0.peak));
        assert_eq!(live.total, before.0.total + 64);
        assert_eq!(counts.allocations, before.1.allocations + 1);
        assert_eq!(counts.deallocations, before.1.deallocations + 1);
    }

    #[test]
    fn pairs_stay_in_the_cell_and_the_figures_stay_exact() {
        let ledger = Ledger::<4>::new(None);
        let tally = Tally::new();
        assert!(alloc(&tally, &ledger, 1000));
        let used = ledger.budget().used();
        for _ in 0..10_000 {
            assert!(alloc(&tally, &ledger, 64));
            free(&tally, &ledger, 64);
        }
        assert_eq!(ledger.budget().used(), used, "no refill, no spill");
        // Published every 4096 allocations or frees, without the thread's own flush.
        let lag = 10_001 - ledger.counts().allocations;
        assert!(lag > 0 && lag <= u64::from(FLUSH_OPS), "{lag}");
        free(&tally, &ledger, 1000);
        tally.flush(&ledger);
        let counts = ledger.counts();
        assert_eq!((counts.allocations, counts.deallocations), (10_001, 10_001));
        let live = ledger.live().read();
        assert_eq!((live.value, live.peak), (0, 1064));
        assert_eq!(live.total, 1000 + 64 * 10_000);
        assert_eq!(counts.freed_bytes, live.total);
    }
}
