//! The tracking global allocator, installed the way a host application installs it
//! (semantics §1). The statistics are process-wide, so this binary runs its checks one after
//! another on the main thread (`harness = false`): the test harness's own threads would
//! otherwise allocate in the middle of an exact measurement.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ndmem_alloc::{heap, Tracking};

mod common;
use common::child::Rerun;
use common::forked::{killed, wait_or_kill};

#[global_allocator]
static GLOBAL: Tracking<TrueLive> = Tracking::new(TrueLive);

/// System's allocator under `Tracking`, counting the bytes it really holds: a measure of
/// the heap independent of `Tracking`'s own figures, to check the limit against.
struct TrueLive;

/// Bytes the inner allocator holds now.
static TRUE_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Highest `TRUE_LIVE` since the last [`reset_true_peak`].
static TRUE_PEAK: AtomicUsize = AtomicUsize::new(0);

fn reset_true_peak() {
    TRUE_PEAK.store(TRUE_LIVE.load(Ordering::SeqCst), Ordering::SeqCst);
}

fn true_grew(bytes: usize) {
    let now = TRUE_LIVE.fetch_add(bytes, Ordering::SeqCst) + bytes;
    TRUE_PEAK.fetch_max(now, Ordering::SeqCst);
}

/// A size `TrueLive` refuses (returns null for, as an exhausted system would) while it is
/// not 0: the inner allocator failing inside the budget.
static REFUSED_SIZE: AtomicUsize = AtomicUsize::new(0);

fn inner_refuses(layout: Layout) -> bool {
    layout.size() == REFUSED_SIZE.load(Ordering::Relaxed)
}

// SAFETY: forwards every call to System unchanged, or returns null (a refusal the contract
// allows); the counting only touches atomics.
unsafe impl GlobalAlloc for TrueLive {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if inner_refuses(layout) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, forwarded unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            true_grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if inner_refuses(layout) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, forwarded unchanged.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            true_grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        TRUE_LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's pointer and layout, forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    /// Counts the net change once the reallocation is done (a moving realloc holds both
    /// blocks for a moment; that transient is not what `Tracking` bounds, see its docs).
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's arguments, forwarded unchanged.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                true_grew(new_size - layout.size());
            } else {
                TRUE_LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
            }
        }
        new
    }
}

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

