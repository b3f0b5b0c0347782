//! The error type of the `ndmem` crate: every way a workspace, tensor, scope or device
//! operation can fail, each with a message that names what was wrong, and the out-of-memory
//! report attached to a refusal at a limit (semantics §7; `stats` builds it).

use std::fmt;

use ndmem_alloc::{AllocError, ByteSize, ConfigError};

/// Errors of ndmem operations. Nothing in the safe API panics on bad input or misuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor from a workspace that is no longer open (left or destroyed) was used
    /// (semantics §3).
    #[error("Op [{op}] {arg} argument uses leaked workspace pointer from workspace [{workspace}]")]
    LeakedWorkspacePointer {
        /// The operation that refused the tensor.
        op: String,
        /// Which argument (`X`, `Y`, `Z`, ...).
        arg: String,
        /// The workspace the tensor was allocated in.
        workspace: String,
    },
    /// A tensor from an earlier cycle of a still-open workspace was used (semantics §3).
    #[error("Op [{op}] {arg} argument uses outdated workspace pointer from workspace [{workspace}] (allocated in generation {allocated_in}, now {current})")]
    OutdatedWorkspacePointer {
        /// The operation that refused the tensor.
        op: String,
        /// Which argument (`X`, `Y`, `Z`, ...).
        arg: String,
        /// The workspace the tensor was allocated in.
        workspace: String,
        /// The generation the tensor was allocated in.
        allocated_in: u64,
        /// The workspace's generation now.
        current: u64,
    },
    /// A workspace with the `Fail` spill policy cannot serve a request (semantics §2.2).
    #[error("workspace [{workspace}] is full: {requested} bytes requested, {available} bytes left in this cycle")]
    WorkspaceFull {
        /// The workspace.
        workspace: String,
        /// Bytes requested (after alignment padding).
        requested: usize,
        /// Bytes left in the buffer.
        available: usize,
    },
    /// A workspace exists but no cycle of it is running (it was left or destroyed), so
    /// nothing can be allocated in it (semantics §2.2).
    #[error("workspace [{workspace}] is not open on this thread: {reason}; enter it with get_and_activate first")]
    WorkspaceNotOpen {
        /// The workspace.
        workspace: String,
        /// Why it is not open.
        reason: &'static str,
    },
    /// A workspace cannot recycle or free its memory while views of it are alive.
    #[error("workspace [{workspace}] cannot {action}: {views} view(s) of its memory are still alive; drop them first (or detach() the tensors)")]
    WorkspaceInUse {
        /// The workspace.
        workspace: String,
        /// What was refused (`start a new cycle`, `be destroyed`).
        action: &'static str,
        /// Live views of its memory.
        views: usize,
    },
    /// A workspace's memory-mapped file could not be created, sized, mapped or claimed
    /// (`LocationPolicy::Mmap`).
    #[error("workspace [{workspace}]: memory-mapped file {path}: {message}")]
    WorkspaceFile {
        /// The workspace.
        workspace: String,
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No workspace with this id exists on this thread.
    #[error("no workspace [{workspace}] exists on this thread")]
    NoSuchWorkspace {
        /// The id asked for.
        workspace: String,
    },
    /// Workspace memory was used from a thread other than its owner (semantics §3).
    #[error("Op [{op}] {arg} argument lives in workspace [{workspace}] of thread {owner:?} and cannot be used from thread {current:?}; detach() it before sending it")]
    WrongThread {
        /// The operation that refused the tensor.
        op: String,
        /// Which argument.
        arg: String,
        /// The workspace the tensor was allocated in.
        workspace: String,
        /// The owning thread.
        owner: std::thread::ThreadId,
        /// The thread that tried to use it.
        current: std::thread::ThreadId,
    },
    /// A tensor of a closed scope was used, or a closed scope asked to take, create or
    /// open something (semantics §4).
    #[error("{}", scope_closed(op, arg, scope))]
    ScopeClosed {
        /// The operation that refused the tensor (or the scope).
        op: String,
        /// Which argument; empty when the closed scope itself refused (`attach`, a
        /// constructor, `child`).
        arg: String,
        /// The closed scope.
        scope: String,
    },
    /// Something was attached to a capped scope, or a child scope opened in it (semantics
    /// §4).
    #[error("scope [{scope}] is capped: nothing more can be attached to it, and no child scope opened in it")]
    ScopeCapped {
        /// The capped scope.
        scope: String,
    },
    /// A scope operation that its state forbids (closing the root, borrowing into the root,
    /// ...); closing a closed scope again is not one (it does nothing, as in DJL).
    #[error("scope [{scope}]: {message}")]
    Scope {
        /// The scope.
        scope: String,
        /// What is wrong.
        message: String,
    },
    /// An in-place op on a tensor whose memory other handles (clones, views) share.
    #[error("Op [{op}] writes in place, but {others} other handle(s) share this tensor's memory; copy() it first")]
    SharedTensor {
        /// The in-place operation.
        op: String,
        /// How many other handles share the memory.
        others: usize,
    },
    /// Shapes do not fit the operation.
    #[error("Op [{op}]: {message}")]
    Shape {
        /// The operation.
        op: String,
        /// What is wrong, with the shapes involved.
        message: String,
    },
    /// Integer arithmetic with no defined result: division by zero, or `MIN / -1` (whose
    /// quotient does not fit). Integer add, sub, mul, sums and matmul wrap instead.
    #[error("Op [{op}]: {message}")]
    Arithmetic {
        /// The operation.
        op: String,
        /// What has no result, with the operands.
        message: String,
    },
    /// Data types do not fit the operation.
    #[error("Op [{op}]: {message}")]
    DType {
        /// The operation.
        op: String,
        /// What is wrong, with the types involved.
        message: String,
    },
    /// No GPU or CUDA driver is available (semantics §5).
    #[error("no device: {reason}")]
    NoDevice {
        /// Why no device could be used.
        reason: String,
    },
    /// The heap (the global allocator: `NDMEM_MAX_HEAP` through `Tracking`, or the system)
    /// refused what an operation returns in a `Vec`; nothing was allocated.
    #[error("{op}: the heap refused {requested} bytes (under NDMEM_MAX_HEAP or out of system memory); free heap memory or raise NDMEM_MAX_HEAP")]
    HeapRefused {
        /// The operation.
        op: String,
        /// Bytes asked for.
        requested: usize,
    },
    /// The device reported an error.
    #[error("device {device}: {message}")]
    Device {
        /// Device ordinal.
        device: u32,
        /// The driver's message.
        message: String,
    },
    /// Memory could not be allocated. A refusal at a limit is
    /// [`AllocError::OutOfMemory`] with this crate's [`OomReport`] attached (semantics §7):
    /// its message lists the largest holders and what to do, and [`Error::oom_report`]
    /// returns it. The physical limit, a bad layout and the OS give the other variants.
    #[error(transparent)]
    Alloc(AllocError),
    /// A configuration value is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A prefetching iterator's producer panicked or could not start (semantics §6).
    #[error("prefetch iterator [{iterator}]: {message}")]
    Prefetch {
        /// The iterator's name.
        iterator: String,
        /// What happened, with the batch number where there is one.
        message: String,
    },
    /// A prefetched batch was used after its window ended (semantics §6): `detach()` a
    /// batch to keep it longer.
    #[error("prefetch iterator [{iterator}]: batch {batch} was used after its window: {reason}; detach() a batch to keep it longer")]
    PrefetchWindow {
        /// The iterator's name.
        iterator: String,
        /// The batch's number in the stream, from 0.
        batch: u64,
        /// Why the window ended.
        reason: String,
    },
}

