//! The error type of the `ndmem` crate: every way a workspace, tensor, scope or device
//! operation can fail, each with a message that names what was wrong.

use ndmem_alloc::{AllocError, ConfigError};

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
    /// A tensor of a closed scope was used (semantics §4).
    #[error("Op [{op}] {arg} argument belongs to scope [{scope}], which is closed")]
    ScopeClosed {
        /// The operation that refused the tensor.
        op: String,
        /// Which argument.
        arg: String,
        /// The closed scope.
        scope: String,
    },
    /// Something was attached to a capped scope (semantics §4).
    #[error("scope [{scope}] is capped: nothing more can be attached to it")]
    ScopeCapped {
        /// The capped scope.
        scope: String,
    },
    /// A scope operation that its state forbids (closing the root, closing twice, ...).
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
    /// The device reported an error.
    #[error("device {device}: {message}")]
    Device {
        /// Device ordinal.
        device: u32,
        /// The driver's message.
        message: String,
    },
    /// Memory could not be allocated (a limit, a bad layout, the OS).
    #[error(transparent)]
    Alloc(#[from] AllocError),
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

/// `Result` with ndmem's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
