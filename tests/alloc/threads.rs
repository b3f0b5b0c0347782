//! Threads' own caches (semantics §1): they keep what a cycle frees, they count against the
//! limit, and they are given up on thread exit, on a lower limit and to a thread at the
//! limit; the statistics read from any thread are exact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ndmem_alloc::{AllocError, Block, Limits, Pool, Usage};

use crate::{pool_with, MIB};

/// Runs `cache` on a thread of its own, which then stays alive (its cache untouched) while
/// `meanwhile` runs on the calling thread, and exits afterwards.
fn while_a_thread_caches(pool: &Pool, cache: impl FnOnce(&Pool) + Send, meanwhile: impl FnOnce()) {
    std::thread::scope(|s| {
        // Channels, not barriers: if `meanwhile` panics, `done` drops and the thread ends.
        let (cached, has_cached) = mpsc::channel::<()>();
        let (done, wait_done) = mpsc::channel::<()>();
        s.spawn(move || {
            cache(pool);
            cached.send(()).unwrap();
            let _ = wait_done.recv();
        });
        has_cached.recv().unwrap();
        meanwhile();
        drop(done);
    });
}

/// Allocates and frees `n` blocks of `size` bytes at once: they end in this thread's cache.
fn cache_blocks(pool: &Pool, n: usize, size: usize) {
    let blocks: Vec<Block> = (0..n).map(|_| pool.allocate(size, 64).unwrap()).collect();
    drop(blocks);
}

#[test]
fn a_thread_keeps_what_it_frees_and_counts_it_against_the_limit() {
    let pool = pool_with(8 * MIB);
    while_a_thread_caches(
        &pool,
        |pool| cache_blocks(pool, 2, MIB),
        || {
            let s = pool.stats();
            assert_eq!(
                s.thread_cached_bytes,
                2 * MIB,
                "the thread keeps its blocks"
            );
            assert_eq!(s.cached_bytes, 2 * MIB);
            assert_eq!((s.live_bytes, s.used_bytes), (0, 2 * MIB));
        },
    );
}

#[test]
fn a_thread_at_the_limit_recalls_what_other_threads_cache() {
    let pool = pool_with(8 * MIB);
    while_a_thread_caches(
        &pool,
        |pool| cache_blocks(pool, 2, MIB),
        || {
            assert_eq!(pool.stats().used_bytes, 2 * MIB);
            // 7 MiB fit only once the other thread's 2 MiB went back to the OS.
            let block = pool.allocate(7 * MIB, 64).unwrap();
            let s = pool.stats();
            assert_eq!((s.thread_cached_bytes, s.cached_bytes), (0, 0));
            assert_eq!(s.used_bytes, block.capacity());
            assert_eq!(s.failed_allocations, 0);
        },
    );
}

#[test]
fn a_thread_s_cache_goes_back_to_the_shared_classes_when_it_exits() {
    let pool = pool_with(64 * MIB);
    std::thread::scope(|s| {
        // An explicit join returns once the thread is gone, its thread-locals dropped (the
        // end of a scope only waits for the closures to return).
        s.spawn(|| cache_blocks(&pool, 4, 64 << 10)).join().unwrap();
    });
    let after_exit = pool.stats();
    assert_eq!(after_exit.thread_cached_bytes, 0);
    assert_eq!(
        after_exit.cached_bytes,
        4 * (64 << 10),
        "in the shared classes"
    );
    assert_eq!(after_exit.used_bytes, 4 * (64 << 10));
    assert_eq!(after_exit.live_bytes, 0);
    assert_eq!((after_exit.allocations, after_exit.deallocations), (4, 4));
    // This thread takes them from the shared classes, without the OS.
    let blocks: Vec<Block> = (0..4)
        .map(|_| pool.allocate(64 << 10, 64).unwrap())
        .collect();
    let s = pool.stats();
    assert_eq!(s.os_allocations, after_exit.os_allocations);
    assert_eq!(s.cache_hits, after_exit.cache_hits + 4);
    assert_eq!(s.cached_bytes, 0);
    drop(blocks);
}

/// Runs `step` on a fresh thread and waits until the thread is gone.
fn on_a_fresh_thread(pool: &Pool, step: impl FnOnce(&Pool) + Send) {
    std::thread::scope(|s| {
        // An explicit join returns once the thread's thread-locals were dropped.
        s.spawn(|| step(pool)).join().unwrap();
    });
}

