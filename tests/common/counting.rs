//! System's allocator, counting the heap allocations of each thread, so a test binary that
//! installs it can check that a path allocates nothing on the Rust heap: `common::counting`,
//! or this file alone with `#[path = "common/counting.rs"] mod counting;`. Install
//! `counting::CountingPerThread` as the `#[global_allocator]`.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// System, counting the calling thread's allocations and reallocations.
pub(crate) struct CountingPerThread;

std::thread_local! {
    static HEAP_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to System unchanged; the count is a const thread-local
// without destructor, which never allocates.
unsafe impl GlobalAlloc for CountingPerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = HEAP_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout, forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's pointer and layout, forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = HEAP_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's arguments, forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Heap allocations (and reallocations) the calling thread made so far.
pub(crate) fn heap_allocations_of_this_thread() -> u64 {
    HEAP_ALLOCATIONS.with(Cell::get)
}
