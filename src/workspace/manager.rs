//! The per-thread workspace manager: which workspaces this thread has, which one is
//! current, nesting and parents, guards, statistics, and cleanup at thread exit
//! (semantics §2.2, §2.5).
//!
//! Invariant: the stack of entered workspaces holds exactly one entry per live guard
//! (a workspace, or "none" for a [`ScopeOut`] guard), each with a token its guard alone
//! holds, so a guard dropped out of order removes its own entry and no other; the current
//! workspace is the top entry's. Guards are `!Send`, so entries are pushed and removed on the thread that owns
//! them; when the thread exits, the manager's destructor destroys every workspace it
//! still knows, which frees their memory.
//!
//! The process-wide registry ([`all_workspaces`], semantics §7) holds one [`Published`]
//! copy of the figures of every live workspace of every thread: a workspace joins it when
//! it is created and leaves it when it is destroyed (or its thread exits), and its thread
//! republishes its figures at every leave (and the new generation at every enter). The
//! bump path never touches it.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};

use ndmem_alloc::trace::{self, EventKind, Space};

use super::arena::Arena;
use super::config::{debug_mode, WorkspaceConfig};
use super::stamp::WorkspaceMemory;
use super::stats::{Figures, Published, WorkspaceStats};
use crate::error::Error;
use crate::memory::MemorySource;

/// What one thread knows about its workspaces.
struct Manager {
    /// Every workspace of the thread, in creation order.
    workspaces: RefCell<Vec<Rc<Arena>>>,
    /// One entry per live guard, in the order they were made.
    stack: RefCell<Vec<Entry>>,
    /// The token of the next entry: each guard removes its own entry, whatever order the
    /// guards drop in.
    next: Cell<u64>,
}

/// A live guard's stack entry: its workspace (`None` for a scope-out guard) and the
/// token the guard carries to remove it.
struct Entry {
    token: u64,
    arena: Option<Rc<Arena>>,
}

impl Manager {
    const fn new() -> Manager {
        Manager {
            workspaces: RefCell::new(Vec::new()),
            stack: RefCell::new(Vec::new()),
            next: Cell::new(0),
        }
    }

    /// Pushes an entry for a new guard (`None`: a scope-out guard); returns its token.
    fn push(&self, arena: Option<Rc<Arena>>) -> u64 {
        let token = self.next.get();
        self.next.set(token.wrapping_add(1));
        self.stack.borrow_mut().push(Entry { token, arena });
        token
    }

    /// The current workspace: the top entry's (`None` with no entry or a scope-out on
    /// top).
    fn current(&self) -> Option<Rc<Arena>> {
        self.stack.borrow().last().and_then(|e| e.arena.clone())
    }

    /// Adds `arena` to this thread's list and to the registry.
    fn add(&self, arena: &Rc<Arena>) {
        arena.publish();
        lock_registry().push(Arc::clone(arena.published()));
        self.workspaces.borrow_mut().push(Rc::clone(arena));
    }

    /// Removes the workspace at `position` from this thread's list and the registry.
    fn remove(&self, position: usize) -> Rc<Arena> {
        let arena = self.workspaces.borrow_mut().remove(position);
        lock_registry().retain(|p| !Arc::ptr_eq(p, arena.published()));
        arena
    }

    fn find(&self, id: &str) -> Option<Rc<Arena>> {
        self.workspaces
            .borrow()
            .iter()
            .find(|a| same_id(a.id(), id))
            .cloned()
    }

    /// Removes the entry of the guard that holds `token` (nothing if it is gone already:
    /// the thread's manager was torn down).
    fn pop(&self, token: u64) {
        let mut stack = self.stack.borrow_mut();
        // Guards usually drop innermost first: the top goes without a search or a move.
        let popped = match stack.last() {
            Some(top) if top.token == token => stack.pop(),
            _ => stack
                .iter()
                .rposition(|e| e.token == token)
                .map(|position| stack.remove(position)),
        };
        drop(stack);
        drop(popped);
    }
}

