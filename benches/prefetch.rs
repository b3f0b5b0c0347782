//! Batches per second through a prefetching iterator and through its shield (semantics §6),
//! when building a batch and consuming it cost about the same.
//!
//! Each batch is 4 Ki `f32` written into a tensor after a fixed amount of arithmetic (the
//! "build"); the consumer reads the tensor back and does the same amount of arithmetic (the
//! "step"). The work is counted in iterations calibrated once on this machine, not in wall
//! time, so a thread that gets no CPU does not finish its work anyway: the speed-up needs
//! two cores that are really free. With both costs equal, prefetching can at best double
//! the rate.
//!
//! Run: `cargo bench --bench prefetch` (options: `--batches N`, default 2000;
//! `--micros T`, the cost of each side, default 200; `--capacity C`, default 2;
//! `--rounds R`, default 5; the best round of each is reported).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ndmem::prefetch::Prefetch;
use ndmem::{shield, Tensor};

/// Elements of a batch.
const ELEMENTS: usize = 4 << 10;

/// Arithmetic that cannot be skipped: `iterations` steps of a linear congruential generator.
fn work(seed: u64, iterations: u64) -> u64 {
    let mut x = seed;
    for _ in 0..iterations {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
    }
    black_box(x)
}

/// Iterations of [`work`] that take `target` on this core (best of a few tries).
fn calibrate(target: Duration) -> u64 {
    let probe = 1_000_000;
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            work(1, probe);
            start.elapsed()
        })
        .min()
        .unwrap();
    (probe as f64 * target.as_secs_f64() / best.as_secs_f64()) as u64
}

/// The producer's side: the work, then a batch tensor filled from it.
fn build(i: u64, iterations: u64, data: &mut [f32]) -> ndmem::Result<Tensor> {
    let x = work(i, iterations);
    for (j, v) in data.iter_mut().enumerate() {
        *v = (x as u32 ^ j as u32) as f32;
    }
    Tensor::from_slice(data, &[ELEMENTS])
}

/// The consumer's side: the batch read back, then the work.
fn consume(batch: &Tensor, iterations: u64) -> ndmem::Result<u64> {
    let sum: f32 = batch.view::<f32>()?.iter().sum();
    Ok(work(u64::from(sum.to_bits()), iterations))
}

/// What two threads get done beside each other, against one thread doing both shares: the
/// ceiling of any overlap on this machine right now (2.0 with two free cores).
fn parallel_ceiling(iterations: u64, count: u64) -> f64 {
    let start = Instant::now();
    for i in 0..2 * count {
        work(i, iterations);
    }
    let one = start.elapsed();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                for i in 0..count {
                    work(i + t, iterations);
                }
            });
        }
    });
    one.as_secs_f64() / start.elapsed().as_secs_f64()
}

/// Batches per second through `batches`.
fn rate(batches: Prefetch<Tensor>, count: u64, iterations: u64) -> f64 {
    let start = Instant::now();
    let mut seen = 0;
    for batch in batches {
        let batch = batch.expect("a batch");
        black_box(consume(batch.get().expect("inside its window"), iterations).unwrap());
        seen += 1;
    }
    assert_eq!(seen, count);
    count as f64 / start.elapsed().as_secs_f64()
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), for the record: the figure
/// means something only when two cores are free.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let load_before = load();
    let count = arg("--batches", 2000);
    let micros = arg("--micros", 200);
    let capacity = arg("--capacity", 2) as usize;
    let rounds = arg("--rounds", 5);
    let iterations = calibrate(Duration::from_micros(micros));

    // What each side costs alone, on one thread.
    let mut data = vec![0f32; ELEMENTS];
    let start = Instant::now();
    let built: Vec<Tensor> = (0..200)
        .map(|i| build(i, iterations, &mut data).unwrap())
        .collect();
    let build_cost = start.elapsed() / 200;
    let start = Instant::now();
    for batch in &built {
        black_box(consume(batch, iterations).unwrap());
    }
    let consume_cost = start.elapsed() / 200;
    drop(built);

    let (mut with, mut without) = (0f64, 0f64);
    for _ in 0..rounds {
        let mut data = vec![0f32; ELEMENTS];
        let prefetched = Prefetch::builder()
            .name("BENCH")
            .capacity(capacity)
            .spawn(0..count, move |i| build(i, iterations, &mut data))
            .unwrap();
        with = with.max(rate(prefetched, count, iterations));
        let mut data = vec![0f32; ELEMENTS];
        let shielded = shield(0..count, move |i| build(i, iterations, &mut data));
        without = without.max(rate(shielded, count, iterations));
    }
    println!(
        "prefetch bench: {count} batches of {ELEMENTS} f32, build {build_cost:.0?}, consume {consume_cost:.0?} per batch (alone), capacity {capacity}, best of {rounds}"
    );
    println!("  shield (no prefetch): {without:>8.0} batches/s");
    println!("  prefetch:             {with:>8.0} batches/s");
    println!("  speed-up:             {:>8.2}x", with / without);
    println!(
        "  two plain threads:    {:>8.2}x (the ceiling here now: 2.00 with two free cores)",
        parallel_ceiling(iterations, count / 4)
    );
    println!(
        "  load average {load_before} before, {} after, on {} cores",
        load(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
