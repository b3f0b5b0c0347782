//! Per-thread caches of freed blocks in front of the shared size classes, and the per-thread
//! tallies the pool's statistics are summed from.
//!
//! A thread keeps, for each pool it allocates from, a [`Slot`]: one free list per size class
//! (the blocks are linked through a word of their own: see [`link`]), each with its length
//! and its cap, and
//! the thread's tally of allocations and frees. A block freed by that thread goes onto its
//! list while the list is shorter than its cap, and the thread's next request of that class
//! takes it back: neither touches a lock or a cache line another thread writes.
//!
//! The hit paths are [`Slot::try_take`] and [`Slot::try_keep`], on the slot the thread used
//! last (one thread-local load names it). They decline, changing nothing, whenever the
//! operation needs anything else (a lookup, an empty list or a full one, a recall under
//! way, figures to publish), and the general path runs in a cold function instead; so an
//! inlined allocation or free is straight-line code with no call, and the caller's frame
//! stays as small as the work.
//!
//! Caps are learned, and they carry the byte bound. Every list starts with a cap of 0; each
//! time its thread finds it empty, the cap grows by one block, as long as the caps of all
//! the slot's lists, in bytes, stay within the pool's per-thread bound. A miss means every
//! block the list could keep is in use, so after one cycle a list keeps as many blocks as
//! its thread held at once, and the next cycle is served from the list alone. The blocks
//! a slot holds never pass the bound, and the free path checks nothing but the list's
//! length against its cap. A thread that allocates and frees many blocks of a class (a
//! thousand 64 KiB blocks a step) keeps them all, while a thread that only frees what another
//! allocates (the consumer of a prefetching loader) never finds a list empty, keeps
//! nothing, and passes its blocks on through the shared classes instead of hoarding them
//! while the other thread asks the OS. A recall empties the lists and sets the caps back to
//! 0, so they are learned again under the bound of the time.
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
//!   owner's side is a compiler fence on Linux, where the recaller's side makes every
//!   thread of the process fence (`membarrier`), so a cache hit costs no read-modify-write
//!   and no test of which barrier is in use: a Linux thread keeps a cache only once that
//!   barrier is registered (without it, as on kernels before 4.14 or under a filter that
//!   forbids the call, every thread uses the shared classes). Elsewhere the owner fences.
//! - A slot's tally and hit counters are written by its owner alone (plain loads and
//!   stores of atomics, no read-modify-write) and read by others under the registry's lock.
//!   A hit writes one counter, of its class and usage: its bytes are the class's size. A
//!   thread that exits folds its tally into the pool's books and removes its slot under
//!   that same lock, so a sum taken under the lock counts every operation that is not in
//!   flight exactly once.
//! - The hit paths hold no test of the recorder: while it is on, every listed slot's
//!   `rise` is `isize::MIN` and its `gate` `isize::MAX`, so each operation takes the
//!   general path, which records it. The recorder's start switches it on and then forces
//!   both thresholds of every slot of every pool (each under its registry's lock, with
//!   release writes); the general path sets them back from the recorder's state, never
//!   overwriting a forcing it has not seen the switch of (both are
//!   [`Gate`](crate::counter::Gate)s: see its invariant, and the loom model `gate`), and a
//!   slot starts forced and is set from the recorder's state only after it is listed. An
//!   operation in flight when the recorder starts may go unrecorded, as with any test of a
//!   flag.
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

use super::class::{class_of, class_size, NUM_CLASSES};
use super::os::{heavy_barrier, light_barrier};
use super::stats::{Books, Figures};
use super::{Core, Usage};
use crate::counter::Gate;
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Unpublished drift of a thread's live bytes after which it publishes them for the peak.
const PEAK_BATCH: isize = 4 << 20;

/// At or below this published level a free publishes once the level is this much below it.
const PEAK_SMALL: isize = 256 << 10;

/// The level below which a free publishes, once `published` was: above [`PEAK_SMALL`], a
/// batch below it, or half of it when that is higher; at or below (a thread near nothing,
/// or below it, freeing what others allocated), `PEAK_SMALL` below it. A thread that gives
/// back most of what it published and then idles publishes the fall, so the published sum
/// overstates an idle thread's live bytes by no more than the larger of what it still
/// holds and `PEAK_SMALL`, whatever it freed of other threads' blocks (a peak reset then
/// starts from a sum that far from the truth at most); a loop that allocates and frees the
/// same bytes each step publishes a handful of times a step at most, nothing below 256
/// KiB (its level never falls below where it started).
fn fall_below(published: isize) -> isize {
    if published > PEAK_SMALL {
        (published - PEAK_BATCH).max(published / 2)
    } else {
        published - PEAK_SMALL
    }
}

/// Entries of each per-class array of a slot: one for every value of the `u8` a class
/// travels in, so that the hot paths index them with the class as it comes ([`list`]'s mask
/// then costs nothing) and no bounds check: 6 instructions less per block than the classes
/// rounded up to a power of two (128), for 10 KiB more per thread and pool. The entries
/// past the last class stay empty.
///
/// Under Miri the arrays keep the classes rounded up to a power of two (128) instead:
/// Tree Borrows tracks every atomic of a slot as a cell of its own, and at 256 entries
/// (2,300 atomics a slot) a test that makes slots ran three times as long (the
/// workspaces and tensors suites of scripts/miri.sh). [`list`]'s mask keeps every class
/// in bounds either way.
#[cfg(not(miri))]
const LISTS: usize = 256;
#[cfg(miri)]
const LISTS: usize = NUM_CLASSES.next_power_of_two();

