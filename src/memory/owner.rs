//! Ownership records: which scope owns a tensor's memory, and what each scope holds.
//!
//! An [`Owned`] is a tensor's memory ([`Home`]) with its ownership record (the owning
//! [`Owner`], if any, and how many references owners hold). An [`Owner`] is the record of
//! one scope (semantics §4): its name, source, parent, children, capped and closed state,
//! what it owns and what it borrowed (and whom to give each back to). Both know nothing of
//! tensors or scope handles; `crate::tensor` and `crate::scope` are built on them. A
//! [`Handle`] is a tensor's reference to an `Owned`: the shared header and, beside it, the
//! header's validity check, so the check never loads the header first; headers whose last
//! reference drops are recycled through a per-thread list of spares (and a process-wide
//! depot between threads), so a loop that makes as many tensors each step as it drops
//! allocates none on the heap after its first steps, even when another thread makes them.
//!
//! Invariant: a pool-backed memory is owned by exactly one thing, its handles or one open
//! owner, and that owner is recorded on both sides (the owner's list and the memory's
//! owner field) under one process-wide ownership lock, so transfers never lose or double a
//! tensor. Closing an owner closes its children, then frees what it owns (through the
//! home's hand-off and epoch reclamation, so concurrent readers finish first) and gives
//! borrowed memory back. A header is refilled only while its `Arc` is the sole reference
//! (a spare, or the last reference being dropped), so no handle's probe ever points into a
//! header that changed under it.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use crate::error::{Error, Result};
use crate::memory::home::{Home, Probe, Unreachable, ViewHold};
use crate::memory::MemorySource;
use crate::reclaim::Pin;
use crate::workspace::Stamp;

const CAPPED: u8 = 1;
const CLOSED: u8 = 2;

/// Serialises every ownership transfer (adopt, attach, detach, ret, borrow, close).
static OWNERSHIP: Mutex<()> = Mutex::new(());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ROOT: OnceLock<Arc<Owner>> = OnceLock::new();

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the data are
/// plain ownership records, consistent at every await point).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the process-wide ownership lock (every transfer, and the exact handle count of
/// [`Owned::write_exclusive`], run under it).
fn ownership_lock() -> MutexGuard<'static, ()> {
    lock(&OWNERSHIP)
}

/// A tensor's memory and its ownership record (views of a tensor share one).
pub(crate) struct Owned {
    /// `None` only in a spare header (see [`Handle`]), which nothing but its list sees.
    home: Option<Home>,
    /// References owners hold (in their owned or borrowed lists); changed only under the
    /// ownership lock. `Arc::strong_count` minus this is the number of tensor handles.
    owner_refs: AtomicUsize,
    /// The owner; `None`: the handles own it. Always `None` for workspace memory.
    owner: Mutex<Option<Arc<Owner>>>,
    /// The thread whose handle made this header ([`token_of`] its spares): a header
    /// dropped on another thread goes back through the depot instead of that thread's
    /// spares.
    maker: usize,
}

impl Owned {
    /// Memory owned by its handles.
    pub(crate) fn new(home: Home) -> Owned {
        Owned {
            home: Some(home),
            owner_refs: AtomicUsize::new(0),
            owner: Mutex::new(None),
            maker: 0,
        }
    }

    /// Where the bytes live.
    #[inline(always)]
    fn home(&self) -> &Home {
        self.home.as_ref().expect("a header in use holds a home")
    }

    /// Bytes of the memory.
    pub(crate) fn len(&self) -> usize {
        self.home().len()
    }

    /// Bytes held of the pool (a block's capacity), as the pool counts them.
    pub(crate) fn held_bytes(&self) -> usize {
        self.home().held_bytes()
    }

    /// The host pool block this memory holds, and its capacity: a pool block, or a device
    /// tensor's host copy; `None` for workspace memory and a device tensor not yet copied.
    pub(crate) fn pool_share(&self) -> Option<(MemorySource, usize)> {
        self.home().pool_share()
    }

    /// The validity check (semantics §3, §4): one atomic load, plus a thread-token compare
    /// for workspace memory.
    #[inline(always)]
    pub(crate) fn is_live(&self) -> bool {
        self.home().is_live()
    }

    /// [`Owned::is_live`], with the error naming `op`, `arg` and the owner when not.
    #[inline]
    pub(crate) fn check(&self, op: &str, arg: &str) -> Result<()> {
        if self.is_live() {
            Ok(())
        } else {
            Err(self.refusal(op, arg))
        }
    }

    #[cold]
    #[inline(never)]
    fn refusal(&self, op: &str, arg: &str) -> Error {
        self.home().refusal(op, arg, || self.owner_name())
    }

    fn owner_name(&self) -> String {
        self.owner()
            .map_or_else(|| "?".into(), |owner| owner.name.clone())
    }

    /// The bytes for a borrowed view, checked, kept alive until the hold drops.
    pub(crate) fn hold_for_view(&self, op: &str, arg: &str) -> Result<(ViewHold<'_>, &[u8])> {
        self.home()
            .hold_for_view()
            .map_err(|e| e.or_refusal(|| self.refusal(op, arg)))
    }