/// A program that starts fresh threads for each step: the blocks an exited thread cached
/// (more than the shared classes' 16 slots a class hold) wait in the pool, counted as
/// cached, and the next thread's step takes them all without the OS, as cache hits.
#[test]
fn a_fresh_thread_finds_the_blocks_an_exited_thread_cached() {
    const BLOCKS: usize = 200;
    let pool = pool_with(64 * MIB);
    on_a_fresh_thread(&pool, |pool| cache_blocks(pool, BLOCKS, 1000));
    let before = pool.stats();
    assert_eq!(before.thread_cached_bytes, 0);
    assert_eq!(
        before.cached_bytes,
        BLOCKS * 1024,
        "the class of 1000 B is 1 KiB"
    );
    assert_eq!(before.used_bytes, BLOCKS * 1024);
    assert_eq!(before.os_allocations, BLOCKS as u64);
    on_a_fresh_thread(&pool, |pool| cache_blocks(pool, BLOCKS, 1000));
    let after = pool.stats();
    assert_eq!(
        after.os_allocations, before.os_allocations,
        "no block from the OS"
    );
    assert_eq!(after.cache_hits, before.cache_hits + BLOCKS as u64);
    assert_eq!((after.allocations, after.deallocations), (400, 400));
    assert_eq!(
        (after.cached_bytes, after.used_bytes),
        (BLOCKS * 1024, BLOCKS * 1024)
    );
    assert_eq!(pool.trim(), BLOCKS * 1024, "trim hands them to the OS");
    let trimmed = pool.stats();
    assert_eq!((trimmed.cached_bytes, trimmed.used_bytes), (0, 0));
}

/// Threads that start together each find a list that a thread before them left, rather
/// than one of them taking all while the other asks the OS: the pool's memory stays what
/// one step needs, round after round.
#[test]
fn threads_that_start_together_each_find_a_list_left_for_them() {
    const BLOCKS: usize = 100;
    let pool = pool_with(64 * MIB);
    let round = |pool: &Pool| {
        let together = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let blocks: Vec<Block> = (0..BLOCKS)
                            .map(|_| pool.allocate(1000, 64).unwrap())
                            .collect();
                        together.wait();
                        drop(blocks);
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
        });
    };
    round(&pool);
    let first = pool.stats();
    assert_eq!(first.os_allocations, 2 * BLOCKS as u64);
    for _ in 0..5 {
        round(&pool);
    }
    let s = pool.stats();
    assert_eq!(
        s.os_allocations, first.os_allocations,
        "no block from the OS since"
    );
    assert_eq!(s.used_bytes, 2 * BLOCKS * 1024);
}

/// A lower limit lowers what a thread may keep, and what waits for the next thread with it:
/// the depot's lists go to the shared classes (16 a class) and the OS.
#[test]
fn a_lower_bound_empties_what_waits_for_the_next_thread() {
    const BLOCK: usize = 64 << 10;
    let pool = pool_with(64 * MIB);
    on_a_fresh_thread(&pool, |pool| cache_blocks(pool, 48, BLOCK));
    assert_eq!(pool.stats().cached_bytes, 48 * BLOCK);
    pool.set_max_bytes(Some(32 * MIB)).unwrap();
    let s = pool.stats();
    assert_eq!(
        s.cached_bytes,
        16 * BLOCK,
        "only the shared slots keep blocks"
    );
    assert_eq!(s.used_bytes, 16 * BLOCK);
}

/// What exited threads leave waiting is bounded by what one thread may keep (a quarter of
/// the limit): past it, blocks go to the shared classes (16 a class) and the OS.
#[test]
fn what_exited_threads_leave_waiting_stays_within_one_threads_bound() {
    const BLOCK: usize = 64 << 10;
    // A 16 MiB limit: each thread may keep 4 MiB, 64 blocks; each caches 48.
    let pool = pool_with(16 * MIB);
    on_a_fresh_thread(&pool, |pool| cache_blocks(pool, 48, BLOCK));
    assert_eq!(pool.stats().cached_bytes, 48 * BLOCK, "all 48 wait");
    // This thread needs all 48 at once and its own 48 more: the first 48 come from what
    // the first thread left, the rest from the OS.
    on_a_fresh_thread(&pool, |pool| cache_blocks(pool, 96, BLOCK));
    let s = pool.stats();
    // 96 blocks came back: 64 (its bound) wait whole, 16 fill the shared slots, 16 go to
    // the OS.
    assert_eq!(s.cached_bytes, (64 + 16) * BLOCK, "{s:?}");
    assert_eq!(s.used_bytes, s.cached_bytes);
    assert_eq!(s.live_bytes, 0);
}

