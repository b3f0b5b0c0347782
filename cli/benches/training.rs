//! One training step of the `ndmem train` MLP (Iris, 4-32-3) under each memory mode:
//! `pool` (blocks owned by handles), `workspaces` (a learned FirstLoop workspace per step)
//! and `scopes` (a child scope per step), at batch 16 (the command's default) and batch 64
//! (four times the arithmetic per tensor, so the memory modes differ less). The model and
//! step code are the command's own, from the `ndmem_cli` library. After each batch size's
//! timings it prints steps/s per mode (from the median of 2000 timed steps), the
//! `workspaces`/`pool` ratio (target: at least 1.5x), and pool and heap allocations per
//! step after the first, and checks that `workspaces` takes none of either. The heap is
//! the command's: `Tracking<System>` as the global allocator, whose counts `heap::stats()`
//! reads (exact here: the bench's one thread allocates).

use std::alloc::System;
use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use ndmem::alloc::{heap, Pool, Tracking};

use ndmem_cli::data::{fill_batch, shuffler, Dataset, Split, CLASSES, FEATURES};
use ndmem_cli::model::Dims;
use ndmem_cli::modes::{Mode, Trainer};

/// The command's allocator, so heap allocations per step are counted as `ndmem train`
/// counts them.
#[global_allocator]
static GLOBAL: Tracking<System> = Tracking::new(System);

/// Rows per step: the command's default, and four times that.
const BATCHES: [usize; 2] = [16, 64];
/// Learning rate (small, so the many timed steps on one batch stay finite).
const LR: f32 = 0.01;
/// The command's default model: 4-32-3.
const DIMS: Dims = Dims {
    inputs: FEATURES,
    hidden: 32,
    classes: CLASSES.len(),
};

/// The first batch `ndmem train --batch <rows>` trains on: `rows` standardised training
/// rows of the first epoch's shuffle, and their one-hot labels.
fn batch(rows: usize) -> (Vec<f32>, Vec<f32>) {
    let data = Dataset::iris().expect("the embedded CSV parses");
    let split = Split::new(&data, 42);
    let mut order: Vec<usize> = (0..split.train.rows()).collect();
    shuffler(42).shuffle(&mut order);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    fill_batch(&split.train, &order[..rows], &mut x, &mut y);
    (x, y)
}

/// Steps per second of `mode`: one over the median of `steps` timed steps, after a few
/// untimed ones (the first learns the workspace).
fn steps_per_sec(mode: Mode, x: &[f32], y: &[f32], steps: usize) -> f64 {
    let mut trainer = Trainer::new(mode, DIMS, 42).unwrap();
    for _ in 0..3 {
        trainer.step(x, y, LR).unwrap();
    }
    let mut nanos: Vec<u128> = (0..steps)
        .map(|_| {
            let started = Instant::now();
            black_box(trainer.step(black_box(x), black_box(y), LR).unwrap());
            started.elapsed().as_nanos()
        })
        .collect();
    nanos.sort_unstable();
    1e9 / nanos[steps / 2].max(1) as f64
}

/// Times one step per mode (criterion), then prints steps/s per mode, the
/// `workspaces`/`pool` ratio, and pool allocations per step after the first.
fn training_step(c: &mut Criterion) {
    for rows in BATCHES {
        batch_size(c, rows);
    }
}

/// [`training_step`] at `rows` rows a step.
fn batch_size(c: &mut Criterion, rows: usize) {
    let (x, y) = batch(rows);
    let mut group = c.benchmark_group(format!("train_step_batch{rows}"));
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

    println!("steps/s per mode (median of 2000 steps, batch {rows}):");
    let rates = Mode::ALL.map(|mode| steps_per_sec(mode, &x, &y, 2000));
    for (mode, rate) in Mode::ALL.iter().zip(rates) {
        println!("  {:<11} {rate:>9.0}", mode.name());
    }
    println!(
        "workspaces / pool at batch {rows}: {:.2}x (target: at least 1.5x)",
        rates[1] / rates[0]
    );

    println!("allocations per step after the first (100 steps, batch {rows}):");
    for mode in Mode::ALL {
        let mut trainer = Trainer::new(mode, DIMS, 42).unwrap();
        trainer.step(&x, &y, LR).unwrap();
        let (before, heap_before) = (Pool::global().stats(), heap::stats());
        for _ in 0..100 {
            trainer.step(&x, &y, LR).unwrap();
        }
        let (after, heap_after) = (Pool::global().stats(), heap::stats());
        let allocations = (after.allocations - before.allocations) as f64 / 100.0;
        let os = (after.os_allocations - before.os_allocations) as f64 / 100.0;
        let heap = (heap_after.allocations - heap_before.allocations) as f64 / 100.0;
        println!(
            "  {:<11} {allocations:>6.2} pool, {os:>5.2} OS, {heap:>6.2} heap",
            mode.name()
        );
        if mode == Mode::Workspaces {
            assert_eq!(
                (allocations, heap),
                (0.0, 0.0),
                "a learned workspace step takes nothing from the pool or the heap"
            );
        }
    }
}

criterion_group!(benches, training_step);
criterion_main!(benches);