    /// The bytes, writable, after the validity check, if `this` is the only tensor handle
    /// to the memory; otherwise [`Error::SharedTensor`]. Owners' references are counted
    /// exactly (`owner_refs`, read under the ownership lock, which every change to it
    /// holds) and never read or write data, so they do not count as handles.
    pub(crate) fn write_exclusive<'a>(
        handle: &'a mut Handle,
        op: &str,
        pin: &'a Pin,
    ) -> Result<&'a mut [u8]> {
        let this = Owned::exclusive(handle, op)?;
        // SAFETY: no other tensor handle exists (counted by `exclusive`, which keeps `handle` borrowed), and `&mut` to the only
        // tensor-side `Arc` for `'a` excludes every other reader or writer, including
        // views, which borrow a handle. Owners' references never touch the bytes.
        let bytes = unsafe { this.home().write_unshared(pin) };
        bytes.map_err(|e| e.or_refusal(|| this.refusal(op, "X")))
    }

    /// The memory behind `handle`, checked live, if `handle` is its only tensor handle;
    /// otherwise [`Error::SharedTensor`]. Owners' references are counted exactly
    /// (`owner_refs`, read under the ownership lock, which every change to it holds) and
    /// never read or write data, so they do not count as handles.
    fn exclusive<'a>(handle: &'a mut Handle, op: &str) -> Result<&'a Owned> {
        let this: &'a mut Arc<Owned> = &mut handle.owned;
        this.check(op, "X")?;
        if Arc::strong_count(this) != 1 {
            // Other references: owners' or other handles'. Nothing can add a handle while
            // we hold `&mut` to this one (a clone needs another handle, and owners never
            // hand theirs out), and owner references change only under this lock.
            let _transfer = ownership_lock();
            let handles = Arc::strong_count(this) - this.owner_refs.load(Ordering::Acquire);
            if handles != 1 {
                return Err(Error::SharedTensor {
                    op: op.into(),
                    others: handles.saturating_sub(1),
                });
            }
        }
        // Other handles may have been dropped just now by threads that read the bytes: the
        // fence orders their reads (released by the drop) before our writes, as
        // `Arc::get_mut` does after reading the counts.
        fence(Ordering::Acquire);
        Ok(this)
    }

    /// The device memory, for device operations (semantics §5).
    pub(crate) fn device_slot(&self) -> Option<&crate::device::slot::DeviceSlot> {
        self.home().device_slot()
    }

    /// The device memory, for an in-place device operation, if `this` is the only tensor
    /// handle (counted as in [`Owned::write_exclusive`]); otherwise [`Error::SharedTensor`].
    pub(crate) fn device_exclusive<'a>(
        handle: &'a mut Handle,
        op: &str,
    ) -> Result<&'a crate::device::slot::DeviceSlot> {
        let this = Owned::exclusive(handle, op)?;
        this.home().device_slot().ok_or_else(|| Error::Device {
            device: 0,
            message: format!("Op [{op}]: X argument is not in device memory"),
        })
    }

    /// Whether its closed owner freed this memory.
    pub(crate) fn is_freed(&self) -> bool {
        self.home().is_freed()
    }

    /// The workspace stamp, for workspace memory.
    pub(crate) fn stamp(&self) -> Option<&Stamp> {
        self.home().stamp()
    }

    /// The source the memory was drawn from (a workspace's for workspace memory).
    pub(crate) fn source(&self) -> MemorySource {
        self.home().source()
    }

    /// The owner, if an owner (not the handles) owns this memory.
    pub(crate) fn owner(&self) -> Option<Arc<Owner>> {
        lock(&self.owner).clone()
    }

    /// Records `owner` (the caller holds the ownership lock); returns the previous one.
    /// Workspace memory cannot be owned by a scope.
    fn set_owner(&self, owner: Option<Arc<Owner>>) -> Result<Option<Arc<Owner>>> {
        self.check_ownable(owner.as_ref().map_or("?", |o| o.name.as_str()))?;
        Ok(std::mem::replace(&mut *lock(&self.owner), owner))
    }

    /// [`Error::Scope`] naming `scope` if this is workspace memory, which no scope owns.
    fn check_ownable(&self, scope: &str) -> Result<()> {
        match self.home().stamp() {
            Some(stamp) => Err(Error::Scope {
                scope: scope.into(),
                message: format!(
                    "a tensor of workspace [{}] belongs to its workspace; detach() it first",
                    stamp.workspace_id()
                ),
            }),
            None => Ok(()),
        }
    }

    /// [`Error::ScopeClosed`] if this memory was freed by its closed owner.
    fn check_not_freed(&self, op: &str) -> Result<()> {
        if self.is_freed() {
            return Err(self.refusal(op, "X"));
        }
        Ok(())
    }
}

impl fmt::Debug for Owned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owned")
            .field("home", &self.home)
            .field("owner", &self.owner().map(|o| o.name.clone()))
            .finish()
    }
}

/// Spare headers kept per thread (at most this many), so that creating a tensor reuses
/// the header of one dropped before instead of allocating.
const SPARE_HEADERS: usize = 256;