/// With `Tracking` installed, the PyTorch-style keys carry the heap's figures, which
/// follow an allocation exactly.
fn the_pytorch_keys_carry_the_heap_figures() {
    let keys = || -> std::collections::BTreeMap<String, u64> {
        ndmem::stats::snapshot()
            .pytorch_keys()
            .into_iter()
            .collect()
    };
    let before = keys();
    for key in ["current", "peak", "allocated", "freed"] {
        assert!(
            before.contains_key(&format!("ndmem.heap.{key}")),
            "{before:?}"
        );
    }
    let v: Vec<u8> = Vec::with_capacity(1 << 20);
    let during = keys();
    // Both snapshots allocate alike, so the difference is the vector's megabyte.
    assert_eq!(
        during["ndmem.heap.allocated"]
            - before["ndmem.heap.allocated"]
            - (during["ndmem.heap.freed"] - before["ndmem.heap.freed"]),
        during["ndmem.heap.current"] - before["ndmem.heap.current"]
    );
    assert!(during["ndmem.heap.current"] >= before["ndmem.heap.current"] + (1 << 20));
    assert!(during["ndmem.heap.peak"] >= during["ndmem.heap.current"]);
    drop(v);
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

/// A peak reset is never undone by another thread's high from before it: that thread's
/// unpublished high-water mark began before the reset, so when it next publishes (here,
/// at its exit) it must not raise the new peak to its old high.
fn a_reset_peak_is_not_raised_by_a_high_from_before_it() {
    use std::sync::mpsc::channel;
    let (done_tx, done_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let worker = std::thread::spawn(move || {
        // 3 MiB up and down: under the 4 MiB that publishes at once, so the high stays
        // in this thread's unpublished mark.
        drop(std::hint::black_box(vec![1u8; 3 << 20]));
        done_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    });
    done_rx.recv().unwrap();
    heap::reset_peak();
    let reset = heap::stats();
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    let after = heap::stats();
    // Since the reset nothing rose by more than the worker's exit bookkeeping.
    assert!(
        after.peak_bytes < reset.peak_bytes + (64 << 10),
        "peak {} after the join, {} at the reset: a 3 MiB high from before the reset \
         came back",
        after.peak_bytes,
        reset.peak_bytes
    );
    // And the thread that reset still sees its own highs exactly.
    heap::reset_peak();
    let start = heap::stats();
    drop(std::hint::black_box(vec![1u8; 1 << 20]));
    assert_eq!(heap::stats().peak_bytes, start.live_bytes + (1 << 20));
}

/// A thread idle at a peak reset keeps its next excursion: its mark began before the
/// reset, but everything it reaches after the reset counts towards the new peak (a 3 MB
/// block allocated and freed after the reset, under the 4 MiB that publishes at once,
/// was lost from the peak).
fn an_excursion_after_a_reset_by_a_thread_idle_at_it_reaches_the_peak() {
    use std::sync::mpsc::channel;
    let (published_tx, published_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let (done_tx, done_rx) = channel();
    let worker = std::thread::spawn(move || {
        let _ = heap::stats(); // publishes this thread's tally: its mark starts here
        published_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop(std::hint::black_box(vec![1u8; 3_000_000]));
        let _ = heap::stats();
        done_tx.send(()).unwrap();
        // Stays alive: the peak must come from the publication above, not from an exit.
        let (_, park) = channel::<()>();
        let _ = park.recv_timeout(std::time::Duration::from_millis(200));
    });
    published_rx.recv().unwrap();
    heap::reset_peak();
    let reset = heap::stats();
    go_tx.send(()).unwrap();
    done_rx.recv().unwrap();
    let after = heap::stats();
    assert!(
        after.peak_bytes >= reset.live_bytes + 3_000_000,
        "peak {} after a 3 MB excursion on another thread, live {} at the reset",
        after.peak_bytes,
        reset.live_bytes
    );
    worker.join().unwrap();
}

/// A single thread sees an exact peak, even for blocks too small to make the thread
/// publish its tally on their own (the module docs promise exact figures to one thread).
fn peak_is_exact_for_small_blocks_on_one_thread() {
    for size in [100, 64 << 10, 200 << 10] {
        heap::reset_peak();
        let start = heap::stats();
        let small: Vec<u8> = Vec::with_capacity(size);
        std::hint::black_box(&small);
        drop(small);
        let after = heap::stats();
        assert_eq!(after.live_bytes, start.live_bytes, "{size}");
        assert_eq!(
            after.peak_bytes,
            start.live_bytes + size,
            "peak after a {size}-byte block came and went"
        );
    }
}

fn a_limit_below_use_is_refused() {
    let live = heap::stats().live_bytes;
    let err = heap::set_limit(Some(live / 2)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("heap limit")
            && msg.contains("already in use or held against it")
            && msg.contains("threads' cells of at most 128 KiB each"),
        "{msg}"
    );
    assert_eq!(
        heap::stats().limit,
        None,
        "the refused limit was not applied"
    );
}

fn a_copy_the_heap_cannot_hold_is_an_error_not_an_abort() {
    // The tensor's bytes are pool memory; `to_vec` copies them onto the heap.
    let t = ndmem::Tensor::zeros(ndmem::DType::F32, &[1 << 20]).unwrap();
    let live = heap::stats().live_bytes;
    heap::set_limit(Some(live + (1 << 20))).unwrap();
    let result = t.to_vec::<f32>();
    heap::set_limit(None).unwrap();
    let err = result.unwrap_err();
    assert!(
        matches!(err, ndmem::Error::HeapRefused { requested, .. } if requested == 4 << 20),
        "{err:?}"
    );
    assert!(err.to_string().contains("NDMEM_MAX_HEAP"), "{err}");
    // Nothing was lost: with room again, the copy works.
    assert_eq!(t.to_vec::<f32>().unwrap().len(), 1 << 20);
}

fn a_trace_ring_the_heap_cannot_hold_is_an_error_not_an_abort() {
    // Semantics §7: `trace::start` allocates its ring fallibly; refused, nothing changes.
    let live = heap::stats().live_bytes;
    heap::set_limit(Some(live + (64 << 20))).unwrap();
    let result = ndmem::trace::start(usize::MAX);
    let on = ndmem::trace::is_on();
    heap::set_limit(None).unwrap();
    let err = result.unwrap_err();
    assert_eq!(err.capacity, 1 << 30, "clamped to the largest ring");
    assert_eq!(err.bytes, 40 << 30);
    assert!(!on, "the recorder stays off");
    assert!(err.to_string().contains("fewer events"), "{err}");
    // With room, a small ring starts.
    ndmem::trace::start(16).unwrap();
    assert!(ndmem::trace::is_on());
    ndmem::trace::stop();
}

/// The layouts the OOM hook saw (size, alignment), for
/// [`an_inner_refusal_counts_a_failure_and_nothing_else`].
static HOOK_SIZE: AtomicUsize = AtomicUsize::new(0);
static HOOK_ALIGN: AtomicUsize = AtomicUsize::new(0);

/// `heap::system_refused()` as the hook saw it (1: true, 2: false).
static HOOK_BY_SYSTEM: AtomicUsize = AtomicUsize::new(0);

fn layout_hook(layout: Layout, _: &heap::HeapStats) {
    HOOK_SIZE.store(layout.size(), Ordering::Relaxed);
    HOOK_ALIGN.store(layout.align(), Ordering::Relaxed);
    HOOK_BY_SYSTEM.store(
        if heap::system_refused() { 1 } else { 2 },
        Ordering::Relaxed,
    );
}

/// The inner allocator refuses an allocation `Tracking` had room for: the caller gets
/// null, the OOM hook the layout asked for, and the figures count one failure and nothing
/// else (no live byte, no allocation, no budget kept), whether the request took the hot
/// path (a small block the thread's cell covers) or the cold one (a block the cell cannot
/// cover), through `alloc` or `alloc_zeroed`.
fn an_inner_refusal_counts_a_failure_and_nothing_else() {
    // Warm the thread's cell so that the small request is served from it.
    drop(vec![0u8; 100]);
    heap::set_oom_hook(layout_hook);
    for (size, align) in [(1_000_003, 64), (104, 32)] {
        for zeroed in [false, true] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let before = heap::stats();
            REFUSED_SIZE.store(size, Ordering::Relaxed);
            // SAFETY: a valid non-zero layout; the result is only compared with null.
            let ptr = unsafe {
                if zeroed {
                    std::alloc::alloc_zeroed(layout)
                } else {
                    std::alloc::alloc(layout)
                }
            };
            REFUSED_SIZE.store(0, Ordering::Relaxed);
            assert!(ptr.is_null(), "the inner allocator refused {size} bytes");
            assert_eq!(
                (
                    HOOK_SIZE.load(Ordering::Relaxed),
                    HOOK_ALIGN.load(Ordering::Relaxed)
                ),
                (size, align),
                "the hook sees the layout asked for"
            );
            assert_eq!(
                HOOK_BY_SYSTEM.load(Ordering::Relaxed),
                1,
                "the hook is told the system refused"
            );
            let after = heap::stats();
            let what = format!("{size} bytes, zeroed {zeroed}: {before:?} then {after:?}");
            assert_eq!(
                after.failed_allocations,
                before.failed_allocations + 1,
                "{what}"
            );
            assert_eq!(after.live_bytes, before.live_bytes, "{what}");
            assert_eq!(after.allocations, before.allocations, "{what}");
            assert_eq!(
                after.total_allocated_bytes, before.total_allocated_bytes,
                "{what}"
            );
            assert_eq!(after.peak_bytes, before.peak_bytes, "{what}");
        }
    }
    // A refusal by the limit is not the system's.
    let limit = heap::stats().reserved_bytes + (1 << 20);
    heap::set_limit(Some(limit)).unwrap();
    let mut v: Vec<u8> = Vec::new();
    assert!(v.try_reserve_exact(4 << 20).is_err());
    assert_eq!(
        HOOK_BY_SYSTEM.load(Ordering::Relaxed),
        2,
        "the limit refused"
    );
    heap::set_limit(None).unwrap();
    heap::clear_oom_hook();
}

/// `exit_on_oom` after the inner allocator refused a request the limit had room for: the
/// line says the system refused, and does not tell the user to raise the limit.
fn exit_on_oom_names_the_system_when_the_limit_had_room() {
    let out = run_child(&[], "exit_on_oom_inner_refusal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("out of memory: the system refused 1.00 MiB"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("raise"), "stderr: {stderr}");
}

static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);
/// Calls that saw a zero-size layout or no limit; checked after the threads end, because
/// the hook runs inside the allocator and must not panic.
static HOOK_BAD_CALLS: AtomicUsize = AtomicUsize::new(0);

fn count_hook(layout: Layout, stats: &heap::HeapStats) {
    if layout.size() == 0 || stats.limit.is_none() {
        HOOK_BAD_CALLS.fetch_add(1, Ordering::Relaxed);
    }
    HOOK_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Four threads allocate against a tight heap limit for a bounded time (semantics §1): the
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
    reset_true_peak();
    go.wait();
    done.wait();
    let true_peak = TRUE_PEAK.load(Ordering::SeqCst);
    let peak = heap::stats().peak_bytes;
    heap::set_limit(None).unwrap();
    for worker in workers {
        worker.join().unwrap();
    }
    drop((ready, go, done));
    // The bytes System really held under the limit, counted outside `Tracking`.
    assert!(
        true_peak <= limit,
        "System held {true_peak} bytes at once, above the limit of {limit}"
    );
    assert!(
        true_peak + HEADROOM / 2 > limit,
        "the threads did press against the limit (true peak {true_peak}, limit {limit})"
    );
    assert!(peak <= limit, "peak {peak} passed the limit {limit}");
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
    assert_eq!(
        HOOK_BAD_CALLS.load(Ordering::Relaxed),
        0,
        "the hook saw a zero-size layout or no limit"
    );
}

/// The largest block `try_reserve_exact` grants now, to within 4 KiB (a binary search
/// between 0 and `hi`).
fn largest_allocation(hi: usize) -> usize {
    let (mut lo, mut hi) = (0, hi);
    while hi - lo > 4096 {
        let mid = lo + (hi - lo) / 2;
        let mut v: Vec<u8> = Vec::new();
        if v.try_reserve_exact(mid).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Idle threads do not keep the heap's headroom from the thread that needs it
/// (semantics §1): 64 threads each allocate and free, then wait; a refused allocation
/// first recalls the budget they hold in reserve, so one block can take nearly all of the
/// headroom, and the figures stay exact.
fn idle_threads_do_not_strand_the_headroom() {
    const THREADS: usize = 64;
    const HEADROOM: usize = 8 << 20;
    let start_live = heap::stats().live_bytes;
    let limit = heap::stats().reserved_bytes + HEADROOM;
    heap::set_limit(Some(limit)).unwrap();
    let ready = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (ready, done) = (ready.clone(), done.clone());
            std::thread::spawn(move || {
                for size in [24, 1000, 4096, 40_000, 100_000] {
                    let v = vec![t as u8; size];
                    std::hint::black_box(&v);
                }
                ready.wait();
                done.wait();
            })
        })
        .collect();
    ready.wait();
    heap::reset_peak();
    let before = heap::stats();
    let headroom = limit - before.live_bytes;
    let largest = largest_allocation(headroom);
    // The figures stay exact through the recall.
    let big: Vec<u8> = Vec::with_capacity(largest);
    let during = heap::stats();
    drop(big);
    let after = heap::stats();
    done.wait();
    for worker in workers {
        worker.join().unwrap();
    }
    drop((ready, done));
    // Checked with the limit lifted: a failed assertion's backtrace allocates.
    heap::set_limit(None).unwrap();
    assert!(
        largest * 10 >= headroom * 9,
        "with {THREADS} idle threads the largest allocation is {largest} bytes of a \
         headroom of {headroom} ({:.0}%)",
        largest as f64 * 100.0 / headroom as f64
    );
    assert_eq!(during.live_bytes, before.live_bytes + largest);
    assert!(during.reserved_bytes <= limit, "{during:?}");
    assert!(during.peak_bytes <= limit, "{during:?}");
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(
        after.total_allocated_bytes - before.total_allocated_bytes,
        after.total_freed_bytes - before.total_freed_bytes,
        "every byte allocated since was freed"
    );
    let end = heap::stats();
    assert_eq!(
        end.live_bytes, start_live,
        "live bytes back to the start value"
    );
    assert!(end.reserved_bytes >= end.live_bytes);
}

fn run_child(env: &[(&str, &str)], case: &str) -> std::process::Output {
    env.iter()
        .fold(Rerun::binary().env(CHILD, case), |child, (k, v)| {
            child.env(k, v)
        })
        .output()
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

fn env_not_utf8_is_reported_too() {
    use std::os::unix::ffi::OsStrExt;
    let value = std::ffi::OsStr::from_bytes(b"64K\xff");
    let out = Rerun::binary()
        .env(CHILD, "expect_no_limit")
        .env("NDMEM_MAX_HEAP", value)
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("is not a valid size"), "stderr: {stderr}");
}

/// The allocator's warning and `heap::env_error()` give the same reason for a value that is
/// not UTF-8 (not a parse of its raw bytes), and show the value the same way.
fn env_not_utf8_warning_agrees_with_env_error() {
    use std::os::unix::ffi::OsStrExt;
    let value = std::ffi::OsStr::from_bytes(b"1\xffG");
    let out = Rerun::binary()
        .env(CHILD, "expect_not_utf8")
        .env("NDMEM_MAX_HEAP", value)
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "NDMEM_MAX_HEAP=\"1\u{fffd}G\" is not a valid size: it is not valid UTF-8 \
             (invalid bytes shown as U+FFFD); the heap limit is not applied"
        ),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("unknown unit"), "stderr: {stderr}");
}

