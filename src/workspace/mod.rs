//! Workspaces: named, per-thread, cyclic bump arenas (SEMANTICS 2), and the validity
//! stamps that keep their memory from being used after a cycle ends (SEMANTICS 3).
//!
//! A loop enters a workspace once per iteration ([`Workspaces::get_and_activate`]) and
//! allocates in it by bumping an offset; leaving ends the *cycle*, and the next one reuses
//! the same memory. The first cycles spill to the pool while the workspace learns how much
//! a cycle needs; after that a cycle touches neither the pool nor the OS.
//!
//! Invariant: memory handed out by a workspace is never freed or reused while a guard of
//! the cycle that handed it out is alive, and every later use of it goes through
//! [`Stamp::check`], which refuses memory of an ended cycle, of a destroyed workspace, or
//! of another thread (circular workspaces: only destroyed).
//!
//! Modules: `config` (policies and their validation), `arena` (the buffer, bumping,
//! spills, learning, the ring; all `unsafe` code), `manager` (per-thread state, guards,
//! statistics), `stamp` (validity tokens).

mod arena;
mod config;
mod manager;
mod stamp;

pub use config::{
    AllocationPolicy, LearningPolicy, LocationPolicy, MirroringPolicy, ResetPolicy, SpillPolicy,
    WorkspaceConfig, WorkspaceConfigBuilder, ENV_WORKSPACES, MAX_ALIGNMENT,
};
pub use manager::{
    allocate_in, allocate_in_current, allocate_in_parent, parent_of_current, workspaces, ScopeOut,
    WorkspaceGuard, WorkspaceStats, Workspaces,
};
pub use stamp::{Stamp, ViewPin, WorkspaceMemory};
