//! # ndmem-alloc
//!
//! The accounting floor of ndmem: a tracking `#[global_allocator]` ([`Tracking`]) with an
//! exact heap limit, and a native [`Pool`] for tensor memory whose off-heap and physical
//! limits hold exactly under any number of threads.
//!
//! Both rest on one idea, a *budget* ([`counter::Budget`]): bytes are reserved by a
//! compare-and-swap on a single word before memory is obtained, so no interleaving can push
//! the total past the limit. The global allocator reserves per thread in batches to stay
//! off the shared cache line; the pool reserves only when it goes to the OS, because freed
//! blocks stay reserved in its caches (one per thread, then shared) and are reused without
//! touching the budget. Both keep their statistics per thread and make them exact when read:
//! the global allocator in batches of [`counter::Counter`]s (a value with its peak and
//! running total), the pool in per-thread tallies summed on read.
//!
//! ```
//! use ndmem_alloc::{Limits, Pool};
//!
//! let pool = Pool::new(Limits::builder().max_bytes(1 << 20).build());
//! let block = pool.allocate(4096, 64)?;
//! assert_eq!(block.ptr().as_ptr() as usize % 64, 0);
//! assert!(pool.allocate(2 << 20, 64).is_err()); // over the 1 MiB limit
//! drop(block);
//! assert_eq!(pool.stats().live_bytes, 0);
//! # Ok::<(), ndmem_alloc::AllocError>(())
//! ```
//!
//! Sizes and limits come from the environment (`NDMEM_MAX_HEAP`, `NDMEM_MAX_BYTES`,
//! `NDMEM_MAX_PHYSICAL_BYTES`, `NDMEM_MAX_DEVICE_BYTES`); see [`Limits`].

#![warn(missing_docs)]

mod at_load;
pub mod counter;
mod display;
mod error;
mod limits;
#[cfg(not(ndmem_loom))]
mod oom;
mod physical;
mod pool;
mod slots;
mod sync;
pub mod trace;
#[cfg(not(ndmem_loom))]
mod tracking;

pub use error::{
    AllocError, AttachedReport, ByteSize, ConfigError, Holders, MemoryKind, OomDetail,
    RequestedBytes, DRIVER_REFUSED,
};
pub use limits::{
    parse_size, LimitSource, LimitSources, Limits, LimitsBuilder, ENV_MAX_BYTES,
    ENV_MAX_DEVICE_BYTES, ENV_MAX_HEAP, ENV_MAX_PHYSICAL_BYTES,
};
pub use physical::{page_size, physical_bytes, physical_ram};
pub use pool::{
    os_thread_id, Block, FreedBlock, Pool, PoolStats, Reservation, Usage, MAX_ALIGN, RELIEF_ROUNDS,
    SLOTS_PER_CLASS,
};
pub use slots::Slots;
#[cfg(not(ndmem_loom))]
pub use tracking::{heap, HeapStats, Tracking};

/// The examples of `README.md`, compiled and run as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
