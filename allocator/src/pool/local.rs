//! Per-thread caches of freed blocks in front of the shared size classes, and the per-thread
//! tallies the pool's statistics are summed from.
//!
//! A thread keeps, for each pool it allocates from, a [`Slot`]: one free list per size class
//! (the blocks are linked through their first word), the bytes on those lists, and the
//! thread's tally of allocations and frees. A block freed by that thread goes onto its list
//! while the slot holds less than the pool's per-thread bound and the list is shorter than
//! its cap, and the thread's next request of that class takes it back: neither touches a
//! lock or a cache line another thread writes. A list's cap starts at [`START_CAP`] blocks
//! and doubles each time its thread finds the list empty, up to 8 MiB worth
//! ([`list_cap`]): a thread that allocates and frees many blocks of a class keeps them all,
//! while a thread that only frees what another allocates (the consumer of a prefetching
//! loader) keeps a few and passes the rest on through the shared classes instead of
//! hoarding them while the other thread asks the OS.
//! The slots of a pool are listed in its [`Registry`], so that another thread can recall
//! what they hold (at a limit, on a lower limit, on `trim`) and sum their tallies.
//!
//! Invariants:
//! - A block on a slot's lists is owned by that slot alone and stays reserved in the pool's
//!   budget, so `used = live + cached <= max_bytes` holds with thread caches too.
//! - A slot's lists are touched by one thread at a time: its owner, between raising `busy`
//!   and lowering it, if it found `recall` down after raising `busy`; or a recaller (holding
//!   the registry's lock, which the owner never takes while `busy`), between raising
//!   `recall` and lowering it, once it saw `busy` down after raising `recall`. This is
//!   Dekker's handshake: each side stores its flag, then a store-load barrier, then loads
//!   the other's, so at least one side sees the other and stands back (the owner uses the
//!   shared classes for that one request; the recaller waits, the owner's turn being a few
//!   instructions that neither wait nor allocate). The barrier is asymmetric (`os`): the
//!   owner's side is a compiler fence when the recaller's side can make every thread of the
//!   process fence (Linux `membarrier`), so a cache hit costs no read-modify-write at all.
//! - A slot's tally is written by its owner alone (plain loads and stores of atomics, no
//!   read-modify-write) and read by others under the registry's lock. A thread that exits
//!   folds its tally into the pool's books and removes its slot under that same lock, so a
//!   sum taken under the lock counts every operation that is not in flight exactly once.
//! - Lifetimes: a thread's entry for a pool holds an `Arc` of the pool's core, so the core
//!   (registry, budget, shared classes) outlives the slot; a slot is freed only by its owner
//!   thread (at exit, or when it prunes the entries of dropped pools), after it left the
//!   registry under the lock, so a pointer in the registry is always to a live slot. A
//!   dropped pool empties every slot to the OS first (no block can be freed into a slot
//!   afterwards: blocks borrow their pool), and marks itself closed so that threads drop
//!   their entries for it.
//!
//! Under `--cfg ndmem_loom` no thread registers a slot (loom runs its threads on one OS
//! thread, so a `thread_local!` would be shared by them): the models check the shared path.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ptr::{self, NonNull};
#[cfg(not(ndmem_loom))]
use std::sync::Arc;

#[cfg(ndmem_loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(ndmem_loom))]
use std::sync::{Mutex, MutexGuard};

use super::class::NUM_CLASSES;
use super::os::{heavy_barrier, light_barrier};
use super::stats::{Books, Figures};
use super::{Core, Usage};
use crate::sync::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};

/// Unpublished drift of a thread's live bytes after which it publishes them for the peak.
const PEAK_BATCH: isize = 4 << 20;

/// Bytes one class's list may hold (at least two blocks of any class).
const LIST_BYTES: usize = 8 << 20;

/// The cap of a list its thread has not yet found empty.
pub(super) const START_CAP: u32 = 32;

/// The most blocks of `capacity` bytes a thread's list ever keeps: 8 MiB worth, at least 2.
#[inline(always)]
pub(super) fn list_cap(capacity: usize) -> u32 {
    (LIST_BYTES / capacity.max(1)).clamp(2, u32::MAX as usize) as u32
}

/// A slot's lists: the head of each class's list (null when empty), its length and its
/// current cap.
struct Lists {
    heads: [*mut u8; NUM_CLASSES],
    lens: [u32; NUM_CLASSES],
    caps: [u32; NUM_CLASSES],
}