/// `a == b`, without a call to the C library's `memcmp` for the short ids workspaces
/// have: the lengths, then eight bytes at a time (entering a workspace looks it up by id at
/// every cycle).
#[inline]
fn same_id(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let (mut a_words, mut b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().expect("8 bytes"));
    for (x, y) in a_words.by_ref().zip(b_words.by_ref()) {
        if word(x) != word(y) {
            return false;
        }
    }
    let (a_tail, b_tail) = (a_words.remainder(), b_words.remainder());
    a_tail.iter().zip(b_tail).all(|(x, y)| x == y)
}

impl Drop for Manager {
    fn drop(&mut self) {
        // semantics §2.2 Decision: a thread's workspaces are freed when it exits. A view that
        // outlives its thread (one kept in another thread-local, say) still reads its
        // workspace's memory: that workspace is invalidated but its memory is leaked, never
        // freed under the view.
        let mine = self.workspaces.get_mut();
        lock_registry().retain(|p| !mine.iter().any(|a| Arc::ptr_eq(p, a.published())));
        for arena in self.workspaces.get_mut().drain(..) {
            if arena.shared().views() > 0 {
                arena.shared().destroy();
                std::mem::forget(arena);
            } else {
                arena.destroy();
            }
        }
        self.stack.get_mut().clear();
    }
}

thread_local! {
    static MANAGER: Manager = const { Manager::new() };
}

/// Every live workspace of every thread (semantics §7).
static REGISTRY: Mutex<Vec<Arc<Published>>> = Mutex::new(Vec::new());

fn lock_registry() -> std::sync::MutexGuard<'static, Vec<Arc<Published>>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The statistics of every live workspace of every thread, with the owning thread
/// (`name (ThreadId(n))`), in creation order (semantics §7). The calling thread's figures
/// are exact; another thread's are those it published when it last left the workspace,
/// with the generation and `open` of its last enter (so `used` and `spilled_bytes` of a
/// cycle running there lag).
pub fn all_workspaces() -> Vec<(String, WorkspaceStats)> {
    all_workspaces_with_source()
        .into_iter()
        .map(|w| (w.thread, w.stats))
        .collect()
}

/// One entry of [`all_workspaces_with_source`].
pub(crate) struct WorkspaceEntry {
    /// The owning thread, as `name (ThreadId(n))`.
    pub(crate) thread: String,
    pub(crate) stats: WorkspaceStats,
    pub(crate) source: MemorySource,
    /// Whether the calling thread owns it (its figures are exact; another thread's running
    /// cycle shows `used` as of its start).
    pub(crate) mine: bool,
}

/// [`all_workspaces`] with each workspace's memory source and whether it is the calling
/// thread's.
pub(crate) fn all_workspaces_with_source() -> Vec<WorkspaceEntry> {
    let _ = MANAGER.try_with(|m| {
        if let Ok(list) = m.workspaces.try_borrow() {
            for arena in list.iter() {
                arena.publish();
            }
        }
    });
    lock_registry()
        .iter()
        .map(|p| WorkspaceEntry {
            thread: p.thread().to_string(),
            stats: p.load(),
            source: p.source(),
            mine: p.is_this_threads(),
        })
        .collect()
}

/// Records the end of a cycle and what learning did at it (semantics §7).
fn trace_cycle_end(arena: &Arena, before: &Figures, after: &Figures) {
    if after.cycles == before.cycles {
        return;
    }
    let name = arena.trace_name();
    let bytes = (before.used + before.spilled_bytes) as u64;
    trace::record(
        EventKind::CycleEnd,
        Space::Workspace,
        name,
        bytes,
        after.size as u64,
    );
    if after.size > before.size {
        let kind = if before.size == 0 {
            EventKind::Learn
        } else {
            EventKind::Reallocate
        };
        trace::record(
            kind,
            Space::Workspace,
            name,
            after.size as u64,
            after.size as u64,
        );
    }
}