thread_local! {
    /// Headers whose memory was released, each the only reference to its allocation.
    static SPARE: RefCell<Vec<Arc<Owned>>> = const { RefCell::new(Vec::new()) };
}

/// Spare headers passed between threads, at most [`DEPOT_HEADERS`]. A header dropped on a
/// thread other than the one that made it goes here (its maker is likely to make more: a
/// prefetching producer whose batches the training loop drops), and so does half of a
/// thread's spares when they are full; a thread whose spares ran out takes up to
/// [`DEPOT_MOVE`] from here before it allocates. So headers that cross threads come back
/// to their maker instead of being freed on one side and allocated on the other. The lock
/// is taken once per header that crossed threads and once per [`DEPOT_MOVE`] moved, never
/// while a thread's own spares serve.
static DEPOT: Mutex<Vec<Arc<Owned>>> = Mutex::new(Vec::new());
/// Headers the depot keeps at most.
const DEPOT_HEADERS: usize = 4 * SPARE_HEADERS;
/// Headers moved to or from the depot at once.
const DEPOT_MOVE: usize = SPARE_HEADERS / 2;

/// A token of the thread whose spares these are, unique among live threads: their address.
fn token_of(spare: &RefCell<Vec<Arc<Owned>>>) -> usize {
    spare as *const _ as usize
}

/// The depot, with room for [`DEPOT_HEADERS`]; `None` if it has none yet and `reserve` is
/// false, or the heap refuses the room (the depot's one allocation, made once). Only an
/// allocating path reserves: a free path must never need the heap (semantics §6), nor
/// take room a deferred free was promised.
fn depot(reserve: bool) -> Option<MutexGuard<'static, Vec<Arc<Owned>>>> {
    let mut depot = lock(&DEPOT);
    if depot.capacity() == 0 && (!reserve || depot.try_reserve_exact(DEPOT_HEADERS).is_err()) {
        return None;
    }
    Some(depot)
}

/// Makes the depot's room now (its one allocation), for a caller about to pass tensors
/// between threads; nothing if the heap refuses it (the depot then tries again later).
pub(crate) fn prepare_depot() {
    drop(depot(true));
}

/// Refills this thread's empty spares from the depot; `false` if the depot had none.
#[cold]
#[inline(never)]
fn take_from_depot(spare: &mut Vec<Arc<Owned>>) -> bool {
    if spare.capacity() == 0 && spare.try_reserve_exact(SPARE_HEADERS).is_err() {
        return false;
    }
    // An allocating path: the depot's room is made here (or by `prepare_depot`).
    let Some(mut depot) = depot(true) else {
        return false;
    };
    let keep = depot.len().saturating_sub(DEPOT_MOVE);
    spare.extend(depot.drain(keep..));
    !spare.is_empty()
}

/// Moves half of this thread's full spares to the depot, as many as it has room for.
#[cold]
#[inline(never)]
fn give_to_depot(spare: &mut Vec<Arc<Owned>>) {
    let Some(mut depot) = depot(false) else {
        return;
    };
    let room = (DEPOT_HEADERS - depot.len()).min(DEPOT_MOVE);
    let from = spare.len() - room.min(spare.len());
    depot.extend(spare.drain(from..));
}

/// Puts a header another thread made into the depot; gives it back if there is no room.
#[cold]
#[inline(never)]
fn return_to_depot(header: Arc<Owned>) -> Option<Arc<Owned>> {
    let Some(mut depot) = depot(false) else {
        return Some(header);
    };
    if depot.len() == DEPOT_HEADERS {
        return Some(header);
    }
    depot.push(header);
    None
}

/// A tensor handle's reference to its memory: the shared header ([`Owned`] in an `Arc`)
/// and the header's validity check beside it ([`Probe`]), so checking a tensor loads the
/// handle and then the checked word, never the header first.
///
/// Headers are recycled: when the last handle drops one that nothing else references, its
/// home is released (as dropping the `Arc` would) and the empty header goes to a
/// per-thread list of spares, which [`Fresh::new`] takes from before it allocates. A
/// loop that makes and drops the same number of tensors each step allocates no headers
/// after its first step.
///
/// Invariant: `probe` was made from the home in `owned` after the header was filled, and
/// the header's home is replaced only while this handle's `Arc` is the sole reference
/// (in [`Fresh::new`] and in the drop), so the probe's addresses stay valid while the
/// handle lives.
pub(crate) struct Handle {
    owned: ManuallyDrop<Arc<Owned>>,
    probe: Probe,
}

// SAFETY: the probe holds an address into the header (or the workspace state the header's
// stamp keeps alive), which the handle's `Arc` keeps alive and which is only read,
// atomically; or a cycle word, compared with the calling thread's own table.
// `Arc<Owned>` is `Send + Sync`.
unsafe impl Send for Handle {}
// SAFETY: as above; `&Handle` only loads through the probe.
unsafe impl Sync for Handle {}

impl Handle {
    /// The validity check (semantics §3, §4): one load of the probe and one of the word it
    /// names (see [`Probe`]), and the full check through the header only when the probe
    /// cannot tell.
    #[inline(always)]
    pub(crate) fn is_live(&self) -> bool {
        // SAFETY: the probe was made from the home in this handle's header, which the
        // handle keeps alive and which is not replaced while it is shared (the invariant).
        (unsafe { self.probe.passes() }) || self.home_is_live()
    }

