//! NDManager-style ownership scopes (SEMANTICS 4).
//!
//! Invariant: a pool-backed tensor is owned by exactly one thing, its handles or one open
//! scope, and that owner is recorded on both sides (the scope's list and the storage's
//! owner field) under one process-wide ownership lock, so transfers never lose or double
//! a tensor. Closing a scope closes its children, then frees what it owns (through epoch
//! reclamation, so concurrent readers finish first) and gives borrowed tensors back.
//!
//! Scopes form a tree: a process-wide root that cannot be closed, base scopes under it
//! ([`Scope::new_base`]), child scopes under those ([`Scope::child`]). A [`Scope`] handle
//! closes its scope when dropped, like DJL's try-with-resources.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::error::{Error, Result};
use crate::tensor::storage::{lock, Storage};
use crate::tensor::{DType, Element, Tensor};

const CAPPED: u8 = 1;
const CLOSED: u8 = 2;

/// Serialises every ownership transfer (attach, detach, ret, borrow, close).
static OWNERSHIP: Mutex<()> = Mutex::new(());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ROOT: OnceLock<Arc<ScopeShared>> = OnceLock::new();

/// Takes the process-wide ownership lock (every transfer, and the exact handle count of
/// [`crate::tensor::storage::Storage::write_exclusive`], run under it).
pub(crate) fn ownership_lock() -> MutexGuard<'static, ()> {
    lock(&OWNERSHIP)
}

/// A scope's reference to a storage. Counted on the storage while it exists, so that
/// `Arc::strong_count` minus the scope references is exactly the number of tensor handles.
struct Held(Arc<Storage>);

impl Held {
    fn new(storage: &Arc<Storage>) -> Held {
        let held = Held(storage.clone());
        storage.scope_ref_added();
        held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.scope_ref_removed();
    }
}

/// Who to give a borrowed storage back to when the borrowing scope closes.
enum Origin {
    /// Its handles owned it.
    Handles,
    /// This scope owned it.
    Owned(Arc<ScopeShared>),
    /// This scope had borrowed it in turn, from `Origin`.
    Borrowed(Arc<ScopeShared>, Box<Origin>),
}

/// A storage taken out of a scope's lists, with what is needed to put it back.
enum Entry {
    Owned(Held),
    Borrowed(Held, Origin),
}

/// The state of one scope, shared by its handle and the storages it owns.
pub(crate) struct ScopeShared {
    name: String,
    id: u64,
    parent: Option<Arc<ScopeShared>>,
    flags: AtomicU8,
    inner: Mutex<ScopeInner>,
}

#[derive(Default)]
struct ScopeInner {
    owned: Vec<Held>,
    /// Borrowed storages and whom to give each back to.
    borrowed: Vec<(Held, Origin)>,
    children: Vec<Weak<ScopeShared>>,
}

impl ScopeShared {
    fn new(name: &str, parent: Option<Arc<ScopeShared>>) -> Arc<ScopeShared> {
        let scope = Arc::new(ScopeShared {
            name: name.to_string(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent: parent.clone(),
            flags: AtomicU8::new(0),
            inner: Mutex::new(ScopeInner::default()),
        });
        if let Some(parent) = parent {
            lock(&parent.inner).children.push(Arc::downgrade(&scope));
        }
        scope
    }

    /// The scope's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn is_closed(&self) -> bool {
        self.flags.load(Ordering::Acquire) & CLOSED != 0
    }

    /// [`Error::ScopeClosed`] for `op`'s `arg` and this scope.
    fn closed(&self, op: &str, arg: &str) -> Error {
        Error::ScopeClosed {
            op: op.into(),
            arg: arg.into(),
            scope: self.name.clone(),
        }
    }