const _: () = assert!(
    NUM_CLASSES <= LISTS
        && LISTS.is_power_of_two()
        && (cfg!(miri) || LISTS == u8::MAX as usize + 1)
);

/// The index of `class`'s entries (`class` itself: every class is below [`LISTS`]).
#[inline(always)]
fn list(class: usize) -> usize {
    debug_assert!(class < NUM_CLASSES);
    class & (LISTS - 1)
}

/// A slot's lists: the head of each class's list (null when empty) and its cap, with the
/// caps' sum in bytes (the lengths are beside them, in the slot, for readers).
struct Lists {
    heads: [*mut u8; LISTS],
    caps: [u32; LISTS],
    /// `sum(caps[c] * class_size(c))`: at most the pool's per-thread bound.
    capped: usize,
}

/// One thread's cache and tally for one pool. Aligned to two cache lines, so that no line
/// of it is shared with another thread's slot (their owners write theirs at every hit).
#[repr(align(128))]
pub(super) struct Slot {
    /// The owner's live bytes above which it must publish towards the peak (a new high, or
    /// a batch above what it last published); lowered to `isize::MIN` by a peak reset, so
    /// the owner's next allocation starts its high again. Written by the owner with a
    /// compare-exchange, so a reset is never overwritten. `isize::MIN` (forced) while the
    /// recorder is on (every allocation takes the general path, which records it).
    rise: Gate,
    /// The owner's live bytes below which a free leaves the hit path: [`Mark::fall`], or
    /// `isize::MAX` (forced) while the recorder is on (every free takes the general path,
    /// which records it).
    gate: Gate,
    /// 1 while the owner is inside (takes or keeps a block).
    busy: AtomicUsize,
    /// 1 while a recaller wants in or is inside.
    recall: AtomicUsize,
    /// Each class's free list; see the handshake.
    lists: UnsafeCell<Lists>,
    /// Each list's length; written by whoever is inside, read by anyone (the bytes cached
    /// are summed from them).
    lens: [AtomicU32; LISTS],
    tally: Tally,
    /// Allocations served on the hit path, per class and usage (index
    /// [`hit`]`(class, usage)`): their bytes are the class's size, so one counter holds
    /// both the count and the bytes, and the hit path writes one figure.
    taken: [AtomicU64; HITS],
    /// Frees kept on the hit path, per class and usage, as `taken`.
    kept: [AtomicU64; HITS],
    /// The owner's peak bookkeeping; touched by the owner thread alone.
    mark: UnsafeCell<Mark>,
}

/// A thread's counts off the hit paths, written by the thread alone, each only growing
/// (the hit paths count in the slot's `taken` and `kept`). The figures the statistics
/// show are derived when read: bytes allocated and freed are the sums over the usages,
/// live bytes per usage their differences, cache hits the allocations less the misses.
struct Tally {
    /// Bytes handed out, per usage.
    allocated: [AtomicU64; 4],
    /// Bytes given back, per usage.
    freed: [AtomicU64; 4],
    allocations: AtomicU64,
    deallocations: AtomicU64,
    /// Allocations not served from a cache (fresh OS memory, reservations).
    misses: AtomicU64,
}

/// What the owner last published towards the pool's peak.
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
    /// [`fall_below`]`(published)`: the level below which a free publishes.
    fall: isize,
    /// The level above which an allocation publishes: what `rise` holds when nothing forces
    /// it (the recorded hit path tests this copy, since the recorder forces `rise`).
    rise: isize,
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

impl Tally {
    /// Counts an allocation of `bytes` for `usage`.
    #[inline(always)]
    fn count_allocation(&self, bytes: usize, usage: Usage) {
        bump(&self.allocated[usage.index()], bytes as u64);
        bump(&self.allocations, 1);
    }

    /// Counts a free of `bytes` for `usage`.
    #[inline(always)]
    fn count_free(&self, bytes: usize, usage: Usage) {
        bump(&self.freed[usage.index()], bytes as u64);
        bump(&self.deallocations, 1);
    }
}