/// One thread's cache and tally for one pool.
pub(super) struct Slot {
    /// 1 while the owner is inside (takes or keeps a block).
    busy: AtomicUsize,
    /// 1 while a recaller wants in or is inside.
    recall: AtomicUsize,
    /// Each class's free list; see the handshake.
    lists: UnsafeCell<Lists>,
    /// Bytes on the lists; written by whoever is inside, read by anyone.
    bytes: AtomicUsize,
    tally: Tally,
    /// The owner's peak bookkeeping; touched by the owner thread alone.
    mark: UnsafeCell<Mark>,
}

/// A thread's counts, written by the thread alone: every figure only grows, except the
/// per-usage nets and `cached`.
struct Tally {
    allocated: AtomicU64,
    freed: AtomicU64,
    allocations: AtomicU64,
    deallocations: AtomicU64,
    cache_hits: AtomicU64,
    usage: [AtomicIsize; 4],
}

/// What the owner last published towards the pool's peak.
#[derive(Default)]
struct Mark {
    /// The thread's live bytes (allocated minus freed by it; negative if it frees what
    /// others allocated).
    level: isize,
    /// `level` when it last published.
    published: isize,
    /// The highest `level` since the last peak reset.
    high: isize,
    /// The pool's peak epoch `high` belongs to.
    epoch: u64,
}

// SAFETY: the lists (raw block pointers, owned by the slot) are touched by one thread at a
// time (the handshake of the module invariant), and `mark` only by the owner thread;
// everything else is atomic.
unsafe impl Send for Slot {}
// SAFETY: as for `Send`: shared access to the non-atomic parts is serialised by the
// handshake (lists) or confined to the owner thread (`mark`).
unsafe impl Sync for Slot {}