/// A fork while another thread changes the heap limit: the child must not inherit the
/// limit change's lock taken (its first refill, `stats` and `set_limit` would then wait
/// forever for a thread it does not have).
fn a_fork_beside_limit_changes_leaves_the_child_a_usable_heap() {
    let out = run_child(&[], "fork_beside_limit_changes");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

/// Forks 40 children while a thread changes the limit in a loop; each child allocates past
/// its cell (a refill, which reads the budget's limit and headroom together), reads the
/// statistics, and kills itself. A child that has not exited after 10 s is killed and counted.
fn fork_beside_limit_changes() {
    let limit = heap::stats().reserved_bytes + (64 << 20);
    heap::set_limit(Some(limit)).unwrap();
    // A static, not an `Arc` the changer owns: a forked child has no changer thread, and
    // memory only that thread referred to would be a leak there (under memcheck).
    static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let changer = std::thread::spawn(move || {
        while !STOP.load(std::sync::atomic::Ordering::Relaxed) {
            heap::set_limit(Some(limit)).unwrap();
            std::thread::yield_now();
        }
    });
    let mut hung = 0;
    for _ in 0..40 {
        // SAFETY: the child only allocates, reads the statistics and calls _exit; the
        // tracking allocator and libc's allocator are fork-safe.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let v = std::hint::black_box(vec![1u8; 3 << 20]);
            if heap::stats().live_bytes < v.len() {
                // SAFETY: ends the child at once, running nothing of the parent's.
                unsafe { libc::_exit(3) };
            }
            // Done: SIGKILL ends the child running nothing at all, not even memcheck's leak
            // check, which would count what the parent's other threads held as lost here.
            // SAFETY: kills this process, the forked child.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        match wait_or_kill(pid, std::time::Duration::from_secs(10)) {
            Some(status) => assert!(killed(status), "child status {status}"),
            None => hung += 1,
        }
    }
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
    changer.join().unwrap();
    assert_eq!(hung, 0, "children stuck after a fork beside a limit change");
}

