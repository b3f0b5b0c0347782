//! NDManager-style ownership scopes (semantics §4): the public handle.
//!
//! Scopes form a tree: a process-wide root that cannot be closed, base scopes under it
//! ([`Scope::new_base`], [`Scope::new_base_in`] for a pool of their own), child scopes
//! under those ([`Scope::child`], same pool as the parent). A [`Scope`] handle closes its
//! scope when dropped, like DJL's try-with-resources.
//!
//! Invariant: a scope handle holds nothing but its ownership record
//! (`crate::memory::owner::Owner`) and calls only down, into that record and into
//! [`crate::tensor`]; the record keeps every ownership fact (lists, lent tensors, capped
//! and closed state) under one lock, so transfers never lose or double a tensor.

use std::sync::Arc;

use crate::error::Result;
use crate::memory::owner::Owner;
use crate::memory::MemorySource;
use crate::tensor::{DType, Element, Tensor};

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
    owner: Arc<Owner>,
    closes_on_drop: bool,
}

impl Scope {
    /// The process-wide root scope (global pool). It cannot be closed; dropping this
    /// handle does nothing. It records nothing it is given, as DJL's system manager: a
    /// tensor it creates, or that is attached or returned to it, is owned by its handles
    /// and freed when the last one drops (so are the outputs of ops on it), since a
    /// scope that never closes would keep it for the life of the process; its
    /// `tensor_count()` and `bytes()` stay 0.
    pub fn root() -> Scope {
        Scope {
            owner: Owner::root().clone(),
            closes_on_drop: false,
        }
    }

    /// A new scope directly under the root (DJL's `NDManager.newBaseManager()`), drawing
    /// from the global pool.
    pub fn new_base(name: &str) -> Scope {
        Scope::new_base_in(name, MemorySource::global())
    }

    /// A new scope directly under the root whose tensors (and its children's) draw from
    /// `source`, under that pool's limits.
    ///
    /// ```
    /// use ndmem::alloc::{Limits, Pool};
    /// use ndmem::{DType, MemorySource, Scope};
    ///
    /// let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
    /// let scope = Scope::new_base_in("private", source);
    /// let x = scope.zeros(DType::F32, &[1024])?;
    /// assert_eq!(source.pool().stats().live_bytes, 4096);
    /// assert!(scope.zeros(DType::F32, &[1 << 20]).is_err()); // over that pool's limit
    /// scope.close()?;
    /// ndmem::reclaim::collect();
    /// # Ok::<(), ndmem::Error>(())
    /// ```
    pub fn new_base_in(name: &str, source: MemorySource) -> Scope {
        Scope {
            owner: Owner::new_base(name, source),
            closes_on_drop: true,
        }
    }

    /// A new scope under this one (DJL's `newSubManager()`), with this scope's memory
    /// source; closed with its parent. A closed (or concurrently closing) parent gives
    /// [`crate::Error::ScopeClosed`], never an open child under a closed parent; a capped
    /// one [`crate::Error::ScopeCapped`] (DJL's capped manager refuses a sub-manager too).
    pub fn child(&self, name: &str) -> Result<Scope> {
        Ok(Scope {
            owner: self.owner.child(name)?,
            closes_on_drop: true,
        })
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        self.owner.name()
    }

    /// The memory source the scope's tensors are drawn from.
    pub fn source(&self) -> MemorySource {
        self.owner.source()
    }

    /// Whether the scope has been closed (directly or through a parent).
    pub fn is_closed(&self) -> bool {
        self.owner.is_closed()
    }

    /// Tensors the scope owns now (borrowed ones excluded).
    pub fn tensor_count(&self) -> usize {
        self.owner.owned_count()
    }

    /// Bytes of the tensors the scope owns now.
    pub fn bytes(&self) -> usize {
        self.owner.owned_bytes()
    }

