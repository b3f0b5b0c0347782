//! Helpers shared by the integration test binaries: include with
//! `#[path = "../common/mod.rs"] mod common;` from a `tests/<area>/main.rs` (or `mod common;`
//! from a file directly under `tests/`).
//!
//! - [`child`]: this test binary run again as a child process, for what is process-wide: an
//!   environment variable read once, the RSS, the epoch, the global pool.
//! - [`counting`]: a global allocator counting each thread's heap allocations.
//! - [`forked`]: waiting for a forked child, with a deadline.

// Each binary uses only some of these helpers.
#![allow(dead_code, unused_imports, unused_macros)]

pub(crate) mod child;
pub(crate) mod counting;
pub(crate) mod forked;

pub(crate) use child::test_name;
