//! The tracking global allocator, installed the way a host application installs it
//! (SEMANTICS 1). The statistics are process-wide, so this binary runs its checks one after
//! another on the main thread (`harness = false`): the test harness's own threads would
//! otherwise allocate in the middle of an exact measurement.

use std::alloc::{Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ndmem_alloc::{heap, Tracking};

#[global_allocator]
static GLOBAL: Tracking<System> = Tracking::new(System);

const CHILD: &str = "NDMEM_HEAP_TEST_CHILD";

fn vec_of_known_capacity_counts_exact_bytes() {
    let before = heap::stats();
    let v: Vec<u64> = Vec::with_capacity(1000);
    let during = heap::stats();
    assert_eq!(during.live_bytes - before.live_bytes, 8000);
    assert_eq!(
        during.total_allocated_bytes - before.total_allocated_bytes,
        8000
    );
    assert_eq!(during.allocations - before.allocations, 1);
    drop(v);
    let after = heap::stats();
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.total_freed_bytes - before.total_freed_bytes, 8000);
    assert_eq!(after.deallocations - before.deallocations, 1);
}

fn realloc_counts_the_new_size_once() {
    let mut v: Vec<u8> = Vec::with_capacity(100);
    let before = heap::stats();
    v.reserve_exact(10_000);
    let grown = v.capacity();
    let after = heap::stats();
    assert_eq!(after.live_bytes - before.live_bytes, grown - 100);
    assert_eq!(after.reallocations - before.reallocations, 1);
    assert_eq!(
        after.allocations, before.allocations,
        "a realloc is not a new allocation"
    );
    v.shrink_to(10);
    let shrunk = heap::stats();
    assert_eq!(after.live_bytes - shrunk.live_bytes, grown - v.capacity());
}

fn peak_follows_allocations_and_resets() {
    heap::reset_peak();
    let start = heap::stats();
    assert_eq!(start.peak_bytes, start.live_bytes);
    let big = vec![1u8; 4 << 20];
    std::hint::black_box(&big);
    drop(big);
    let after = heap::stats();
    assert!(
        after.peak_bytes >= start.live_bytes + (4 << 20),
        "{after:?}"
    );
    heap::reset_peak();
    assert_eq!(heap::stats().peak_bytes, heap::stats().live_bytes);
}

fn a_limit_below_use_is_refused() {
    let live = heap::stats().live_bytes;
    let err = heap::set_limit(Some(live / 2)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("heap limit") && msg.contains("already in use"),
        "{msg}"
    );
    assert_eq!(
        heap::stats().limit,
        None,
        "the refused limit was not applied"
    );
}

static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

