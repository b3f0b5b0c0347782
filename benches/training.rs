//! One training step of the `ndmem train` MLP (Iris, 4-32-3, batch 64) under each memory
//! mode: `pool` (blocks owned by handles), `workspaces` (a learned FirstLoop workspace per
//! step) and `scopes` (a child scope per step). The model and step code are the command's
//! own modules, included by path. After the timings it prints pool allocations per step
//! after the first, and checks that `workspaces` takes none.

// The included modules' unit tests compile here too (`cargo clippy --all-targets`) but run
// with the binary's tests; their imports go unused in this crate.
#![cfg_attr(test, allow(unused_imports))]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ndmem::alloc::Pool;

#[allow(dead_code)]
#[path = "../src/bin/ndmem/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../src/bin/ndmem/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../src/bin/ndmem/modes.rs"]
mod modes;

use data::{fill_batch, Dataset, Split, CLASSES, FEATURES};
use model::Dims;
use modes::{Mode, Trainer};

const BATCH: usize = 64;
const LR: f32 = 0.01;
const DIMS: Dims = Dims {
    inputs: FEATURES,
    hidden: 32,
    classes: CLASSES.len(),
};

/// The first 64 standardised training rows and their one-hot labels.
fn batch() -> (Vec<f32>, Vec<f32>) {
    let data = Dataset::iris().expect("the embedded CSV parses");
    let split = Split::new(&data, 42);
    let rows: Vec<usize> = (0..BATCH).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    fill_batch(&split.train, &rows, &mut x, &mut y);
    (x, y)
}

fn training_step(c: &mut Criterion) {
    let (x, y) = batch();
    let mut group = c.benchmark_group("train_step_batch64");
    for mode in Mode::ALL {
        let mut trainer = Trainer::new(mode, DIMS, 42).unwrap();
        // The first step learns the workspace; a few more warm the pool's cache.
        for _ in 0..3 {
            trainer.step(&x, &y, LR).unwrap();
        }
        group.bench_function(mode.name(), |b| {
            b.iter(|| black_box(trainer.step(black_box(&x), black_box(&y), LR).unwrap()))
        });
    }
    group.finish();

    println!("pool allocations per step after the first (100 steps, batch {BATCH}):");
    for mode in Mode::ALL {
        let mut trainer = Trainer::new(mode, DIMS, 42).unwrap();
        trainer.step(&x, &y, LR).unwrap();
        let before = Pool::global().stats();
        for _ in 0..100 {
            trainer.step(&x, &y, LR).unwrap();
        }
        let after = Pool::global().stats();
        let allocations = (after.allocations - before.allocations) as f64 / 100.0;
        let os = (after.os_allocations - before.os_allocations) as f64 / 100.0;
        println!(
            "  {:<11} {allocations:>6.2} pool, {os:>5.2} OS",
            mode.name()
        );
        if mode == Mode::Workspaces {
            assert_eq!(
                allocations, 0.0,
                "a learned workspace step takes nothing from the pool"
            );
        }
    }
}

criterion_group!(benches, training_step);
criterion_main!(benches);
