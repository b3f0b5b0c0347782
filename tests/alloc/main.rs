//! The native pool (semantics §1): blocks and the cache, exact limits under concurrency,
//! relief at a limit, the statistics, bad input and the out-of-memory message, and the
//! global pool's environment variables.
//!
//! Every test draws from a pool of its own, so the tests run in parallel. The few that read
//! what is process-wide (the RSS, the environment) run in a child process of their own
//! (`common::child`).

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod blocks;
mod cache;
mod environment;
mod errors;
mod fork;
mod limits;
mod reclaimers;
mod threads;

use ndmem_alloc::{Limits, Pool, PoolStats};

/// Heap allocations are counted per thread, so a test can check a path allocates nothing.
#[global_allocator]
static GLOBAL: common::counting::CountingPerThread = common::counting::CountingPerThread;

const MIB: usize = 1 << 20;

/// The stats, with the RSS (which the rest of the process moves) left out of comparisons.
pub(crate) fn stats_without_rss(pool: &Pool) -> PoolStats {
    PoolStats {
        physical_bytes: 0,
        ..pool.stats()
    }
}

pub(crate) fn pool_with(max_bytes: usize) -> Pool {
    Pool::new(
        Limits::builder()
            .max_bytes(max_bytes)
            .max_physical_bytes(None)
            .build(),
    )
}

/// The OS id of the calling thread, from /proc/thread-self.
pub(crate) fn this_thread_os_id() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .parse()
        .unwrap()
}
