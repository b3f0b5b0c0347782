//! Validity stamps: how memory handed out by a workspace knows whether it may still be
//! used (semantics §3).
//!
//! Invariant: a workspace's whole lifecycle state is one word ([`super::state`]:
//! `generation << 2 | DESTROYED | OPEN`) written only by the owning thread, so a [`Stamp`]
//! decides with one load: the memory is usable iff the word equals the word at allocation time (open, not
//! destroyed, same generation) and the caller is the owner thread. Circular workspaces only
//! test `DESTROYED`, and their stamps own a reference to the memory itself: a spill block,
//! or a counted reference to one slot of the ring, which the ring never reuses while the
//! count is above 0. So a consumer on another thread can never read freed memory, nor memory
//! being overwritten.
//!
//! A tensor handle does not load the stamp to check: it keeps the stamp's [`StampProbe`]
//! beside it. For a non-circular workspace that is the memory's *cycle word* (the
//! workspace's slot in its thread's table of open cycles, and an id unique to the cycle),
//! checked with one load of the calling thread's own table ([`cycle_word_passes`]): the
//! thread check comes with the table, as no other thread's table ever holds the word. A
//! circular workspace's probe is the address of a destroyed flag in the pool's hand-off
//! form. Either way the probe decides exactly as the stamp does, or (a workspace beyond
//! the table's slots, or the rare cycle past the ids a word can hold) defers to it.
//!
//! The `unsafe` items here make [`WorkspaceMemory`] `Send + Sync` (its pointer is a plain
//! address whose use is guarded by the stamp).

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use super::state::{generation_of, opened, StateWord, DESTROYED, OPEN};
use crate::error::Error;
use crate::memory::handoff::Handoff;
use crate::memory::MemorySource;

/// A number naming the calling thread, unique for the life of the process (never reused,
/// unlike addresses of thread-locals). Costs one thread-local read once assigned.
#[inline]
pub(crate) fn thread_token() -> u64 {
    let token = assigned_token();
    if token != 0 {
        token
    } else {
        TOKEN.with(assign_token)
    }
}

thread_local! {
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's token, or 0 if it was never assigned. Tokens start at 1, so 0
/// matches no owner: a thread that never owned a workspace needs no token to be refused.
#[inline(always)]
fn assigned_token() -> u64 {
    // A const, destructor-free thread-local is never torn down, so `with` cannot fail.
    TOKEN.with(Cell::get)
}

#[cold]
fn assign_token(slot: &Cell<u64>) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    slot.set(token);
    token
}

/// Entries in each thread's table of open cycles (see [`cycle_word_passes`]). Entry 0 is
/// never written, so a workspace without an entry of its own (its thread holds
/// `CYCLE_SLOTS - 1` others, or it is circular) has slot 0 and always takes the full
/// check.
const CYCLE_SLOTS: usize = 256;

/// Where the slot starts in a cycle word (bit 0 is always set; bits 1 and 2 are clear, so
/// the slot's bits are its entry's byte offset in the table).
const SLOT_SHIFT: u32 = 3;
/// Where the cycle id starts in a cycle word.
const ID_SHIFT: u32 = SLOT_SHIFT + CYCLE_SLOTS.trailing_zeros();
/// The largest cycle id a word holds.
const MAX_CYCLE_ID: usize = usize::MAX >> ID_SHIFT;

/// The cycle word no table entry ever holds (slot 0, id 0): that of memory whose
/// workspace has no slot, or was not open when it was allocated. Its check is the full one.
pub(crate) const NO_CYCLE_WORD: usize = 1;

/// How many cycle ids a thread takes from the process-wide counter at once.
const CYCLE_ID_BATCH: u64 = 1 << 10;

