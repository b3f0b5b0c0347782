//! loom models of `ndmem_alloc::Pool`'s lock-free paths, on the real pool with tiny
//! blocks (64 and 128 bytes, carved from the pool's slabs: one mapping per iteration).
//!
//! What they check, over every interleaving within the preemption bound:
//! - two threads allocating and freeing under a limit: every block ends up counted exactly
//!   once; and while one thread takes a block the other is still freeing, `used = live +
//!   cached` never passes `max_bytes` and the `cached` counter never wraps (it is raised
//!   before a block enters a slot, lowered after one leaves);
//! - a cached block wanted by two threads goes to exactly one of them, the other gets
//!   fresh memory: no block is handed out twice;
//! - at the limit, relief (trimming the cache) racing a cache hit never lets both
//!   requests through, and the loser gets an out-of-memory error;
//! - `set_max_bytes` lowering the limit while a block is allocated: exactly one of the two
//!   wins, and use never ends above the limit in force.
//!
//! Under loom no thread keeps a cache of its own (`pool::local` registers none: loom runs
//! its threads on one OS thread), so these models check the shared classes, the books and
//! the registry lock the statistics are summed under. The threads' caches are entered by a
//! handshake whose barrier is process-wide (`membarrier`), which loom cannot model; the
//! stress tests of `tests/alloc/threads.rs` and memcheck cover it.
//!
//! `Pool::new` builds 113 classes x 16 slots of loom atomics and `trim` (at relief and at
//! drop) scans them all, so these models raise loom's per-execution branch cap. The
//! physical limit is off: its RSS estimate is a heuristic re-read from `/proc`, not a
//! lock-free invariant. `Pool::stats` is costly to model (it reads every counter), so
//! each model reads it concurrently at most once, where a race would show.
#![cfg(ndmem_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::{AllocError, Limits, Pool};
use ndmem_loom_tests::builder;

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut model = builder();
    model.max_branches = 20_000;
    model.check(f);
}

fn pool(max_bytes: usize) -> Arc<Pool> {
    Arc::new(Pool::new(
        Limits::builder()
            .max_bytes(max_bytes)
            .max_physical_bytes(None)
            .build(),
    ))
}

/// The pool's own figures are within the limit and add up.
fn assert_within(pool: &Pool, limit: usize) {
    let s = pool.stats();
    assert!(
        s.used_bytes <= limit,
        "used {} > limit {limit}",
        s.used_bytes
    );
    assert!(
        s.cached_bytes <= limit,
        "cached {} (wrapped?)",
        s.cached_bytes
    );
    assert!(s.live_bytes <= limit, "live {} (wrapped?)", s.live_bytes);
}

#[test]
fn allocate_and_free_under_a_limit_keep_the_books_exact() {
    check(|| {
        let pool = pool(128);
        let other = {
            let pool = pool.clone();
            thread::spawn(move || drop(pool.allocate(64, 64).unwrap()))
        };
        drop(pool.allocate(64, 64).unwrap());
        other.join().unwrap();
        let s = pool.stats();
        assert_eq!(s.live_bytes, 0);
        assert_eq!(s.allocations, 2);
        assert_eq!(s.deallocations, 2);
        assert_eq!(s.cache_hits + s.os_allocations, 2);
        // Every block obtained from the OS is cached now (two slots free for it).
        assert_eq!(s.cached_bytes, 64 * s.os_allocations as usize);
        assert_eq!(s.used_bytes, s.cached_bytes);
        assert_eq!(s.total_allocated_bytes, 128);
        assert_eq!(s.total_freed_bytes, 128);
        assert!(s.peak_bytes <= 128 && s.peak_used_bytes <= 128);
    });
}

/// The race behind the `cached` counter's order (raised before a block enters a slot,
/// lowered after one leaves): a thread takes the block the other is still freeing, and the
/// figures it reads at that moment must be within the limit, none wrapped. Split from the
/// model above, which checks the books once both are done, because a concurrent
/// `Pool::stats` multiplies the interleavings of everything that runs beside it: here only
/// the free races the allocation and the read.
#[test]
fn a_block_taken_while_its_free_is_in_flight_leaves_no_figure_wrapped() {
    check(|| {
        let pool = pool(128);
        let mine = pool.allocate(64, 64).unwrap();
        let other = {
            let pool = pool.clone();
            thread::spawn(move || {
                let block = pool.allocate(64, 64).unwrap();
                // Read just after a pop that may have taken the other thread's block
                // before that thread finished freeing it: `cached` must not have wrapped.
                assert_within(&pool, 128);
                drop(block);
            })
        };
        drop(mine);
        other.join().unwrap();
        let s = pool.stats();
        assert_eq!(s.live_bytes, 0);
        assert_eq!(s.used_bytes, s.cached_bytes);
        assert_eq!(s.cache_hits + s.os_allocations, 2);
    });
}