#[test]
fn a_lower_limit_recalls_what_threads_cache() {
    let pool = pool_with(8 * MIB);
    while_a_thread_caches(
        &pool,
        |pool| cache_blocks(pool, 2, MIB),
        || {
            let _live = pool.allocate(MIB, 64).unwrap();
            assert_eq!(pool.stats().used_bytes, 3 * MIB);
            // Refused below what is live, accepted once the other thread's cache is recalled.
            assert!(matches!(
                pool.set_max_bytes(Some(MIB / 2)),
                Err(AllocError::LimitBelowUse { .. })
            ));
            assert_eq!(
                pool.stats().thread_cached_bytes,
                2 * MIB,
                "a refusal changes nothing"
            );
            pool.set_max_bytes(Some(2 * MIB)).unwrap();
            let s = pool.stats();
            assert_eq!((s.thread_cached_bytes, s.used_bytes), (0, MIB));
            assert_eq!(s.limit_bytes, Some(2 * MIB));
        },
    );
}

#[test]
fn statistics_read_from_another_thread_are_exact() {
    let pool = pool_with(64 * MIB);
    std::thread::scope(|s| {
        // Made inside the scope, so that a failed assertion drops them and the thread ends.
        let (to_main, from_thread) = mpsc::channel();
        let (to_thread, from_main) = mpsc::channel::<()>();
        let pool = &pool;
        s.spawn(move || {
            let a = pool.allocate_for(1000, 16, Usage::Tensor).unwrap();
            let b = pool.allocate_for(5000, 16, Usage::Workspace).unwrap();
            let c = pool.allocate_for(100, 16, Usage::Mirror).unwrap();
            let r = pool.reserve(3000, Usage::Other).unwrap();
            let sizes = [a.capacity(), b.capacity(), c.capacity()];
            drop(c);
            to_main.send(sizes).unwrap();
            from_main.recv().unwrap();
            drop((a, b, r));
            to_main.send(sizes).unwrap();
            from_main.recv().unwrap();
        });
        let [a, b, c] = from_thread.recv().unwrap();
        assert_eq!((a, b, c), (1024, 5120, 112), "the size classes");
        let s = pool.stats();
        assert_eq!(s.live_bytes, a + b + 3000);
        assert_eq!(
            (
                s.tensor_bytes,
                s.workspace_bytes,
                s.mirror_bytes,
                s.other_bytes
            ),
            (a, b, 0, 3000)
        );
        assert_eq!((s.allocations, s.deallocations), (4, 1));
        assert_eq!(s.total_allocated_bytes, (a + b + c + 3000) as u64);
        assert_eq!(s.total_freed_bytes, c as u64);
        assert_eq!(s.peak_bytes, a + b + c + 3000, "one thread: the exact peak");
        assert_eq!((s.cached_bytes, s.thread_cached_bytes), (c, c));
        assert_eq!(s.used_bytes, s.live_bytes + s.cached_bytes);
        to_thread.send(()).unwrap();
        from_thread.recv().unwrap();
        let s = pool.stats();
        assert_eq!((s.live_bytes, s.tensor_bytes, s.workspace_bytes), (0, 0, 0));
        assert_eq!((s.allocations, s.deallocations), (4, 4));
        assert_eq!(s.cached_bytes, a + b + c);
        to_thread.send(()).unwrap();
    });
    // Folded in at exit: the same figures.
    let s = pool.stats();
    assert_eq!((s.allocations, s.deallocations, s.live_bytes), (4, 4, 0));
    assert_eq!(s.total_allocated_bytes, s.total_freed_bytes);
}

