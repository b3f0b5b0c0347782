//! The memory seam: where the bytes of every public handle come from and live.
//!
//! Three parts, each calling only downward (see `docs/design.md`):
//! - [`source`]: the memory source, a handle to the pool that workspaces, scopes and
//!   tensors draw from (the global pool unless configured otherwise);
//! - `home`: where one tensor's bytes live (a workspace slot or a pool block);
//! - `owner`: the ownership record scopes keep (their lists, what they lent, the lock).
//!
//! Invariant: nothing in this module knows `Tensor` or `Scope`; they are built on it.

pub mod source;

pub use source::MemorySource;