    /// The check through the header, for when the probe could not pass: memory of a
    /// workspace that has no slot in its thread's table (see [`Probe::passes`]).
    #[cold]
    #[inline(never)]
    fn home_is_live(&self) -> bool {
        self.owned.is_live()
    }

    /// The bytes, after the validity check through the probe, for as long as `pin` holds
    /// the epoch (one dependent load fewer than through the header).
    #[inline]
    pub(crate) fn read<'a>(&'a self, op: &str, arg: &str, pin: &'a Pin) -> Result<&'a [u8]> {
        if self.is_live() {
            // SAFETY: this header's home's check (its probe, or the home itself where the
            // probe cannot tell) answered live just now, on this thread, under `pin` (taken
            // by the caller before this call).
            unsafe { self.home().read_checked(pin) }
                .map_err(|e| e.or_refusal(|| self.refusal(op, arg)))
        } else {
            Err(self.refusal(op, arg))
        }
    }

    /// The shared header.
    pub(crate) fn arc(&self) -> &Arc<Owned> {
        &self.owned
    }
}

/// This thread's token and a spare header, if it has one (one thread-local access).
#[inline]
fn take_spare() -> (usize, Option<Arc<Owned>>) {
    SPARE
        .try_with(|s| {
            let mut spare = s.borrow_mut();
            if spare.is_empty() && !take_from_depot(&mut spare) {
                return (token_of(s), None);
            }
            (token_of(s), spare.pop())
        })
        .unwrap_or((0, None))
}

/// A header for memory not shared yet, filled in place (a spare of this thread's if it has
/// one), so the memory's record is written once instead of moved through the op that
/// fills it. It is the only reference to its allocation until [`Fresh::share`], so the
/// bytes are written through it with no count to check; dropped unshared, it releases the
/// memory and goes back to the spares.
#[derive(Debug)]
pub(crate) struct Fresh {
    /// `Some` until shared: the only reference to its allocation, holding a home.
    header: Option<Arc<Owned>>,
}

impl Fresh {
    /// A header holding `home`, owned by its handles.
    pub(crate) fn new(home: Home) -> Fresh {
        let (maker, spare) = take_spare();
        // A spare's owner and owner references were cleared when it was recycled; only
        // the home and the maker are new.
        let new = |home| {
            Arc::new(Owned {
                maker,
                ..Owned::new(home)
            })
        };
        let header = match spare {
            Some(mut header) => match Arc::get_mut(&mut header) {
                Some(slot) => {
                    slot.home = Some(home);
                    slot.maker = maker;
                    header
                }
                None => new(home),
            },
            None => new(home),
        };
        Fresh {
            header: Some(header),
        }
    }

    /// The record, to check the memory and to place other memory beside it.
    #[inline]
    pub(crate) fn owned(&self) -> &Owned {
        self.header
            .as_ref()
            .expect("a fresh header until it is shared")
    }

    /// The bytes, writable, if the memory is live.
    #[inline]
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8], Unreachable> {
        let owned = self
            .header
            .as_ref()
            .expect("a fresh header until it is shared");
        // SAFETY: `header` is the only reference to its allocation (made unique above and
        // never cloned before `share` consumes this value), and `&mut self` excludes every
        // other use of it for as long as the bytes are borrowed, so nothing else can reach
        // the home or its bytes.
        unsafe { owned.home().bytes_mut_unshared() }
    }

    /// Shares the memory: its first handle.
    #[inline]
    pub(crate) fn share(mut self) -> Handle {
        let header = self
            .header
            .take()
            .expect("a fresh header until it is shared");
        let probe = header.home().probe();
        Handle {
            owned: ManuallyDrop::new(header),
            probe,
        }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Some(header) = self.header.take() {
            recycle(header);
        }
    }
}

impl Deref for Handle {
    type Target = Owned;

    #[inline(always)]
    fn deref(&self) -> &Owned {
        &self.owned
    }
}

impl Clone for Handle {
    fn clone(&self) -> Handle {
        Handle {
            owned: ManuallyDrop::new(Arc::clone(&self.owned)),
            probe: self.probe,
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and the field is not used after.
        recycle(unsafe { ManuallyDrop::take(&mut self.owned) });
    }
}

/// Drops a reference to a header; if it was the last, releases the memory (as dropping
/// the `Arc` would) and keeps the empty header as a spare of this thread.
fn recycle(mut header: Arc<Owned>) {
    let Some(owned) = Arc::get_mut(&mut header) else {
        return;
    };
    drop(owned.home.take());
    *owned
        .owner
        .get_mut()
        .unwrap_or_else(PoisonError::into_inner) = None;
    *owned.owner_refs.get_mut() = 0;
    let maker = owned.maker;
    let _ = SPARE.try_with(move |s| {
        // Another thread's header goes back to it through the depot, if there is room.
        let header = if maker == token_of(s) {
            header
        } else {
            match return_to_depot(header) {
                Some(header) => header,
                None => return,
            }
        };
        let mut spare = s.borrow_mut();
        // The list's one allocation may fail at a full heap: then the header is simply
        // freed, since a free path must never need the heap (semantics §6).
        let room = spare.capacity() > 0 || spare.try_reserve_exact(SPARE_HEADERS).is_ok();
        if room && spare.len() == SPARE_HEADERS {
            give_to_depot(&mut spare);
        }
        if room && spare.len() < SPARE_HEADERS {
            spare.push(header);
        }
    });
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.owned.fmt(f)
    }
}