/// [`Error::ScopeClosed`]'s message: the argument that belongs to the closed scope, or,
/// with no argument, the scope that refused.
fn scope_closed(op: &str, arg: &str, scope: &str) -> String {
    if arg.is_empty() {
        format!("Op [{op}]: scope [{scope}] is closed")
    } else {
        format!("Op [{op}] {arg} argument belongs to scope [{scope}], which is closed")
    }
}

impl Error {
    /// The allocator's error inside [`Error::Alloc`].
    pub fn alloc_error(&self) -> Option<&AllocError> {
        match self {
            Error::Alloc(e) => Some(e),
            _ => None,
        }
    }

    /// The out-of-memory report of a refusal at a limit
    /// (`Error::Alloc(AllocError::OutOfMemory { .. })`).
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            Error::Alloc(AllocError::OutOfMemory {
                report: Some(report),
                ..
            }) => report.downcast_ref(),
            _ => None,
        }
    }

    /// Whether this is a refusal at a limit (a host pool's or a device's off-heap limit,
    /// or the physical limit: `AllocError::PhysicalLimit`), the error a smaller batch, a
    /// freed workspace or a higher limit can cure. Only `OutOfMemory` carries the report
    /// ([`Error::oom_report`]); the `stats::on_oom` hooks get one for both.
    pub fn is_out_of_memory(&self) -> bool {
        self.alloc_error()
            .is_some_and(|e| e.refused_at_limit().is_some())
    }
}