fn count_hook(layout: Layout, stats: &heap::HeapStats) {
    assert!(layout.size() > 0);
    assert!(stats.limit.is_some());
    HOOK_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Four threads allocate against a tight heap limit for a bounded time. SEMANTICS 1: the
/// limit is never exceeded, every successful allocation is usable, and live bytes return
/// to their start value.
fn limit_holds_under_four_threads() {
    const THREADS: usize = 4;
    const HEADROOM: usize = 16 << 20;
    let start_live = heap::stats().live_bytes;
    let start_failed = heap::stats().failed_allocations;
    heap::set_oom_hook(count_hook);
    // Plain spawn + join (not thread::scope): join then waits for the threads' exit,
    // which is when they publish their last tallies and return their budget.
    let ready = Arc::new(Barrier::new(THREADS + 1));
    let go = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (ready, go, done) = (ready.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                let mut kept: Vec<Vec<u8>> = Vec::with_capacity(64);
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                ready.wait();
                go.wait();
                // At least 400 ms, and until this thread was refused once (slow under
                // valgrind), but never more than 30 s.
                let start = Instant::now();
                let mut refused = false;
                while start.elapsed() < Duration::from_millis(400)
                    || (!refused && start.elapsed() < Duration::from_secs(30))
                {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let size = 1024 + (seed as usize % (2 << 20));
                    let mut v: Vec<u8> = Vec::new();
                    if v.try_reserve_exact(size).is_ok() {
                        v.resize(size, t as u8 + 1);
                        assert!(v.iter().step_by(4096).all(|b| *b == t as u8 + 1));
                        if kept.len() == kept.capacity() {
                            kept.swap_remove(seed as usize % kept.len());
                        }
                        kept.push(v);
                    } else {
                        refused = true;
                        if !kept.is_empty() {
                            kept.swap_remove(seed as usize % kept.len());
                        }
                    }
                }
                for v in &kept {
                    assert!(v.iter().all(|b| *b == t as u8 + 1), "memory stayed intact");
                }
                drop(kept);
                done.wait();
            })
        })
        .collect();
    ready.wait();
    let limit = heap::stats().reserved_bytes + HEADROOM;
    heap::set_limit(Some(limit)).unwrap();
    heap::reset_peak();
    go.wait();
    done.wait();
    let peak = heap::stats().peak_bytes;
    heap::set_limit(None).unwrap();
    for worker in workers {
        worker.join().unwrap();
    }
    drop((ready, go, done));
    assert!(peak <= limit, "peak {peak} passed the limit {limit}");
    assert!(
        peak + HEADROOM / 2 > limit,
        "the threads did press against the limit"
    );
    heap::clear_oom_hook();
    let end = heap::stats();
    assert_eq!(
        end.live_bytes, start_live,
        "live bytes back to the start value"
    );
    assert!(
        end.failed_allocations > start_failed,
        "the limit of {limit} was hit"
    );
    assert!(HOOK_CALLS.load(Ordering::Relaxed) > 0, "the OOM hook ran");
}

fn run_child(env: &[(&str, &str)], case: &str) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD, case);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn env_limit_applies_at_start() {
    let out = run_child(&[("NDMEM_MAX_HEAP", "64M")], "expect_limit_64m");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn env_garbage_is_reported_not_silently_ignored() {
    let out = run_child(&[("NDMEM_MAX_HEAP", "8X")], "expect_no_limit");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("NDMEM_MAX_HEAP=\"8X\" is not a valid size"),
        "stderr: {stderr}"
    );
}

fn child(case: &str) {
    match case {
        "expect_limit_64m" => {
            assert_eq!(heap::stats().limit, Some(64 << 20));
            let mut v: Vec<u8> = Vec::new();
            assert!(
                v.try_reserve_exact(128 << 20).is_err(),
                "over the env limit"
            );
            assert!(v.try_reserve_exact(1 << 20).is_ok());
        }
        "expect_no_limit" => {
            assert_eq!(heap::stats().limit, None);
            let err = heap::env_error().expect("the variable's error is reported");
            assert!(err.to_string().contains("NDMEM_MAX_HEAP"), "{err}");
        }
        other => panic!("unknown child case {other}"),
    }
}

fn main() {
    if let Ok(case) = std::env::var(CHILD) {
        child(&case);
        return;
    }
    let tests: [(&str, fn()); 7] = [
        (
            "vec_of_known_capacity_counts_exact_bytes",
            vec_of_known_capacity_counts_exact_bytes,
        ),
        (
            "realloc_counts_the_new_size_once",
            realloc_counts_the_new_size_once,
        ),
        (
            "peak_follows_allocations_and_resets",
            peak_follows_allocations_and_resets,
        ),
        ("a_limit_below_use_is_refused", a_limit_below_use_is_refused),
        (
            "limit_holds_under_four_threads",
            limit_holds_under_four_threads,
        ),
        ("env_limit_applies_at_start", env_limit_applies_at_start),
        (
            "env_garbage_is_reported_not_silently_ignored",
            env_garbage_is_reported_not_silently_ignored,
        ),
    ];
    assert!(heap::is_tracking());
    for (name, test) in tests {
        test();
        println!("test {name} ... ok");
    }
    println!(
        "\ntest result: ok. {} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        tests.len()
    );
}
