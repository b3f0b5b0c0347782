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
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::error::{Error, Result};
use crate::tensor::storage::{lock, Storage};
use crate::tensor::{DType, Element, Tensor};

const CAPPED: u8 = 1;
const CLOSED: u8 = 2;

/// Serialises every ownership transfer (attach, detach, ret, borrow, close).
static OWNERSHIP: Mutex<()> = Mutex::new(());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ROOT: OnceLock<Arc<ScopeShared>> = OnceLock::new();

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
    owned: Vec<Arc<Storage>>,
    /// Borrowed storages and the owner to give each back to (`None`: its handles).
    borrowed: Vec<(Arc<Storage>, Option<Arc<ScopeShared>>)>,
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

    /// Errors if nothing may be attached: the scope is capped or closed.
    pub(crate) fn check_attachable(&self) -> Result<()> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & CLOSED != 0 {
            return Err(Error::Scope {
                scope: self.name.clone(),
                message: "the scope is closed".into(),
            });
        }
        if flags & CAPPED != 0 {
            return Err(Error::ScopeCapped {
                scope: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Takes ownership of a new storage.
    pub(crate) fn adopt(self: &Arc<Self>, storage: &Arc<Storage>) -> Result<()> {
        let _transfer = lock(&OWNERSHIP);
        self.take(storage)
    }

    /// Records `storage` as owned (ownership lock held): checks, then both sides.
    fn take(self: &Arc<Self>, storage: &Arc<Storage>) -> Result<()> {
        self.check_attachable()?;
        storage.set_owner(Some(self.clone()))?;
        lock(&self.inner).owned.push(storage.clone());
        Ok(())
    }

    /// Removes `storage` from the owned list (ownership lock held).
    fn release(&self, storage: &Arc<Storage>) -> bool {
        let mut inner = lock(&self.inner);
        match inner.owned.iter().position(|s| Arc::ptr_eq(s, storage)) {
            Some(i) => {
                inner.owned.swap_remove(i);
                true
            }
            None => false,
        }
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
        for storage in owned {
            storage.free_for_scope();
        }
        for (storage, original) in borrowed {
            match original {
                Some(owner) if !owner.is_closed() => {
                    if owner.give_back(&storage).is_err() {
                        storage.free_for_scope();
                    }
                }
                Some(_) => storage.free_for_scope(),
                None => {
                    // Its handles owned it before the borrow: they own it again.
                    let _ = storage.set_owner(None);
                }
            }
        }
        if let Some(parent) = &self.parent {
            lock(&parent.inner)
                .children
                .retain(|c| c.upgrade().is_some_and(|c| c.id != self.id));
        }
    }

    /// Takes a storage back after a borrow, even if capped since (it was ours before).
    fn give_back(self: &Arc<Self>, storage: &Arc<Storage>) -> Result<()> {
        storage.set_owner(Some(self.clone()))?;
        lock(&self.inner).owned.push(storage.clone());
        Ok(())
    }

    fn dump(&self, depth: usize, out: &mut String) {
        let inner = lock(&self.inner);
        let owned_bytes: usize = inner.owned.iter().map(|s| s.len()).sum();
        let borrowed_bytes: usize = inner.borrowed.iter().map(|(s, _)| s.len()).sum();
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
            inner.owned.len(),
            owned_bytes,
            indent = depth * 2
        );
        if !inner.borrowed.is_empty() {
            let _ = write!(
                out,
                " (+{} borrowed, {} bytes)",
                inner.borrowed.len(),
                borrowed_bytes
            );
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

    /// A new scope under this one (DJL's `newSubManager()`); closed with its parent.
    pub fn child(&self, name: &str) -> Result<Scope> {
        if self.shared.is_closed() {
            return Err(self.closed_error("create a child"));
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
        lock(&self.shared.inner).owned.len()
    }

    /// Bytes of the tensors the scope owns now.
    pub fn bytes(&self) -> usize {
        lock(&self.shared.inner).owned.iter().map(|s| s.len()).sum()
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

    /// Makes this scope the owner of `tensor` (from its handles or another scope).
    pub fn attach(&self, tensor: &Tensor) -> Result<()> {
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        self.shared.check_attachable()?;
        let previous = storage.owner();
        if previous
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &self.shared))
        {
            return Ok(());
        }
        self.shared.take(storage)?;
        if let Some(previous) = previous {
            previous.release(storage);
        }
        Ok(())
    }

    /// Hands `tensor` from this scope to its handles: the caller now owns it.
    pub fn detach(&self, tensor: &Tensor) -> Result<()> {
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        if !self.shared.release(storage) {
            return Err(self.not_owned_error("detach"));
        }
        storage.set_owner(None)?;
        Ok(())
    }

    /// Borrows `tensors`: this scope owns them until it closes, then gives each back to
    /// the scope (or the handles) that owned it before.
    pub fn temp_attach_all(&self, tensors: &[&Tensor]) -> Result<()> {
        let _transfer = lock(&OWNERSHIP);
        self.shared.check_attachable()?;
        for tensor in tensors {
            let storage = tensor.storage();
            let previous = storage.set_owner(Some(self.shared.clone()))?;
            if let Some(previous) = &previous {
                previous.release(storage);
            }
            lock(&self.shared.inner)
                .borrowed
                .push((storage.clone(), previous));
        }
        Ok(())
    }

    /// Hands `tensor` to the parent scope (DJL's `ret`), returning it for chaining.
    pub fn ret(&self, tensor: &Tensor) -> Result<Tensor> {
        let parent = self.shared.parent.clone().ok_or_else(|| Error::Scope {
            scope: self.name().into(),
            message: "the root scope has no parent to return tensors to".into(),
        })?;
        let storage = tensor.storage();
        let _transfer = lock(&OWNERSHIP);
        parent.check_attachable()?;
        if !self.shared.release(storage) {
            return Err(self.not_owned_error("return"));
        }
        parent.take(storage)?;
        Ok(tensor.clone())
    }

    /// After this, attaching anything to the scope is an error (a leak tripwire).
    pub fn cap(&self) {
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

    fn closed_error(&self, what: &str) -> Error {
        Error::Scope {
            scope: self.name().into(),
            message: format!("cannot {what}: the scope is closed"),
        }
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