thread_local! {
    /// Entry `s`: the cycle word of the cycle running now in this thread's workspace with
    /// slot `s`, or 0 while it is closed (or the slot is free). Only this thread reads or
    /// writes its table.
    static OPEN_CYCLES: [Cell<usize>; CYCLE_SLOTS] =
        const { [const { Cell::new(0) }; CYCLE_SLOTS] };
    /// Slots of this thread's table held by a workspace (bit `s % 64` of word `s / 64`);
    /// slot 0 is never handed out.
    static SLOTS_HELD: Cell<[u64; CYCLE_SLOTS / 64]> = const { Cell::new([1, 0, 0, 0]) };
    /// The next cycle id this thread hands out, and the end of its batch.
    static CYCLE_IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Whether the calling thread's table holds `word` (a cycle word, bit 0 set): the check
/// of memory of a non-circular workspace, without a load of the workspace.
///
/// Why it decides as [`Stamp::is_valid`]: a cycle word names a workspace's slot and a
/// cycle id unique in the process, and an entry is written by its thread alone: with the
/// word of a cycle of its own workspace when that cycle opens, and with 0 when it closes
/// or the workspace is destroyed (which also frees the slot). So the caller's table holds
/// the memory's cycle word exactly while the caller is the owner thread and that cycle
/// runs, that is, while the state word equals the word at allocation time and the caller
/// is the owner. [`NO_CYCLE_WORD`] is never in a table: such memory takes the full check.
#[inline(always)]
pub(crate) fn cycle_word_passes(word: usize) -> bool {
    let slot = (word >> SLOT_SHIFT) % CYCLE_SLOTS;
    OPEN_CYCLES.with(|cycles| cycles[slot].get()) == word
}

/// A free slot of this thread's table, or 0 if all are held.
fn claim_slot() -> usize {
    SLOTS_HELD.with(|held| {
        let mut words = held.get();
        for (w, word) in words.iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = word.trailing_ones();
                *word |= 1 << bit;
                held.set(words);
                return w * 64 + bit as usize;
            }
        }
        0
    })
}

/// Gives slot `slot` of this thread's table back (nothing for slot 0).
fn release_slot(slot: usize) {
    if slot == 0 {
        return;
    }
    OPEN_CYCLES.with(|cycles| cycles[slot].set(0));
    SLOTS_HELD.with(|held| {
        let mut words = held.get();
        words[slot / 64] &= !(1 << (slot % 64));
        held.set(words);
    });
}

/// The process-wide counter cycle ids are taken from.
static NEXT_CYCLE_ID: AtomicU64 = AtomicU64::new(1);

/// A cycle id unique in the process, from 1; `None` once all that fit in a cycle word
/// are spent (from then on every cycle takes the full check). Threads take ids in
/// batches, so opening a cycle shares no cache line with other threads.
fn fresh_cycle_id() -> Option<usize> {
    CYCLE_IDS.with(|batch| take_cycle_id(&NEXT_CYCLE_ID, batch))
}

/// [`fresh_cycle_id`] from `counter`, through the thread's `batch` (next, end).
fn take_cycle_id(counter: &AtomicU64, batch: &Cell<(u64, u64)>) -> Option<usize> {
    let (mut next, mut end) = batch.get();
    if next == end {
        // The load keeps a spent counter from growing any further.
        if counter.load(Ordering::Relaxed) > MAX_CYCLE_ID as u64 {
            return None;
        }
        next = counter.fetch_add(CYCLE_ID_BATCH, Ordering::Relaxed);
        end = next + CYCLE_ID_BATCH;
    }
    batch.set((next + 1, end));
    usize::try_from(next).ok().filter(|&id| id <= MAX_CYCLE_ID)
}

/// The state of one workspace shared with every stamp of its memory.
pub(crate) struct Shared {
    id: Box<str>,
    owner_token: u64,
    owner: ThreadId,
    circular: bool,
    /// Where the workspace's memory comes from (and where copies out of it go).
    source: MemorySource,
    state: StateWord,
    /// This workspace's slot in its thread's table of open cycles (0: none, see
    /// [`cycle_word_passes`]); given back when the workspace is destroyed.
    slot: AtomicUsize,
    /// The cycle word of the cycle opened last; written and read by the owner thread only.
    cycle_word: AtomicUsize,
    /// A circular workspace's destroyed flag, in the form of a pool block's freed flag, so
    /// that its stamps' probe is the pool's check (freed exactly when `DESTROYED` is set).
    destroyed: Handoff,
    /// Live [`ViewPin`]s: borrowed views of this workspace's memory that must not see it
    /// recycled (non-circular workspaces only).
    views: AtomicUsize,
}

