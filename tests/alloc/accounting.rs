//! What counts: reservations against the limit, and the totals of bytes and calls.

use ndmem_alloc::Usage;

use crate::{pool_with, MIB};

#[test]
fn reservations_count_outside_memory_against_the_limit() {
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

/// Total allocated and freed bytes and counts, consistent with live bytes (semantics §1).
#[test]
fn totals_count_every_byte_handed_out_and_given_back() {
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
