//! Reclaimers: run before a request at the limit fails, never recursively, without heap
//! allocations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ndmem_alloc::{AllocError, Block, Pool};

use crate::common::counting::heap_allocations_of_this_thread;
use crate::{pool_with, MIB};

static RECLAIMED: Mutex<Option<Block<'static>>> = Mutex::new(None);
static RECLAIM_CALLS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn registered_reclaimers_run_before_an_allocation_fails() {
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

static LATE: Mutex<Vec<Block<'static>>> = Mutex::new(Vec::new());
static LATE_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Semantics §1: the reclaimers run in every relief round while a round frees something,
/// not in the first alone. Here the bytes the request needs become reclaimable only after
/// the first round (as when other threads close scopes while it relieves: their frees are
/// pending a moment later); a pool that ran its reclaimers once refused the request with
/// those bytes only waiting.
#[test]
fn reclaimers_run_again_in_each_relief_round_that_freed_something() {
    let pool: &'static Pool = Box::leak(Box::new(pool_with(8 * MIB)));
    pool.register_reclaimer(|| {
        let call = LATE_CALLS.fetch_add(1, Ordering::SeqCst);
        let mut late = LATE.lock().unwrap();
        // Call 0 frees one small block; call 1 the big one.
        let take = match call {
            0 => late.iter().position(|b| b.capacity() < MIB),
            1 => late.iter().position(|b| b.capacity() >= MIB),
            _ => None,
        };
        take.map_or(0, |i| late.swap_remove(i).capacity())
    });
    {
        let mut late = LATE.lock().unwrap();
        late.push(pool.allocate(6 * MIB, 64).unwrap());
        late.push(pool.allocate(64 << 10, 64).unwrap());
    }
    let block = pool
        .allocate(6 * MIB, 64)
        .expect("the second round freed the bytes");
    assert_eq!(LATE_CALLS.load(Ordering::SeqCst), 2);
    assert_eq!(pool.stats().live_bytes, block.capacity());
    drop(block);
    // A request that can never fit: its first round's reclaimers free nothing, so no
    // later round runs them again (a reclaimer that freed nothing may have waited; the
    // first round's trim released the cache, so a second round ran, without them).
    let err = pool.allocate(16 * MIB, 64).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err:?}");
    assert_eq!(LATE_CALLS.load(Ordering::SeqCst), 3);
}

static RECURSIVE_CALLS: AtomicUsize = AtomicUsize::new(0);
static RECURSIVE_INNER_REFUSED: AtomicUsize = AtomicUsize::new(0);

/// A reclaimer that allocates from its own pool at the limit does not run the reclaimers
/// again (which would recurse until the stack overflows); its request simply fails.
#[test]
fn a_reclaimer_that_allocates_from_the_pool_does_not_recurse() {
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

/// A reclaimer that panics fails the request with an error value; the panic does not
/// unwind out of the pool, which stays usable.
#[test]
fn a_panicking_reclaimer_fails_the_request_with_an_error() {
    let pool = pool_with(8 * MIB);
    pool.register_reclaimer(|| panic!("the reclaimer broke"));
    let held = pool.allocate(6 * MIB, 64).unwrap();
    let err = pool.allocate(4 * MIB, 64).unwrap_err();
    match &err {
        AllocError::ReclaimerPanicked {
            requested, message, ..
        } => {
            assert_eq!(*requested, 4 * MIB);
            assert_eq!(message, "the reclaimer broke");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains("a reclaimer registered with the pool panicked: the reclaimer broke"),
        "{err}"
    );
    let s = pool.stats();
    assert_eq!((s.failed_allocations, s.live_bytes), (1, held.capacity()));
    drop(held);
    // The reclaimer still panics at the limit, so make room without it.
    pool.trim();
    assert!(
        pool.allocate(4 * MIB, 64).is_ok(),
        "the pool is still usable"
    );
}