#[test]
fn a_cycle_of_a_thousand_4_kib_blocks_needs_no_os_after_the_first() {
    cycle_of_a_thousand_needs_no_os_after_the_first(4096);
}

/// 64 MiB a cycle: more than any count-based cache keeps, all of it within the bound.
#[test]
fn a_cycle_of_a_thousand_64_kib_blocks_needs_no_os_after_the_first() {
    cycle_of_a_thousand_needs_no_os_after_the_first(64 << 10);
}

fn cycle_of_a_thousand_needs_no_os_after_the_first(size: usize) {
    // The per-thread bound (a quarter of the limit) is a cycle's worth, and a little more.
    let pool = pool_with(4 * 1024 * size);
    let cycle = || {
        let blocks: Vec<Block> = (0..1000)
            .map(|_| pool.allocate(size, 64).unwrap())
            .collect();
        drop(blocks);
    };
    cycle();
    let warm = pool.stats();
    assert_eq!(warm.os_allocations, 1000);
    for _ in 0..10 {
        cycle();
    }
    let s = pool.stats();
    assert_eq!(
        s.os_allocations, warm.os_allocations,
        "no OS allocation after warm-up"
    );
    assert_eq!(s.os_frees, warm.os_frees);
    assert_eq!(s.cache_hits, warm.cache_hits + 10_000);
    assert_eq!(s.thread_cached_bytes, 1000 * size);
}

/// A pool dropped while a thread that cached its blocks is alive: the blocks go back to the
/// OS with the pool, and the thread later forgets it; many pools on one thread likewise.
#[test]
fn a_pool_dropped_before_the_thread_that_cached_its_blocks() {
    let pool = Arc::new(pool_with(8 * MIB));
    let (to_thread, from_main) = mpsc::channel::<()>();
    let (to_main, from_thread) = mpsc::channel::<()>();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            cache_blocks(&pool, 4, 64 << 10);
            drop(pool);
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            // The first pool is gone now: many more come and go on this thread.
            for _ in 0..50 {
                let other = pool_with(MIB);
                cache_blocks(&other, 3, 4096);
                assert_eq!(other.stats().thread_cached_bytes, 3 * 4096);
            }
        })
    };
    from_thread.recv().unwrap();
    let s = pool.stats();
    assert_eq!((s.thread_cached_bytes, s.os_frees), (4 * (64 << 10), 0));
    let pool = Arc::into_inner(pool).expect("the worker let go of the pool");
    drop(pool); // while the worker, which caches its blocks, lives on
    to_thread.send(()).unwrap();
    worker.join().unwrap();
}

/// Takes `blocks` off the tally of bytes held, then frees them (in this order, so the tally
/// never lags behind the pool).
fn give_back(held: &AtomicUsize, blocks: &mut Vec<Block>) {
    held.fetch_sub(blocks.iter().map(|b| b.capacity()).sum(), Ordering::SeqCst);
    blocks.clear();
}

/// Four threads against a tight limit with blocks small enough to stay in their caches:
/// the bytes they hold (counted by the threads) never pass the limit, refusals come only
/// after the other threads' caches were recalled, and the books balance at the end.
#[test]
fn the_limit_holds_exactly_with_four_threads_caching() {
    const LIMIT: usize = 4 * MIB;
    let pool = pool_with(LIMIT);
    let held = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let refusals = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let (pool, held, most, refusals) = (&pool, &held, &most, &refusals);
            threads.push(s.spawn(move || {
                let mut mine: Vec<Block> = Vec::new();
                let mut seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t + 1);
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(300)
                    || (refusals.load(Ordering::Relaxed) == 0
                        && start.elapsed() < Duration::from_secs(30))
                {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let size = 64 << (seed % 13); // 64 B .. 256 KiB
                    match pool.allocate(size, 64) {
                        Ok(block) => {
                            let now = held.fetch_add(block.capacity(), Ordering::SeqCst)
                                + block.capacity();
                            most.fetch_max(now, Ordering::SeqCst);
                            mine.push(block);
                        }
                        Err(AllocError::OutOfMemory { .. }) => {
                            refusals.fetch_add(1, Ordering::Relaxed);
                            give_back(held, &mut mine);
                        }
                        Err(other) => panic!("{other}"),
                    }
                    if mine.len() > 24 {
                        let b = mine.swap_remove(seed as usize % mine.len());
                        held.fetch_sub(b.capacity(), Ordering::SeqCst);
                    }
                }
                give_back(held, &mut mine);
            }));
        }
        // Joined one by one: a join returns once the thread's caches were handed back.
        for thread in threads {
            thread.join().unwrap();
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT,
        "the threads held {most} bytes, above {LIMIT}"
    );
    assert!(
        most > LIMIT / 2,
        "the threads pressed against the limit ({most})"
    );
    assert!(
        refusals.load(Ordering::Relaxed) > 0,
        "the limit was reached"
    );
    let s = pool.stats();
    assert_eq!(s.live_bytes, 0);
    assert_eq!(s.allocations, s.deallocations);
    assert_eq!(s.thread_cached_bytes, 0, "every thread exited");
    assert!(s.used_bytes <= LIMIT && s.peak_used_bytes <= LIMIT);
    assert_eq!(s.used_bytes, s.cached_bytes);
}