    /// Errors if nothing may be attached: the scope is closed ([`Error::ScopeClosed`] for
    /// `op`'s `arg`) or capped ([`Error::ScopeCapped`]).
    pub(crate) fn check_attachable(&self, op: &str, arg: &str) -> Result<()> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & CLOSED != 0 {
            return Err(self.closed(op, arg));
        }
        if flags & CAPPED != 0 {
            return Err(Error::ScopeCapped {
                scope: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Takes ownership of a new storage.
    pub(crate) fn adopt(self: &Arc<Self>, op: &str, storage: &Arc<Storage>) -> Result<()> {
        let _transfer = lock(&OWNERSHIP);
        self.take(op, "Z", storage)
    }

    /// Records `storage` as owned (ownership lock held): checks, then both sides.
    fn take(self: &Arc<Self>, op: &str, arg: &str, storage: &Arc<Storage>) -> Result<()> {
        self.check_attachable(op, arg)?;
        storage.set_owner(Some(self.clone()))?;
        lock(&self.inner).owned.push(Held::new(storage));
        Ok(())
    }

    /// Removes `storage` from the owned or the borrowed list (ownership lock held).
    fn release(&self, storage: &Arc<Storage>) -> Option<Entry> {
        let mut inner = lock(&self.inner);
        if let Some(i) = inner.owned.iter().position(|h| Arc::ptr_eq(&h.0, storage)) {
            return Some(Entry::Owned(inner.owned.swap_remove(i)));
        }
        let i = inner
            .borrowed
            .iter()
            .position(|(h, _)| Arc::ptr_eq(&h.0, storage))?;
        let (held, origin) = inner.borrowed.swap_remove(i);
        Some(Entry::Borrowed(held, origin))
    }

    /// Puts back what [`ScopeShared::release`] took out, and the owner field with it
    /// (ownership lock held).
    fn restore(self: &Arc<Self>, entry: Entry) {
        let mut inner = lock(&self.inner);
        let storage = match entry {
            Entry::Owned(held) => {
                let storage = held.0.clone();
                inner.owned.push(held);
                storage
            }
            Entry::Borrowed(held, origin) => {
                let storage = held.0.clone();
                inner.borrowed.push((held, origin));
                storage
            }
        };
        drop(inner);
        // Cannot fail: only pool storages enter a scope's lists.
        let _ = storage.set_owner(Some(self.clone()));
    }

    /// Whether this scope's lists hold `storage` (ownership lock held).
    fn holds(&self, storage: &Arc<Storage>) -> bool {
        let inner = lock(&self.inner);
        inner.owned.iter().any(|h| Arc::ptr_eq(&h.0, storage))
            || inner
                .borrowed
                .iter()
                .any(|(h, _)| Arc::ptr_eq(&h.0, storage))
    }

    /// Closes this scope and its children (ownership lock held).
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
        for held in owned {
            held.0.free_for_scope();
        }
        for (held, origin) in borrowed {
            give_back(held, origin);
        }
        if let Some(parent) = &self.parent {
            lock(&parent.inner)
                .children
                .retain(|c| c.upgrade().is_some_and(|c| c.id != self.id));
        }
    }

    fn dump(&self, depth: usize, out: &mut String) {
        let inner = lock(&self.inner);
        let live = |h: &&Held| h.0.is_live();
        let owned = inner.owned.iter().filter(live).count();
        let owned_bytes: usize = inner.owned.iter().filter(live).map(|h| h.0.len()).sum();
        let borrowed = inner.borrowed.iter().filter(|(h, _)| h.0.is_live()).count();
        let borrowed_bytes: usize = inner
            .borrowed
            .iter()
            .filter(|(h, _)| h.0.is_live())
            .map(|(h, _)| h.0.len())
            .sum();
        let flags = self.flags.load(Ordering::Acquire);
        let _ = write!(
            out,
            "{:indent$}{} [{}]: {} tensors, {} bytes",
            "",
            if depth == 0 && self.parent.is_none() {
                "root"
            } else {
                "scope"
            },
            self.name,
            owned,
            owned_bytes,
            indent = depth * 2
        );
        if borrowed != 0 {
            let _ = write!(out, " (+{borrowed} borrowed, {borrowed_bytes} bytes)");
        }
        if flags & CAPPED != 0 {
            out.push_str(" capped");
        }
        if flags & CLOSED != 0 {
            out.push_str(" closed");
        }
        out.push('\n');
        let children: Vec<_> = inner.children.iter().filter_map(Weak::upgrade).collect();
        drop(inner);
        for child in children {
            child.dump(depth + 1, out);
        }
    }
}

/// Gives a borrowed storage back to `origin` as its borrower closes (ownership lock
/// held): to its handles, to its open owner (even if capped since: it was theirs), to
/// an open scope that had borrowed it in turn, or, when that scope closed meanwhile, to
/// whom that scope would have given it back. An owner that closed meanwhile frees it.
fn give_back(held: Held, origin: Origin) {
    let storage = held.0.clone();
    match origin {
        Origin::Handles => {
            drop(held);
            let _ = storage.set_owner(None);
        }
        Origin::Owned(owner) if !owner.is_closed() => {
            let _ = storage.set_owner(Some(owner.clone()));
            lock(&owner.inner).owned.push(held);
        }
        Origin::Owned(_) => {
            drop(held);
            storage.free_for_scope();
        }
        Origin::Borrowed(borrower, origin) if !borrower.is_closed() => {
            let _ = storage.set_owner(Some(borrower.clone()));
            lock(&borrower.inner).borrowed.push((held, *origin));
        }
        Origin::Borrowed(_, origin) => give_back(held, *origin),
    }
}

/// [`Error::ScopeClosed`] if `storage` was freed by its closed scope.
fn check_not_freed(storage: &Storage, op: &str) -> Result<()> {
    if storage.is_freed() {
        return Err(Error::ScopeClosed {
            op: op.into(),
            arg: "X".into(),
            scope: storage
                .owner()
                .map_or_else(|| "?".into(), |s| s.name().to_string()),
        });
    }
    Ok(())
}

fn root() -> &'static Arc<ScopeShared> {
    ROOT.get_or_init(|| ScopeShared::new("root", None))
}

/// An ownership scope: closing it (or dropping the handle) frees every tensor it owns.
///
/// ```
/// use ndmem::{DType, Scope};
///
/// let model = Scope::new_base("model");
/// let batch = model.child("batch")?;
/// let x = batch.zeros(DType::F32, &[2, 3])?;
/// let y = x.add_scalar(1.0)?;            // belongs to `batch`, like its first input
/// let kept = batch.ret(&y)?;             // now owned by `model`
/// batch.close()?;
/// assert!(x.to_vec::<f32>().is_err());   // its scope is closed
/// assert_eq!(kept.to_vec::<f32>()?, vec![1.0; 6]);
/// # Ok::<(), ndmem::Error>(())
/// ```
pub struct Scope {
    shared: Arc<ScopeShared>,
    closes_on_drop: bool,
}

impl Scope {
    /// The process-wide root scope. It cannot be closed; dropping this handle does nothing.
    pub fn root() -> Scope {
        Scope {
            shared: root().clone(),
            closes_on_drop: false,
        }
    }