/// A panic in the OOM hook would unwind out of `GlobalAlloc::alloc` (undefined
/// behaviour); the allocator aborts the process instead.
fn a_panicking_oom_hook_aborts_instead_of_unwinding() {
    use std::os::unix::process::ExitStatusExt;
    // No backtrace: capturing one allocates megabytes at a heap already at its limit
    // (and std then deadlocks on its own backtrace lock when that allocation fails).
    let out = run_child(&[("RUST_BACKTRACE", "0")], "panicking_hook");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(SIGABRT),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("hook panicked on purpose"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("OOM hook panicked"), "stderr: {stderr}");
    assert!(
        !stderr.contains("unwound out of the allocator"),
        "stderr: {stderr}"
    );
}

/// Eight threads refused at once: `exit_on_oom` prints one line, whichever thread gets
/// there first, and the process exits with status 1.
fn exit_on_oom_prints_one_line_for_threads_refused_at_once() {
    for _ in 0..3 {
        let out = run_child(&[], "exit_on_oom_from_racing_threads");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
        assert!(stderr.contains("heap::set_limit"), "stderr: {stderr}");
    }
}

/// The signal `std::process::abort` raises (6 on Linux, macOS and the BSDs).
const SIGABRT: i32 = 6;

fn panicking_hook(_: Layout, _: &heap::HeapStats) {
    panic!("hook panicked on purpose");
}

