//! Where a tensor's bytes live and how to prove they may still be touched.
//!
//! Invariant: the bytes of a [`Storage`] are reachable only through [`Storage::read`],
//! which first runs the validity check of SEMANTICS 3 and 4 (workspace stamp, or the
//! "freed by its scope" flag) under an epoch pin. A scope frees pool memory by setting that
//! flag and deferring the block to [`crate::reclaim`], so a reader that passed the check
//! keeps the memory until it unpins. Outputs are written only before they are shared
//! ([`NewStorage::bytes_mut`]). This module and the workspace arena are the only places in
//! the `ndmem` crate that turn raw pool pointers into slices.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
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
}

enum Home {
    /// Bump-allocated in a workspace; valid while its stamp says so.
    Workspace(Stamp),
    /// A pool block owned by the handles, or by a scope.
    Pool(PoolHome),
}

struct PoolHome {
    /// Set (once) when the owning scope closed and the block went to reclamation.
    freed: AtomicBool,
    block: Mutex<Option<Block<'static>>>,
    /// The scope that owns the block; `None`: the handles own it.
    owner: Mutex<Option<Arc<ScopeShared>>>,
}

// SAFETY: the pointer is either into a pool block this storage owns (Block is Send + Sync)
// or into workspace memory whose cross-thread use the stamp refuses (only circular
// workspaces, which keep their buffer alive through the stamp, hand memory across threads).
unsafe impl Send for Storage {}
// SAFETY: shared access only reads, through `read`, after the validity check.
unsafe impl Sync for Storage {}

/// Where a new storage should go (SEMANTICS "The flow of one allocation").
#[derive(Clone, Copy)]
pub(crate) enum Placement<'a> {
    /// Current workspace, else this scope (the first input's), else the handles.
    Auto(Option<&'a Arc<ScopeShared>>),
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
                },
                scope: None,
            });
        }
        let scope = match placement {
            Placement::Auto(scope) => scope.cloned(),
            Placement::Scope(scope) => Some(scope.clone()),
            _ => None,
        };
        if let Some(scope) = &scope {
            scope.check_attachable()?;
        }
        let block = Pool::global().allocate_for(bytes, layout.align(), Usage::Tensor)?;
        Ok(NewStorage {
            storage: Storage {
                ptr: block.ptr(),
                bytes,
                home: Home::Pool(PoolHome {
                    freed: AtomicBool::new(false),
                    block: Mutex::new(Some(block)),
                    owner: Mutex::new(None),
                }),
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
    pub(crate) fn share(self) -> Result<Arc<Storage>> {
        let storage = Arc::new(self.storage);
        if let Some(scope) = self.scope {
            scope.adopt(&storage)?;
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
    pub(crate) fn read<'a>(&'a self, op: &str, arg: &str, _pin: &Pin) -> Result<&'a [u8]> {
        self.check(op, arg)?;
        // SAFETY: the check passed, so the memory is live: a pool block not yet handed to
        // reclamation (and `_pin` keeps a block handed over after the check alive until the
        // borrow ends), or workspace memory of the current generation on its owner thread
        // (or a circular workspace whose stamp keeps the buffer alive). Storages are never
        // written after they are shared.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes) })
    }

    /// The bytes, writable, after the validity check, if `this` is the only handle to the
    /// storage (a scope that owns it holds one more reference, which never reads or writes
    /// data); otherwise [`Error::SharedTensor`].
    pub(crate) fn write_exclusive<'a>(
        this: &'a mut Arc<Storage>,
        op: &str,
        _pin: &Pin,
    ) -> Result<&'a mut [u8]> {
        let owners = 1 + usize::from(this.owner().is_some());
        let handles = Arc::strong_count(this);
        if handles != owners {
            return Err(Error::SharedTensor {
                op: op.into(),
                others: handles.saturating_sub(owners),
            });
        }
        this.check(op, "X")?;
        // SAFETY: the check passed (the memory is live, see `read`), and no other handle
        // exists: `&mut` to the only tensor-side `Arc` excludes every other reader or
        // writer (the owning scope's reference never touches the bytes, and if it frees
        // them concurrently the pin keeps the block until this borrow ends).
        Ok(unsafe { std::slice::from_raw_parts_mut(this.ptr.as_ptr(), this.bytes) })
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

    /// Frees the block now (its scope closed): later checks fail, readers pinned before
    /// keep it until they unpin.
    pub(crate) fn free_for_scope(&self) {
        if let Home::Pool(home) = &self.home {
            home.freed.store(true, Ordering::SeqCst);
            if let Some(block) = lock(&home.block).take() {
                reclaim::defer_free(block);
            }
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Home::Pool(home) = &self.home {
            if let Some(block) = lock(&home.block).take() {
                reclaim::defer_free(block);
            }
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