    /// A new scope directly under the root (DJL's `NDManager.newBaseManager()`).
    pub fn new_base(name: &str) -> Scope {
        Scope {
            shared: ScopeShared::new(name, Some(root().clone())),
            closes_on_drop: true,
        }
    }

    /// A new scope under this one (DJL's `newSubManager()`); closed with its parent. A
    /// closed (or concurrently closing) parent gives [`Error::ScopeClosed`], never an open
    /// child under a closed parent.
    pub fn child(&self, name: &str) -> Result<Scope> {
        let _transfer = lock(&OWNERSHIP);
        if self.shared.is_closed() {
            return Err(self.shared.closed("child", "X"));
        }
        Ok(Scope {
            shared: ScopeShared::new(name, Some(self.shared.clone())),
            closes_on_drop: true,
        })
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Whether the scope has been closed (directly or through a parent).
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Tensors the scope owns now (borrowed ones excluded).
    pub fn tensor_count(&self) -> usize {
        let inner = lock(&self.shared.inner);
        inner.owned.iter().filter(|h| h.0.is_live()).count()
    }

    /// Bytes of the tensors the scope owns now.
    pub fn bytes(&self) -> usize {
        let inner = lock(&self.shared.inner);
        inner
            .owned
            .iter()
            .filter(|h| h.0.is_live())
            .map(|h| h.0.len())
            .sum()
    }

    /// A zero-filled tensor owned by this scope (ignores any current workspace).
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::zeros_in_scope(dtype, shape, &self.shared)
    }

    /// A tensor of ones owned by this scope.
    pub fn ones(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::full_in_scope(dtype, shape, 1.0, &self.shared)
    }

    /// A tensor of `value`s owned by this scope.
    pub fn full(&self, dtype: DType, shape: &[usize], value: f64) -> Result<Tensor> {
        Tensor::full_in_scope(dtype, shape, value, &self.shared)
    }

    /// A tensor copied from `data`, owned by this scope.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice_in_scope(data, shape, &self.shared)
    }

    /// Makes this scope the owner of `tensor` (from its handles or another scope; a
    /// tensor this scope borrowed becomes its own for good). Errors: the scope is closed
    /// ([`Error::ScopeClosed`]) or capped ([`Error::ScopeCapped`]), the tensor's memory was
    /// already freed by its closed scope ([`Error::ScopeClosed`]), or it lives in a
    /// workspace ([`Error::Scope`]).
    pub fn attach(&self, tensor: &Tensor) -> Result<()> {
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        check_not_freed(storage, "attach")?;
        self.shared.check_attachable("attach", "X")?;
        let previous = storage.owner();
        if let Some(previous) = &previous {
            if Arc::ptr_eq(previous, &self.shared) {
                match self.shared.release(storage) {
                    Some(Entry::Borrowed(held, _)) | Some(Entry::Owned(held)) => {
                        lock(&self.shared.inner).owned.push(held);
                    }
                    None => self.shared.take("attach", "X", storage)?,
                }
                return Ok(());
            }
        }
        self.shared.take("attach", "X", storage)?;
        if let Some(previous) = previous {
            drop(previous.release(storage));
        }
        Ok(())
    }