/// `Result` with ndmem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of thing holds memory in an [`OomReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum HolderKind {
    /// A workspace: its buffer plus its spills.
    Workspace,
    /// A scope: the tensors it owns.
    Scope,
    /// The refusing pool's cache of freed blocks.
    PoolCache,
    /// Deferred frees waiting for the epoch.
    PendingReclamation,
    /// Memory of the refusing device, by purpose (tensors, workspaces, mirrors, its cache).
    Device,
}

/// One holder of memory, with its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Holder {
    /// What it is.
    pub kind: HolderKind,
    /// Its name (`[LOOP] on thread main (ThreadId(1))`, `[model]`, ...).
    pub name: String,
    /// Bytes it holds.
    pub bytes: usize,
    /// The breakdown (`buffer 6.00 MiB, spilled 0 B, open`).
    pub detail: String,
}

/// The report attached to an out-of-memory error (`Error::Alloc(AllocError::OutOfMemory {
/// report, .. })`, read with [`Error::oom_report`]) and
/// handed to `stats::on_oom` hooks (semantics §7). `stats` builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OomReport {
    /// The pool's refusal (its message opens the report), without the report attached.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub error: AllocError,
    /// The largest holders, largest first (at most eight).
    pub holders: Vec<Holder>,
    /// Bytes held for reuse that could not serve this request: the pool's cached blocks
    /// (the pool takes a cached block of the request's size class before it refuses, so
    /// any left are of other classes) plus the workspace buffer bytes no running cycle
    /// uses (they serve only their workspace's bumps).
    pub fragmentation_bytes: usize,
    /// What to do, most direct first: the limit's knob, `trim`, which workspace to
    /// destroy, which scope to close, collection.
    pub advice: Vec<String>,
}

impl fmt::Display for OomReport {
    /// The pool's message, then the holders, the fragmentation figure and the advice.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            // The pool's opening (semantics §1); its one-size-fits-all hint gives way to
            // the advice below, which names the knob that applies.
            AllocError::OutOfMemory {
                kind,
                requested,
                needed,
                thread,
                used,
                limit,
                holders,
                ..
            } => write!(
                f,
                "Can't allocate {kind} memory: {}; threadId: {thread}; {} {} of {} limit in use ({})",
                ndmem_alloc::RequestedBytes(*requested, *needed),
                kind.budget(),
                ByteSize(*used),
                ByteSize(*limit),
                holders.of(*kind)
            )?,
            other => write!(f, "{other}")?,
        }
        if !self.holders.is_empty() {
            f.write_str("\nlargest holders:")?;
            for h in &self.holders {
                write!(f, "\n  {} {}: {}", ByteSize(h.bytes), h.name, h.detail)?;
            }
        }
        write!(
            f,
            "\nheld for reuse but unusable for this request: {}",
            ByteSize(self.fragmentation_bytes)
        )?;
        if !self.advice.is_empty() {
            f.write_str("\nwhat to do:")?;
        }
        for a in &self.advice {
            write!(f, "\n  - {a}")?;
        }
        Ok(())
    }
}
