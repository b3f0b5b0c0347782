//! Pool live bytes return to their baseline when scopes close and when reclamation runs
//! (SEMANTICS 4, 6). One test in its own binary: the global pool's figures are
//! process-wide, so nothing else may allocate from it meanwhile.

use ndmem::alloc::Pool;
use ndmem::{reclaim, DType, Scope, Tensor};

fn live() -> usize {
    Pool::global().stats().live_bytes
}

#[test]
fn scopes_and_reclamation_return_pool_memory_to_the_baseline() {
    let baseline = live();

    // Closing a scope frees what it owns once nobody is pinned.
    let scope = Scope::new_base("baseline");
    let batch = scope.child("batch").unwrap();
    let x = batch.ones(DType::F32, &[256, 256]).unwrap();
    let y = x.matmul(&x).unwrap().relu().unwrap();
    assert!(live() >= baseline + 3 * 256 * 256 * 4);
    scope.close().unwrap();
    reclaim::collect();
    assert_eq!(live(), baseline, "scope close gave everything back");
    assert!(y.to_vec::<f32>().is_err());

    // Handle-owned tensors: freed through the epoch when the last handle drops.
    let t = Tensor::rand(DType::F64, &[1 << 16], 9).unwrap();
    let shared = t.clone();
    std::thread::spawn(move || shared.sum(None).unwrap().scalar().unwrap())
        .join()
        .unwrap();
    assert!(live() > baseline);
    drop(t);
    assert!(reclaim::pending_bytes() > 0 || live() == baseline);
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0);
    assert_eq!(
        live(),
        baseline,
        "after collect() the pool is back to the baseline"
    );
}
