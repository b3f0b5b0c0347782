//! # ndmem
//!
//! A memory-accounting runtime for tensor workloads. This crate builds on
//! [`ndmem_alloc`], which provides the tracking global allocator and the native pool.

#![warn(missing_docs)]

mod error;

pub use error::{Error, Result};
pub use ndmem_alloc as alloc;
