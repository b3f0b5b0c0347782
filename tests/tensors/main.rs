//! Tensors: the ops against plain ndarray (`ops`), the validity checks of workspace memory
//! (`validity`, semantics §3), NDManager-style scopes (`scopes`, semantics §4), epoch
//! reclamation (`reclaim`, semantics §6) and the heap allocations of ops on workspace
//! tensors (`heap`: none).
//!
//! Byte checks read a pool of the test's own, so the tests run in parallel; those that read
//! the process-wide epoch run in a child process of their own (`common::child`). Heap
//! allocations are counted per thread (`common::counting`, this binary's allocator), so
//! they too run in parallel.

#[path = "../common/mod.rs"]
mod common;

mod djl;
mod heap;
mod ops;
mod reclaim;
mod scopes;
mod validity;

use ndmem::alloc::{Limits, Pool};
use ndmem::MemorySource;

/// Counts each thread's heap allocations (the `heap` tests read them).
#[global_allocator]
static ALLOCATOR: common::counting::CountingPerThread = common::counting::CountingPerThread;

/// A pool of this test's own, with an optional byte limit.
pub(crate) fn private(max_bytes: Option<usize>) -> MemorySource {
    MemorySource::new(Pool::new(Limits::builder().max_bytes(max_bytes).build()))
}

/// The live bytes of `source`'s pool.
pub(crate) fn live(source: &MemorySource) -> usize {
    source.pool().stats().live_bytes
}
