//! Where a tensor's bytes live and how to prove they may still be touched.
//!
//! Invariant: the bytes of a [`Storage`] are reachable only through [`Storage::read`]
//! (under an epoch pin), [`Storage::hold_for_view`] (under a view count or workspace view
//! pin) and [`Storage::write_exclusive`] (the only tensor handle, under a pin), each of
//! which first runs the validity check of SEMANTICS 3 and 4 (workspace stamp, or the
//! "freed by its scope" flag). A scope frees pool memory by setting that flag and, once no
//! view holds the block, deferring it to [`crate::reclaim`], so a reader that passed the
//! check keeps the memory until it unpins or drops its view. Outputs are written before
//! they are shared ([`NewStorage::bytes_mut`]), shared storages only by
//! `write_exclusive`. This module and the workspace arena are the only places in
//! the `ndmem` crate that turn raw pool pointers into slices.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ndmem_alloc::{Block, Pool, Usage};

use crate::error::{Error, Result};
use crate::reclaim::{self, Pin};
use crate::scope::ScopeShared;
use crate::workspace::{self, Stamp};

/// The memory behind one or more tensors (views share it).
pub(crate) struct Storage {
    ptr: NonNull<u8>,
    bytes: usize,
    home: Home,
    /// References scopes hold (in their owned or borrowed lists); changed only under the
    /// ownership lock. `Arc::strong_count` minus this is the number of tensor handles.
    scope_refs: AtomicUsize,
}

enum Home {
    /// Bump-allocated in a workspace; valid while its stamp says so.
    Workspace(Stamp),
    /// A pool block owned by the handles, or by a scope.
    Pool(PoolHome),
}

pub(crate) struct PoolHome {
    /// Set (once) when the owning scope closed; the block goes to reclamation then, or
    /// when the last [`ViewHold`] drops if views were alive.
    freed: AtomicBool,
    /// Live [`ViewHold`]s: borrowed views reading the block outside any epoch pin.
    views: AtomicUsize,
    block: Mutex<Option<Block<'static>>>,
    /// The scope that owns the block; `None`: the handles own it.
    owner: Mutex<Option<Arc<ScopeShared>>>,
}

// SAFETY: the pointer is either into a pool block this storage owns (Block is Send + Sync)
// or into workspace memory whose cross-thread use the stamp refuses (only circular
// workspaces hand memory across threads: their stamps keep the ring alive and hold a
// counted reference to the slot, which the ring never reuses while it is held).
unsafe impl Send for Storage {}
// SAFETY: shared access only reads, through `read`, after the validity check.
unsafe impl Sync for Storage {}

