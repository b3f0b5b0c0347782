//! Tensor costs: the validity check per op argument; an elementwise op and a 256x256
//! matmul with their outputs in a learned workspace versus in the pool; and the fixed cost
//! of an op (a `relu` of 16 elements, ten to a workspace cycle: the memory layer's share of
//! every op) and the small matmul kernel on the training MLP's narrow shapes (64x32 by 32x3,
//! and a transposed 32x64 by 64x3), in a learned workspace.

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

fn small_ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("small_ops");
    let tiny = Tensor::rand(DType::F32, &[4, 4], 3).unwrap();
    let h = Tensor::rand(DType::F32, &[64, 32], 4).unwrap();
    let w = Tensor::rand(DType::F32, &[32, 3], 5).unwrap();
    let d = Tensor::rand(DType::F32, &[64, 3], 6).unwrap();
    let ht = h.transpose().unwrap();
    let ws = workspaces();
    let cfg = WorkspaceConfig::default();
    // Learn the workspace size first.
    for _ in 0..2 {
        let _g = ws.get_and_activate(&cfg, "SMALL").unwrap();
        for _ in 0..10 {
            black_box(tiny.relu().unwrap());
        }
        black_box(h.matmul(&w).unwrap());
        black_box(ht.matmul(&d).unwrap());
    }
    group.bench_function("relu_4x4_x10/pool", |bench| {
        bench.iter(|| {
            for _ in 0..10 {
                black_box(tiny.relu().unwrap());
            }
        })
    });
    group.bench_function("relu_4x4_x10/workspace", |bench| {
        bench.iter(|| {
            let _g = ws.get_and_activate(&cfg, "SMALL").unwrap();
            for _ in 0..10 {
                black_box(tiny.relu().unwrap());
            }
        })
    });
    group.bench_function("matmul_64x32x3/workspace", |bench| {
        bench.iter(|| {
            let _g = ws.get_and_activate(&cfg, "SMALL").unwrap();
            black_box(h.matmul(&w).unwrap().len())
        })
    });
    group.bench_function("matmul_t32x64x3/workspace", |bench| {
        bench.iter(|| {
            let _g = ws.get_and_activate(&cfg, "SMALL").unwrap();
            black_box(ht.matmul(&d).unwrap().len())
        })
    });
    group.finish();
}

criterion_group!(benches, validity_check, ops_by_placement, small_ops);
criterion_main!(benches);