impl Shared {
    /// State of a new workspace of the calling thread: closed, generation 0.
    pub(crate) fn new(id: &str, circular: bool, source: MemorySource) -> Shared {
        Shared {
            id: id.into(),
            owner_token: thread_token(),
            owner: std::thread::current().id(),
            circular,
            source,
            state: StateWord::new(),
            slot: AtomicUsize::new(if circular { 0 } else { claim_slot() }),
            cycle_word: AtomicUsize::new(NO_CYCLE_WORD),
            destroyed: Handoff::new(),
            views: AtomicUsize::new(0),
        }
    }

    /// Live views of this workspace's memory.
    pub(crate) fn views(&self) -> usize {
        self.views.load(Ordering::Acquire)
    }

    /// The workspace id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Marks the start of cycle `generation` (owner thread only), under a fresh cycle id.
    pub(crate) fn open(&self, generation: u64) {
        self.state.open(generation);
        let slot = self.slot.load(Ordering::Relaxed);
        let word = match fresh_cycle_id() {
            Some(id) if slot != 0 => id << ID_SHIFT | slot << SLOT_SHIFT | 1,
            _ => NO_CYCLE_WORD,
        };
        self.cycle_word.store(word, Ordering::Relaxed);
        self.set_open_cycle(if word == NO_CYCLE_WORD { 0 } else { word });
    }

    /// Marks the end of the current cycle (owner thread only).
    pub(crate) fn close(&self, generation: u64) {
        self.state.close(generation);
        self.set_open_cycle(0);
    }

    /// Marks the workspace destroyed, for good (owner thread only), and gives its slot
    /// back.
    pub(crate) fn destroy(&self) {
        self.state.destroy();
        release_slot(self.slot.swap(0, Ordering::Relaxed));
        // `free` reports whether a view was counted on the flag; none ever is.
        let _ = self.destroyed.free();
    }

    /// Whether this workspace holds a slot of its thread's table of open cycles.
    #[cfg(test)]
    pub(crate) fn has_slot(&self) -> bool {
        self.slot.load(Ordering::Relaxed) != 0
    }

    /// Writes this workspace's entry of the (owner) thread's table of open cycles.
    fn set_open_cycle(&self, word: usize) {
        let slot = self.slot.load(Ordering::Relaxed);
        if slot != 0 {
            OPEN_CYCLES.with(|cycles| cycles[slot].set(word));
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.load();
        f.debug_struct("Shared")
            .field("id", &self.id)
            .field("owner", &self.owner)
            .field("circular", &self.circular)
            .field("generation", &generation_of(state))
            .field("open", &(state & OPEN != 0))
            .field("destroyed", &(state & DESTROYED != 0))
            .finish()
    }
}

/// Something that keeps memory alive while a stamp of a circular workspace exists.
pub(crate) type KeepAlive = Arc<dyn Send + Sync>;

/// Keeps a workspace from recycling memory a borrowed view reads (see [`Stamp::pin_view`]).
#[derive(Debug)]
pub struct ViewPin {
    shared: Option<Arc<Shared>>,
}

impl Drop for ViewPin {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.views.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A cheap, clonable validity token for workspace memory (semantics §3): the workspace's
/// shared state and the generation the memory was allocated in. `Send + Sync`, so a tensor
/// may carry it to another thread, where [`Stamp::check`] refuses it unless the workspace
/// is circular.
#[derive(Clone)]
pub struct Stamp {
    shared: Arc<Shared>,
    /// The state word at allocation time: `generation << 2 | OPEN`.
    expected: u64,
    /// What the check compares, kept beside `expected` so the check reads one line of the
    /// stamp and one word of the workspace: valid iff `state & state_mask == expected &
    /// state_mask` and `(thread_token() ^ owner_token) & token_mask == 0`. Non-circular:
    /// the whole word must equal `expected`, on the owner thread. Circular: only
    /// `DESTROYED` must be clear (it is clear in `expected`), on any thread.
    state_mask: u64,
    owner_token: u64,
    token_mask: u64,
    /// The cycle word of the cycle the memory was allocated in ([`NO_CYCLE_WORD`] if the
    /// workspace was not open), for [`cycle_word_passes`].
    cycle_word: usize,
    /// For circular workspaces: the buffer or spill block holding the memory.
    keep_alive: Option<KeepAlive>,
}

impl Stamp {
    /// A stamp for memory allocated now, in cycle `generation` of the workspace.
    pub(crate) fn new(
        shared: Arc<Shared>,
        generation: u64,
        keep_alive: Option<KeepAlive>,
    ) -> Stamp {
        let expected = opened(generation);
        let circular = shared.circular;
        // Made on the owner thread, during the allocation: the cycle word is this cycle's.
        let cycle_word = if shared.state.load() == expected {
            shared.cycle_word.load(Ordering::Relaxed)
        } else {
            NO_CYCLE_WORD
        };
        Stamp {
            expected,
            cycle_word,
            state_mask: if circular { DESTROYED } else { u64::MAX },
            owner_token: shared.owner_token,
            token_mask: if circular { 0 } else { u64::MAX },
            shared,
            keep_alive,
        }
    }