/// An owner's reference to memory. Counted on the memory while it exists, so that
/// `Arc::strong_count` minus the owner references is exactly the number of tensor handles.
struct Held(ManuallyDrop<Arc<Owned>>);

impl Held {
    fn new(owned: &Arc<Owned>) -> Held {
        let held = Held(ManuallyDrop::new(Arc::clone(owned)));
        owned.owner_refs.fetch_add(1, Ordering::AcqRel);
        held
    }
}

impl Drop for Held {
    /// The last reference to drop, of these and the handles, recycles the header.
    fn drop(&mut self) {
        self.0.owner_refs.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: taken once, here, and the field is not used after.
        recycle(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

/// Whom to give borrowed memory back to when the borrowing owner closes.
enum Origin {
    /// Its handles owned it.
    Handles,
    /// This owner owned it.
    Owned(Arc<Owner>),
    /// This owner had borrowed it in turn, from `Origin`.
    Borrowed(Arc<Owner>, Box<Origin>),
}

/// Memory taken out of an owner's lists, with what is needed to put it back.
enum Entry {
    Owned(Held),
    Borrowed(Held, Origin),
}

/// The ownership record of one scope.
pub(crate) struct Owner {
    name: String,
    id: u64,
    parent: Option<Arc<Owner>>,
    source: MemorySource,
    flags: AtomicU8,
    inner: Mutex<Lists>,
}

#[derive(Default)]
struct Lists {
    owned: Vec<Held>,
    /// Borrowed memory and whom to give each back to.
    borrowed: Vec<(Held, Origin)>,
    children: Vec<Weak<Owner>>,
}

impl Owner {
    fn new(name: &str, parent: Option<Arc<Owner>>, source: MemorySource) -> Arc<Owner> {
        let owner = Arc::new(Owner {
            name: name.to_string(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent: parent.clone(),
            source,
            flags: AtomicU8::new(0),
            inner: Mutex::new(Lists::default()),
        });
        if let Some(parent) = parent {
            lock(&parent.inner).children.push(Arc::downgrade(&owner));
        }
        owner
    }

    /// The process-wide root (global source); it cannot be closed.
    pub(crate) fn root() -> &'static Arc<Owner> {
        ROOT.get_or_init(|| Owner::new("root", None, MemorySource::global()))
    }

    /// A new owner directly under the root, drawing from `source`.
    pub(crate) fn new_base(name: &str, source: MemorySource) -> Arc<Owner> {
        Owner::new(name, Some(Owner::root().clone()), source)
    }

    /// A new owner under this one, with its source. A closed (or concurrently closing)
    /// parent gives [`Error::ScopeClosed`], never an open child under a closed parent.
    pub(crate) fn child(self: &Arc<Self>, name: &str) -> Result<Arc<Owner>> {
        let _transfer = ownership_lock();
        // A child is attached to its parent, as DJL's `newSubManager` attaches the new
        // manager: a capped parent refuses it too.
        self.check_attachable("child")?;
        Ok(Owner::new(name, Some(self.clone()), self.source))
    }

    /// The scope's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Where this owner's new memory comes from.
    pub(crate) fn source(&self) -> MemorySource {
        self.source
    }

    /// Whether this is the root (no parent).
    pub(crate) fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    /// Whether the owner has been closed (directly or through a parent).
    pub(crate) fn is_closed(&self) -> bool {
        self.flags.load(Ordering::Acquire) & CLOSED != 0
    }

    /// [`Error::ScopeClosed`] for `op`'s `arg` and this owner.
    fn closed(&self, op: &str, arg: &str) -> Error {
        Error::ScopeClosed {
            op: op.into(),
            arg: arg.into(),
            scope: self.name.clone(),
        }
    }

    /// The refusal of `op` (`what` it would do) on `owned` by this closed owner:
    /// [`Error::ScopeClosed`] when a close freed the memory (naming the scope that owned
    /// it: this one, or a child or other scope closed with it or before), else
    /// [`Error::Scope`] saying this scope is closed (the tensor is someone else's and
    /// still usable; only this scope can no longer act).
    fn closed_for(self: &Arc<Self>, op: &str, what: &str, owned: &Arc<Owned>) -> Error {
        let owner = owned.owner();
        if owned.is_freed() {
            return owner.as_ref().unwrap_or(self).closed(op, "X");
        }
        match owner {
            Some(owner) if Arc::ptr_eq(&owner, self) => self.closed(op, "X"),
            _ => Error::Scope {
                scope: self.name.clone(),
                message: format!(
                    "is closed, so it cannot {what} a tensor (this one is not its: it was \
                     not freed by the close and stays usable)"
                ),
            },
        }
    }

    fn not_owned(&self, what: &str) -> Error {
        Error::Scope {
            scope: self.name.clone(),
            message: format!("cannot {what} a tensor this scope does not own"),
        }
    }

    /// Errors if nothing may be attached: the owner is closed ([`Error::ScopeClosed`] for
    /// `op`, naming no argument: the scope itself refuses) or capped
    /// ([`Error::ScopeCapped`]).
    pub(crate) fn check_attachable(&self, op: &str) -> Result<()> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & CLOSED != 0 {
            return Err(self.closed(op, ""));
        }
        if flags & CAPPED != 0 {
            return Err(Error::ScopeCapped {
                scope: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Takes ownership of new memory (an op's output, `op`'s `Z`).
    pub(crate) fn adopt(self: &Arc<Self>, op: &str, owned: &Arc<Owned>) -> Result<()> {
        let _transfer = ownership_lock();
        self.take(op, owned)
    }

    /// Records `owned` as owned (ownership lock held): checks, then both sides.
    ///
    /// The root records nothing: what it is given is its handles' from then on, freed
    /// when the last one drops, as DJL's system manager tracks nothing it is given. The
    /// root never closes, so a tensor it recorded would be kept for the life of the
    /// process, and with it every output of an op on it (they belong to the scope of
    /// their first input).
    fn take(self: &Arc<Self>, op: &str, owned: &Arc<Owned>) -> Result<()> {
        self.check_attachable(op)?;
        if self.is_root() {
            // The same refusal of workspace memory, naming the root; the owner field is
            // never the root, even for a moment.
            owned.check_ownable(&self.name)?;
            owned.set_owner(None)?;
            return Ok(());
        }
        owned.set_owner(Some(self.clone()))?;
        lock(&self.inner).owned.push(Held::new(owned));
        Ok(())
    }

    /// Removes `owned` from the owned or the borrowed list (ownership lock held).
    fn release(&self, owned: &Arc<Owned>) -> Option<Entry> {
        let mut inner = lock(&self.inner);
        if let Some(i) = inner.owned.iter().position(|h| Arc::ptr_eq(&h.0, owned)) {
            return Some(Entry::Owned(inner.owned.swap_remove(i)));
        }
        let i = inner
            .borrowed
            .iter()
            .position(|(h, _)| Arc::ptr_eq(&h.0, owned))?;
        let (held, origin) = inner.borrowed.swap_remove(i);
        Some(Entry::Borrowed(held, origin))
    }

    /// Puts back what [`Owner::release`] took out, and the owner field with it
    /// (ownership lock held).
    fn restore(self: &Arc<Self>, entry: Entry) {
        let mut inner = lock(&self.inner);
        let owned = match entry {
            Entry::Owned(held) => {
                let owned = Arc::clone(&held.0);
                inner.owned.push(held);
                owned
            }
            Entry::Borrowed(held, origin) => {
                let owned = Arc::clone(&held.0);
                inner.borrowed.push((held, origin));
                owned
            }
        };
        drop(inner);
        // Cannot fail: only pool memory enters an owner's lists.
        let _ = owned.set_owner(Some(self.clone()));
    }

    /// Whether this owner's lists hold `owned` (ownership lock held).
    fn holds(&self, owned: &Arc<Owned>) -> bool {
        let inner = lock(&self.inner);
        inner.owned.iter().any(|h| Arc::ptr_eq(&h.0, owned))
            || inner.borrowed.iter().any(|(h, _)| Arc::ptr_eq(&h.0, owned))
    }

    /// Makes this owner the owner of `owned` (from its handles or another owner; memory
    /// this owner borrowed becomes its own for good).
    pub(crate) fn attach(self: &Arc<Self>, owned: &Arc<Owned>) -> Result<()> {
        let _transfer = ownership_lock();
        self.attach_locked("attach", owned)
    }

    /// [`Owner::attach`] for `op` (ownership lock held).
    fn attach_locked(self: &Arc<Self>, op: &str, owned: &Arc<Owned>) -> Result<()> {
        owned.check_not_freed(op)?;
        self.check_attachable(op)?;
        let previous = owned.owner();
        if let Some(previous) = &previous {
            if Arc::ptr_eq(previous, self) {
                match self.release(owned) {
                    Some(Entry::Borrowed(held, _)) | Some(Entry::Owned(held)) => {
                        lock(&self.inner).owned.push(held);
                    }
                    None => self.take(op, owned)?,
                }
                return Ok(());
            }
        }
        self.take(op, owned)?;
        if let Some(previous) = previous {
            drop(previous.release(owned));
        }
        Ok(())
    }

    /// Hands `owned` from this owner to its handles (borrowed memory included: neither
    /// this owner nor the one it was borrowed from owns it afterwards).
    pub(crate) fn detach(self: &Arc<Self>, owned: &Arc<Owned>) -> Result<()> {
        let _transfer = ownership_lock();
        if self.is_closed() {
            return Err(self.closed_for("detach", "detach", owned));
        }
        let Some(entry) = self.release(owned) else {
            // The root records nothing: a tensor no scope owns is its handles' already.
            if self.is_root() && owned.owner().is_none() && owned.stamp().is_none() {
                return Ok(());
            }
            return Err(self.not_owned("detach"));
        };
        drop(entry);
        owned.set_owner(None)?;
        Ok(())
    }

    /// Borrows every memory in `all` until this owner closes (see `Scope::temp_attach_all`);
    /// all or nothing. The root never closes, so it never borrows ([`Error::Scope`]): the
    /// memory would never be given back (DJL's system manager refuses too).
    pub(crate) fn borrow_all(self: &Arc<Self>, all: &[&Arc<Owned>]) -> Result<()> {
        if self.is_root() {
            return Err(Error::Scope {
                scope: self.name.clone(),
                message: "the root scope never closes, so it cannot borrow tensors \
                          (attach them to it instead)"
                    .into(),
            });
        }
        let _transfer = ownership_lock();
        self.check_attachable("temp_attach_all")?;
        let mut unique: Vec<&Arc<Owned>> = Vec::with_capacity(all.len());
        for owned in all {
            owned.check_not_freed("temp_attach_all")?;
            if owned.stamp().is_some() {
                // The same refusal attach gives.
                owned.set_owner(Some(self.clone()))?;
            }
            if !unique.iter().any(|o| Arc::ptr_eq(o, owned)) {
                unique.push(owned);
            }
        }
        for owned in unique {
            if self.holds(owned) {
                continue;
            }
            let previous = owned.set_owner(Some(self.clone()))?;
            let origin = match previous {
                None => Origin::Handles,
                Some(previous) => match previous.release(owned) {
                    Some(Entry::Borrowed(_, origin)) => {
                        Origin::Borrowed(previous, Box::new(origin))
                    }
                    Some(Entry::Owned(_)) | None => Origin::Owned(previous),
                },
            };
            lock(&self.inner).borrowed.push((Held::new(owned), origin));
        }
        Ok(())
    }

    /// Hands `owned` to the parent (DJL's `ret`); borrowed memory goes for good too. If
    /// the parent cannot take it (capped or closed), it stays here, as before the call.
    /// Memory this owner does not hold goes to the parent all the same, from its handles
    /// or another owner, as an attach to the parent (DJL's `ret` attaches whatever it is
    /// given).
    pub(crate) fn ret(self: &Arc<Self>, owned: &Arc<Owned>) -> Result<()> {
        let parent = self.parent.clone().ok_or_else(|| Error::Scope {
            scope: self.name.clone(),
            message: "the root scope has no parent to return tensors to".into(),
        })?;
        let _transfer = ownership_lock();
        if self.is_closed() {
            return Err(self.closed_for("ret", "return", owned));
        }
        owned.check_not_freed("ret")?;
        let Some(entry) = self.release(owned) else {
            return parent.attach_locked("ret", owned);
        };
        match parent.take("ret", owned) {
            Ok(()) => {
                drop(entry);
                Ok(())
            }
            Err(e) => {
                self.restore(entry);
                Err(e)
            }
        }
    }

    /// After this, attaching anything is an error (a leak tripwire).
    pub(crate) fn cap(&self) {
        let _transfer = ownership_lock();
        self.flags.fetch_or(CAPPED, Ordering::AcqRel);
    }

    /// Closes this owner and its children, freeing what they own and giving borrowed
    /// memory back. The root is never closed ([`Error::Scope`]).
    pub(crate) fn close(self: &Arc<Self>) -> Result<()> {
        if self.is_root() {
            return Err(Error::Scope {
                scope: self.name.clone(),
                message: "the root scope cannot be closed".into(),
            });
        }
        let _transfer = ownership_lock();
        self.close_locked();
        Ok(())
    }

    /// Closes this owner and its children (ownership lock held).
    fn close_locked(self: &Arc<Self>) {
        if self.flags.fetch_or(CLOSED, Ordering::SeqCst) & CLOSED != 0 {
            return;
        }
        let (owned, borrowed, children) = {
            let mut inner = lock(&self.inner);
            (
                std::mem::take(&mut inner.owned),
                std::mem::take(&mut inner.borrowed),
                std::mem::take(&mut inner.children),
            )
        };
        for child in children.iter().filter_map(Weak::upgrade) {
            child.close_locked();
        }
        // The blocks whose free falls to this close go to the epoch together: one deferred
        // call and one flush for the scope, not one per tensor. Without heap room for the
        // list, each goes alone (a free never needs the heap).
        let mut batch = Vec::new();
        let _ = batch.try_reserve_exact(owned.len());
        for held in owned {
            held.0.home().free_into(&mut batch);
        }
        crate::reclaim::defer_free_all(batch);
        for (held, origin) in borrowed {
            give_back(held, origin);
        }
        if let Some(parent) = &self.parent {
            lock(&parent.inner)
                .children
                .retain(|c| c.upgrade().is_some_and(|c| c.id != self.id));
        }
    }

    /// Live memories this owner owns (borrowed ones excluded).
    pub(crate) fn owned_count(&self) -> usize {
        let inner = lock(&self.inner);
        inner.owned.iter().filter(|h| h.0.is_live()).count()
    }

    /// Bytes of the live memories this owner owns.
    pub(crate) fn owned_bytes(&self) -> usize {
        let inner = lock(&self.inner);
        inner
            .owned
            .iter()
            .filter(|h| h.0.is_live())
            .map(|h| h.0.len())
            .sum()
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owner")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Gives borrowed memory back to `origin` as its borrower closes (ownership lock held):
/// to its handles, to its open owner (even if capped since: it was theirs), to an open
/// owner that had borrowed it in turn, or, when that one closed meanwhile, to whom it
/// would have given it back. An owner that closed meanwhile frees it.
fn give_back(held: Held, origin: Origin) {
    let owned = Arc::clone(&held.0);
    match origin {
        Origin::Handles => {
            drop(held);
            let _ = owned.set_owner(None);
        }
        Origin::Owned(owner) if !owner.is_closed() => {
            let _ = owned.set_owner(Some(owner.clone()));
            lock(&owner.inner).owned.push(held);
        }
        Origin::Owned(_) => {
            drop(held);
            owned.home().free();
        }
        Origin::Borrowed(borrower, origin) if !borrower.is_closed() => {
            let _ = owned.set_owner(Some(borrower.clone()));
            lock(&borrower.inner).borrowed.push((held, *origin));
        }
        Origin::Borrowed(_, origin) => give_back(held, *origin),
    }
}

/// One scope's figures, as `Scope::debug_dump` prints them and `stats::snapshot` reports
/// them (semantics §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScopeFigures {
    /// The owner's process-wide id.
    pub(crate) id: u64,
    pub(crate) name: String,
    /// 0 for the scope walked from, 1 for its children, ...
    pub(crate) depth: usize,
    /// Whether this is the process-wide root.
    pub(crate) root: bool,
    /// Live memories owned, and their bytes.
    pub(crate) tensors: usize,
    pub(crate) bytes: usize,
    /// Live memories borrowed, and their bytes.
    pub(crate) borrowed: usize,
    pub(crate) borrowed_bytes: usize,
    /// What the owned and borrowed memories hold of their pools: block capacities, as the
    /// pools count them.
    pub(crate) held_bytes: usize,
    /// The owned and borrowed pool blocks by the host pool they were drawn from (a scope
    /// may hold tensors of several): pool, bytes held, tensors. What an out-of-memory
    /// report of one pool counts of the scope.
    pub(crate) held_by_pool: Vec<PoolShare>,
    pub(crate) capped: bool,
    pub(crate) closed: bool,
    /// Where the owner's new memory comes from.
    pub(crate) source: MemorySource,
}

/// What a scope holds of one host pool: block capacities and tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolShare {
    pub(crate) source: MemorySource,
    pub(crate) bytes: usize,
    pub(crate) tensors: usize,
}

/// `owned` grouped by the host pool of each block (see [`ScopeFigures::held_by_pool`]).
fn shares<'a>(owned: impl Iterator<Item = &'a Owned>) -> Vec<PoolShare> {
    let mut shares: Vec<PoolShare> = Vec::new();
    for memory in owned {
        let Some((source, bytes)) = memory.pool_share() else {
            continue;
        };
        match shares.iter_mut().find(|s| s.source == source) {
            Some(share) => {
                share.bytes += bytes;
                share.tensors += 1;
            }
            None => shares.push(PoolShare {
                source,
                bytes,
                tensors: 1,
            }),
        }
    }
    shares
}

impl Owner {
    /// The figures of this owner and every owner under it, depth first (each owner's lock
    /// taken on its own, never two at once).
    pub(crate) fn walk(&self) -> Vec<ScopeFigures> {
        let mut out = Vec::new();
        self.walk_into(0, &mut out);
        out
    }

    fn walk_into(&self, depth: usize, out: &mut Vec<ScopeFigures>) {
        let inner = lock(&self.inner);
        let live = |h: &&Held| h.0.is_live();
        let borrowed = inner.borrowed.iter().filter(|(h, _)| h.0.is_live());
        let flags = self.flags.load(Ordering::Acquire);
        out.push(ScopeFigures {
            id: self.id,
            name: self.name.clone(),
            depth,
            root: self.parent.is_none(),
            tensors: inner.owned.iter().filter(live).count(),
            bytes: inner.owned.iter().filter(live).map(|h| h.0.len()).sum(),
            borrowed: borrowed.clone().count(),
            borrowed_bytes: borrowed.clone().map(|(h, _)| h.0.len()).sum(),
            held_bytes: inner
                .owned
                .iter()
                .filter(live)
                .map(|h| h.0.held_bytes())
                .chain(borrowed.clone().map(|(h, _)| h.0.held_bytes()))
                .sum(),
            held_by_pool: shares(
                inner
                    .owned
                    .iter()
                    .filter(live)
                    .chain(borrowed.map(|(h, _)| h))
                    .map(|h| &**h.0),
            ),
            capped: flags & CAPPED != 0,
            closed: flags & CLOSED != 0,
            source: self.source,
        });
        let children: Vec<_> = inner.children.iter().filter_map(Weak::upgrade).collect();
        drop(inner);
        for child in children {
            child.walk_into(depth + 1, out);
        }
    }
}
