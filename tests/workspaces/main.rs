//! Workspaces: one test per clause of semantics §2 (`config`, `lifecycle`, `learning`,
//! `circular`, `source`, `location`, `debug_modes`), the validity stamps of semantics §3
//! (`stamps`), the allocator_api2 integration (`allocator`), and the figures only the
//! process-wide counters show (`pool_counters`).
//!
//! Tests run on parallel threads of one process. Workspaces are per thread, so ids never
//! collide. The tests that read the global pool's counters, or an environment variable
//! read once per process, run in a child process of their own (`common::child`).

#[path = "../common/mod.rs"]
mod common;

mod allocator;
mod circular;
mod config;
mod debug_modes;
mod files;
mod learning;
mod lifecycle;
mod location;
mod nd4j;
mod pool_counters;
mod source;
mod stamps;

use std::alloc::Layout;
use std::ptr::NonNull;

use ndmem::alloc::{Limits, Pool};
use ndmem::workspace::WorkspaceMemory;
use ndmem::{AllocationPolicy, Error, WorkspaceConfig};

/// Heap allocations are counted per thread, so a test can check that a cycle allocates
/// nothing (`pool_counters`); the other tests are not affected.
#[global_allocator]
static GLOBAL: common::counting::CountingPerThread = common::counting::CountingPerThread;

/// Bytes the pool really hands out for a request of `bytes` (its size class).
pub(crate) fn capacity(bytes: usize) -> usize {
    Pool::new(Limits::unlimited())
        .allocate(bytes, 16)
        .expect("a small block")
        .capacity()
}

pub(crate) fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 1).expect("a valid layout")
}

pub(crate) fn strict() -> ndmem::workspace::WorkspaceConfigBuilder {
    WorkspaceConfig::builder().policy_allocation(AllocationPolicy::Strict)
}

/// Allocates `n` x `size` bytes in the guard's workspace and returns the pointers.
pub(crate) fn fill(guard: &ndmem::WorkspaceGuard, n: usize, size: usize) -> Vec<NonNull<[u8]>> {
    (0..n)
        .map(|_| guard.alloc(layout(size)).expect("allocation"))
        .collect()
}

#[allow(unsafe_code)]
pub(crate) fn write(memory: &WorkspaceMemory, byte: u8) {
    memory.stamp.check("write", "X").expect("valid memory");
    // SAFETY: the stamp says the memory is valid on this thread; it holds `len` bytes.
    unsafe { std::ptr::write_bytes(memory.ptr.as_ptr(), byte, memory.len) };
}

#[allow(unsafe_code)]
pub(crate) fn read(memory: &WorkspaceMemory) -> Vec<u8> {
    // SAFETY: callers only read memory they know is alive (checked, or a circular slot
    // that the ring has not wrapped over; circular stamps keep the buffer alive).
    unsafe { std::slice::from_raw_parts(memory.ptr.as_ptr(), memory.len).to_vec() }
}

pub(crate) fn config_error(result: Result<WorkspaceConfig, Error>) -> String {
    match result {
        Err(Error::Config(e)) => e.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}