    /// Hands `tensor` from this scope to its handles: the caller now owns it. A tensor this
    /// scope borrowed ([`Scope::temp_attach_all`]) is detached too: neither this scope nor
    /// the one it was borrowed from owns it afterwards.
    pub fn detach(&self, tensor: &Tensor) -> Result<()> {
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        if self.shared.is_closed() {
            return Err(self.shared.closed("detach", "X"));
        }
        let entry = self
            .shared
            .release(storage)
            .ok_or_else(|| self.not_owned_error("detach"))?;
        drop(entry);
        storage.set_owner(None)?;
        Ok(())
    }

    /// Borrows `tensors`: this scope owns them until it closes, then gives each back to
    /// the scope (or the handles) that owned it before. A tensor listed twice is borrowed
    /// once; one this scope already owns or borrows is left as it is. All or nothing: if
    /// any tensor cannot be borrowed (freed by its closed scope, or in a workspace),
    /// nothing is.
    pub fn temp_attach_all(&self, tensors: &[&Tensor]) -> Result<()> {
        let _transfer = lock(&OWNERSHIP);
        self.shared.check_attachable("temp_attach_all", "X")?;
        let mut storages: Vec<&Arc<Storage>> = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let storage = tensor.storage();
            check_not_freed(storage, "temp_attach_all")?;
            if storage.stamp().is_some() {
                // The same refusal attach gives.
                storage.set_owner(Some(self.shared.clone()))?;
            }
            if !storages.iter().any(|s| Arc::ptr_eq(s, storage)) {
                storages.push(storage);
            }
        }
        for storage in storages {
            if self.shared.holds(storage) {
                continue;
            }
            let previous = storage.set_owner(Some(self.shared.clone()))?;
            let origin = match previous {
                None => Origin::Handles,
                Some(previous) => match previous.release(storage) {
                    Some(Entry::Borrowed(_, origin)) => {
                        Origin::Borrowed(previous, Box::new(origin))
                    }
                    Some(Entry::Owned(_)) | None => Origin::Owned(previous),
                },
            };
            lock(&self.shared.inner)
                .borrowed
                .push((Held::new(storage), origin));
        }
        Ok(())
    }

    /// Hands `tensor` to the parent scope (DJL's `ret`), returning it for chaining; a tensor
    /// this scope borrowed goes to the parent for good too. If the parent cannot take it
    /// (capped or closed), the tensor stays with this scope, as before the call.
    pub fn ret(&self, tensor: &Tensor) -> Result<Tensor> {
        let parent = self.shared.parent.clone().ok_or_else(|| Error::Scope {
            scope: self.name().into(),
            message: "the root scope has no parent to return tensors to".into(),
        })?;
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        if self.shared.is_closed() {
            return Err(self.shared.closed("ret", "X"));
        }
        check_not_freed(storage, "ret")?;
        let entry = self
            .shared
            .release(storage)
            .ok_or_else(|| self.not_owned_error("return"))?;
        match parent.take("ret", "X", storage) {
            Ok(()) => {
                drop(entry);
                Ok(tensor.clone())
            }
            Err(e) => {
                self.shared.restore(entry);
                Err(e)
            }
        }
    }

    /// After this, attaching anything to the scope is an error (a leak tripwire).
    pub fn cap(&self) {
        let _transfer = lock(&OWNERSHIP);
        self.shared.flags.fetch_or(CAPPED, Ordering::AcqRel);
    }

    /// Closes the scope and its children, freeing every tensor they own. Tensors of a
    /// closed scope fail every later use with [`Error::ScopeClosed`].
    pub fn close(mut self) -> Result<()> {
        if self.shared.parent.is_none() {
            return Err(Error::Scope {
                scope: self.name().into(),
                message: "the root scope cannot be closed".into(),
            });
        }
        self.closes_on_drop = false;
        let _transfer = lock(&OWNERSHIP);
        self.shared.close_locked();
        Ok(())
    }

    /// The tree under this scope: names, tensor counts and bytes per scope.
    pub fn debug_dump(&self) -> String {
        let mut out = String::new();
        self.shared.dump(0, &mut out);
        out
    }

    fn not_owned_error(&self, what: &str) -> Error {
        Error::Scope {
            scope: self.name().into(),
            message: format!("cannot {what} a tensor this scope does not own"),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.closes_on_drop {
            let _transfer = lock(&OWNERSHIP);
            self.shared.close_locked();
        }
    }
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("name", &self.shared.name)
            .field("closed", &self.is_closed())
            .finish()
    }
}
