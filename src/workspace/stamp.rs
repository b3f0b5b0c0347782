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
//! The `unsafe` items here make [`WorkspaceMemory`] `Send + Sync` (its pointer is a plain
//! address whose use is guarded by the stamp) and let a [`StampProbe`] (the check with the
//! state word's address in place of the stamp, kept beside a tensor handle) load the word
//! while its caller keeps the stamp alive. The probe decides exactly as the stamp does.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use super::state::{generation_of, opened, StateWord, DESTROYED, OPEN};
use crate::error::Error;
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

/// The state of one workspace shared with every stamp of its memory.
pub(crate) struct Shared {
    id: Box<str>,
    owner_token: u64,
    owner: ThreadId,
    circular: bool,
    /// Where the workspace's memory comes from (and where copies out of it go).
    source: MemorySource,
    state: StateWord,
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

    /// Marks the start of cycle `generation`.
    pub(crate) fn open(&self, generation: u64) {
        self.state.open(generation);
    }

    /// Marks the end of the current cycle.
    pub(crate) fn close(&self, generation: u64) {
        self.state.close(generation);
    }

    /// Marks the workspace destroyed, for good.
    pub(crate) fn destroy(&self) {
        self.state.destroy();
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
        Stamp {
            expected,
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

    /// This stamp's check, unpacked to sit beside a handle to the memory: the address of
    /// the state word and what to compare it with, so the check reads the word directly
    /// instead of through the stamp and its `Arc` (see [`StampProbe`]).
    pub(crate) fn probe(&self) -> StampProbe {
        StampProbe {
            word: NonNull::from(&self.shared.state),
            expected: self.expected,
            // Tokens start at 1: 0 marks a circular workspace's probe.
            owner_token: if self.shared.circular {
                0
            } else {
                self.owner_token
            },
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

/// A [`Stamp`]'s check with the address of the workspace's state word in place of the
/// stamp: a handle that keeps the stamp alive (in the memory's header) and this probe
/// beside it checks with one load of its own fields and one of the word, the same number
/// of dependent loads as a pool block's freed bit. The decision is [`Stamp::is_valid`]'s,
/// on the same word, so the invariant above holds unchanged; only its form is the one for
/// the kind of workspace: for a non-circular one, the word equals `expected` and the
/// caller's token is `owner_token`; for a circular one (`owner_token` 0, which no thread
/// has), `DESTROYED` is clear.
#[derive(Clone, Copy)]
pub(crate) struct StampProbe {
    word: NonNull<StateWord>,
    /// The word at allocation time.
    expected: u64,
    /// The owner thread's token; 0 for a circular workspace (any thread).
    owner_token: u64,
}

impl StampProbe {
    /// [`Stamp::is_valid`] of the stamp this probe was made from.
    ///
    /// # Safety
    /// That stamp, or a clone of it, is alive: it holds the `Arc` the word lives in.
    #[inline(always)]
    pub(crate) unsafe fn is_valid(&self) -> bool {
        // SAFETY: the caller keeps a clone of the stamp alive, and with it the `Shared`
        // that holds the word (an `Arc` allocation, which never moves).
        let state = unsafe { self.word.as_ref() }.load();
        if self.owner_token != 0 {
            // Branch-free: both tests always run.
            (state ^ self.expected) | (assigned_token() ^ self.owner_token) == 0
        } else {
            state & DESTROYED == 0
        }
    }
}

impl fmt::Debug for StampProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StampProbe")
            .field("expected", &self.expected)
            .field("circular", &(self.owner_token == 0))
            .finish()
    }
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

    #[test]
    fn a_probe_decides_as_its_stamp_does() {
        for circular in [false, true] {
            let shared = Arc::new(Shared::new("P", circular, MemorySource::global()));
            shared.open(1);
            let stamp = Stamp::new(shared.clone(), 1, None);
            let probe = stamp.probe();
            // SAFETY: `stamp` lives for the whole closure's use.
            let agree = || unsafe { probe.is_valid() } == stamp.is_valid();
            assert!(agree() && stamp.is_valid());
            let there = stamp.clone();
            let (valid, probed) = std::thread::spawn(move || {
                let probe = there.probe();
                // SAFETY: `there` lives until the end of this closure.
                (there.is_valid(), unsafe { probe.is_valid() })
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