fn thread_exiting(workspace: &str) -> Error {
    Error::WorkspaceNotOpen {
        workspace: workspace.to_string(),
        reason: "the thread is exiting and its workspaces are gone",
    }
}

/// This thread's workspace manager (semantics §2.5). The handle is `!Send`: every thread
/// has its own workspaces.
///
/// ND4J: `Nd4j.getWorkspaceManager()`.
///
/// ```
/// use ndmem::WorkspaceConfig;
///
/// let ws = ndmem::workspaces();
/// let cfg = WorkspaceConfig::default();
/// for _ in 0..3 {
///     let guard = ws.get_and_activate(&cfg, "LOOP")?;
///     let mut v = allocator_api2::vec::Vec::new_in(&guard);
///     v.extend_from_slice(&[1.0f32; 256]);
///     assert_eq!(ws.current().as_deref(), Some("LOOP"));
/// } // each iteration is one cycle; the first one learns the size
/// let stats = ws.workspace("LOOP").unwrap();
/// assert!(stats.size >= 1024 && stats.cycles == 3);
/// ws.destroy("LOOP")?;
/// # Ok::<(), ndmem::Error>(())
/// ```
pub fn workspaces() -> Workspaces {
    Workspaces {
        _not_send: PhantomData,
    }
}

/// The calling thread's workspace manager; see [`workspaces`].
#[derive(Debug, Clone, Copy)]
pub struct Workspaces {
    _not_send: PhantomData<*const ()>,
}

impl Workspaces {
    /// Enters the workspace `id` of this thread, creating it with `config` on first use,
    /// and returns the guard whose drop leaves it (semantics §2.2). A new cycle starts
    /// (generation + 1, BlockLeft rewinds) unless the workspace is already open on this
    /// thread, in which case only its nesting counter rises. The workspace that was current
    /// becomes its parent (semantics §2.5).
    ///
    /// An existing workspace keeps the configuration it was created with, its memory
    /// source included: `config` is read only when the workspace is created. Fails on an
    /// invalid `NDMEM_WORKSPACES`, or if the initial buffer cannot be obtained.
    ///
    /// ND4J: `getAndActivateWorkspace(config, id)`.
    pub fn get_and_activate(
        &self,
        config: &WorkspaceConfig,
        id: &str,
    ) -> Result<WorkspaceGuard, Error> {
        let mode = debug_mode()?;
        MANAGER
            .try_with(|m| {
                let arena = match m.find(id) {
                    Some(arena) => arena,
                    None => {
                        let arena = Rc::new(Arena::new(id, config, mode)?);
                        m.add(&arena);
                        arena
                    }
                };
                arena.enter(m.current().as_ref())?;
                let token = m.push(Some(Rc::clone(&arena)));
                arena.publish_entered();
                Ok(WorkspaceGuard {
                    arena,
                    token,
                    _not_send: PhantomData,
                })
            })
            .unwrap_or_else(|_| Err(thread_exiting(id)))
    }

    /// A guard during which no workspace is current, so allocations go to the pool
    /// (semantics §2.5). ND4J: `scopeOutOfWorkspaces()`.
    pub fn scope_out(&self) -> ScopeOut {
        let token = MANAGER.try_with(|m| m.push(None)).unwrap_or(u64::MAX);
        ScopeOut {
            token,
            _not_send: PhantomData,
        }
    }

    /// The id of this thread's current workspace, if any. ND4J: `getCurrentWorkspace()`.
    pub fn current(&self) -> Option<String> {
        MANAGER
            .try_with(|m| m.current().map(|a| a.id().to_string()))
            .ok()
            .flatten()
    }

    /// Whether this thread has a workspace `id`. ND4J: `checkIfWorkspaceExists(id)`.
    pub fn exists(&self, id: &str) -> bool {
        MANAGER.try_with(|m| m.find(id).is_some()).unwrap_or(false)
    }

