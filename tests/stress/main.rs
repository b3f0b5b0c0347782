//! Under pressure: tensors freed with the heap at its limit (semantics §6), and random
//! work from several threads against tight pool limits (semantics §1, §2, §4), with the
//! `Tracking` allocator installed as a host application installs it.
//!
//! Tests that set the heap limit run alone in a child process (the limit is process-wide,
//! and an abort there must not take the test runner down).

#![allow(unsafe_code)]

use ndmem::alloc::heap;
use ndmem::alloc::Tracking;

#[path = "../common/mod.rs"]
mod common;

mod at_the_heap_limit;
mod threads;

#[global_allocator]
static GLOBAL: Tracking<std::alloc::System> = Tracking::new(std::alloc::System);

/// Whether `Tracking` counts this binary's heap (it is the global allocator).
#[test]
fn the_tracking_allocator_is_installed() {
    std::hint::black_box(Vec::<u8>::with_capacity(64));
    assert!(heap::is_tracking());
}