fn child(case: &str) {
    match case {
        "panicking_hook" => {
            let limit = heap::stats().reserved_bytes + (4 << 20);
            heap::set_limit(Some(limit)).unwrap();
            heap::set_oom_hook(panicking_hook);
            let result = std::panic::catch_unwind(|| {
                let mut v: Vec<u8> = Vec::new();
                v.try_reserve_exact(64 << 20).is_err()
            });
            // Only reached if the panic unwound out of the allocator.
            eprintln!("the hook's panic unwound out of the allocator: {result:?}");
        }
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
        "expect_not_utf8" => {
            assert_eq!(heap::stats().limit, None);
            let err = heap::env_error().expect("the variable's error is reported");
            assert!(
                err.to_string().contains(
                    "NDMEM_MAX_HEAP=\"1\u{fffd}G\" is not a valid size: it is not valid UTF-8 \
                     (invalid bytes shown as U+FFFD)"
                ),
                "{err}"
            );
        }
        "exit_on_oom_from_racing_threads" => {
            let limit = heap::stats().reserved_bytes + (16 << 20);
            heap::set_limit(Some(limit)).unwrap();
            heap::set_oom_hook(heap::exit_on_oom);
            let start = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        start.wait();
                        let mut held: Vec<Vec<u8>> = Vec::new();
                        loop {
                            held.push(Vec::with_capacity(1 << 20));
                        }
                    });
                }
            });
        }
        "exit_on_oom_inner_refusal" => {
            let limit = heap::stats().reserved_bytes + (64 << 20);
            heap::set_limit(Some(limit)).unwrap();
            heap::set_oom_hook(heap::exit_on_oom);
            REFUSED_SIZE.store(1 << 20, Ordering::Relaxed);
            let v: Vec<u8> = Vec::with_capacity(1 << 20);
            std::hint::black_box(&v);
            eprintln!("the inner allocator served what it should have refused");
        }
        "fork_beside_limit_changes" => fork_beside_limit_changes(),
        other => panic!("unknown child case {other}"),
    }
}