    /// Semantics §3: `Ok` if the memory may be used now from this thread; otherwise
    /// [`Error::LeakedWorkspacePointer`] (workspace left or destroyed),
    /// [`Error::OutdatedWorkspacePointer`] (a newer cycle started) or [`Error::WrongThread`],
    /// naming `op`, `arg` and the workspace.
    ///
    /// One atomic load and a thread-token compare. Circular workspaces are exempt from the
    /// open/generation and thread checks: only "destroyed" is an error (their memory stays
    /// valid until the ring wraps over it, which it does not while this stamp lives).
    #[inline]
    pub fn check(&self, op: &str, arg: &str) -> Result<(), Error> {
        if self.is_valid() {
            return Ok(());
        }
        Err(self.refusal(self.shared.state.load(), op, arg))
    }

    /// [`Stamp::check`] without the error: one atomic load and a thread-token compare.
    #[inline(always)]
    pub fn is_valid(&self) -> bool {
        decide(
            self.shared.state.load(),
            self.state_mask,
            self.expected & self.state_mask,
            self.owner_token,
            self.token_mask,
        )
    }

    /// This stamp's check in the form a tensor handle keeps beside it (see
    /// [`StampProbe`]).
    pub(crate) fn probe(&self) -> StampProbe {
        if self.shared.circular {
            StampProbe::Flag(NonNull::from(&self.shared.destroyed))
        } else {
            StampProbe::Cycle(self.cycle_word)
        }
    }

    #[cold]
    fn refusal(&self, state: u64, op: &str, arg: &str) -> Error {
        let workspace = self.shared.id.to_string();
        if state & DESTROYED != 0 || state & OPEN == 0 {
            return Error::LeakedWorkspacePointer {
                op: op.to_string(),
                arg: arg.to_string(),
                workspace,
            };
        }
        if state != self.expected {
            return Error::OutdatedWorkspacePointer {
                op: op.to_string(),
                arg: arg.to_string(),
                workspace,
                allocated_in: self.generation(),
                current: generation_of(state),
            };
        }
        Error::WrongThread {
            op: op.to_string(),
            arg: arg.to_string(),
            workspace,
            owner: self.shared.owner,
            current: std::thread::current().id(),
        }
    }

    /// Pins the memory for a borrowed view: while the pin lives, the workspace refuses to
    /// start a new cycle (which would write over the memory) or to be destroyed, and keeps
    /// its spills and buffer. Circular workspaces need no pin: the stamp itself keeps their
    /// memory alive and its ring slot out of use.
    pub fn pin_view(&self) -> ViewPin {
        ViewPin {
            shared: (!self.shared.circular).then(|| {
                self.shared.views.fetch_add(1, Ordering::AcqRel);
                self.shared.clone()
            }),
        }
    }

    /// The id of the workspace the memory lives in.
    pub fn workspace_id(&self) -> &str {
        &self.shared.id
    }

    /// The memory source of the workspace the memory lives in.
    pub fn source(&self) -> MemorySource {
        self.shared.source
    }

    /// The generation (cycle number, from 1) the memory was allocated in.
    pub fn generation(&self) -> u64 {
        generation_of(self.expected)
    }

    /// Whether the workspace is circular ([`crate::ResetPolicy::EndOfBuffer`]).
    pub fn is_circular(&self) -> bool {
        self.shared.circular
    }

