//! The memory seam: where the bytes of every public handle come from and live.
//!
//! Parts, each calling only downward (see `docs/design.md`):
//! - [`source`]: the memory source, a handle to the pool that workspaces, scopes and
//!   tensors draw from (the global pool unless configured otherwise);
//! - `handoff`: who frees a pool block, and when (the freed bit and the view count);
//! - `home`: where one tensor's bytes live (a workspace slot or a pool block) and the
//!   checked ways to read and write them;
//! - `owner`: the ownership records scopes keep (their lists, what they lent, the lock).
//!
//! Invariant: nothing in this module knows `Tensor` or `Scope`; they are built on it.

// The items are `pub` because the loom model compiles this file as a public module.
#[allow(unreachable_pub)]
pub(crate) mod handoff;
pub(crate) mod home;
pub(crate) mod owner;
pub mod source;

pub use source::MemorySource;
