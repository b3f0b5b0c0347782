//! # ndmem
//!
//! A memory-accounting runtime for tensor workloads. This crate builds on
//! [`ndmem_alloc`], which provides the tracking global allocator and the native pool.

#![warn(missing_docs)]

mod error;
pub mod memory;
pub mod reclaim;
pub mod scope;
mod sync;
pub mod tensor;
pub mod workspace;

pub use error::{Error, Result};
pub use memory::MemorySource;
pub use ndmem_alloc as alloc;
pub use scope::Scope;
pub use tensor::{DType, Element, Tensor, TensorView};
pub use workspace::{
    workspaces, AllocationPolicy, LearningPolicy, LocationPolicy, MirroringPolicy, ResetPolicy,
    SpillPolicy, WorkspaceConfig, WorkspaceGuard, WorkspaceStats,
};

/// The README's examples are compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
