//! The native pool (SEMANTICS 1): exact limits under concurrency, the cache, relief at a
//! limit, bad input, and the out-of-memory message.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ndmem_alloc::{physical_bytes, AllocError, Block, ByteSize, Limits, Pool, PoolStats, Usage};

const MIB: usize = 1 << 20;

#[path = "common/counting.rs"]
mod counting;

/// Heap allocations are counted per thread, so a test can check a path allocates nothing.
#[global_allocator]
static GLOBAL: counting::CountingPerThread = counting::CountingPerThread;
use counting::heap_allocations_of_this_thread;

/// The tests of this binary run one at a time: the physical limit is checked against the
/// RSS of the whole process, which the other tests would move meanwhile.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The stats, with the RSS (which the rest of the process moves) left out of comparisons.
fn stats_without_rss(pool: &Pool) -> PoolStats {
    PoolStats {
        physical_bytes: 0,
        ..pool.stats()
    }
}

fn pool_with(max_bytes: usize) -> Pool {
    Pool::new(
        Limits::builder()
            .max_bytes(max_bytes)
            .max_physical_bytes(None)
            .build(),
    )
}

#[test]
fn freed_blocks_are_reused_without_the_os() {
    let _serial = serial();
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
fn blocks_honour_every_alignment_up_to_a_page() {
    let _serial = serial();
    let pool = pool_with(256 * MIB);
    let mut held = Vec::new();
    for shift in 0..=12 {
        let align = 1usize << shift;
        for size in [1, 7, 64, 100, 1000, 4096, 5000, 300_000, 3 * MIB + 5] {
            let mut block = pool.allocate(size, align).unwrap();
            assert_eq!(block.ptr().as_ptr() as usize % align, 0, "{size} @ {align}");
            assert!(block.capacity() >= size && block.len() == size);
            block.as_slice_mut().fill(0xAB);
            held.push(block);
        }
    }
    assert!(held.iter().all(|b| b.as_slice().iter().all(|x| *x == 0xAB)));
}

#[test]
fn zeroed_blocks_are_zero_even_when_reused() {
    let _serial = serial();
    let pool = pool_with(64 * MIB);
    for size in [100, 100_000, 2 * MIB] {
        let mut dirty = pool.allocate(size, 16).unwrap();
        dirty.as_slice_mut().fill(0xFF);
        drop(dirty);
        let clean = pool.allocate_zeroed(size, 16).unwrap();
        assert!(clean.as_slice().iter().all(|b| *b == 0), "{size}");
    }
}

#[test]
fn bad_requests_are_errors_that_change_nothing() {
    let _serial = serial();
    let pool = pool_with(64 * MIB);
    let keep = pool.allocate(1000, 16).unwrap();
    drop(pool.allocate(4 * MIB, 64).unwrap());
    let before = stats_without_rss(&pool);
    assert_eq!(before.cached_bytes, 4 * MIB, "a block is cached");
    let cases: [(usize, usize, &str); 6] = [
        (0, 16, "zero-size"),
        (64, 0, "power of two"),
        (64, 3, "power of two"),
        (64, 8192, "above 4096"),
        (usize::MAX, 16, "overflows"),
        (isize::MAX as usize, 4096, "overflows"),
    ];
    for (size, align, expected) in cases {
        let err = pool.allocate(size, align).unwrap_err();
        assert!(matches!(err, AllocError::InvalidLayout { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(expected) && msg.contains(&size.to_string()),
            "{msg}"
        );
    }
    let err = pool.reserve(0, Usage::Other).unwrap_err();
    assert!(err.to_string().contains("zero"), "{err}");
    // A limit below the live block is refused before the cache is touched.
    let err = pool.set_max_bytes(Some(512)).unwrap_err();
    assert!(matches!(err, AllocError::LimitBelowUse { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&keep.capacity().to_string()),
        "{err}"
    );
    // Every figure, the cache and the OS calls included, is as it was.
    assert_eq!(stats_without_rss(&pool), before);
    assert_eq!(pool.limits().0, Some(64 * MIB));
    assert_eq!(keep.len(), 1000);
}

#[test]
fn a_request_too_large_for_the_limit_is_refused_with_a_useful_message() {
    let _serial = serial();
    let pool = pool_with(8 * MIB);
    let _ws = pool.allocate_for(5 * MIB, 64, Usage::Workspace).unwrap();
    let _t = pool.allocate_for(2 * MIB, 64, Usage::Tensor).unwrap();
    let before = pool.stats();
    let err = pool.allocate(4 * MIB, 64).unwrap_err();
    let AllocError::OutOfMemory {
        requested,
        used,
        limit,
        thread,
        ..
    } = err.clone()
    else {
        panic!("{err:?}");
    };
    assert_eq!(requested, 4 * MIB);
    assert_eq!(limit, 8 * MIB);
    assert_eq!(used, before.used_bytes);
    let tid = this_thread_os_id();
    assert_eq!(thread, tid);
    let msg = err.to_string();
    for part in [
        "Can't allocate [HOST] memory: 4194304 bytes".to_string(),
        format!("threadId: {tid}"),
        format!(
            "off-heap {} of {} limit in use",
            ByteSize(used),
            ByteSize(8 * MIB)
        ),
        format!("workspaces {}", ByteSize(5 * MIB)),
        format!("tensors {}", ByteSize(2 * MIB)),
        "raise Limits::max_bytes of this pool".to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} lacks {part:?}");
    }
    let after = pool.stats();
    assert_eq!(
        after.used_bytes, before.used_bytes,
        "a failed request reserves nothing"
    );
    assert_eq!(after.failed_allocations, before.failed_allocations + 1);
}

#[test]
fn at_the_limit_the_cache_is_released_and_the_request_retried() {
    let _serial = serial();
    let pool = pool_with(8 * MIB);
    drop(pool.allocate(5 * MIB, 64).unwrap());
    assert_eq!(pool.stats().cached_bytes, 5 * MIB);
    let block = pool.allocate(6 * MIB, 64).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.cached_bytes, 0);
    assert_eq!(stats.used_bytes, block.capacity());
}

static RECLAIMED: Mutex<Option<Block<'static>>> = Mutex::new(None);
static RECLAIM_CALLS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn registered_reclaimers_run_before_an_allocation_fails() {
    let _serial = serial();
    let pool: &'static Pool = Box::leak(Box::new(pool_with(8 * MIB)));
    pool.register_reclaimer(|| {
        RECLAIM_CALLS.fetch_add(1, Ordering::SeqCst);
        RECLAIMED.lock().unwrap().take().map_or(0, |b| b.capacity())
    });
    *RECLAIMED.lock().unwrap() = Some(pool.allocate(6 * MIB, 64).unwrap());
    // Only reclaiming the parked block makes room for this one.
    let block = pool.allocate(6 * MIB, 64).unwrap();
    assert_eq!(RECLAIM_CALLS.load(Ordering::SeqCst), 1);
    assert_eq!(pool.stats().live_bytes, block.capacity());
    assert_eq!(
        pool.stats().cache_hits,
        1,
        "the reclaimed block was reused, not refetched"
    );
}

static RECURSIVE_CALLS: AtomicUsize = AtomicUsize::new(0);
static RECURSIVE_INNER_REFUSED: AtomicUsize = AtomicUsize::new(0);

/// A reclaimer that allocates from its own pool at the limit does not run the reclaimers
/// again (which would recurse until the stack overflows); its request simply fails.
#[test]
fn a_reclaimer_that_allocates_from_the_pool_does_not_recurse() {
    let _serial = serial();
    let pool: &'static Pool = Box::leak(Box::new(pool_with(8 * MIB)));
    pool.register_reclaimer(move || {
        RECURSIVE_CALLS.fetch_add(1, Ordering::SeqCst);
        if pool.allocate(4 * MIB, 64).is_err() {
            RECURSIVE_INNER_REFUSED.fetch_add(1, Ordering::SeqCst);
        }
        0
    });
    let _held = pool.allocate(6 * MIB, 64).unwrap();
    let err = pool.allocate(4 * MIB, 64).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err:?}");
    assert_eq!(RECURSIVE_CALLS.load(Ordering::SeqCst), 1);
    assert_eq!(RECURSIVE_INNER_REFUSED.load(Ordering::SeqCst), 1);
    // The guard is released: the next failure runs the reclaimer again, once.
    assert!(pool.allocate(4 * MIB, 64).is_err());
    assert_eq!(RECURSIVE_CALLS.load(Ordering::SeqCst), 2);
}

/// The out-of-memory path (reclaimers, cache release, retry, error) allocates nothing on
/// the Rust heap: it runs when memory is short.
#[test]
fn a_refusal_with_reclaimers_allocates_nothing_on_the_heap() {
    let _serial = serial();
    let pool = pool_with(8 * MIB);
    pool.register_reclaimer(|| 0);
    pool.register_reclaimer(|| 0);
    let _held = pool.allocate(6 * MIB, 64).unwrap();
    let before = heap_allocations_of_this_thread();
    let err = pool.allocate(4 * MIB, 64).unwrap_err();
    let after = heap_allocations_of_this_thread();
    assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err:?}");
    assert_eq!(after - before, 0, "heap allocations on the OOM path");
}