    /// Statistics of this thread's workspace `id`, if it exists. ND4J: `getWorkspaceForCurrentThread(id)`.
    pub fn workspace(&self, id: &str) -> Option<WorkspaceStats> {
        MANAGER
            .try_with(|m| m.find(id).map(|a| a.stats()))
            .ok()
            .flatten()
    }

    /// Statistics of every workspace of this thread, in creation order.
    pub fn statistics(&self) -> Vec<WorkspaceStats> {
        MANAGER
            .try_with(|m| m.workspaces.borrow().iter().map(|a| a.stats()).collect())
            .unwrap_or_default()
    }

    /// The statistics as a table, one line per workspace. ND4J: `printAllocationStatistics()`.
    pub fn allocation_statistics(&self) -> String {
        let stats = self.statistics();
        let mut out = format!(
            "Workspaces of thread {:?}: {}\n",
            std::thread::current().id(),
            stats.len()
        );
        for s in &stats {
            out.push_str(&s.to_string());
            out.push('\n');
        }
        out
    }

    /// Prints [`Workspaces::allocation_statistics`] to standard output.
    pub fn print_allocation_statistics(&self) {
        print!("{}", self.allocation_statistics());
    }

    /// Destroys this thread's workspace `id`: its memory is freed (at once, or when its last
    /// guard leaves if it is open) and memory it handed out becomes invalid (semantics §2.2,
    /// §3). A later `get_and_activate` with the same id creates a new workspace.
    /// ND4J: `destroyWorkspace(ws)`.
    pub fn destroy(&self, id: &str) -> Result<(), Error> {
        let arena = MANAGER
            .try_with(|m| {
                let list = m.workspaces.borrow();
                let position = list.iter().position(|a| a.id() == id)?;
                let views = list[position].shared().views();
                drop(list);
                if views > 0 {
                    return Some(Err(Error::WorkspaceInUse {
                        workspace: id.to_string(),
                        action: "be destroyed",
                        views,
                    }));
                }
                Some(Ok(m.remove(position)))
            })
            .ok()
            .flatten()
            .ok_or_else(|| Error::NoSuchWorkspace {
                workspace: id.to_string(),
            })??;
        arena.destroy();
        Ok(())
    }

    /// Destroys every workspace of this thread; returns how many there were.
    /// ND4J: `destroyAllWorkspacesForCurrentThread()`.
    ///
    /// A workspace whose memory a live view still reads is kept (it is freed when the
    /// thread exits, or by a later call once the view is gone).
    pub fn destroy_all_for_current_thread(&self) -> usize {
        let all: Vec<Rc<Arena>> = MANAGER
            .try_with(|m| {
                let mut idle = Vec::new();
                let mut i = 0;
                while i < m.workspaces.borrow().len() {
                    if m.workspaces.borrow()[i].shared().views() > 0 {
                        i += 1;
                    } else {
                        idle.push(m.remove(i));
                    }
                }
                idle
            })
            .unwrap_or_default();
        for arena in &all {
            arena.destroy();
        }
        all.len()
    }
}