fn main() {
    if let Ok(case) = std::env::var(CHILD) {
        child(&case);
        return;
    }
    let tests: [(&str, fn()); 21] = [
        (
            "exit_on_oom_names_the_system_when_the_limit_had_room",
            exit_on_oom_names_the_system_when_the_limit_had_room,
        ),
        (
            "exit_on_oom_prints_one_line_for_threads_refused_at_once",
            exit_on_oom_prints_one_line_for_threads_refused_at_once,
        ),
        (
            "the_pytorch_keys_carry_the_heap_figures",
            the_pytorch_keys_carry_the_heap_figures,
        ),
        (
            "a_trace_ring_the_heap_cannot_hold_is_an_error_not_an_abort",
            a_trace_ring_the_heap_cannot_hold_is_an_error_not_an_abort,
        ),
        (
            "an_inner_refusal_counts_a_failure_and_nothing_else",
            an_inner_refusal_counts_a_failure_and_nothing_else,
        ),
        (
            "a_copy_the_heap_cannot_hold_is_an_error_not_an_abort",
            a_copy_the_heap_cannot_hold_is_an_error_not_an_abort,
        ),
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
        (
            "a_reset_peak_is_not_raised_by_a_high_from_before_it",
            a_reset_peak_is_not_raised_by_a_high_from_before_it,
        ),
        (
            "an_excursion_after_a_reset_by_a_thread_idle_at_it_reaches_the_peak",
            an_excursion_after_a_reset_by_a_thread_idle_at_it_reaches_the_peak,
        ),
        (
            "peak_is_exact_for_small_blocks_on_one_thread",
            peak_is_exact_for_small_blocks_on_one_thread,
        ),
        ("a_limit_below_use_is_refused", a_limit_below_use_is_refused),
        (
            "limit_holds_under_four_threads",
            limit_holds_under_four_threads,
        ),
        (
            "idle_threads_do_not_strand_the_headroom",
            idle_threads_do_not_strand_the_headroom,
        ),
        ("env_limit_applies_at_start", env_limit_applies_at_start),
        (
            "env_garbage_is_reported_not_silently_ignored",
            env_garbage_is_reported_not_silently_ignored,
        ),
        ("env_not_utf8_is_reported_too", env_not_utf8_is_reported_too),
        (
            "env_not_utf8_warning_agrees_with_env_error",
            env_not_utf8_warning_agrees_with_env_error,
        ),
        (
            "a_fork_beside_limit_changes_leaves_the_child_a_usable_heap",
            a_fork_beside_limit_changes_leaves_the_child_a_usable_heap,
        ),
        (
            "a_panicking_oom_hook_aborts_instead_of_unwinding",
            a_panicking_oom_hook_aborts_instead_of_unwinding,
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