#[test]
fn limits_below_use_are_refused_and_change_nothing() {
    let _serial = serial();
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
    let _serial = serial();
    // The other tests of this binary wait (`serial`), so the RSS moves only by what this
    // test does; the margins (256 MiB refused, 8 MiB accepted, under RSS + 64 MiB) leave
    // room for the harness's own threads.
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
    assert_eq!(pool.stats().used_bytes, 0);
    assert!(pool.allocate(8 * MIB, 64).is_ok());
}

/// The OS id of the calling thread, from /proc/thread-self.
fn this_thread_os_id() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .parse()
        .unwrap()
}

#[test]
fn trim_gives_cached_blocks_back_to_the_os() {
    let _serial = serial();
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
fn reservations_count_outside_memory_against_the_limit() {
    let _serial = serial();
    let pool = pool_with(8 * MIB);
    let r = pool.reserve(6 * MIB, Usage::Workspace).unwrap();
    let held = pool.stats();
    assert_eq!(held.workspace_bytes, 6 * MIB);
    assert_eq!((held.allocations, held.deallocations), (1, 0));
    assert_eq!(held.total_allocated_bytes, 6 * MIB as u64);
    assert!(pool.allocate(4 * MIB, 64).is_err());
    drop(r);
    let after = pool.stats();
    // A reservation counts as one allocation and one deallocation, like a block.
    assert_eq!((after.allocations, after.deallocations), (1, 1));
    assert_eq!(after.total_freed_bytes, 6 * MIB as u64);
    assert_eq!(after.live_bytes, 0);
    assert!(pool.allocate(4 * MIB, 64).is_ok());
}

/// SEMANTICS 1: total allocated and freed bytes and counts, consistent with live bytes.
#[test]
fn totals_count_every_byte_handed_out_and_given_back() {
    let _serial = serial();
    let pool = pool_with(64 * MIB);
    let a = pool.allocate(1000, 16).unwrap(); // class 1024
    let b = pool.allocate(3 * MIB, 64).unwrap(); // class 3 MiB
    let r = pool.reserve(5000, Usage::Other).unwrap();
    let during = pool.stats();
    let total = (a.capacity() + b.capacity() + 5000) as u64;
    assert_eq!((a.capacity(), b.capacity()), (1024, 3 * MIB));
    assert_eq!(during.total_allocated_bytes, total);
    assert_eq!(during.total_freed_bytes, 0);
    assert_eq!(during.live_bytes as u64, total);
    drop((a, b));
    let reused = pool.allocate(900, 16).unwrap(); // from the cache: counted again
    let after = pool.stats();
    assert_eq!(after.total_allocated_bytes, total + 1024);
    assert_eq!(after.total_freed_bytes, 1024 + 3 * MIB as u64);
    assert_eq!(
        after.total_allocated_bytes - after.total_freed_bytes,
        after.live_bytes as u64
    );
    assert_eq!((after.allocations, after.deallocations), (4, 2));
    drop((reused, r));
    let end = pool.stats();
    assert_eq!(end.total_allocated_bytes, end.total_freed_bytes);
    assert_eq!(end.allocations, end.deallocations);
}

/// SEMANTICS 1: four threads allocate against a tight pool limit for a bounded time. The
/// limit is never passed, every success is usable, and everything is given back.
#[test]
fn limit_holds_under_four_threads() {
    let _serial = serial();
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

#[test]
fn global_pool_names_the_environment_variables() {
    let _serial = serial();
    let run = |env: (&str, &str), case: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", case, "--ignored", "--nocapture"])
            .env(env.0, env.1)
            .output()
            .unwrap()
    };
    let out = run(("NDMEM_MAX_BYTES", "1M"), "child_global_pool_over_limit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(("NDMEM_MAX_BYTES", "lots"), "child_global_pool_garbage");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `heap::stats()` reports `NDMEM_MAX_HEAP` before the tracking allocator has counted
/// anything (here it never does: this binary's global allocator is not `Tracking`).
#[test]
fn heap_stats_report_the_environment_limit_before_any_allocation() {
    let _serial = serial();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_heap_limit_from_env", "--ignored"])
        .env("NDMEM_MAX_HEAP", "64M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "the child ran: {stdout}");
}

#[test]
#[ignore = "run by heap_stats_report_the_environment_limit_before_any_allocation"]
fn child_heap_limit_from_env() {
    assert!(!ndmem_alloc::heap::is_tracking());
    assert_eq!(ndmem_alloc::heap::stats().limit, Some(64 * MIB));
}

#[test]
#[ignore = "run by global_pool_names_the_environment_variables with the variable set"]
fn child_global_pool_over_limit() {
    let pool = Pool::try_global().unwrap();
    assert_eq!(pool.limits().0, Some(MIB));
    let err = pool.allocate(2 * MIB, 64).unwrap_err();
    assert!(err.to_string().contains("raise NDMEM_MAX_BYTES"), "{err}");
}

#[test]
#[ignore = "run by global_pool_names_the_environment_variables with the variable set"]
fn child_global_pool_garbage() {
    let err = Pool::try_global().unwrap_err();
    assert!(
        err.to_string().contains("NDMEM_MAX_BYTES=\"lots\""),
        "{err}"
    );
    let err = Pool::global().allocate(64, 8).unwrap_err();
    assert!(matches!(err, AllocError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("NDMEM_MAX_BYTES"), "{err}");
}