/// An unlimited pool's threads keep a quarter of the installed RAM each at most.
#[test]
fn an_unlimited_pool_still_bounds_what_a_thread_keeps() {
    let pool = Pool::new(Limits::unlimited());
    cache_blocks(&pool, 3, MIB);
    let s = pool.stats();
    assert_eq!(s.thread_cached_bytes, 3 * MIB);
    assert!(s.thread_cached_bytes <= ndmem_alloc::physical_ram() / 4);
}

/// A peak reset starts the peak again from the live bytes, also for a thread whose own high
/// was set before the reset: its next rise counts from where it is, not from its old high.
#[test]
fn a_peak_reset_starts_every_thread_again_from_its_live_bytes() {
    let pool = pool_with(64 * MIB);
    std::thread::scope(|s| {
        let (to_main, from_thread) = mpsc::channel::<()>();
        let (to_thread, from_main) = mpsc::channel::<()>();
        let pool = &pool;
        s.spawn(move || {
            // A high of 8 KiB, then down to 1 KiB live.
            let mut blocks: Vec<Block> = (0..8).map(|_| pool.allocate(1024, 16).unwrap()).collect();
            blocks.truncate(1);
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            // After the reset: 2 KiB live, below the old high but a new peak.
            blocks.push(pool.allocate(1024, 16).unwrap());
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
        });
        from_thread.recv().unwrap();
        assert_eq!(pool.stats().peak_bytes, 8 * 1024);
        pool.reset_peak();
        assert_eq!(
            pool.stats().peak_bytes,
            1024,
            "the reset starts from the live bytes"
        );
        to_thread.send(()).unwrap();
        from_thread.recv().unwrap();
        let s = pool.stats();
        assert_eq!((s.live_bytes, s.peak_bytes), (2048, 2048));
        // The same on this thread.
        let a = pool.allocate(1024, 16).unwrap();
        drop(a);
        assert_eq!(pool.stats().peak_bytes, 3 * 1024);
        pool.reset_peak();
        let b = pool.allocate(1024, 16).unwrap();
        assert_eq!(pool.stats().peak_bytes, 3 * 1024);
        drop(b);
        to_thread.send(()).unwrap();
    });
}

/// A cache learns its caps from misses (each adds a block to a list's cap), and a lower
/// limit recalls the caches and sets the caps back.
#[test]
fn a_thread_keeps_as_many_blocks_of_a_class_as_it_missed_and_a_lower_limit_resets_that() {
    let pool = pool_with(64 * MIB);
    // Five misses: a cap of five.
    cache_blocks(&pool, 5, 4096);
    assert_eq!(pool.stats().thread_cached_bytes, 5 * 4096);
    // Five hits and a miss: six kept.
    cache_blocks(&pool, 6, 4096);
    assert_eq!(pool.stats().thread_cached_bytes, 6 * 4096);
    // Two blocks at a time: no miss, and the six stay.
    cache_blocks(&pool, 2, 4096);
    let s = pool.stats();
    assert_eq!(s.thread_cached_bytes, 6 * 4096);
    pool.set_max_bytes(Some(32 * MIB)).unwrap();
    let s = pool.stats();
    assert_eq!(s.thread_cached_bytes, 0, "a lower bound recalls the caches");
    assert_eq!(s.cached_bytes, 6 * 4096, "into the shared classes");
}

