//! Workspaces: named, per-thread, cyclic bump arenas (semantics §2), and the validity
//! stamps that keep their memory from being used after a cycle ends (semantics §3).
//!
//! A loop enters a workspace once per iteration ([`Workspaces::get_and_activate`]) and
//! allocates in it by bumping an offset; leaving ends the *cycle*, and the next one reuses
//! the same memory. The first cycles spill to the pool while the workspace learns how much
//! a cycle needs; after that a cycle touches neither the pool nor the OS. Every byte comes
//! from the configuration's [`crate::MemorySource`] (the global pool unless set).
//!
//! Invariant: memory handed out by a workspace is never freed or reused while a guard of
//! the cycle that handed it out is alive, and every later use of it goes through
//! [`Stamp::check`], which refuses memory of an ended cycle, of a destroyed workspace, or
//! of another thread (circular workspaces: only destroyed).
//!
//! Modules, each using only those listed before it (in parentheses: which):
//! - `slots`, `state`: what is shared across threads (the ring slots' references, the
//!   stamp's state word), on `crate::sync` alone so that loom can model them;
//! - `sizing`: size arithmetic and ring geometry, pure, `unsafe` forbidden;
//! - `config` (sizing): policies and their validation, the memory source; `stats`: the
//!   figures;
//! - `stamp` (state): validity tokens;
//! - `buffer` (config): the buffer, a pool block or a mapped file;
//! - `bump` (sizing): the running cycle's region; `spill` (buffer, sizing, stamp);
//!   `ring` (buffer, sizing, slots, stamp);
//! - `arena` (all of the above): one workspace's cycles;
//! - `manager` (arena, config, stamp, stats): per-thread state and guards;
//! - `alloc_api` (arena, manager): `&WorkspaceGuard` as an allocator-api2 allocator.
//!
//! `unsafe` code lives in `buffer` (mapping a file), `bump` (the bump pointer), `stamp`
//! (`WorkspaceMemory: Send + Sync`) and `alloc_api` (the `Allocator` impl).

mod alloc_api;
mod arena;
mod buffer;
mod bump;
mod config;
mod manager;
mod ring;
pub(crate) mod sizing;
mod slots;
mod spill;
mod stamp;
mod state;
mod stats;

pub use config::{
    AllocationPolicy, DebugMode, LearningPolicy, LocationPolicy, MirroringPolicy, ResetPolicy,
    SpillPolicy, WorkspaceConfig, WorkspaceConfigBuilder, ENV_WORKSPACES, MAX_ALIGNMENT,
    MAX_RING_SLOTS,
};
pub use manager::{
    all_workspaces, allocate_in, allocate_in_current, allocate_in_parent, parent_of_current,
    workspaces, ScopeOut, WorkspaceGuard, Workspaces,
};
pub(crate) use manager::{all_workspaces_with_source, WorkspaceEntry};
pub(crate) use manager::{allocate_tensor_in, parent_of_current_is};
pub(crate) use stamp::{cycle_word_passes, StampProbe};
pub use stamp::{Stamp, ViewPin, WorkspaceMemory};
pub use stats::WorkspaceStats;
