//! Tensor costs: the validity check per op argument, and an elementwise op and a 256x256
//! matmul with their outputs in a learned workspace versus in the pool.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ndmem::{workspaces, DType, Tensor, WorkspaceConfig};

fn validity_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("validity_check");
    let pool_tensor = Tensor::ones(DType::F32, &[16]).unwrap();
    // The answer goes to `black_box` here, not back to `iter` (whose `black_box` stores it
    // and reads it back volatile): that read-back chains each iteration to the last
    // through a stack slot and measures the harness, not the check.
    group.bench_function("pool_tensor", |b| {
        b.iter(|| {
            black_box(black_box(&pool_tensor).is_valid());
        })
    });
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1 << 20)
        .build()
        .unwrap();
    let _guard = ws.get_and_activate(&cfg, "CHECK").unwrap();
    let ws_tensor = Tensor::ones(DType::F32, &[16]).unwrap();
    group.bench_function("workspace_tensor", |b| {
        b.iter(|| {
            black_box(black_box(&ws_tensor).is_valid());
        })
    });
    group.finish();
}

fn ops_by_placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("ops");
    let a = Tensor::rand(DType::F32, &[256, 256], 1).unwrap();
    let b = Tensor::rand(DType::F32, &[256, 256], 2).unwrap();
    let ws = workspaces();
    let cfg = WorkspaceConfig::default();
    // Learn the workspace size first.
    for _ in 0..2 {
        let _g = ws.get_and_activate(&cfg, "OPS").unwrap();
        black_box(a.add(&b).unwrap());
        black_box(a.matmul(&b).unwrap());
    }
    group.bench_function("add_256x256/pool", |bench| {
        bench.iter(|| black_box(a.add(&b).unwrap()))
    });
    group.bench_function("add_256x256/workspace", |bench| {
        bench.iter(|| {
            let _g = ws.get_and_activate(&cfg, "OPS").unwrap();
            black_box(a.add(&b).unwrap().len())
        })
    });
    group.bench_function("matmul_256x256/pool", |bench| {
        bench.iter(|| black_box(a.matmul(&b).unwrap()))
    });
    group.bench_function("matmul_256x256/workspace", |bench| {
        bench.iter(|| {
            let _g = ws.get_and_activate(&cfg, "OPS").unwrap();
            black_box(a.matmul(&b).unwrap().len())
        })
    });
    group.finish();
}

criterion_group!(benches, validity_check, ops_by_placement);
criterion_main!(benches);
