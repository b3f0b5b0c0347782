//! The cache of freed blocks: reuse without the OS, release at the limit, trim.

use crate::{pool_with, MIB};

#[test]
fn freed_blocks_are_reused_without_the_os() {
    let pool = pool_with(64 * MIB);
    let first = pool.allocate(4 * MIB, 64).unwrap();
    let addr = first.ptr();
    drop(first);
    let before = pool.stats();
    assert_eq!(before.live_bytes, 0);
    assert_eq!(before.cached_bytes, 4 * MIB);
    assert_eq!(
        before.used_bytes,
        4 * MIB,
        "cached bytes count toward the limit"
    );
    let second = pool.allocate(4 * MIB - 100, 64).unwrap();
    let after = pool.stats();
    assert_eq!(second.ptr(), addr, "the cached block came back");
    assert_eq!(after.os_allocations, before.os_allocations);
    assert_eq!(after.cache_hits, before.cache_hits + 1);
    assert_eq!(after.allocations, before.allocations + 1);
}

#[test]
fn at_the_limit_the_cache_is_released_and_the_request_retried() {
    let pool = pool_with(8 * MIB);
    drop(pool.allocate(5 * MIB, 64).unwrap());
    assert_eq!(pool.stats().cached_bytes, 5 * MIB);
    let block = pool.allocate(6 * MIB, 64).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.cached_bytes, 0);
    assert_eq!(stats.used_bytes, block.capacity());
}

#[test]
fn trim_gives_cached_blocks_back_to_the_os() {
    let pool = pool_with(64 * MIB);
    let blocks: Vec<_> = (0..4).map(|_| pool.allocate(MIB, 64).unwrap()).collect();
    drop(blocks);
    let before = pool.stats();
    assert_eq!(before.cached_bytes, 4 * MIB);
    assert_eq!(pool.trim(), 4 * MIB);
    let after = pool.stats();
    assert_eq!((after.cached_bytes, after.used_bytes), (0, 0));
    assert_eq!(after.os_frees, before.os_frees + 4);
}

#[test]
fn a_thread_that_frees_what_another_allocates_passes_the_blocks_on() {
    // A producer allocates, a consumer frees (a prefetching loader): the consumer's cache
    // must not hoard the blocks while the producer asks the OS for new ones.
    const BLOCKS: usize = 2000;
    const SIZE: usize = 16 << 10;
    let pool = pool_with(1024 * MIB);
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let mut used_at_half = 0;
    // The consumer allocates too (its training step), so it has a cache of its own.
    drop(pool.allocate(SIZE, 16).unwrap());
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            for i in 0..BLOCKS {
                tx.send((i, pool.allocate(SIZE, 16).unwrap())).unwrap();
            }
        });
        for (i, block) in rx {
            drop(block);
            if i == BLOCKS / 2 {
                used_at_half = pool.stats().used_bytes;
            }
        }
    });
    let stats = pool.stats();
    // Once the consumer's list is full, its frees feed the producer: the pool stops
    // growing.
    assert!(
        stats.used_bytes <= used_at_half + 16 * SIZE,
        "the pool grew from {used_at_half} to {} bytes in the second half: {stats:?}",
        stats.used_bytes
    );
    // What the consumer keeps is bounded by its list's cap, not by the pool's limit.
    assert!(stats.thread_cached_bytes <= 8 * MIB, "{stats:?}");
}
