//! Workspace bump allocation against its anchors (ARCHITECTURE "Hot paths ... are
//! benchmarked"): a learned workspace vs System malloc/free vs bumpalo vs bump-scope.
//!
//! - `alloc/<impl>/<size>`: one allocation of 64 B .. 64 KiB, written to (a byte per page and
//!   the last byte) and black-boxed. Arenas are reset every 100 allocations, which adds
//!   1/100 of a cycle (enter + leave, or reset) to each figure.
//! - `alloc_page_aligned/<impl>/4096`: the same at 4 KiB with every block aligned to a page
//!   (the workspace's alignment 4096): equal work for all three (see `per_allocation`).
//! - `cycle_1000x4KiB/<impl>`: a whole cycle of 1000 allocations of 4 KiB, each written,
//!   then everything released (guard drop, reset, or 1000 frees).
//! - `enter_leave/workspace`: entering and leaving a learned workspace (an empty cycle).
//! - Before criterion runs, minor page faults per cycle after learning are printed, read
//!   from /proc/self/stat (the same counter getrusage's ru_minflt reports).
//!
//! Run: `cargo bench --bench workspace -- --warm-up-time 1 --measurement-time 3`.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use ndmem::{workspaces, AllocationPolicy, WorkspaceConfig};

const SIZES: [usize; 6] = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10];
/// Allocations between two resets in the per-allocation benchmark.
const PER_CYCLE: u64 = 100;
const PAGE: usize = 4096;

/// Writes a byte in every page of the block and its last byte, so fresh pages fault.
#[inline(always)]
fn touch(ptr: NonNull<u8>, size: usize) {
    let mut at = 0;
    while at < size {
        // SAFETY: `at < size` and the block holds `size` writable bytes.
        unsafe { ptr.as_ptr().add(at).write_volatile(at as u8) };
        at += PAGE;
    }
    // SAFETY: `size > 0`; the last byte is in the block.
    unsafe { ptr.as_ptr().add(size - 1).write_volatile(1) };
    black_box(ptr);
}

fn learned_config(cycle_bytes: usize) -> WorkspaceConfig {
    learned_config_aligned(cycle_bytes, 16)
}

fn learned_config_aligned(cycle_bytes: usize, alignment: usize) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(cycle_bytes)
        .alignment(alignment)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .expect("a valid configuration")
}

fn per_allocation(c: &mut Criterion) {
    allocations(c, "alloc", &SIZES, 16);
    // The same work for all three at 4 KiB: blocks that start a page. Aligned to 16, a
    // bumpalo block starts 4048 bytes into a page and a bump-scope one 48 bytes in (their
    // chunk headers), so a block's last byte and the next block's first share a cache line
    // and `touch` writes one new line a block; the workspace's blocks start pages and it
    // writes two. Page-aligned, all three write two.
    allocations(c, "alloc_page_aligned", &[4 << 10], 4096);
}

/// `group/<impl>/<size>` for each of `sizes`, every request aligned to `align` (the
/// workspace's own alignment too).
fn allocations(c: &mut Criterion, name: &str, sizes: &[usize], align: usize) {
    let mut group = c.benchmark_group(name);
    for &size in sizes {
        let layout = Layout::from_size_align(size, align).unwrap();
        group.throughput(Throughput::Elements(1));

        let cfg = learned_config_aligned(size * PER_CYCLE as usize, align);
        group.bench_with_input(BenchmarkId::new("workspace", size), &size, |b, _| {
            let ws = workspaces();
            drop(ws.get_and_activate(&cfg, "BENCH").unwrap()); // created outside the timing
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(PER_CYCLE);
                    let start = Instant::now();
                    let guard = ws.get_and_activate(&cfg, "BENCH").unwrap();
                    for _ in 0..n {
                        let p = guard.alloc(layout).unwrap();
                        touch(p.cast(), size);
                    }
                    drop(guard);
                    elapsed += start.elapsed();
                    left -= n;
                }
                elapsed
            });
            assert_eq!(ws.workspace("BENCH").unwrap().total_spilled_bytes, 0);
            ws.destroy("BENCH").unwrap();
        });

        group.bench_with_input(BenchmarkId::new("system", size), &size, |b, _| {
            b.iter(|| {
                // SAFETY: a non-zero layout; the block is freed with the same layout.
                let p = unsafe { System.alloc(layout) };
                let p = NonNull::new(p).expect("memory");
                touch(p, size);
                // SAFETY: allocated just above with `layout`.
                unsafe { System.dealloc(p.as_ptr(), layout) };
            });
        });

        group.bench_with_input(BenchmarkId::new("bumpalo", size), &size, |b, _| {
            let mut bump = bumpalo::Bump::with_capacity(size * PER_CYCLE as usize + align);
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(PER_CYCLE);
                    let start = Instant::now();
                    for _ in 0..n {
                        touch(bump.alloc_layout(layout), size);
                    }
                    bump.reset();
                    elapsed += start.elapsed();
                    left -= n;
                }
                elapsed
            });
        });

        group.bench_with_input(BenchmarkId::new("bump-scope", size), &size, |b, _| {
            let mut bump: bump_scope::Bump =
                bump_scope::Bump::with_size(size * PER_CYCLE as usize + align);
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(PER_CYCLE);
                    let start = Instant::now();
                    for _ in 0..n {
                        touch(bump.alloc_layout(layout), size);
                    }
                    bump.reset();
                    elapsed += start.elapsed();
                    left -= n;
                }
                elapsed
            });
        });
    }
    group.finish();
}