/// The guard of one entry into a workspace: while it lives the workspace is open (and
/// current unless another was entered since); dropping it leaves the workspace, and the
/// last guard of a cycle ends the cycle (semantics §2.2).
///
/// `&WorkspaceGuard` is an [`allocator_api2::alloc::Allocator`]: collections built on it
/// live in the workspace and, by borrowing the guard, cannot outlive the cycle.
///
/// ```
/// use allocator_api2::vec::Vec;
///
/// let ws = ndmem::workspaces();
/// let guard = ws.get_and_activate(&ndmem::WorkspaceConfig::default(), "DOC_GUARD")?;
/// let mut squares: Vec<u64, _> = Vec::new_in(&guard);
/// squares.extend((0..100u64).map(|i| i * i));
/// assert_eq!(squares[99], 9801);
/// // drop(guard) here would not compile: `squares` borrows it.
/// # drop(squares);
/// # Ok::<(), ndmem::Error>(())
/// ```
///
/// Values allocated through the guard cannot outlive it, so they cannot see the cycle end:
///
/// ```compile_fail,E0505
/// let ws = ndmem::workspaces();
/// let guard = ws.get_and_activate(&ndmem::WorkspaceConfig::default(), "DOC_BORROW").unwrap();
/// let v = allocator_api2::vec::Vec::<u8, _>::new_in(&guard);
/// drop(guard); // error[E0505]: cannot move out of `guard` because it is borrowed
/// drop(v);
/// ```
///
/// and a guard stays on the thread that owns the workspace:
///
/// ```compile_fail,E0277
/// fn send<T: Send>(_: T) {}
/// let ws = ndmem::workspaces();
/// send(ws.get_and_activate(&ndmem::WorkspaceConfig::default(), "DOC_SEND").unwrap());
/// ```
///
/// ND4J: the `MemoryWorkspace` returned by `notifyScopeEntered`, closed by `close()`.
pub struct WorkspaceGuard {
    arena: Rc<Arena>,
    /// Its entry in the thread's stack.
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl WorkspaceGuard {
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The workspace id.
    pub fn id(&self) -> &str {
        self.arena.id()
    }

    /// Allocates `layout` in the workspace: a bump in its buffer, or a spill by policy
    /// (semantics §2.2). The memory is valid until the cycle ends.
    ///
    /// Zero-size requests succeed with a dangling pointer aligned to
    /// max(alignment, `layout.align()`) that takes no workspace bytes. Requests whose
    /// padded size overflows fail with [`Error::Alloc`] (`InvalidLayout`); a full
    /// workspace with [`crate::SpillPolicy::Fail`] fails with [`Error::WorkspaceFull`]
    /// and leaves the offset unchanged; a destroyed workspace fails with
    /// [`Error::WorkspaceNotOpen`].
    #[inline]
    pub fn alloc(&self, layout: Layout) -> Result<NonNull<[u8]>, Error> {
        self.arena.alloc(layout)
    }

    /// [`WorkspaceGuard::alloc`] returning the memory with its validity [`super::Stamp`].
    pub fn alloc_memory(&self, layout: Layout) -> Result<WorkspaceMemory, Error> {
        self.arena.alloc_memory(layout)
    }

    /// The workspace's current generation (cycle number, from 1).
    pub fn generation(&self) -> u64 {
        self.arena.generation()
    }

    /// A snapshot of the workspace's statistics.
    pub fn stats(&self) -> WorkspaceStats {
        self.arena.stats()
    }
}

impl fmt::Debug for WorkspaceGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkspaceGuard")
            .field("workspace", &self.arena.id())
            .finish()
    }
}

impl Drop for WorkspaceGuard {
    fn drop(&mut self) {
        let _ = MANAGER.try_with(|m| m.pop(self.token));
        let before = trace::is_on().then(|| self.arena.figures());
        self.arena.leave();
        self.arena.publish();
        if let Some(before) = before {
            trace_cycle_end(&self.arena, &before, &self.arena.figures());
        }
    }
}