/// Waits until `n` threads have arrived, so that blocks stay live across the race.
fn rendezvous(arrived: &AtomicUsize, n: usize) {
    arrived.fetch_add(1, Ordering::SeqCst);
    while arrived.load(Ordering::SeqCst) < n {
        thread::yield_now();
    }
}

#[test]
fn a_cached_block_goes_to_exactly_one_thread() {
    check(|| {
        let pool = pool(1 << 10);
        drop(pool.allocate(64, 64).unwrap()); // one block in the cache
        let arrived = Arc::new(AtomicUsize::new(0));
        let other = {
            let (pool, arrived) = (pool.clone(), arrived.clone());
            thread::spawn(move || {
                let block = pool.allocate(64, 64).unwrap();
                let addr = block.ptr().as_ptr() as usize;
                rendezvous(&arrived, 2); // both blocks live now
                addr
            })
        };
        let mine = pool.allocate(64, 64).unwrap();
        rendezvous(&arrived, 2);
        let theirs = other.join().unwrap();
        assert_ne!(
            mine.ptr().as_ptr() as usize,
            theirs,
            "one block handed out twice"
        );
        let s = pool.stats();
        assert_eq!(s.cache_hits, 1);
        assert_eq!(s.os_allocations, 2);
        assert_eq!(s.live_bytes, 64);
        drop(mine);
        assert_eq!(pool.stats().live_bytes, 0);
        assert_eq!(pool.stats().cached_bytes, 128);
    });
}

#[test]
fn relief_racing_a_cache_hit_lets_exactly_one_request_through() {
    check(|| {
        let pool = pool(128);
        drop(pool.allocate(64, 64).unwrap()); // 64 bytes cached, 64 of headroom
        let arrived = Arc::new(AtomicUsize::new(0));
        let small = {
            let (pool, arrived) = (pool.clone(), arrived.clone());
            thread::spawn(move || {
                let block = pool.allocate(64, 64);
                let ok = block.is_ok();
                rendezvous(&arrived, 2); // hold the block until both have tried
                ok
            })
        };
        // 128 bytes fit only once the cached block is trimmed (relief).
        let big = pool.allocate(128, 64);
        if let Err(e) = &big {
            assert!(matches!(e, AllocError::OutOfMemory { .. }), "{e}");
        }
        rendezvous(&arrived, 2);
        let small_ok = small.join().unwrap();
        assert!(
            big.is_ok() != small_ok,
            "big {:?}, small {small_ok}",
            big.is_ok()
        );
        drop(big);
        let s = pool.stats();
        assert!(s.peak_bytes <= 128, "peak live {}", s.peak_bytes);
        assert_eq!(s.live_bytes, 0);
        assert_eq!(s.used_bytes, s.cached_bytes);
        assert_eq!(s.failed_allocations, 1);
        assert_within(&pool, 128);
    });
}

#[test]
fn lowering_the_limit_races_an_allocation_safely() {
    check(|| {
        let pool = pool(256);
        drop(pool.allocate(64, 64).unwrap()); // cached: trimmed by the lower limit
        let lowering_done = Arc::new(AtomicUsize::new(0));
        let allocator = {
            let (pool, lowering_done) = (pool.clone(), lowering_done.clone());
            thread::spawn(move || {
                let block = pool.allocate(128, 64);
                let ok = block.is_ok();
                if ok {
                    // Whatever the limit is now, this block fits in it.
                    let limit = pool.limits().0.unwrap();
                    assert!(limit >= 128, "128 bytes live under a limit of {limit}");
                }
                // The block stays live until the limit change is over (freed and cached,
                // it would rightly let a lower limit through).
                rendezvous(&lowering_done, 2);
                ok
            })
        };
        let lowered = pool.set_max_bytes(Some(100));
        rendezvous(&lowering_done, 2);
        let allocated = allocator.join().unwrap();
        match (allocated, &lowered) {
            (true, Err(AllocError::LimitBelowUse { .. })) => {
                assert_eq!(pool.limits().0, Some(256))
            }
            (false, Ok(())) => assert_eq!(pool.limits().0, Some(100)),
            (true, Ok(())) => panic!("128 bytes allocated and the limit lowered to 100"),
            (_, lowered) => panic!("allocated {allocated}, set_max_bytes {lowered:?}"),
        }
        let s = pool.stats();
        assert_eq!(s.live_bytes, 0);
        assert!(s.used_bytes <= s.limit_bytes.unwrap());
    });
}