/// Where a new storage should go (SEMANTICS "The flow of one allocation").
#[derive(Clone, Copy)]
pub(crate) enum Placement<'a> {
    /// Current workspace, else the scope that owns this storage (the first input's), if
    /// any, else the handles. The owner is looked up only when no workspace takes it.
    Auto(Option<&'a Storage>),
    /// Pool memory owned by the handles, ignoring any workspace (detach).
    Detached,
    /// Pool memory owned by this scope, ignoring any workspace.
    Scope(&'a Arc<ScopeShared>),
    /// The parent of the current workspace, else detached (leverage).
    ParentWorkspace,
    /// The open workspace with this id (leverage_to).
    Workspace(&'a str),
    /// The current workspace; detached if none is current (migrate).
    CurrentWorkspace,
}

/// A storage that is not shared yet, so its bytes may be written.
pub(crate) struct NewStorage {
    storage: Storage,
    scope: Option<Arc<ScopeShared>>,
}

impl NewStorage {
    /// Allocates `bytes` (at least one) aligned to `align` where `placement` says.
    pub(crate) fn allocate(
        op: &str,
        bytes: usize,
        align: usize,
        placement: Placement<'_>,
    ) -> Result<NewStorage> {
        let bytes = bytes.max(1);
        let layout = Layout::from_size_align(bytes, align.max(16)).map_err(|_| {
            Error::Alloc(ndmem_alloc::AllocError::InvalidLayout {
                size: bytes,
                align,
                reason: "the tensor is too large",
            })
        })?;
        let in_workspace = match placement {
            Placement::Auto(_) | Placement::CurrentWorkspace => {
                workspace::allocate_in_current(layout)
            }
            Placement::ParentWorkspace => workspace::allocate_in_parent(layout),
            Placement::Workspace(id) => Some(workspace::allocate_in(id, layout)),
            Placement::Detached | Placement::Scope(_) => None,
        };
        if let Some(memory) = in_workspace {
            let memory = memory?;
            return Ok(NewStorage {
                storage: Storage {
                    ptr: memory.ptr,
                    bytes,
                    home: Home::Workspace(memory.stamp),
                    scope_refs: AtomicUsize::new(0),
                },
                scope: None,
            });
        }
        let scope = match placement {
            Placement::Auto(first) => first.and_then(Storage::owner),
            Placement::Scope(scope) => Some(scope.clone()),
            _ => None,
        };
        if let Some(scope) = &scope {
            scope.check_attachable(op, "Z")?;
        }
        let block = Pool::global().allocate_for(bytes, layout.align(), Usage::Tensor)?;
        Ok(NewStorage {
            storage: Storage {
                ptr: block.ptr(),
                bytes,
                home: Home::Pool(PoolHome {
                    freed: AtomicBool::new(false),
                    views: AtomicUsize::new(0),
                    block: Mutex::new(Some(block)),
                    owner: Mutex::new(None),
                }),
                scope_refs: AtomicUsize::new(0),
            },
            scope,
        })
    }

    /// The bytes, writable: nobody else can see this storage yet.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the storage was just allocated for `bytes` bytes (workspace bump or pool
        // block, both initialised memory) and is not shared, so this is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.storage.ptr.as_ptr(), self.storage.bytes) }
    }

    /// Shares the storage, attaching it to its scope if it has one.
    pub(crate) fn share(self, op: &str) -> Result<Arc<Storage>> {
        let storage = Arc::new(self.storage);
        if let Some(scope) = self.scope {
            scope.adopt(op, &storage)?;
        }
        Ok(storage)
    }
}

impl Storage {
    /// Bytes of the storage.
    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// SEMANTICS 3 and 4: may these bytes be used now, from this thread? One atomic load
    /// (and a thread-token compare for workspace memory).
    #[inline(always)]
    pub(crate) fn is_live(&self) -> bool {
        match &self.home {
            Home::Workspace(stamp) => stamp.is_valid(),
            Home::Pool(home) => !home.freed.load(Ordering::Acquire),
        }
    }

    /// [`Storage::is_live`], with the error naming `op`, `arg` and the owner when not.
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
        match &self.home {
            Home::Workspace(stamp) => {
                stamp
                    .check(op, arg)
                    .err()
                    .unwrap_or_else(|| Error::LeakedWorkspacePointer {
                        op: op.into(),
                        arg: arg.into(),
                        workspace: stamp.workspace_id().into(),
                    })
            }
            Home::Pool(_) => Error::ScopeClosed {
                op: op.into(),
                arg: arg.into(),
                scope: self.owner_name().unwrap_or_else(|| "?".into()),
            },
        }
    }

    /// The bytes, after the validity check, for as long as `pin` holds the epoch.
    #[inline]
    pub(crate) fn read<'a>(&'a self, op: &str, arg: &str, _pin: &'a Pin) -> Result<&'a [u8]> {
        self.check(op, arg)?;
        // SAFETY: the check passed, so the memory is live: a pool block not yet handed to
        // reclamation (and `_pin` keeps a block handed over after the check alive until the
        // borrow ends), or workspace memory of the current generation on its owner thread
        // (or a circular workspace, whose stamp keeps the ring alive and its slot out of
        // the ring's reuse, so no cycle writes the bytes while we read). Shared storages are
        // written only through `write_exclusive`, which needs the only tensor handle, so no
        // reader of this one exists then.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes) })
    }

    /// The bytes, writable, after the validity check, if `this` is the only tensor handle
    /// to the storage; otherwise [`Error::SharedTensor`]. Scopes' references are counted
    /// exactly (`scope_refs`, read under the ownership lock, which every change to it
    /// holds) and never read or write data, so they do not count as handles.
    pub(crate) fn write_exclusive<'a>(
        this: &'a mut Arc<Storage>,
        op: &str,
        _pin: &'a Pin,
    ) -> Result<&'a mut [u8]> {
        this.check(op, "X")?;
        if Arc::strong_count(this) != 1 {
            // Other references: scopes' or other handles'. Nothing can add a handle while
            // we hold `&mut` to this one (a clone needs another handle, and scopes never
            // hand theirs out), and scope references change only under this lock.
            let _transfer = crate::scope::ownership_lock();
            let handles = Arc::strong_count(this) - this.scope_refs.load(Ordering::Acquire);
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
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: the check passed (the memory is live, see `read`), and no other tensor
        // handle exists (counted above): `&mut` to the only tensor-side `Arc` excludes
        // every other reader or writer, including views, which borrow a handle. Scopes'
        // references never touch the bytes; if the owning scope frees them concurrently,
        // `_pin` keeps the block allocated until this borrow, bound to it, ends.
        Ok(unsafe { std::slice::from_raw_parts_mut(this.ptr.as_ptr(), this.bytes) })
    }

    /// A scope took a reference (ownership lock held).
    pub(crate) fn scope_ref_added(&self) {
        self.scope_refs.fetch_add(1, Ordering::AcqRel);
    }

    /// A scope dropped a reference (ownership lock held).
    pub(crate) fn scope_ref_removed(&self) {
        self.scope_refs.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether its closed scope freed this (pool) storage.
    pub(crate) fn is_freed(&self) -> bool {
        match &self.home {
            Home::Pool(home) => home.freed.load(Ordering::Acquire),
            Home::Workspace(_) => false,
        }
    }

    /// The workspace stamp, for workspace-backed storage.
    pub(crate) fn stamp(&self) -> Option<&Stamp> {
        match &self.home {
            Home::Workspace(stamp) => Some(stamp),
            Home::Pool(_) => None,
        }
    }

    /// The owning scope, if a scope owns this storage.
    pub(crate) fn owner(&self) -> Option<Arc<ScopeShared>> {
        match &self.home {
            Home::Pool(home) => lock(&home.owner).clone(),
            Home::Workspace(_) => None,
        }
    }

    fn owner_name(&self) -> Option<String> {
        self.owner().map(|s| s.name().to_string())
    }

    /// Records `scope` as the owner (the caller holds the ownership lock); returns the
    /// previous owner. Workspace memory cannot be owned by a scope.
    pub(crate) fn set_owner(
        &self,
        scope: Option<Arc<ScopeShared>>,
    ) -> Result<Option<Arc<ScopeShared>>> {
        match &self.home {
            Home::Pool(home) => Ok(std::mem::replace(&mut *lock(&home.owner), scope)),
            Home::Workspace(stamp) => Err(Error::Scope {
                scope: scope.map_or_else(|| "?".into(), |s| s.name().to_string()),
                message: format!(
                    "a tensor of workspace [{}] belongs to its workspace; detach() it first",
                    stamp.workspace_id()
                ),
            }),
        }
    }

    /// Frees the block (its scope closed): later checks fail; readers pinned before keep
    /// it until they unpin, and live views until the last of them drops.
    pub(crate) fn free_for_scope(&self) {
        if let Home::Pool(home) = &self.home {
            // SeqCst pairs with `hold_for_view`: either the view sees `freed`, or this
            // sees the view (and the view's drop frees the block).
            home.freed.store(true, Ordering::SeqCst);
            if home.views.load(Ordering::SeqCst) == 0 {
                home.defer_block();
            }
        }
    }

    /// The bytes for a borrowed view, checked, kept from being freed until the returned
    /// hold drops (without an epoch pin, so a long-lived view stalls no reclamation): a
    /// pool block is kept by a view count its scope's close respects, workspace memory
    /// by the workspace's view pin.
    pub(crate) fn hold_for_view(&self, op: &str, arg: &str) -> Result<(ViewHold<'_>, &[u8])> {
        let hold = match &self.home {
            Home::Pool(home) => {
                home.views.fetch_add(1, Ordering::SeqCst);
                let hold = ViewHold::Pool(home);
                if home.freed.load(Ordering::SeqCst) {
                    drop(hold);
                    return Err(self.refusal(op, arg));
                }
                hold
            }
            Home::Workspace(stamp) => {
                stamp.check(op, arg)?;
                ViewHold::Workspace(stamp.pin_view())
            }
        };
        // SAFETY: the memory is live and stays so while `hold` lives, which the caller
        // keeps with the slice (`TensorView`): a pool block is not freed while the view
        // count is non-zero (the count was raised before `freed` was seen clear, so
        // `free_for_scope` sees it, and the storage itself outlives the `&self` borrow);
        // workspace memory passed the stamp check on its owner thread and the view pin
        // stops new cycles and destroys. Shared storages are written only through
        // `write_exclusive`, which needs the only handle, and a view borrows one.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes) };
        Ok((hold, bytes))
    }
}

/// Keeps a storage's memory alive for a borrowed view (see [`Storage::hold_for_view`]).
pub(crate) enum ViewHold<'a> {
    Pool(&'a PoolHome),
    Workspace(#[allow(dead_code)] workspace::ViewPin),
}

impl Drop for ViewHold<'_> {
    fn drop(&mut self) {
        if let ViewHold::Pool(home) = self {
            if home.views.fetch_sub(1, Ordering::SeqCst) == 1 && home.freed.load(Ordering::SeqCst) {
                home.defer_block();
            }
        }
    }
}

impl PoolHome {
    /// Hands the block to epoch reclamation, once.
    fn defer_block(&self) {
        if let Some(block) = lock(&self.block).take() {
            reclaim::defer_free(block);
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Home::Pool(home) = &self.home {
            // No view is alive: views borrow a handle, and this is the last reference.
            home.defer_block();
        }
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the data are
/// plain ownership records, consistent at every await point).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