/// A guard during which no workspace is current ([`Workspaces::scope_out`]); dropping it
/// restores the previous current workspace.
#[derive(Debug)]
#[must_use = "scope_out() has no effect once its guard is dropped"]
pub struct ScopeOut {
    /// Its entry in the thread's stack.
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ScopeOut {
    fn drop(&mut self) {
        let _ = MANAGER.try_with(|m| m.pop(self.token));
    }
}

/// Allocates in this thread's current workspace, if any: `None` when no workspace is
/// current, inside [`Workspaces::scope_out`], or with `NDMEM_WORKSPACES=bypass`.
pub fn allocate_in_current(layout: Layout) -> Option<Result<WorkspaceMemory, Error>> {
    // The stack is not borrowed while allocating: a spill may run the pool's reclaimers,
    // which may drop tensors and so call back into this module.
    let current = MANAGER
        .try_with(
            |m| match m.stack.borrow().last().and_then(|e| e.arena.as_ref()) {
                Some(arena) if !arena.is_bypassed() => Some(Rc::clone(arena)),
                _ => None,
            },
        )
        .ok()
        .flatten()?;
    Some(current.alloc_memory(layout))
}

/// Allocates in the parent of the current workspace (the one that was current when its
/// cycle started); `None` if there is none (or no current workspace, or bypass mode).
pub fn allocate_in_parent(layout: Layout) -> Option<Result<WorkspaceMemory, Error>> {
    let parent = MANAGER
        .try_with(
            |m| match m.stack.borrow().last().and_then(|e| e.arena.as_ref()) {
                Some(arena) if !arena.is_bypassed() => arena.parent(),
                _ => None,
            },
        )
        .ok()
        .flatten()?;
    Some(parent.alloc_memory(layout))
}

/// The id of the parent of the current workspace (see [`allocate_in_parent`]), if any.
pub fn parent_of_current() -> Option<String> {
    MANAGER
        .try_with(
            |m| match m.stack.borrow().last().and_then(|e| e.arena.as_ref()) {
                Some(arena) if !arena.is_bypassed() => arena.parent(),
                _ => None,
            },
        )
        .ok()
        .flatten()
        .map(|parent| parent.id().to_string())
}

/// Whether the parent of the current workspace (see [`allocate_in_parent`]) has id `id`;
/// [`parent_of_current`] without copying the id.
pub(crate) fn parent_of_current_is(id: &str) -> bool {
    MANAGER
        .try_with(
            |m| match m.stack.borrow().last().and_then(|e| e.arena.as_ref()) {
                Some(arena) if !arena.is_bypassed() => {
                    arena.parent().is_some_and(|parent| parent.id() == id)
                }
                _ => false,
            },
        )
        .unwrap_or(false)
}

/// Allocates in the workspace `id` of this thread: [`Error::NoSuchWorkspace`] if it does
/// not exist, [`Error::WorkspaceNotOpen`] if no cycle of it is running. Raw memory, as
/// the guard's allocator hands out: under `NDMEM_WORKSPACES=bypass` it spills.
pub fn allocate_in(id: &str, layout: Layout) -> Result<WorkspaceMemory, Error> {
    find_for(id)?.alloc_memory(layout)
}

/// The workspace `id` of this thread, or the error [`allocate_in`] gives for it.
fn find_for(id: &str) -> Result<Rc<Arena>, Error> {
    MANAGER
        .try_with(|m| m.find(id))
        .map_err(|_| thread_exiting(id))?
        .ok_or_else(|| Error::NoSuchWorkspace {
            workspace: id.to_string(),
        })
}

/// A tensor's memory in the workspace `id` of this thread (`leverage_to`): as
/// [`allocate_in`], except that under `NDMEM_WORKSPACES=bypass` an open workspace takes
/// no tensor (`None`: it goes to the pool, as every tensor does then, semantics §2.5).
pub(crate) fn allocate_tensor_in(
    id: &str,
    layout: Layout,
) -> Option<Result<WorkspaceMemory, Error>> {
    let arena = match find_for(id) {
        Ok(arena) => arena,
        Err(e) => return Some(Err(e)),
    };
    if arena.is_bypassed() && arena.is_open() {
        return None;
    }
    Some(arena.alloc_memory(layout))
}

#[cfg(test)]
mod tests {
    use super::same_id;

    #[test]
    fn same_id_is_string_equality() {
        let ids = [
            "",
            "a",
            "BENCH",
            "ABCDEFGH",
            "ABCDEFGHI",
            "WS_LAYER_0123456789",
            "é",
        ];
        for a in ids {
            for b in ids {
                assert_eq!(same_id(a, b), a == b, "{a:?} {b:?}");
            }
        }
        // A difference at each position, in the words and in the tail.
        let base = "WS_LAYER_0123456789";
        for at in 0..base.len() {
            let mut other = base.as_bytes().to_vec();
            other[at] ^= 1;
            let other = String::from_utf8(other).unwrap();
            assert!(!same_id(base, &other), "{other}");
        }
    }
}
