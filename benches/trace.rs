//! The timeline recorder's cost (semantics §7), recorder off and on in the same run:
//!
//! - `trace/bump/{off,on}`: one 64-byte bump in a learned workspace (one event when on);
//! - `trace/pool/{off,on}`: one 256-byte pool allocation and its free, from the pool's
//!   cache (two events when on);
//! - `trace/record/on`: one event recorded directly.
//!
//! Before criterion runs, the overhead per event is printed from interleaved runs of the
//! same loops: `(on - off) / events`, each the fastest of 21 runs (on a shared machine the
//! fastest run is the one least disturbed by others). The target: off costs nothing
//! measurable against the code without the recorder, on adds at most 20 ns per event.
//!
//! Run: `cargo bench --bench trace -- --warm-up-time 1 --measurement-time 2`.

use std::alloc::Layout;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ndmem::alloc::{Limits, Pool};
use ndmem::trace::{self, EventKind, Space};
use ndmem::{workspaces, AllocationPolicy, MemorySource, WorkspaceConfig};

/// Bumps per cycle; the cycle's enter and leave are outside the timed part.
const PER_CYCLE: u64 = 1000;
const LAYOUT: Layout = match Layout::from_size_align(64, 16) {
    Ok(l) => l,
    Err(_) => panic!(),
};

fn config() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(64 * PER_CYCLE as usize)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .expect("a valid configuration")
}

/// `iters` bumps, timed without the cycles' enter and leave.
fn bumps(iters: u64) -> Duration {
    let ws = workspaces();
    let cfg = config();
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(PER_CYCLE);
        let guard = ws.get_and_activate(&cfg, "TRACE_BENCH").unwrap();
        let start = Instant::now();
        for _ in 0..n {
            black_box(guard.alloc(black_box(LAYOUT)).unwrap());
        }
        total += start.elapsed();
        drop(guard);
        left -= n;
    }
    total
}

/// `iters` pool allocations and frees of 256 bytes (served from the cache).
fn pool_round_trips(pool: &'static Pool, iters: u64) -> Duration {
    drop(pool.allocate(256, 16).unwrap());
    let start = Instant::now();
    for _ in 0..iters {
        black_box(pool.allocate(black_box(256), 16).unwrap());
    }
    start.elapsed()
}

fn set(on: bool) {
    if on {
        trace::start(1 << 12).unwrap();
    } else {
        trace::stop();
    }
}

fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

/// Nanoseconds per operation, off and on, interleaved, fastest of 21.
fn compare(ops: u64, mut run: impl FnMut(u64) -> Duration) -> (f64, f64) {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..21 {
        set(false);
        off.push(run(ops).as_nanos() as f64 / ops as f64);
        set(true);
        on.push(run(ops).as_nanos() as f64 / ops as f64);
    }
    set(false);
    (fastest(off), fastest(on))
}

fn report_overhead(pool: &'static Pool) {
    let (off, on) = compare(200_000, bumps);
    println!(
        "trace overhead: bump {off:.1} ns off, {on:.1} ns on: {:+.1} ns per event",
        on - off
    );
    let (off, on) = compare(200_000, |n| pool_round_trips(pool, n));
    println!(
        "trace overhead: pool alloc+free {off:.1} ns off, {on:.1} ns on: {:+.1} ns per event (2 events)",
        (on - off) / 2.0
    );
}

fn benches(c: &mut Criterion) {
    let pool = MemorySource::new(Pool::new(Limits::unlimited())).pool();
    report_overhead(pool);
    let mut group = c.benchmark_group("trace");
    group.throughput(Throughput::Elements(1));
    for on in [false, true] {
        let state = if on { "on" } else { "off" };
        group.bench_function(format!("bump/{state}"), |b| {
            set(on);
            b.iter_custom(bumps);
        });
        group.bench_function(format!("pool/{state}"), |b| {
            set(on);
            b.iter_custom(|n| pool_round_trips(pool, n));
        });
    }
    let name = trace::intern(Space::Scope, "bench");
    group.bench_function("record/on", |b| {
        set(true);
        b.iter(|| trace::record(EventKind::Alloc, Space::Scope, name, black_box(64), 0));
    });
    set(false);
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
