//! The allocation flow of a new tensor: where its memory goes, and who owns it.
//!
//! Invariant: a new tensor's memory is written only before it is shared
//! ([`NewStorage::bytes_mut`]); sharing it ([`NewStorage::share`]) hands pool memory to the
//! owner the placement chose (the first input's scope, or the scope asked for), or leaves
//! it to the handles. Workspace memory is never owned by a scope. Pool memory comes from
//! the placement's [`MemorySource`], never from a pool named here.

use std::alloc::Layout;
use std::sync::Arc;

use ndmem_alloc::Usage;

use crate::error::{Error, Result};
use crate::memory::home::Home;
use crate::memory::owner::{Fresh, Handle, Owned, Owner};
use crate::memory::MemorySource;
use crate::workspace;

/// Where a new tensor's memory should go (the design's "flow of one allocation").
#[derive(Clone, Copy, Debug)]
pub(crate) enum Placement<'a> {
    /// The current workspace, else pool memory from the first input's source (the global
    /// pool if there is no first input, or it is not pool memory), owned by the first
    /// input's owner, if any, else by the handles.
    Auto(Option<&'a Owned>),
    /// Pool memory from `source`, owned by `owner` (else the handles), ignoring any
    /// workspace (detach, a scope's constructors, `Tensor::zeros_in`).
    Pool {
        /// The pool.
        source: MemorySource,
        /// The owner, if not the handles.
        owner: Option<&'a Arc<Owner>>,
    },
    /// The parent of the current workspace, else pool memory from this source (leverage).
    ParentWorkspace(MemorySource),
    /// The open workspace with this id (leverage_to).
    Workspace(&'a str),
    /// The current workspace, else pool memory from this source (migrate).
    CurrentWorkspace(MemorySource),
}

/// A tensor's memory that is not shared yet, so its bytes may be written.
#[derive(Debug)]
pub(crate) struct NewStorage {
    fresh: Fresh,
    owner: Option<Arc<Owner>>,
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
            Placement::Auto(_) | Placement::CurrentWorkspace(_) => {
                workspace::allocate_in_current(layout)
            }
            Placement::ParentWorkspace(_) => workspace::allocate_in_parent(layout),
            Placement::Workspace(id) => workspace::allocate_tensor_in(id, layout),
            Placement::Pool { .. } => None,
        };
        if let Some(memory) = in_workspace {
            return Ok(NewStorage {
                fresh: Fresh::new(Home::workspace(memory?, bytes)),
                owner: None,
            });
        }
        let (source, owner) = match placement {
            Placement::Auto(first) => {
                let owner = first.and_then(Owned::owner);
                let source = first.map(Owned::source).unwrap_or_default();
                (source, owner)
            }
            Placement::Pool { source, owner } => (source, owner.cloned()),
            Placement::ParentWorkspace(source) | Placement::CurrentWorkspace(source) => {
                (source, None)
            }
            // A workspace under `NDMEM_WORKSPACES=bypass`: the pool, as for every tensor.
            Placement::Workspace(_) => (MemorySource::default(), None),
        };
        if let Some(owner) = &owner {
            owner.check_attachable(op)?;
        }
        let block = source.allocate(bytes, layout.align(), Usage::Tensor)?;
        Ok(NewStorage {
            fresh: Fresh::new(Home::pool(block, bytes, source)),
            owner,
        })
    }

    /// The bytes, writable, after the validity check (`op`'s `Z`): nobody else can see
    /// this memory yet.
    pub(crate) fn bytes_mut(&mut self, op: &str) -> Result<&mut [u8]> {
        self.fresh.owned().check(op, "Z")?;
        // Live a moment ago, on this thread, and not shared: it still is (the error is
        // only for a cycle that ended in between, which nothing here does).
        self.fresh.bytes_mut().map_err(|e| {
            e.or_refusal(|| Error::LeakedWorkspacePointer {
                op: op.into(),
                arg: "Z".into(),
                workspace: "?".into(),
            })
        })
    }

    /// Shares the memory (in a recycled header when this thread has one), handing it to
    /// its owner if it has one.
    pub(crate) fn share(self, op: &str) -> Result<Handle> {
        let handle = self.fresh.share();
        if let Some(owner) = self.owner {
            owner.adopt(op, handle.arc())?;
        }
        Ok(handle)
    }
}
