//! Heap allocations of ops on workspace tensors: none, once the workspace has learned its
//! size (semantics §3: a learned workspace takes nothing from the pool, and the tensors it
//! holds take nothing from the heap either). Counted per thread by
//! `common::counting::CountingPerThread`, this binary's global allocator.

use ndmem::{workspaces, DType, Tensor, WorkspaceConfig};

use crate::common::counting::heap_allocations_of_this_thread;

/// Heap allocations `f` makes on this thread.
fn allocations<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = heap_allocations_of_this_thread();
    let out = f();
    (heap_allocations_of_this_thread() - before, out)
}

type Op = (&'static str, fn(&Tensor, &Tensor, &Tensor) -> Tensor);

/// Every op under test, on `a [4, 8]`, `b [4, 8]` and `m [8, 3]` (floats, positive).
fn ops() -> Vec<Op> {
    vec![
        ("add", |a, b, _| a.add(b).unwrap()),
        ("add_broadcast", |a, b, _| {
            a.add(&b.sum_axis(0).unwrap()).unwrap()
        }),
        ("sub", |a, b, _| a.sub(b).unwrap()),
        ("mul", |a, b, _| a.mul(b).unwrap()),
        ("div", |a, b, _| a.div(b).unwrap()),
        ("matmul", |a, _, m| a.matmul(m).unwrap()),
        ("add_scalar", |a, _, _| a.add_scalar(1.5).unwrap()),
        ("mul_scalar", |a, _, _| a.mul_scalar(0.5).unwrap()),
        ("relu", |a, _, _| a.relu().unwrap()),
        ("relu_backward", |a, b, _| a.relu_backward(b).unwrap()),
        ("sigmoid", |a, _, _| a.sigmoid().unwrap()),
        ("tanh", |a, _, _| a.tanh().unwrap()),
        ("exp", |a, _, _| a.exp().unwrap()),
        ("log", |a, _, _| a.log().unwrap()),
        ("sum", |a, _, _| a.sum().unwrap()),
        ("sum_axis", |a, _, _| a.sum_axis(1).unwrap()),
        ("mean", |a, _, _| a.mean().unwrap()),
        ("mean_axis", |a, _, _| a.mean_axis(0).unwrap()),
        ("softmax", |a, _, _| a.softmax(1).unwrap()),
        ("log_softmax", |a, _, _| a.log_softmax(1).unwrap()),
        ("argmax", |a, _, _| a.argmax(1).unwrap()),
        ("transpose", |a, _, _| a.transpose().unwrap()),
        ("transpose_matmul", |a, b, _| {
            a.transpose().unwrap().matmul(b).unwrap()
        }),
        ("reshape", |a, _, _| a.reshape(&[8, 4]).unwrap()),
        ("broadcast_to", |_, _, m| {
            m.sum_axis(0).unwrap().broadcast_to(&[2, 5, 3]).unwrap()
        }),
        ("copy", |a, _, _| a.copy().unwrap()),
        ("clone_and_drop", |a, _, _| a.clone()),
    ]
}

/// One cycle of `id`: the inputs, then `op` on them, counted.
fn cycle(id: &str, op: &Op) -> u64 {
    let cfg = WorkspaceConfig::default();
    let _guard = workspaces().get_and_activate(&cfg, id).unwrap();
    let a = Tensor::rand(DType::F32, &[4, 8], 1)
        .unwrap()
        .add_scalar(0.5)
        .unwrap();
    let b = Tensor::rand(DType::F32, &[4, 8], 2)
        .unwrap()
        .add_scalar(0.5)
        .unwrap();
    let m = Tensor::rand(DType::F32, &[8, 3], 3).unwrap();
    let (n, out) = allocations(|| {
        let out = (op.1)(&a, &b, &m);
        assert!(out.is_valid());
        out.len()
    });
    assert!(out > 0);
    n
}

#[test]
fn ops_on_workspace_tensors_allocate_nothing_on_the_heap() {
    let mut failures = Vec::new();
    for op in ops() {
        let id = format!("HEAP_{}", op.0);
        // The first cycles learn the workspace (and warm this thread's caches).
        for _ in 0..3 {
            cycle(&id, &op);
        }
        let n = cycle(&id, &op);
        if n != 0 {
            failures.push((op.0, n));
        }
        workspaces().destroy(&id).unwrap();
    }
    assert!(failures.is_empty(), "heap allocations per op: {failures:?}");
}

#[test]
fn creating_and_dropping_workspace_tensors_allocates_nothing() {
    let cfg = WorkspaceConfig::default();
    let mut counts = Vec::new();
    for _ in 0..4 {
        let _guard = workspaces().get_and_activate(&cfg, "HEAP_CREATE").unwrap();
        let (n, ()) = allocations(|| {
            let a = Tensor::zeros(DType::F32, &[16, 16]).unwrap();
            let b = Tensor::from_slice(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
            let c = Tensor::full(DType::I64, &[2, 3, 4, 5], 7.0).unwrap();
            assert_eq!(a.len() + b.len() + c.len(), 256 + 3 + 120);
        });
        counts.push(n);
    }
    workspaces().destroy("HEAP_CREATE").unwrap();
    assert_eq!(
        counts[1..],
        [0, 0, 0],
        "heap allocations per cycle: {counts:?}"
    );
}

#[test]
fn a_pool_tensor_costs_at_most_one_heap_allocation_from_creation_to_free() {
    // Outside workspaces a tensor's memory is a pool block, freed through the epoch when
    // its last handle drops. The deferred free is three words, kept inline by the epoch;
    // what remains is the queue node of the flush that makes the block collectible by any
    // thread at once.
    const TENSORS: u64 = 64;
    let mut counts = Vec::new();
    for _ in 0..4 {
        let (n, ()) = allocations(|| {
            for i in 0..TENSORS {
                let t = Tensor::full(DType::F32, &[4, 8], i as f64).unwrap();
                let u = t.add_scalar(1.0).unwrap();
                assert!(u.is_valid());
            }
        });
        ndmem::reclaim::collect();
        counts.push(n);
    }
    // Two tensors per iteration.
    assert!(
        counts[1..].iter().all(|&n| n <= 2 * TENSORS),
        "heap allocations per {} tensors: {counts:?}",
        2 * TENSORS
    );
}

#[test]
fn a_scope_cycle_costs_at_most_one_heap_allocation_per_tensor_and_its_close_two() {
    // A child scope per step, its tensors, its close (DJL's per-batch NDManager): the close
    // hands all of the scope's blocks to the epoch in one deferred call and one flush.
    const TENSORS: usize = 20;
    let base = ndmem::Scope::new_base("HEAP_SCOPES");
    let mut cycles = Vec::new();
    for _ in 0..4 {
        let mut kept = Vec::with_capacity(TENSORS);
        let (whole, close) = allocations(|| {
            let child = base.child("batch").unwrap();
            for i in 0..TENSORS {
                kept.push(child.full(DType::F32, &[4, 8], i as f64).unwrap());
            }
            kept.clear();
            allocations(|| child.close().unwrap()).0
        });
        ndmem::reclaim::collect();
        cycles.push((whole, close));
    }
    for &(whole, close) in &cycles[1..] {
        assert!(
            close <= 2,
            "closing a scope of {TENSORS} tensors: {cycles:?}"
        );
        assert!(
            whole <= TENSORS as u64,
            "a scope cycle of {TENSORS} tensors: {cycles:?}"
        );
    }
}
