//! Heap allocations of a training step, counted by the tracking allocator the command
//! installs (`ndmem_alloc::Tracking<System>`): none in `workspaces` mode once the first step
//! has learned the workspaces; at most one per tensor created in `pool` and `scopes` modes.
//! `heap::stats()` publishes the calling thread's counts first, so they are exact while the
//! test's thread is the only one allocating: each check runs the modes one after another,
//! and the checks one at a time (`ONE_AT_A_TIME`).

use std::alloc::System;

use ndmem::alloc::{heap, Pool, Tracking};
use ndmem_cli::model::Dims;
use ndmem_cli::modes::{Mode, Trainer};

#[global_allocator]
static GLOBAL: Tracking<System> = Tracking::new(System);

/// Held by each check, so no other test thread allocates while one counts.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const DIMS: Dims = Dims {
    inputs: 4,
    hidden: 32,
    classes: 3,
};

/// A batch of 16 rows, the command's default.
fn batch() -> (Vec<f32>, Vec<f32>) {
    let x = (0..16 * 4).map(|i| (i as f32 * 0.37).sin()).collect();
    let y = (0..16)
        .flat_map(|r| (0..3).map(move |c| f32::from(u8::from(r % 3 == c))))
        .collect();
    (x, y)
}

/// Steps run before counting.
const WARM_UP: usize = 10;

/// Heap allocations and pool allocations (one per tensor created in pool memory) of each
/// of `steps` steps of `mode`, after [`WARM_UP`] uncounted ones.
fn per_step(mode: Mode, steps: usize) -> Vec<(u64, u64)> {
    let (x, y) = batch();
    let mut trainer = Trainer::new(mode, DIMS, 42).unwrap();
    for _ in 0..WARM_UP {
        trainer.step(&x, &y, 0.1).unwrap();
    }
    let pool = Pool::global();
    (0..steps)
        .map(|_| {
            let (heap_before, pool_before) = (heap::stats(), pool.stats());
            trainer.step(&x, &y, 0.1).unwrap();
            let (heap_after, pool_after) = (heap::stats(), pool.stats());
            (
                heap_after.allocations - heap_before.allocations,
                pool_after.allocations - pool_before.allocations,
            )
        })
        .collect()
}

#[test]
fn a_learned_workspace_step_allocates_nothing_on_the_heap() {
    let _alone = alone();
    assert!(heap::is_tracking());
    let steps = per_step(Mode::Workspaces, 50);
    assert!(
        steps.iter().all(|&(heap, pool)| heap == 0 && pool == 0),
        "heap and pool allocations per step: {steps:?}"
    );
}

#[test]
fn pool_and_scopes_steps_allocate_at_most_once_per_tensor() {
    let _alone = alone();
    for mode in [Mode::Pool, Mode::Scopes] {
        let steps = per_step(mode, 50);
        assert!(
            steps.iter().all(|&(heap, tensors)| heap <= tensors),
            "{}: heap allocations and tensors per step: {steps:?}",
            mode.name()
        );
    }
}