    /// Whether this memory lives in the workspace `id` of this thread (the same workspace,
    /// not one created later under the same id), for leverage's "unchanged if it already
    /// lives there".
    ///
    /// A workspace leaves its thread's list only by being destroyed, and a destroyed one
    /// never opens again, so "this thread's workspace `id` is this stamp's" is "this stamp's
    /// workspace has id `id`, belongs to this thread and is not destroyed".
    pub fn is_in(&self, id: &str) -> bool {
        &*self.shared.id == id
            && self.shared.owner_token == thread_token()
            && self.shared.state.load() & DESTROYED == 0
    }

    /// Whether two stamps come from the same workspace (and so the same thread).
    pub fn same_workspace(&self, other: &Stamp) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// The decision of semantics §3 on one load of the state word: the masked word equals the
/// masked word at allocation time, and (unless the workspace is circular) the calling
/// thread is the owner. Branch-free: both tests always run, and `&` (not `&&`) keeps it so.
#[inline(always)]
fn decide(state: u64, state_mask: u64, expected: u64, owner_token: u64, token_mask: u64) -> bool {
    (state & state_mask == expected) & ((assigned_token() ^ owner_token) & token_mask == 0)
}

/// A [`Stamp`]'s check in the form a tensor handle keeps beside it, so that the check
/// reads the handle and one more word, never the stamp or its workspace first.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StampProbe {
    /// A non-circular workspace's memory: its cycle word, for [`cycle_word_passes`]
    /// (valid if it passes; [`NO_CYCLE_WORD`] never passes, and then only the stamp can
    /// tell).
    Cycle(usize),
    /// A circular workspace's memory: valid from any thread while this flag (freed when
    /// the workspace is destroyed) is not freed, the form of a pool block's check.
    Flag(NonNull<Handoff>),
}

impl fmt::Debug for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stamp")
            .field("workspace", &self.shared.id)
            .field("generation", &self.generation())
            .field("circular", &self.shared.circular)
            .field("keeps_memory_alive", &self.keep_alive.is_some())
            .finish()
    }
}

/// Where a workspace allocation lives and how to check it is still valid.
///
/// The pointer is only a location: dereferencing it is the caller's business (under
/// `unsafe`, after [`Stamp::check`] returned `Ok` on the thread doing the access).
#[derive(Debug, Clone)]
pub struct WorkspaceMemory {
    /// The first byte, aligned to at least the requested alignment and the workspace's.
    pub ptr: NonNull<u8>,
    /// Bytes requested (0 for a zero-size request, whose pointer is dangling).
    pub len: usize,
    /// The validity token.
    pub stamp: Stamp,
}

// SAFETY: the pointer in a WorkspaceMemory is a plain address; every access through it is
// an `unsafe` operation of the holder that must be preceded by `Stamp::check` (which refuses
// non-owner threads for non-circular workspaces), and the Stamp itself is Send + Sync.
unsafe impl Send for WorkspaceMemory {}
// SAFETY: as above; `&WorkspaceMemory` exposes only copies of the address and the stamp.
unsafe impl Sync for WorkspaceMemory {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_tokens_differ_between_threads_and_are_stable() {
        let here = thread_token();
        assert_eq!(here, thread_token());
        let there = std::thread::spawn(thread_token).join().unwrap();
        assert_ne!(here, there);
        assert_ne!(here, 0);
    }

    #[test]
    fn cycle_ids_are_unique_across_batches_and_run_out_cleanly() {
        let counter = AtomicU64::new(1);
        let (a, b) = (Cell::new((0, 0)), Cell::new((0, 0)));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 * CYCLE_ID_BATCH {
            assert!(seen.insert(take_cycle_id(&counter, &a).unwrap()));
            assert!(seen.insert(take_cycle_id(&counter, &b).unwrap()));
        }
        assert!(!seen.contains(&0));
        // Near the end: the last ids that fit are handed out, then none, and the counter
        // stops growing.
        let counter = AtomicU64::new(MAX_CYCLE_ID as u64 - 1);
        let batch = Cell::new((0, 0));
        assert_eq!(take_cycle_id(&counter, &batch), Some(MAX_CYCLE_ID - 1));
        assert_eq!(take_cycle_id(&counter, &batch), Some(MAX_CYCLE_ID));
        assert_eq!(
            take_cycle_id(&counter, &batch),
            None,
            "past the word's room"
        );
        let spent = counter.load(Ordering::Relaxed);
        let other = Cell::new((0, 0));
        assert_eq!(take_cycle_id(&counter, &other), None);
        assert_eq!(counter.load(Ordering::Relaxed), spent);
    }