/// Adds `n` to a figure only this thread writes: a load and a store, no read-modify-write.
#[inline(always)]
fn bump(figure: &AtomicU64, n: u64) {
    figure.store(
        figure.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

#[inline(always)]
fn shift(figure: &AtomicIsize, n: isize) {
    figure.store(
        figure.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl Slot {
    fn new() -> Slot {
        Slot {
            busy: AtomicUsize::new(0),
            recall: AtomicUsize::new(0),
            lists: UnsafeCell::new(Lists {
                heads: [ptr::null_mut(); NUM_CLASSES],
                lens: [0; NUM_CLASSES],
                caps: [START_CAP; NUM_CLASSES],
            }),
            bytes: AtomicUsize::new(0),
            tally: Tally {
                allocated: AtomicU64::new(0),
                freed: AtomicU64::new(0),
                allocations: AtomicU64::new(0),
                deallocations: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
                usage: std::array::from_fn(|_| AtomicIsize::new(0)),
            },
            mark: UnsafeCell::new(Mark::default()),
        }
    }

    /// Owner: enters the slot, unless a recaller is at it (then it must not touch it).
    #[inline(always)]
    fn enter(&self) -> bool {
        self.busy.store(1, Ordering::Relaxed);
        light_barrier();
        if self.recall.load(Ordering::Acquire) == 0 {
            return true;
        }
        self.busy.store(0, Ordering::Release);
        false
    }

    /// Owner: leaves the slot, publishing its writes to the next recaller.
    #[inline(always)]
    fn leave(&self) {
        self.busy.store(0, Ordering::Release);
    }

    /// Owner: takes a block of `class` (of `capacity` bytes) from the lists, if any.
    #[inline]
    pub(super) fn take(&self, class: usize, capacity: usize) -> Option<NonNull<u8>> {
        if !self.enter() {
            return None; // being recalled: this request goes to the shared classes
        }
        // SAFETY: the owner is inside (the handshake): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        let block = NonNull::new(lists.heads[class]);
        if let Some(block) = block {
            // SAFETY: a listed block is a live allocation of at least 64 bytes, aligned to
            // 16, owned by this slot, whose first word holds the next block of the list.
            lists.heads[class] = unsafe { block.as_ptr().cast::<*mut u8>().read() };
            lists.lens[class] -= 1;
            let bytes = self.bytes.load(Ordering::Relaxed);
            self.bytes.store(bytes - capacity, Ordering::Relaxed);
        } else {
            // This thread allocates the class faster than it frees it: let it keep more.
            lists.caps[class] = lists.caps[class].saturating_mul(2).min(list_cap(capacity));
        }
        self.leave();
        block
    }

    /// Owner: keeps `block` (of `class`, `capacity` bytes, owned by the caller) on the lists
    /// if the slot stays within `bound` bytes and the list under its cap; `false` leaves
    /// it with the caller.
    #[inline]
    pub(super) fn keep(
        &self,
        class: usize,
        block: NonNull<u8>,
        capacity: usize,
        bound: usize,
    ) -> bool {
        if self.bytes.load(Ordering::Relaxed) + capacity > bound || !self.enter() {
            return false;
        }
        // SAFETY: the owner is inside (the handshake): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        if lists.lens[class] >= lists.caps[class].min(list_cap(capacity)) {
            self.leave();
            return false;
        }
        // SAFETY: the caller owns `block`, a pool block of at least 64 bytes aligned to 16:
        // its first word is ours to overwrite with the link.
        unsafe { block.as_ptr().cast::<*mut u8>().write(lists.heads[class]) };
        lists.heads[class] = block.as_ptr();
        lists.lens[class] += 1;
        // Read again: a recall may have emptied the slot since the bound was checked.
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.bytes.store(bytes + capacity, Ordering::Relaxed);
        self.leave();
        true
    }

    /// Recaller, holding the registry's lock: the first half of the handshake. The
    /// barrier (one for any number of slots) comes between this and [`Slot::drain`].
    fn want(&self) {
        self.recall.store(1, Ordering::Relaxed);
    }

    /// Recaller, holding the registry's lock, after [`Slot::want`] and a heavy barrier (or
    /// the owner itself, at exit): empties the lists, waiting out the owner if it is
    /// inside, and calls `each(block, class)` for every block, which then belongs to the
    /// caller. Returns the bytes the lists held.
    fn drain(&self, mut each: impl FnMut(NonNull<u8>, usize)) -> usize {
        while self.busy.load(Ordering::Acquire) != 0 {
            // The owner's turn is a few instructions that neither wait nor allocate.
            std::thread::yield_now();
        }
        // SAFETY: the recaller is inside (the handshake): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        lists.lens = [0; NUM_CLASSES];
        for (class, head) in lists.heads.iter_mut().enumerate() {
            let mut next = std::mem::replace(head, ptr::null_mut());
            while let Some(block) = NonNull::new(next) {
                // SAFETY: a listed block holds the next block of its list in its first word;
                // it is read before the block is handed to `each`.
                next = unsafe { block.as_ptr().cast::<*mut u8>().read() };
                each(block, class);
            }
        }
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        self.recall.store(0, Ordering::Release);
        bytes
    }

    /// Owner: a block or reservation of `bytes` was handed out for `usage` (`hit`: from a
    /// cache). Publishes towards the peak when the thread's live bytes reach a new high or
    /// drift a batch from what it last published.
    #[inline]
    pub(super) fn live(&self, books: &Books, epoch: u64, bytes: usize, usage: Usage, hit: bool) {
        let t = &self.tally;
        bump(&t.allocated, bytes as u64);
        bump(&t.allocations, 1);
        if hit {
            bump(&t.cache_hits, 1);
        }
        shift(&t.usage[usage.index()], bytes as isize);
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        if m.epoch != epoch {
            // The peak was reset: rises from here on count again.
            m.epoch = epoch;
            m.high = m.level;
        }
        m.level += bytes as isize;
        if m.level > m.high || m.level - m.published > PEAK_BATCH {
            m.high = m.high.max(m.level);
            books.publish(m.level - m.published, true);
            m.published = m.level;
        }
    }

    /// Owner: a block or reservation of `bytes` for `usage` came back.
    #[inline]
    pub(super) fn freed(&self, books: &Books, bytes: usize, usage: Usage) {
        let t = &self.tally;
        bump(&t.freed, bytes as u64);
        bump(&t.deallocations, 1);
        shift(&t.usage[usage.index()], -(bytes as isize));
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        m.level -= bytes as isize;
        if m.published - m.level > PEAK_BATCH {
            books.publish(m.level - m.published, false);
            m.published = m.level;
        }
    }

    /// The slot's figures (exact for every operation of its owner that is not in flight).
    fn figures(&self) -> Figures {
        let t = &self.tally;
        Figures {
            allocated: t.allocated.load(Ordering::Relaxed),
            freed: t.freed.load(Ordering::Relaxed),
            allocations: t.allocations.load(Ordering::Relaxed),
            deallocations: t.deallocations.load(Ordering::Relaxed),
            cache_hits: t.cache_hits.load(Ordering::Relaxed),
            usage: std::array::from_fn(|i| t.usage[i].load(Ordering::Relaxed)),
            cached: 0,
            thread_cached: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// A slot's address in a registry (valid while it is listed there: see the invariant).
struct Listed(NonNull<Slot>);

// SAFETY: a listed slot is `Sync` and stays alive while listed; the pointer is only
// dereferenced under the registry's lock.
unsafe impl Send for Listed {}

/// A pool's list of thread slots, its per-thread bound and its peak epoch.
pub(super) struct Registry {
    slots: Mutex<Vec<Listed>>,
    /// 1 once the pool is dropped: threads drop their entries for it.
    closed: AtomicUsize,
    /// Bytes each thread may keep in its slot.
    bound: AtomicUsize,
    /// Moved by every peak reset, so threads start their highs again.
    epoch: AtomicU64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("bound", &self.bound())
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(super) fn new(bound: usize) -> Registry {
        super::os::prepare_barrier();
        Registry {
            slots: Mutex::new(Vec::new()),
            closed: AtomicUsize::new(0),
            bound: AtomicUsize::new(bound),
            epoch: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Listed>> {
        // Nothing panics while the lock is held; a poisoned list is still whole.
        match self.slots.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    #[inline]
    pub(super) fn bound(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    pub(super) fn set_bound(&self, bound: usize) {
        self.bound.store(bound, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Runs `f` with the lock held, the books' own figures plus every slot's summed into
    /// `figures` first, so that the sum and whatever `f` does see one state of the slots.
    pub(super) fn summed<R>(&self, books: &Books, f: impl FnOnce(Figures) -> R) -> R {
        let slots = self.lock();
        let mut figures = books.figures();
        for listed in slots.iter() {
            // SAFETY: a listed slot is alive while the lock is held.
            figures.add(&unsafe { listed.0.as_ref() }.figures());
        }
        f(figures)
    }

    /// Peak reset: every thread starts its high again from its live bytes now.
    pub(super) fn reset_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// Empties every slot, handing each block (and its class) to `each`; returns the bytes.
    pub(super) fn recall(&self, mut each: impl FnMut(NonNull<u8>, usize)) -> usize {
        let slots = self.lock();
        if slots.is_empty() {
            return 0;
        }
        for listed in slots.iter() {
            // SAFETY: a listed slot is alive while the lock is held.
            unsafe { listed.0.as_ref() }.want();
        }
        heavy_barrier();
        slots
            .iter()
            // SAFETY: as above.
            .map(|listed| unsafe { listed.0.as_ref() }.drain(&mut each))
            .sum()
    }

    /// The pool is being dropped: empties every slot (see [`Registry::recall`]) and marks
    /// the registry closed.
    pub(super) fn close(&self, each: impl FnMut(NonNull<u8>, usize)) {
        self.recall(each);
        self.closed.store(1, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) == 1
    }

    /// The owner thread leaves: under the lock, its blocks go to `each`, its tally into
    /// the books, and the slot off the list. The slot is freed by the caller afterwards.
    fn retire(&self, slot: NonNull<Slot>, books: &Books, each: impl FnMut(NonNull<u8>, usize)) {
        let mut slots = self.lock();
        // SAFETY: the slot is listed, so alive, and the caller is its owner.
        let s = unsafe { slot.as_ref() };
        // The caller is the owner, outside the slot: no barrier is needed to see it out.
        s.want();
        s.drain(each);
        // SAFETY: `mark` belongs to the owner thread, which is the caller.
        let m = unsafe { &*s.mark.get() };
        books.publish(m.level - m.published, false);
        books.fold(&s.figures());
        slots.retain(|listed| listed.0 != slot);
    }
}

/// Runs `f` with this thread's slot for `core`, if it has one.
#[inline]
pub(super) fn with_slot<R>(core: &Core, f: impl FnOnce(&Slot) -> R) -> Option<R> {
    #[cfg(not(ndmem_loom))]
    {
        let slot = CACHES.try_with(|caches| caches.find(core)).ok().flatten()?;
        // SAFETY: a slot found in this thread's entries is alive until this thread removes
        // it, which only `register` (pruning) and the thread's exit do, neither inside `f`
        // (the slot's methods touch no thread-local state).
        Some(f(unsafe { slot.as_ref() }))
    }
    #[cfg(ndmem_loom)]
    {
        let _ = (core, f);
        None
    }
}

/// Gives this thread a slot for `core` (if it has none and the heap can spare one): on
/// failure the thread simply keeps using the shared classes.
#[cfg(not(ndmem_loom))]
pub(super) fn register(core: &Arc<Core>) {
    let _ = CACHES.try_with(|caches| caches.register(core));
}

/// Under loom no thread registers a slot (see the module doc).
#[cfg(ndmem_loom)]
pub(super) fn register<T>(_core: &T) {}

#[cfg(not(ndmem_loom))]
mod thread {
    use std::cell::{Cell, RefCell};

    use super::*;

    /// This thread's slot in one pool, and the pool core it keeps alive.
    pub(super) struct Entry {
        core: Arc<Core>,
        slot: NonNull<Slot>,
    }

    /// This thread's entries, with the last one used in front.
    pub(super) struct Caches {
        last: Cell<(*const Core, *const Slot)>,
        entries: RefCell<Vec<Entry>>,
    }

    std::thread_local! {
        pub(super) static CACHES: Caches = const {
            Caches {
                last: Cell::new((ptr::null(), ptr::null())),
                entries: RefCell::new(Vec::new()),
            }
        };
    }

    impl Caches {
        #[inline]
        pub(super) fn find(&self, core: &Core) -> Option<NonNull<Slot>> {
            let (last_core, last_slot) = self.last.get();
            if ptr::eq(last_core, core) {
                return NonNull::new(last_slot.cast_mut());
            }
            self.find_slow(core)
        }

        #[cold]
        fn find_slow(&self, core: &Core) -> Option<NonNull<Slot>> {
            let entries = self.entries.try_borrow().ok()?;
            let entry = entries.iter().find(|e| ptr::eq(&*e.core, core))?;
            self.last.set((core, entry.slot.as_ptr()));
            Some(entry.slot)
        }

        #[cold]
        pub(super) fn register(&self, core: &Arc<Core>) -> Option<()> {
            if self.find(core).is_some() {
                return Some(());
            }
            let mut entries = self.entries.try_borrow_mut().ok()?;
            // Entries of dropped pools go first (their cores are freed with the last entry).
            if entries.iter().any(|e| e.core.local.is_closed()) {
                self.last.set((ptr::null(), ptr::null()));
                entries.retain(|e| {
                    let closed = e.core.local.is_closed();
                    if closed {
                        e.leave();
                    }
                    !closed
                });
            }
            // Fallible allocations only: the heap may be at its limit.
            entries.try_reserve(1).ok()?;
            let mut one = Vec::new();
            one.try_reserve_exact(1).ok()?;
            one.push(Slot::new());
            let slot = NonNull::from(Box::leak(one.into_boxed_slice())).cast::<Slot>();
            let listed = {
                let mut slots = core.local.lock();
                if slots.try_reserve(1).is_ok() {
                    slots.push(Listed(slot));
                    true
                } else {
                    false
                }
            };
            if !listed {
                // SAFETY: made above from a boxed one-element slice, never shared.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(slot.as_ptr(), 1)) });
                return None;
            }
            entries.push(Entry {
                core: Arc::clone(core),
                slot,
            });
            self.last.set((&**core, slot.as_ptr()));
            Some(())
        }
    }

    impl Entry {
        /// Hands the slot's blocks back to the pool's shared classes, its tally to the
        /// pool's books, and frees the slot.
        fn leave(&self) {
            self.core.retire(self.slot);
            // SAFETY: the slot was made by `register` from a boxed one-element slice, has
            // left the registry (no other thread can reach it), and this thread, its owner,
            // no longer refers to it.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.slot.as_ptr(), 1)) });
        }
    }

    impl Drop for Caches {
        fn drop(&mut self) {
            self.last.set((ptr::null(), ptr::null()));
            for entry in self.entries.get_mut().drain(..) {
                entry.leave();
            }
        }
    }
}

#[cfg(not(ndmem_loom))]
use thread::CACHES;

impl Core {
    /// This thread's slot leaves the pool (see [`Registry::retire`]): its blocks go to the
    /// shared classes, or to the OS when they are full or the pool is closed.
    fn retire(&self, slot: NonNull<Slot>) {
        let closed = self.local.is_closed();
        self.local.retire(slot, &self.books, |block, class| {
            if closed {
                self.os_free(block, super::class::class_size(class));
            } else {
                self.release_shared(block, super::class::class_size(class));
            }
        });
    }
}
