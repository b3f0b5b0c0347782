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