    #[test]
    fn a_cycle_word_names_its_slot_and_never_a_free_entry() {
        for (id, slot) in [(1, 1), (MAX_CYCLE_ID, CYCLE_SLOTS - 1), (12345, 77)] {
            let word = id << ID_SHIFT | slot << SLOT_SHIFT | 1;
            assert_eq!((word >> SLOT_SHIFT) % CYCLE_SLOTS, slot);
            assert_eq!(word >> ID_SHIFT, id);
            assert_ne!(word, 0, "a free or closed entry holds 0");
        }
        // NO_CYCLE_WORD names slot 0, whose entry is never written.
        assert_eq!((NO_CYCLE_WORD >> SLOT_SHIFT) % CYCLE_SLOTS, 0);
        assert!(!cycle_word_passes(NO_CYCLE_WORD));
    }

    #[test]
    fn is_in_names_only_the_live_workspace_of_this_thread() {
        let shared = Arc::new(Shared::new("T", false, MemorySource::global()));
        shared.open(1);
        let stamp = Stamp::new(shared.clone(), 1, None);
        assert!(stamp.is_in("T"));
        assert!(!stamp.is_in("U"), "another id");
        let there = stamp.clone();
        assert!(!std::thread::spawn(move || there.is_in("T")).join().unwrap());
        shared.close(1);
        assert!(
            stamp.is_in("T"),
            "left, not destroyed: still the same workspace"
        );
        shared.destroy();
        assert!(
            !stamp.is_in("T"),
            "a later workspace T would be another one"
        );
    }

    /// A probe's fast answer, through the form a tensor handle keeps and checks.
    ///
    /// # Safety
    /// The stamp the probe was made from is alive.
    unsafe fn passes(probe: StampProbe) -> bool {
        // SAFETY: the caller keeps the stamp, and so what the probe names, alive.
        unsafe { crate::memory::home::Probe::from(probe).passes() }
    }

    #[test]
    fn a_probe_decides_as_its_stamp_does() {
        for circular in [false, true] {
            let shared = Arc::new(Shared::new("P", circular, MemorySource::global()));
            shared.open(1);
            let stamp = Stamp::new(shared.clone(), 1, None);
            let probe = stamp.probe();
            // SAFETY: `stamp` lives for the whole closure's use.
            let agree = || unsafe { passes(probe) } == stamp.is_valid();
            assert!(agree() && stamp.is_valid());
            let there = stamp.clone();
            let (valid, probed) = std::thread::spawn(move || {
                let probe = there.probe();
                // SAFETY: `there` lives until the end of this closure.
                (there.is_valid(), unsafe { passes(probe) })
            })
            .join()
            .unwrap();
            assert_eq!((valid, probed), (circular, circular));
            for step in [
                |s: &Shared| s.close(1),
                |s: &Shared| s.open(2),
                |s: &Shared| s.destroy(),
            ] {
                step(&shared);
                assert!(agree(), "circular {circular}: {shared:?}");
            }
            assert!(!stamp.is_valid());
        }
    }

    #[test]
    fn a_stamp_follows_the_state_word() {
        let shared = Arc::new(Shared::new("T", false, MemorySource::global()));
        shared.open(1);
        let stamp = Stamp::new(shared.clone(), 1, None);
        assert!(stamp.check("op", "X").is_ok());
        shared.close(1);
        assert!(matches!(
            stamp.check("op", "X"),
            Err(Error::LeakedWorkspacePointer { .. })
        ));
        shared.open(2);
        assert!(matches!(
            stamp.check("op", "X"),
            Err(Error::OutdatedWorkspacePointer {
                allocated_in: 1,
                current: 2,
                ..
            })
        ));
        shared.destroy();
        assert!(matches!(
            stamp.check("op", "X"),
            Err(Error::LeakedWorkspacePointer { .. })
        ));
    }
}