const CYCLE_ALLOCS: usize = 1000;
const CYCLE_SIZE: usize = 4 << 10;

fn workspace_cycle(cfg: &WorkspaceConfig) {
    let ws = workspaces();
    let guard = ws.get_and_activate(cfg, "CYCLE").unwrap();
    let layout = Layout::from_size_align(CYCLE_SIZE, 16).unwrap();
    for _ in 0..CYCLE_ALLOCS {
        touch(guard.alloc(layout).unwrap().cast(), CYCLE_SIZE);
    }
}

fn system_cycle(blocks: &mut Vec<NonNull<u8>>) {
    let layout = Layout::from_size_align(CYCLE_SIZE, 16).unwrap();
    for _ in 0..CYCLE_ALLOCS {
        // SAFETY: a non-zero layout; freed below with the same layout.
        let p = NonNull::new(unsafe { System.alloc(layout) }).expect("memory");
        touch(p, CYCLE_SIZE);
        blocks.push(p);
    }
    for p in blocks.drain(..) {
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { System.dealloc(p.as_ptr(), layout) };
    }
}

fn bumpalo_cycle(bump: &mut bumpalo::Bump) {
    let layout = Layout::from_size_align(CYCLE_SIZE, 16).unwrap();
    for _ in 0..CYCLE_ALLOCS {
        touch(bump.alloc_layout(layout), CYCLE_SIZE);
    }
    bump.reset();
}

fn bump_scope_cycle(bump: &mut bump_scope::Bump) {
    let layout = Layout::from_size_align(CYCLE_SIZE, 16).unwrap();
    for _ in 0..CYCLE_ALLOCS {
        touch(bump.alloc_layout(layout), CYCLE_SIZE);
    }
    bump.reset();
}

/// What entering and leaving a learned workspace costs (the per-cycle overhead that the
/// per-allocation figures above include 1/100 of).
fn empty_cycle(c: &mut Criterion) {
    let ws = workspaces();
    let cfg = learned_config(4096);
    c.bench_function("enter_leave/workspace", |b| {
        b.iter(|| drop(black_box(ws.get_and_activate(&cfg, "EMPTY").unwrap())))
    });
    ws.destroy("EMPTY").unwrap();
}

fn whole_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle_1000x4KiB");
    group.throughput(Throughput::Elements(CYCLE_ALLOCS as u64));
    let learned = WorkspaceConfig::default(); // FirstLoop: learns in the first iteration
    group.bench_function("workspace", |b| b.iter(|| workspace_cycle(&learned)));
    workspaces().destroy("CYCLE").unwrap();
    let mut blocks = Vec::with_capacity(CYCLE_ALLOCS);
    group.bench_function("system", |b| b.iter(|| system_cycle(&mut blocks)));
    let mut bump = bumpalo::Bump::new();
    group.bench_function("bumpalo", |b| b.iter(|| bumpalo_cycle(&mut bump)));
    let mut scope: bump_scope::Bump = bump_scope::Bump::new();
    group.bench_function("bump-scope", |b| b.iter(|| bump_scope_cycle(&mut scope)));
    group.finish();
}

/// Minor page faults of the process so far (field 10 of /proc/self/stat, what
/// getrusage reports as ru_minflt), or None where /proc is unavailable.
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(7)?.parse().ok()
}

/// Prints minor page faults per cycle of 1000 x 4 KiB after learning (or warm-up).
fn page_faults() {
    const CYCLES: u64 = 200;
    let per_cycle = |name: &str, run: &mut dyn FnMut()| {
        for _ in 0..3 {
            run(); // learn / warm up
        }
        let (Some(before), start) = (minor_faults(), Instant::now()) else {
            println!("page faults: /proc/self/stat unavailable");
            return;
        };
        for _ in 0..CYCLES {
            run();
        }
        let elapsed = start.elapsed();
        let faults = minor_faults().unwrap_or(before) - before;
        println!(
            "page faults per cycle (1000 x 4 KiB, {CYCLES} cycles after learning): {name:<10} {:>8.2}   ({:.1} us/cycle incl. faults)",
            faults as f64 / CYCLES as f64,
            elapsed.as_secs_f64() * 1e6 / CYCLES as f64
        );
    };
    let cfg = WorkspaceConfig::default();
    per_cycle("workspace", &mut || workspace_cycle(&cfg));
    workspaces().destroy("CYCLE").unwrap();
    let mut blocks = Vec::with_capacity(CYCLE_ALLOCS);
    per_cycle("system", &mut || system_cycle(&mut blocks));
    let mut bump = bumpalo::Bump::new();
    per_cycle("bumpalo", &mut || bumpalo_cycle(&mut bump));
    let mut scope: bump_scope::Bump = bump_scope::Bump::new();
    per_cycle("bump-scope", &mut || bump_scope_cycle(&mut scope));
}

fn main() {
    page_faults();
    let mut criterion = Criterion::default().configure_from_args();
    per_allocation(&mut criterion);
    empty_cycle(&mut criterion);
    whole_cycle(&mut criterion);
    criterion.final_summary();
}
