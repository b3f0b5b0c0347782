//! Limits: changed only when they fit, the physical limit against the RSS, and the byte
//! limit held exactly by four threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ndmem_alloc::{physical_bytes, AllocError, Block, ByteSize, Limits, Pool};

use crate::common::{child::run_alone, test_name};
use crate::{pool_with, this_thread_os_id, MIB};

#[test]
fn limits_below_use_are_refused_and_change_nothing() {
    // The physical limit is checked against the RSS, which the other tests move.
    if run_alone(test_name!(limits_below_use_are_refused_and_change_nothing)) {
        return;
    }
    let pool = pool_with(64 * MIB);
    let _block = pool.allocate(10 * MIB, 64).unwrap();
    drop(pool.allocate(4 * MIB, 64).unwrap());
    let err = pool.set_max_bytes(Some(5 * MIB)).unwrap_err();
    assert!(matches!(err, AllocError::LimitBelowUse { .. }), "{err:?}");
    assert!(err.to_string().contains("already in use"), "{err}");
    assert_eq!(pool.limits().0, Some(64 * MIB));
    // A limit that fits once the cache is released is accepted.
    pool.set_max_bytes(Some(12 * MIB)).unwrap();
    assert_eq!(pool.stats().cached_bytes, 0);
    assert_eq!(pool.limits().0, Some(12 * MIB));
    let rss = physical_bytes();
    assert!(pool.set_max_physical_bytes(Some(rss / 2)).is_err());
}

#[test]
fn the_physical_limit_is_checked_when_memory_comes_from_the_os() {
    if run_alone(test_name!(
        the_physical_limit_is_checked_when_memory_comes_from_the_os
    )) {
        return;
    }
    // Alone in a process of its own, so the RSS moves only by what this test does; the
    // margins (256 MiB refused, 8 MiB accepted, under RSS + 64 MiB) leave room for the
    // harness's own threads.
    let limit = physical_bytes() + 64 * MIB;
    let pool = Pool::new(
        Limits::builder()
            .max_bytes(None)
            .max_physical_bytes(limit)
            .build(),
    );
    let err = pool.allocate(256 * MIB, 4096).unwrap_err();
    let AllocError::PhysicalLimit {
        requested,
        thread,
        limit: reported_limit,
        rss,
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(requested, 256 * MIB);
    assert_eq!(reported_limit, limit);
    assert!(rss + 256 * MIB > limit, "rss {rss}");
    assert_eq!(thread, this_thread_os_id());
    let msg = err.to_string();
    for part in [
        "Can't allocate [HOST] memory: 268435456 bytes".to_string(),
        format!("threadId: {thread}"),
        "physical memory (RSS)".to_string(),
        format!("of {} limit in use", ByteSize(limit)),
        "raise Limits::max_physical_bytes of this pool".to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} lacks {part:?}");
    }
    let after = pool.stats();
    assert_eq!(after.used_bytes, 0);
    assert_eq!(after.peak_used_bytes, 0, "a refused request leaves no peak");
    assert!(pool.allocate(8 * MIB, 64).is_ok());
    assert_eq!(pool.stats().peak_used_bytes, 8 * MIB);
}

/// Four threads allocate against a tight pool limit for a bounded time (semantics §1): the
/// limit is never passed, every success is usable, and everything is given back.
#[test]
fn limit_holds_under_four_threads() {
    const LIMIT: usize = 24 * MIB;
    let pool = pool_with(LIMIT);
    let failures = AtomicUsize::new(0);
    // Bytes the test threads hold, counted by the threads themselves (not by the pool):
    // added once a block is handed out, subtracted before it is given back.
    let held_by_threads = AtomicUsize::new(0);
    let most_held = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (pool, failures) = (&pool, &failures);
            let (held_by_threads, most_held) = (&held_by_threads, &most_held);
            s.spawn(move || {
                let mut held: Vec<Block> = Vec::new();
                let mut seed = 0x2545_f491_4f6c_dd1du64.wrapping_mul(t as u64 + 1);
                // At least 400 ms, and until some thread was refused (slow under
                // valgrind), but never more than 30 s.
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(400)
                    || (failures.load(Ordering::Relaxed) == 0
                        && start.elapsed() < Duration::from_secs(30))
                {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let size = 1 + (seed as usize % (3 * MIB));
                    match pool.allocate(size, 64) {
                        Ok(mut block) => {
                            let now = held_by_threads.fetch_add(block.capacity(), Ordering::SeqCst)
                                + block.capacity();
                            most_held.fetch_max(now, Ordering::SeqCst);
                            block.as_slice_mut().fill(t + 1);
                            held.push(block);
                        }
                        Err(AllocError::OutOfMemory { limit, .. }) => {
                            assert_eq!(limit, LIMIT);
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(other) => panic!("{other}"),
                    }
                    if held.len() > 3 {
                        let b = held.swap_remove(seed as usize % held.len());
                        assert!(b.as_slice().iter().all(|x| *x == t + 1), "block intact");
                        held_by_threads.fetch_sub(b.capacity(), Ordering::SeqCst);
                        drop(b);
                    }
                }
                for b in held {
                    held_by_threads.fetch_sub(b.capacity(), Ordering::SeqCst);
                    drop(b);
                }
            });
        }
    });
    let stats = pool.stats();
    let most_held = most_held.load(Ordering::SeqCst);
    assert!(
        most_held <= LIMIT,
        "the threads held {most_held} bytes at once, above the limit of {LIMIT}"
    );
    assert!(
        most_held > LIMIT / 2,
        "the threads pressed against the limit (held at most {most_held})"
    );
    assert_eq!(held_by_threads.load(Ordering::SeqCst), 0);
    assert!(failures.load(Ordering::Relaxed) > 0, "the limit was hit");
    assert_eq!(stats.live_bytes, 0);
    assert_eq!(stats.allocations, stats.deallocations);
}
