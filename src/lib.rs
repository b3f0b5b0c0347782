//! # ndmem
//!
//! A memory-accounting runtime for tensor workloads. This crate builds on
//! [`ndmem_alloc`], which provides the tracking global allocator and the native pool.

#![warn(missing_docs)]

#[cfg(not(ndmem_loom))]
mod error;
#[cfg(not(ndmem_loom))]
pub mod memory;
#[cfg(not(ndmem_loom))]
pub mod reclaim;
#[cfg(not(ndmem_loom))]
pub mod scope;
mod sync;
#[cfg(not(ndmem_loom))]
pub mod tensor;
#[cfg(not(ndmem_loom))]
pub mod workspace;

// Under `--cfg ndmem_loom` only the pieces the loom models in `loom-tests/` check are built.
#[cfg(ndmem_loom)]
#[path = "workspace/slots.rs"]
pub mod workspace_slots;
#[cfg(ndmem_loom)]
#[path = "workspace/state.rs"]
pub mod workspace_state;

#[cfg(not(ndmem_loom))]
pub use error::{Error, Result};
#[cfg(not(ndmem_loom))]
pub use memory::MemorySource;
#[cfg(not(ndmem_loom))]
pub use ndmem_alloc as alloc;
#[cfg(not(ndmem_loom))]
pub use scope::Scope;
#[cfg(not(ndmem_loom))]
pub use tensor::{DType, Element, Tensor, TensorView};
#[cfg(not(ndmem_loom))]
pub use workspace::{
    workspaces, AllocationPolicy, LearningPolicy, LocationPolicy, MirroringPolicy, ResetPolicy,
    SpillPolicy, WorkspaceConfig, WorkspaceGuard, WorkspaceStats,
};

/// The README's examples are compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
