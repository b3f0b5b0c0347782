//! Freeing never needs the heap (semantics §6): dropping tensors, closing scopes and
//! collecting work with the heap at its limit.

use std::alloc::Layout;

use ndmem::alloc::heap;
use ndmem::{reclaim, DType, Scope, Tensor};

use crate::common::{child::run_alone, test_name};

/// Heap blocks holding the room left under the limit.
struct Filler(Vec<(*mut u8, Layout)>);

impl Drop for Filler {
    fn drop(&mut self) {
        for &(ptr, layout) in &self.0 {
            // SAFETY: allocated by `fill_the_heap` with this layout, freed once.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }
}

/// Sets the heap limit to what is reserved now and takes what room is left, down to the
/// last 8 bytes: the next allocation fails.
fn fill_the_heap() -> Filler {
    let mut stats = heap::stats();
    // The limit may not go below what is reserved; a concurrent reservation makes it move.
    while heap::set_limit(Some(stats.reserved_bytes.max(1))).is_err() {
        stats = heap::stats();
    }
    let mut filler = Vec::with_capacity(4096);
    let mut size = 1 << 20;
    while size >= 8 && filler.len() < filler.capacity() {
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            size /= 2;
        } else {
            filler.push((ptr, layout));
        }
    }
    Filler(filler)
}

#[test]
fn dropping_tensors_with_the_heap_full_does_not_abort() {
    if run_alone(test_name!(
        dropping_tensors_with_the_heap_full_does_not_abort
    )) {
        return;
    }
    // Registered with the epoch before the limit, as a running program would be.
    drop(reclaim::pin());
    let mut tensors: Vec<Tensor> = (0..300)
        .map(|i| Tensor::zeros(DType::F32, &[16 + i % 7]).unwrap())
        .collect();
    let scope = Scope::new_base("FULL_HEAP");
    let mut owned: Vec<Tensor> = (0..100)
        .map(|_| scope.zeros(DType::F64, &[32]).unwrap())
        .collect();
    let pending_before = reclaim::pending_bytes();
    let filler = fill_the_heap();
    // Dropping the handles and closing the scope: no allocation may be needed.
    while let Some(t) = tensors.pop() {
        drop(t);
    }
    scope.close().unwrap();
    while let Some(t) = owned.pop() {
        drop(t);
    }
    reclaim::collect();
    drop(filler);
    let _ = heap::set_limit(None);
    assert!(reclaim::pending_bytes() >= pending_before);
    reclaim::collect();
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0, "every deferred free done");
}

#[test]
fn a_ring_whose_slot_references_the_heap_cannot_hold_is_an_error_not_an_abort() {
    // Semantics §2.1: bookkeeping that scales with the configuration (a ring's reference
    // per slot, here 1,001 of them: a list of 8 KiB and 24 KiB of references) is
    // allocated fallibly, so a heap without room for it makes creating the workspace fail
    // with an error. Every headroom from 0 to 160 KiB, by 1 KiB, is tried: each attempt
    // is refused with an error or creates the ring, and none aborts.
    if run_alone(test_name!(
        a_ring_whose_slot_references_the_heap_cannot_hold_is_an_error_not_an_abort
    )) {
        return;
    }
    use ndmem::{workspaces, Error, ResetPolicy, WorkspaceConfig};
    let ring = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .initial_size(64 << 10)
        .overallocation_limit(1000.0)
        .build()
        .unwrap();
    let ws = workspaces();
    drop(reclaim::pin());
    // Once with room: what a thread allocates once (its pool cache, the names) is made.
    drop(ws.get_and_activate(&ring, "RING_AT_THE_LIMIT").unwrap());
    ws.destroy("RING_AT_THE_LIMIT").unwrap();
    let (mut created, mut refused) = (0, 0);
    let filler = fill_the_heap();
    for room in 0..160usize {
        let reserved = heap::stats().reserved_bytes;
        if heap::set_limit(Some(reserved + (room << 10))).is_err() {
            continue;
        }
        match ws.get_and_activate(&ring, "RING_AT_THE_LIMIT") {
            Ok(guard) => {
                drop(guard);
                ws.destroy("RING_AT_THE_LIMIT").unwrap();
                created += 1;
            }
            Err(Error::Alloc(_)) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    drop(filler);
    let _ = heap::set_limit(None);
    assert!(
        refused > 0 && created > 0,
        "refused {refused}, created {created}"
    );
    assert!(!ws.exists("RING_AT_THE_LIMIT"));
}