impl Slot {
    fn new(epoch: u64) -> Slot {
        Slot {
            // The first allocation publishes (a new high from nothing), and the first free
            // takes the general path: both set the thresholds from the recorder's state
            // once the slot is listed (see the module invariant).
            rise: Gate::new(isize::MIN),
            gate: Gate::new(isize::MAX),
            busy: AtomicUsize::new(0),
            recall: AtomicUsize::new(0),
            lists: UnsafeCell::new(Lists {
                heads: [ptr::null_mut(); LISTS],
                caps: [0; LISTS],
                capped: 0,
            }),
            lens: std::array::from_fn(|_| AtomicU32::new(0)),
            tally: Tally {
                allocated: std::array::from_fn(|_| AtomicU64::new(0)),
                freed: std::array::from_fn(|_| AtomicU64::new(0)),
                allocations: AtomicU64::new(0),
                deallocations: AtomicU64::new(0),
                misses: AtomicU64::new(0),
            },
            taken: std::array::from_fn(|_| AtomicU64::new(0)),
            kept: std::array::from_fn(|_| AtomicU64::new(0)),
            mark: UnsafeCell::new(Mark {
                level: 0,
                published: 0,
                high: 0,
                epoch,
                fall: fall_below(0),
                rise: isize::MIN,
            }),
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

    /// Owner: takes a block of `class` (of `capacity` bytes) from the lists, if any; if the
    /// list is empty, raises its cap within `registry`'s bound.
    #[inline(always)]
    pub(super) fn take(
        &self,
        class: usize,
        capacity: usize,
        registry: &Registry,
    ) -> Option<NonNull<u8>> {
        if !self.enter() {
            return None; // being recalled: this request goes to the shared classes
        }
        // SAFETY: the owner is inside (just entered).
        let block = unsafe { self.pop(class) };
        if block.is_none() {
            // SAFETY: the owner is inside: nobody else touches the lists.
            grow(
                unsafe { &mut *self.lists.get() },
                class,
                capacity,
                registry.bound(),
            );
        }
        self.leave();
        block
    }

    /// Owner, inside the slot: takes the first block of `class`'s list, if any.
    ///
    /// # Safety
    /// The caller is the owner and has entered the slot ([`Slot::enter`]) and not left.
    #[inline(always)]
    unsafe fn pop(&self, class: usize) -> Option<NonNull<u8>> {
        let class = list(class);
        // SAFETY: the owner is inside (the caller's contract): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        let block = NonNull::new(lists.heads[class])?;
        // SAFETY: a listed block is a live allocation of its class, owned by this slot,
        // whose link word holds the next block of the list.
        lists.heads[class] = unsafe { link(block.as_ptr(), class).read() };
        let len = &self.lens[class];
        len.store(len.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        Some(block)
    }

    /// Owner: keeps `block` (of `class`, owned by the caller) on the lists if its list is
    /// under its cap (the caps keep the slot within the bound); `false` leaves it with the
    /// caller.
    #[inline(always)]
    pub(super) fn keep(&self, class: usize, block: NonNull<u8>) -> bool {
        let class = list(class);
        if !self.enter() {
            return false;
        }
        // SAFETY: the owner is inside (the handshake): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        let len = &self.lens[class];
        let n = len.load(Ordering::Relaxed);
        if n >= lists.caps[class] {
            self.leave();
            return false;
        }
        // SAFETY: the caller owns `block`, a pool block of `class`: its link word is ours to
        // overwrite.
        unsafe { link(block.as_ptr(), class).write(lists.heads[class]) };
        lists.heads[class] = block.as_ptr();
        len.store(n + 1, Ordering::Relaxed);
        self.leave();
        true
    }

    /// Owner: `n` blocks of `class` (of `capacity` bytes each), linked through their link
    /// words ([`link`]) from `head` and owned by the caller, become this slot's list of that class,
    /// which must be empty; its cap is raised to hold them and the block handed out with
    /// them (`n + 1`: all come back in a step like the last), if the slot's caps stay
    /// within `bound` bytes with it. `false` (nothing changed, the blocks still the
    /// caller's) when the list is not empty, the bound does not allow it, or a recall is
    /// under way.
    pub(super) fn take_list(
        &self,
        class: usize,
        head: NonNull<u8>,
        n: u32,
        capacity: usize,
        bound: usize,
    ) -> bool {
        let class = list(class);
        if !self.enter() {
            return false;
        }
        // SAFETY: the owner is inside (the handshake): nobody else touches the lists.
        let lists = unsafe { &mut *self.lists.get() };
        let cap = lists.caps[class];
        let wanted = n.saturating_add(1);
        let extra = (wanted.saturating_sub(cap) as usize).saturating_mul(capacity);
        let fits = self.lens[class].load(Ordering::Relaxed) == 0
            && lists.capped.saturating_add(extra) <= bound;
        if fits {
            lists.capped += extra;
            lists.caps[class] = cap.max(wanted);
            lists.heads[class] = head.as_ptr();
            self.lens[class].store(n, Ordering::Relaxed);
        }
        self.leave();
        fits
    }

    /// Bytes on the lists (exact while nobody is inside; each length is read once).
    fn cached_bytes(&self) -> usize {
        self.lens
            .iter()
            .take(NUM_CLASSES)
            .enumerate()
            .map(|(class, n)| n.load(Ordering::Relaxed) as usize * class_size(class))
            .sum()
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
        let bytes = self.cached_bytes();
        for len in &self.lens {
            len.store(0, Ordering::Relaxed);
        }
        // The caps are learned again, under the bound of the time.
        lists.caps = [0; LISTS];
        lists.capped = 0;
        for (class, head) in lists.heads.iter_mut().enumerate() {
            // SAFETY: a listed block of `class` holds the next block of its list in its link
            // word, and the recaller owns the list (the handshake).
            unsafe {
                walk(std::mem::replace(head, ptr::null_mut()), class, |block| {
                    each(block, class)
                })
            };
        }
        self.recall.store(0, Ordering::Release);
        bytes
    }

    /// Owner: a block or reservation of `bytes` was handed out for `usage` (`hit`: from a
    /// cache). Publishes towards the peak when the thread's live bytes pass `rise`.
    #[inline(always)]
    pub(super) fn live(
        &self,
        registry: &Registry,
        books: &Books,
        bytes: usize,
        usage: Usage,
        hit: bool,
    ) {
        self.tally.count_allocation(bytes, usage);
        if !hit {
            bump(&self.tally.misses, 1);
        }
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        m.level += bytes as isize;
        if m.level > self.rise.get() {
            self.rose(m, registry, books);
        }
    }

    /// Owner: the live bytes passed `rise`: a new high since the last reset (whose epoch
    /// is checked here), or a batch above what was published, or the recorder is (or was)
    /// on. Publishes and sets the next `rise` (and the gate), unless a reset or the
    /// recorder's start lowered it meanwhile (then this runs again).
    #[cold]
    fn rose(&self, m: &mut Mark, registry: &Registry, books: &Books) {
        loop {
            // Acquire: a reset's lowered `rise` is seen with its new epoch.
            let seen = self.rise.get();
            let epoch = registry.epoch();
            if m.epoch != epoch {
                // The peak was reset: rises from here on count again.
                m.epoch = epoch;
                m.high = isize::MIN;
            }
            if m.level > m.high || m.level - m.published > PEAK_BATCH {
                m.high = m.high.max(m.level);
                books.publish(m.level - m.published, true);
                m.published = m.level;
                m.fall = fall_below(m.level);
            }
            let next = m.high.min(m.published + PEAK_BATCH);
            m.rise = next;
            if self.rise.replace(seen, next, crate::trace::is_on) {
                self.arm(m);
                return;
            }
        }
    }

    /// Owner: sets the gate of the free's hit path from `m`, or forces it while the
    /// recorder is on.
    #[cold]
    fn arm(&self, m: &Mark) {
        self.gate.set(m.fall, crate::trace::is_on);
    }

    /// Recorder, holding the registry's lock, after it switched on: sends every operation
    /// of the owner to the general path, which records it (see the module invariant).
    fn force(&self) {
        self.rise.force();
        self.gate.force();
    }

    /// Owner: [`Slot::take`] and [`Slot::live`] (a hit) of a block of `class` and `bytes`
    /// in one, if neither needs cold work (publishing towards the peak, or an empty list,
    /// or a recall under way); `None` changes nothing.
    #[inline(always)]
    pub(super) fn try_take(&self, class: usize, bytes: usize, usage: Usage) -> Option<NonNull<u8>> {
        self.take_within(class, bytes, usage, self.rise.get())
    }

    /// Owner, while the recorder is on (which forces `rise`): [`Slot::try_take`] against
    /// the owner's copy of the threshold, declining also when a peak reset is pending, so
    /// that the caller takes the block and records it without the general path.
    #[inline]
    pub(super) fn try_take_recorded(
        &self,
        class: usize,
        bytes: usize,
        usage: Usage,
        registry: &Registry,
    ) -> Option<NonNull<u8>> {
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let (epoch, rise) = unsafe {
            let m = &*self.mark.get();
            (m.epoch, m.rise)
        };
        if epoch != registry.epoch() {
            return None;
        }
        self.take_within(class, bytes, usage, rise)
    }

    /// Owner: a hit of `class` (blocks of `bytes`) for `usage`, if the live bytes stay at
    /// or below `ceiling` with it and the list has a block; `None` changes nothing.
    #[inline(always)]
    fn take_within(
        &self,
        class: usize,
        bytes: usize,
        usage: Usage,
        ceiling: isize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        let level = m.level + bytes as isize;
        if level > ceiling || !self.enter() {
            return None;
        }
        // SAFETY: the owner is inside (just entered).
        let block = unsafe { self.pop(class) };
        self.leave();
        let block = block?;
        debug_assert_eq!(bytes, class_size(class));
        bump(&self.taken[hit(class, usage)], 1);
        m.level = level;
        Some(block)
    }

    /// Owner: [`Slot::freed`] and [`Slot::keep`] of a block of `class` and `bytes` in one,
    /// if neither needs cold work (publishing the figures, or a list at its cap, or a
    /// recall under way); `false` changes nothing.
    #[inline(always)]
    pub(super) fn try_keep(
        &self,
        class: usize,
        block: NonNull<u8>,
        bytes: usize,
        usage: Usage,
    ) -> bool {
        self.keep_within(class, block, bytes, usage, self.gate.get_relaxed())
    }

    /// Owner, while the recorder is on (which forces the gate): [`Slot::try_keep`]
    /// against the owner's own threshold.
    #[inline]
    pub(super) fn try_keep_recorded(
        &self,
        class: usize,
        block: NonNull<u8>,
        bytes: usize,
        usage: Usage,
    ) -> bool {
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let fall = unsafe { (*self.mark.get()).fall };
        self.keep_within(class, block, bytes, usage, fall)
    }

    /// Owner: keeps `block` (of `class`, `bytes`, for `usage`) on its list, if the live
    /// bytes stay at or above `floor` without it and the list is under its cap; `false`
    /// changes nothing.
    #[inline(always)]
    fn keep_within(
        &self,
        class: usize,
        block: NonNull<u8>,
        bytes: usize,
        usage: Usage,
        floor: isize,
    ) -> bool {
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        let level = m.level - bytes as isize;
        if level < floor || !self.keep(class, block) {
            return false;
        }
        debug_assert_eq!(bytes, class_size(class));
        bump(&self.kept[hit(class, usage)], 1);
        m.level = level;
        true
    }

    /// Owner: a block or reservation of `bytes` for `usage` came back.
    #[inline(always)]
    pub(super) fn freed(&self, books: &Books, bytes: usize, usage: Usage) {
        self.tally.count_free(bytes, usage);
        // SAFETY: `mark` is touched by the owner thread alone, and this is the owner.
        let m = unsafe { &mut *self.mark.get() };
        m.level -= bytes as isize;
        if m.level < m.fall {
            self.fell(m, books);
        }
        self.arm(m);
    }

    /// Owner: the live bytes fell a batch below what was published: publishes, and lowers
    /// `rise` to a batch above the new figure, unless a reset lowered it meanwhile.
    #[cold]
    fn fell(&self, m: &mut Mark, books: &Books) {
        let mut seen = self.rise.get();
        books.publish(m.level - m.published, false);
        m.published = m.level;
        m.fall = fall_below(m.level);
        let next = m.high.min(m.published + PEAK_BATCH);
        m.rise = m.rise.min(next);
        // `rise` only comes down here: a reset or the recorder's start that lowered it
        // meanwhile stands (the next allocation starts over).
        while !self.rise.replace(seen, next.min(seen), crate::trace::is_on) {
            seen = self.rise.get();
        }
    }

    /// The slot's figures (exact for every operation of its owner that is not in flight).
    fn figures(&self) -> Figures {
        let t = &self.tally;
        // Frees are read before allocations: a free follows its allocation, so no live
        // figure reads below what it is for want of an allocation read too early.
        let mut freed: [u64; 4] = std::array::from_fn(|i| t.freed[i].load(Ordering::Relaxed));
        let deallocations = t
            .deallocations
            .load(Ordering::Relaxed)
            .wrapping_add(hits(&self.kept, &mut freed));
        let mut allocated: [u64; 4] =
            std::array::from_fn(|i| t.allocated[i].load(Ordering::Relaxed));
        let allocations = t
            .allocations
            .load(Ordering::Relaxed)
            .wrapping_add(hits(&self.taken, &mut allocated));
        Figures {
            allocated: allocated.iter().fold(0, |a, b| a.wrapping_add(*b)),
            freed: freed.iter().fold(0, |a, b| a.wrapping_add(*b)),
            allocations,
            deallocations,
            cache_hits: allocations.wrapping_sub(t.misses.load(Ordering::Relaxed)),
            usage: std::array::from_fn(|i| allocated[i].wrapping_sub(freed[i]) as isize),
            cached: 0,
            thread_cached: self.cached_bytes(),
            ..Figures::default()
        }
    }
}

/// Entries of a slot's hit counters: one per class (of [`LISTS`]) and usage.
const HITS: usize = LISTS * 4;

/// The index of the hit counter of `class` and `usage` (no bounds check needed: below
/// [`HITS`] by construction).
#[inline(always)]
fn hit(class: usize, usage: Usage) -> usize {
    list(class) << 2 | usage.index()
}

/// Adds the hits counted in `counters` to `bytes` (per usage, at each class's size);
/// returns how many there were.
fn hits(counters: &[AtomicU64; HITS], bytes: &mut [u64; 4]) -> u64 {
    let mut count = 0u64;
    for class in 0..NUM_CLASSES {
        for (usage, bytes) in bytes.iter_mut().enumerate() {
            let n = counters[hit(class, Usage::from_index(usage))].load(Ordering::Relaxed);
            if n != 0 {
                count = count.wrapping_add(n);
                *bytes = bytes.wrapping_add(n.wrapping_mul(class_size(class) as u64));
            }
        }
    }
    count
}

/// A list of `class` (blocks of `capacity` bytes) was found empty: its cap grows by one
/// block if the slot's caps stay within `bound` bytes with it.
#[cold]
#[inline(never)]
fn grow(lists: &mut Lists, class: usize, capacity: usize, bound: usize) {
    let cap = lists.caps[class];
    if cap < u32::MAX && lists.capped + capacity <= bound {
        lists.capped += capacity;
        lists.caps[class] = cap + 1;
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

    /// Peak reset, with the lock held (so the slots and their sum are one state): every
    /// thread starts its high again from its live bytes now, and `f` gets the exact figures
    /// the reset starts from.
    pub(super) fn reset_peak<R>(&self, books: &Books, f: impl FnOnce(Figures) -> R) -> R {
        let slots = self.lock();
        let mut figures = books.figures();
        self.epoch.fetch_add(1, Ordering::Relaxed);
        for listed in slots.iter() {
            // SAFETY: a listed slot is alive while the lock is held.
            let slot = unsafe { listed.0.as_ref() };
            figures.add(&slot.figures());
            // Release: the owner that sees this sees the new epoch too.
            slot.rise.force();
        }
        f(figures)
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

    /// The recorder switched on: every listed slot sends its owner's operations to the
    /// general path, which records them. A slot listed after this sees the recorder on
    /// (the lock orders its listing after this).
    pub(super) fn force_all(&self) {
        for listed in self.lock().iter() {
            // SAFETY: a listed slot is alive while the lock is held.
            unsafe { listed.0.as_ref() }.force();
        }
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
    /// the books, the slot off the list, and then `then` runs, the lock still held (so that
    /// a sum of the figures never sees the blocks in no cache). The slot is freed by the
    /// caller afterwards.
    fn retire(
        &self,
        slot: NonNull<Slot>,
        books: &Books,
        each: impl FnMut(NonNull<u8>, usize),
        then: impl FnOnce(),
    ) {
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
        then();
    }
}

/// The word of `block`, a pool block of `class` on a list, that links the next block.
///
/// A block below a page links through its first word. A block of a page or more links
/// through the first word of one of the 64 cache lines of its first page, picked by its
/// address: such blocks start a page (or more) apart, so their first lines all fall in the
/// few cache sets of one page offset, and a list walked block by block (a cycle of a
/// thousand 4 KiB blocks, taken back one after another) would find each link evicted by
/// the others and wait on memory for every block, while the links of 64 colours share a
/// page's worth of sets and stay cached. The picked word is at most 4,032 bytes in, within
/// the block.
#[inline(always)]
fn link(block: *mut u8, class: usize) -> *mut *mut u8 {
    let colour = if class >= PAGE_CLASS {
        // The top 6 bits of the page number's Fibonacci hash: pages in any arithmetic
        // progression (blocks of one size, side by side) spread over all 64.
        ((block as usize as u64 >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
    } else {
        0
    };
    block.wrapping_add(colour * 64).cast()
}

/// The first class of a page or more (see [`link`]).
const PAGE_CLASS: usize = match class_of(4096) {
    Some(class) => class,
    None => panic!("4 KiB has a class"),
};

/// Hands every block of the list of `class` linked from `head` through the blocks' link
/// words to `each`, reading each link before the block is handed on.
///
/// # Safety
///
/// Every block of the list is a pool block of `class`, owned by the caller, whose link
/// word ([`link`]) links the next (null at the end).
unsafe fn walk(head: *mut u8, class: usize, mut each: impl FnMut(NonNull<u8>)) {
    let mut next = head;
    while let Some(block) = NonNull::new(next) {
        // SAFETY: the caller's guarantee: the block's link word links the next.
        next = unsafe { link(block.as_ptr(), class).read() };
        each(block);
    }
}

/// A list of blocks of one class, linked through their link words ([`link`]): its first
/// block and its length.
#[derive(Clone, Copy)]
struct Chain {
    head: *mut u8,
    len: u32,
}

impl Chain {
    #[cfg_attr(ndmem_loom, allow(dead_code))]
    const EMPTY: Chain = Chain {
        head: ptr::null_mut(),
        len: 0,
    };

    /// Links `block`, of the chain's `class` (owned by the chain from now on), in front.
    #[cfg_attr(ndmem_loom, allow(dead_code))]
    fn push(&mut self, class: usize, block: NonNull<u8>) {
        // SAFETY: a pool block of `class`, owned by the caller: its link word is ours to
        // overwrite.
        unsafe { link(block.as_ptr(), class).write(self.head) };
        self.head = block.as_ptr();
        self.len += 1;
    }

    /// Hands every block to `each`, in order (`class`: the chain's).
    fn for_each(self, class: usize, each: impl FnMut(NonNull<u8>)) {
        // SAFETY: a chain owns its blocks of `class`, each linking the next through its
        // link word.
        unsafe { walk(self.head, class, each) };
    }
}

/// A pool's depot: the lists of blocks that exited threads left, a stack of them per class,
/// each for one next thread that misses in that class to take over whole (see
/// [`Core::take_depot`]): threads that start together each find one list, as the threads
/// before them left them, rather than one thread taking them all while the others ask the
/// OS. Its blocks count as the shared classes' (`cached`), stay reserved in the budget,
/// and go back to the OS with the shared classes' (`trim`, a limit, the pool's drop). It
/// holds at most the per-thread bound in bytes: a program that starts fresh threads for
/// each step finds the last step's blocks there, without the OS and without a
/// block-by-block trip through the shared classes' 16 slots.
///
/// The stacks are linked through the blocks themselves (no allocation): the first block of
/// a list waiting in the depot holds, in its words 1 and 2 (its link to the next block of
/// its list is word 0 or a word at least 64 bytes in: [`link`]), the first block of the
/// next list down the stack and its list's length (a block of a class has at least 64
/// bytes).
pub(super) struct Depot {
    chains: Mutex<DepotChains>,
}

struct DepotChains {
    /// The first block of the list on top of each class's stack (null: none).
    tops: [*mut u8; NUM_CLASSES],
    bytes: usize,
}

// SAFETY: the lists' blocks are owned by the depot and only touched under its lock.
unsafe impl Send for DepotChains {}

/// Word offsets, in the first block of a list waiting in the depot, of what the depot
/// keeps there (the list's own link is word 0, or a word at least 64 bytes in: [`link`]).
const BELOW: usize = 1;
const LEN: usize = 2;

impl Depot {
    pub(super) fn new() -> Depot {
        Depot {
            chains: Mutex::new(DepotChains {
                tops: [ptr::null_mut(); NUM_CLASSES],
                bytes: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DepotChains> {
        // Nothing panics while the lock is held; poisoned stacks are still whole.
        match self.chains.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Takes `chain` (of `class`) onto its class's stack if the depot stays within `bound`
    /// bytes with it; gives it back otherwise.
    fn offer(&self, class: usize, chain: Chain, bound: usize) -> Result<(), Chain> {
        let bytes = chain.len as usize * class_size(class);
        let mut chains = self.lock();
        if chains.bytes + bytes > bound || chain.head.is_null() {
            return Err(chain);
        }
        let words = chain.head.cast::<*mut u8>();
        // SAFETY: `head` is the first block of the offered list, which the depot owns now:
        // a block of a class (at least 64 bytes, aligned to 16), whose words 1 and 2 are
        // free (its link is word 0 or a word at least 64 bytes in: `link`). The link is stored as a pointer (provenance kept).
        unsafe {
            words.add(BELOW).write(chains.tops[class]);
            words.add(LEN).cast::<usize>().write(chain.len as usize);
        }
        chains.tops[class] = chain.head;
        chains.bytes += bytes;
        Ok(())
    }

    /// Takes the list on top of `class`'s stack, if any.
    fn take(&self, class: usize) -> Option<Chain> {
        let mut chains = self.lock();
        let chain = Self::pop(&mut chains.tops[class])?;
        chains.bytes -= chain.len as usize * class_size(class);
        Some(chain)
    }

    /// Pops the list on top of a stack (under the lock).
    fn pop(top: &mut *mut u8) -> Option<Chain> {
        let head = NonNull::new(*top)?;
        let words = head.as_ptr().cast::<*mut u8>();
        // SAFETY: the top of a stack is the first block of a list the depot holds, whose
        // words 1 and 2 `offer` wrote.
        let (below, len) = unsafe {
            (
                words.add(BELOW).read(),
                words.add(LEN).cast::<usize>().read(),
            )
        };
        *top = below;
        Some(Chain {
            head: head.as_ptr(),
            len: len as u32,
        })
    }

    /// Empties the depot, handing every block and its class to `each`; returns the bytes.
    pub(super) fn drain(&self, mut each: impl FnMut(NonNull<u8>, usize)) -> usize {
        let mut tops = {
            let mut chains = self.lock();
            chains.bytes = 0;
            std::mem::replace(&mut chains.tops, [ptr::null_mut(); NUM_CLASSES])
        };
        let mut bytes = 0;
        for (class, top) in tops.iter_mut().enumerate() {
            while let Some(chain) = Self::pop(top) {
                bytes += chain.len as usize * class_size(class);
                chain.for_each(class, |block| each(block, class));
            }
        }
        bytes
    }
}

/// Runs `f` with this thread's slot for `core`, if it has one.
#[inline(always)]
pub(super) fn with_slot<R>(core: &Core, f: impl FnOnce(&Slot) -> R) -> Option<R> {
    #[cfg(not(ndmem_loom))]
    {
        let slot = thread::find(core)?;
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

/// This thread's slot for `core` if it is the one it used last (one thread-local load,
/// no lookup); `None` otherwise, even if it has one.
#[inline(always)]
pub(super) fn cached_slot(core: &Core) -> Option<NonNull<Slot>> {
    #[cfg(not(ndmem_loom))]
    {
        thread::last(core)
    }
    #[cfg(ndmem_loom)]
    {
        let _ = core;
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

    /// This thread's entries.
    pub(super) struct Caches {
        entries: RefCell<Vec<Entry>>,
    }

    std::thread_local! {
        pub(super) static CACHES: Caches = const {
            Caches {
                entries: RefCell::new(Vec::new()),
            }
        };
        /// The pool core and slot this thread used last: a value with no destructor, so
        /// reading it is one thread-local load with no state to check. Cleared before the
        /// entries are dropped (and while they are pruned), so it never names a freed slot.
        /// Cleared, it holds a null core (which no pool has) and a dangling slot, so that a
        /// match needs no second test.
        static LAST: Cell<(*const Core, NonNull<Slot>)> = const { Cell::new(CLEARED) };
    }

    /// `LAST` naming no slot.
    const CLEARED: (*const Core, NonNull<Slot>) = (ptr::null(), NonNull::dangling());

    /// This thread's slot for `core`, if it has one.
    #[inline(always)]
    pub(super) fn find(core: &Core) -> Option<NonNull<Slot>> {
        last(core).or_else(|| find_slow(core))
    }

    /// This thread's slot for `core` if `core` is the pool it used last.
    #[inline(always)]
    pub(super) fn last(core: &Core) -> Option<NonNull<Slot>> {
        let (last_core, last_slot) = LAST.with(Cell::get);
        // Only `CLEARED` holds the dangling slot, and its core is null: never `core`.
        ptr::eq(last_core, core).then_some(last_slot)
    }

    #[cold]
    #[inline(never)]
    fn find_slow(core: &Core) -> Option<NonNull<Slot>> {
        CACHES
            .try_with(|caches| {
                let entries = caches.entries.try_borrow().ok()?;
                let entry = entries.iter().find(|e| ptr::eq(&*e.core, core))?;
                LAST.with(|last| last.set((core, entry.slot)));
                Some(entry.slot)
            })
            .ok()
            .flatten()
    }

    impl Caches {
        #[cold]
        pub(super) fn register(&self, core: &Arc<Core>) -> Option<()> {
            if find(core).is_some() {
                return Some(());
            }
            // The owner's side of the handshake is a compiler fence where the OS offers the
            // process-wide barrier (`os`): without it, no thread keeps a cache.
            if !super::super::os::light_barrier_usable() {
                return None;
            }
            let mut entries = self.entries.try_borrow_mut().ok()?;
            // Entries of dropped pools go first (their cores are freed with the last entry).
            if entries.iter().any(|e| e.core.local.is_closed()) {
                LAST.with(|last| last.set(CLEARED));
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
            one.push(Slot::new(core.local.epoch()));
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
            LAST.with(|last| last.set((&**core, slot)));
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
            // `LAST` has no destructor, so it is still there to clear.
            LAST.with(|last| last.set(CLEARED));
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
        // Filled by the drain, emptied after it, both under the registry's lock.
        let chains = std::cell::RefCell::new([Chain::EMPTY; NUM_CLASSES]);
        self.local.retire(
            slot,
            &self.books,
            |block, class| {
                if closed {
                    self.os_free(block, class_size(class));
                } else {
                    chains.borrow_mut()[class].push(class, block);
                }
            },
            || {
                // Each class's list goes to the depot whole while it has room, else block
                // by block to the shared classes (and what they cannot hold to the OS).
                for (class, chain) in chains
                    .replace([Chain::EMPTY; NUM_CLASSES])
                    .into_iter()
                    .enumerate()
                {
                    if chain.len == 0 {
                        continue;
                    }
                    // Counted before the depot has them, so a taker never counts below 0.
                    self.books.caching(chain.len as usize * class_size(class));
                    self.park(class, chain);
                }
            },
        );
    }

    /// A block of `class` (of `capacity` bytes) from the depot, if it has any: the rest of
    /// the depot's list for that class becomes this thread's list of it (its cap raised to
    /// hold it, within the per-thread bound), so the next requests of the class are cache
    /// hits; what the thread cannot keep goes back to the depot or the shared classes.
    pub(super) fn take_depot(&self, class: usize, capacity: usize) -> Option<NonNull<u8>> {
        let chain = self.depot.take(class)?;
        let head = NonNull::new(chain.head)?;
        // SAFETY: the chain's blocks of `class` are ours now; the link word of each links
        // the next.
        let next = unsafe { link(head.as_ptr(), class).read() };
        let rest = Chain {
            head: next,
            len: chain.len - 1,
        };
        self.books.uncached(capacity);
        if let Some(first) = NonNull::new(rest.head) {
            let bytes = rest.len as usize * capacity;
            let kept = with_slot(self, |slot| {
                slot.take_list(class, first, rest.len, capacity, self.local.bound())
            });
            if kept == Some(true) {
                // Out of the shared count: the thread's list counts them now.
                self.books.uncached(bytes);
            } else {
                self.park(class, rest);
            }
        }
        Some(head)
    }

    /// Leaves `chain` (of `class`, counted cached) in the depot if it has room; otherwise
    /// takes it out of the cached count and gives it block by block to the shared classes
    /// (and what they cannot hold to the OS).
    fn park(&self, class: usize, chain: Chain) {
        if let Err(chain) = self.depot.offer(class, chain, self.local.bound()) {
            let capacity = class_size(class);
            self.books.uncached(chain.len as usize * capacity);
            chain.for_each(class, |block| self.release_shared(block, capacity));
        }
    }

    /// Empties the depot: each block leaves the cached count and goes, with its capacity,
    /// to `to`. Returns the bytes.
    pub(super) fn drain_depot(&self, mut to: impl FnMut(NonNull<u8>, usize)) -> usize {
        self.depot.drain(|block, class| {
            let capacity = class_size(class);
            self.books.uncached(capacity);
            to(block, capacity);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte offset of `class`'s link word in a block at address `at`.
    fn offset(at: usize, class: usize) -> usize {
        link(at as *mut u8, class) as usize - at
    }

    #[test]
    fn a_block_below_a_page_links_through_its_first_word() {
        assert_eq!(class_size(PAGE_CLASS), 4096);
        for class in 0..PAGE_CLASS {
            for at in (0x7f00_0000_0000usize..)
                .step_by(class_size(class))
                .take(300)
            {
                assert_eq!(offset(at, class), 0, "class {class} at {at:#x}");
            }
        }
    }

    #[test]
    fn a_block_of_a_page_or_more_links_within_its_first_page_at_a_word() {
        for class in PAGE_CLASS..NUM_CLASSES {
            let size = class_size(class);
            for at in (0x7f00_0000_0000usize..).step_by(size).take(200) {
                let off = offset(at, class);
                assert!(
                    off % 64 == 0 && off + 8 <= 4096.min(size),
                    "class {class}: {off}"
                );
            }
        }
    }

    #[test]
    fn consecutive_blocks_of_a_page_or_more_spread_their_links_over_64_lines() {
        for size in [4096usize, 5120, 8192, 65536, 1 << 20, 1 << 24] {
            let class = class_of(size).expect("a class");
            assert_eq!(class_size(class), size);
            let mut seen = [false; 64];
            for at in (0x7f00_0000_0000usize..).step_by(size).take(1000) {
                seen[offset(at, class) / 64] = true;
            }
            let colours = seen.iter().filter(|&&s| s).count();
            assert!(
                colours >= 48,
                "{size}-byte blocks use {colours} of 64 link lines"
            );
        }
    }
}