    /// A zero-filled tensor owned by this scope, from its source (ignores any current
    /// workspace).
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::full_owned("zeros", dtype, shape, 0.0, &self.owner)
    }

    /// A tensor of ones owned by this scope.
    pub fn ones(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::full_owned("full", dtype, shape, 1.0, &self.owner)
    }

    /// A tensor of `value`s owned by this scope.
    pub fn full(&self, dtype: DType, shape: &[usize], value: f64) -> Result<Tensor> {
        Tensor::full_owned("full", dtype, shape, value, &self.owner)
    }

    /// A tensor copied from `data`, owned by this scope.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice_owned(data, shape, &self.owner)
    }

    /// Makes this scope the owner of `tensor` (from its handles or another scope; a
    /// tensor this scope borrowed becomes its own for good). Errors: the scope is closed
    /// ([`crate::Error::ScopeClosed`]) or capped ([`crate::Error::ScopeCapped`]), the
    /// tensor's memory was already freed by its closed scope
    /// ([`crate::Error::ScopeClosed`]), or it lives in a workspace ([`crate::Error::Scope`]).
    pub fn attach(&self, tensor: &Tensor) -> Result<()> {
        self.owner.attach(tensor.storage())
    }

    /// Hands `tensor` from this scope to its handles: the caller now owns it. A tensor this
    /// scope borrowed ([`Scope::temp_attach_all`]) is detached too: neither this scope nor
    /// the one it was borrowed from owns it afterwards.
    pub fn detach(&self, tensor: &Tensor) -> Result<()> {
        self.owner.detach(tensor.storage())
    }

    /// Borrows `tensors`: this scope owns them until it closes, then gives each back to
    /// the scope (or the handles) that owned it before. A tensor listed twice is borrowed
    /// once; one this scope already owns or borrows is left as it is. All or nothing: if
    /// any tensor cannot be borrowed (freed by its closed scope, or in a workspace),
    /// nothing is. The root never closes, so it cannot borrow ([`crate::Error::Scope`]).
    pub fn temp_attach_all(&self, tensors: &[&Tensor]) -> Result<()> {
        let all: Vec<_> = tensors.iter().map(|t| t.storage()).collect();
        self.owner.borrow_all(&all)
    }

    /// Hands `tensor` to the parent scope (DJL's `ret`), returning it for chaining; a tensor
    /// this scope borrowed goes to the parent for good too, and one it does not own goes
    /// there all the same (from its handles or another scope), as DJL's `ret` attaches
    /// whatever it is given. If the parent cannot take it (capped or closed), the tensor
    /// stays where it was, as before the call.
    pub fn ret(&self, tensor: &Tensor) -> Result<Tensor> {
        self.owner.ret(tensor.storage())?;
        Ok(tensor.clone())
    }

    /// After this, attaching anything to the scope is an error (a leak tripwire).
    pub fn cap(&self) {
        self.owner.cap();
    }

    /// Closes the scope and its children, freeing every tensor they own. Tensors of a
    /// closed scope fail every later use with [`crate::Error::ScopeClosed`]. The root
    /// cannot be closed ([`crate::Error::Scope`]).
    pub fn close(mut self) -> Result<()> {
        self.closes_on_drop = false;
        self.owner.close()
    }

    /// The tree under this scope: names, tensor counts and bytes per scope, one line each
    /// (`scope [batch]: 2 tensors, 96 bytes`, then borrowed tensors, `capped`, `closed`).
    /// The figures are those of `stats::snapshot` (semantics §7).
    pub fn debug_dump(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for f in self.owner.walk() {
            let _ = write!(
                out,
                "{:indent$}{} [{}]: {} tensors, {} bytes",
                "",
                if f.depth == 0 && f.root {
                    "root"
                } else {
                    "scope"
                },
                f.name,
                f.tensors,
                f.bytes,
                indent = f.depth * 2
            );
            if f.borrowed != 0 {
                let _ = write!(
                    out,
                    " (+{} borrowed, {} bytes)",
                    f.borrowed, f.borrowed_bytes
                );
            }
            if f.capped {
                out.push_str(" capped");
            }
            if f.closed {
                out.push_str(" closed");
            }
            out.push('\n');
        }
        out
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.closes_on_drop {
            // Only the root refuses to close, and its handle never closes on drop.
            let _ = self.owner.close();
        }
    }
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("name", &self.name())
            .field("source", &self.source())
            .field("closed", &self.is_closed())
            .finish()
    }
}