/// Eight threads churn blocks of 64 B to 4 MiB (class boundaries and one byte either side)
/// against a 64 MiB limit, half of them freed by another thread, each taking a share of a
/// quota before it asks so that the live blocks and the request always fit: no request may
/// be refused. At the limit, freed blocks sit in caches that other threads keep refilling,
/// and another thread's trim is still giving its blocks to the OS (used, but neither
/// cached nor live); one relief round refused such requests now and then (semantics §1:
/// "refused only when the bytes truly are live"). Another thread reads the statistics
/// meanwhile: the used peak is never below the used bytes.
#[test]
fn at_the_limit_threads_churning_are_refused_only_for_live_bytes() {
    const LIMIT: usize = 64 * MIB;
    const THREADS: usize = 8;
    let pool = pool_with(LIMIT);
    let mut sizes = Vec::new();
    let mut s = 64usize;
    while s <= 4 * MIB {
        for q in 0..4 {
            let c = s + q * (s / 4);
            sizes.extend([c - 1, c, c + 1].into_iter().filter(|&x| x <= 4 * MIB + 1));
        }
        s *= 2;
    }
    // An upper bound of a block's capacity for `size` bytes.
    let share = |size: usize| size + size / 4 + 64;
    let quota = AtomicUsize::new(0);
    let wrong = std::sync::Mutex::new(Vec::<String>::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let allocations = AtomicUsize::new(0);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(Block, usize)>())
        .unzip();
    std::thread::scope(|s| {
        for (t, rx) in receivers.into_iter().enumerate() {
            let (pool, quota, wrong, sizes, allocations) =
                (&pool, &quota, &wrong, &sizes, &allocations);
            let next = senders[(t + 1) % THREADS].clone();
            s.spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1).wrapping_mul(0x0123_4567);
                let mut mine: Vec<(Block, usize)> = Vec::new();
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(1500) {
                    while let Ok((block, taken)) = rx.try_recv() {
                        drop(block);
                        quota.fetch_sub(taken, Ordering::SeqCst);
                    }
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let size = sizes[seed as usize % sizes.len()];
                    let taken = share(size);
                    let fits = quota
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                            (q + taken <= LIMIT).then_some(q + taken)
                        })
                        .is_ok();
                    if fits {
                        match pool.allocate(size, 64) {
                            Ok(block) => {
                                allocations.fetch_add(1, Ordering::Relaxed);
                                mine.push((block, taken));
                            }
                            Err(e) => {
                                quota.fetch_sub(taken, Ordering::SeqCst);
                                wrong.lock().unwrap().push(e.to_string());
                            }
                        }
                    }
                    if !mine.is_empty() && (mine.len() > 6 || !fits) {
                        let (block, taken) = mine.swap_remove(seed as usize % mine.len());
                        if seed & 1 == 0 {
                            let _ = next.send((block, taken)); // freed by the next thread
                        } else {
                            drop(block);
                            quota.fetch_sub(taken, Ordering::SeqCst);
                        }
                    }
                }
                for (block, taken) in mine {
                    drop(block);
                    quota.fetch_sub(taken, Ordering::SeqCst);
                }
                drop(next);
                // What the previous thread sent before it stopped.
                while let Ok((block, taken)) = rx.recv_timeout(Duration::from_millis(200)) {
                    drop(block);
                    quota.fetch_sub(taken, Ordering::SeqCst);
                }
            });
        }
        drop(senders);
        let (pool, stop, wrong) = (&pool, &stop, &wrong);
        let reader = s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let st = pool.stats();
                if st.peak_used_bytes < st.used_bytes || st.used_bytes > LIMIT {
                    wrong.lock().unwrap().push(format!("reading {st:?}"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        std::thread::sleep(Duration::from_millis(1700));
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    });
    let wrong = wrong.into_inner().unwrap();
    assert!(
        wrong.is_empty(),
        "{} wrong of {} allocations, first: {}",
        wrong.len(),
        allocations.load(Ordering::Relaxed),
        wrong[0]
    );
    assert!(allocations.load(Ordering::Relaxed) > 1000);
    let st = pool.stats();
    assert_eq!(st.live_bytes, 0, "{st:?}");
}
