//! Statistics and tracing (semantics §7): the snapshot against the counters it reads, the
//! registry of every thread's workspaces, the PyTorch-style keys, the printed forms, the
//! timeline of a scripted workload, the ring's bound, `NDMEM_TRACE`, and the
//! out-of-memory report and hook.
//!
//! Tests draw from pools of their own where they can, so they run in parallel; the
//! recorder is process-wide, so the tests that start it hold [`TRACE`] and read only the
//! events of their own thread.

#[path = "../common/mod.rs"]
mod common;

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, PoisonError};

use ndmem::alloc::{AllocError, Limits, Pool, PoolStats};
use ndmem::stats::{self, trace, HolderKind, PYTORCH_KEYS};
use ndmem::trace::{EventKind, Space};
use ndmem::{workspaces, DType, Error, MemorySource, Scope, Tensor, WorkspaceConfig};

/// Heap allocations are counted per thread, so a test can check that recording allocates
/// nothing.
#[global_allocator]
static GLOBAL: common::counting::CountingPerThread = common::counting::CountingPerThread;

/// Held by every test that starts or reads the process-wide recorder.
static TRACE: Mutex<()> = Mutex::new(());

fn trace_lock() -> std::sync::MutexGuard<'static, ()> {
    TRACE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn own_source(max_bytes: usize) -> MemorySource {
    MemorySource::new(Pool::new(Limits::builder().max_bytes(max_bytes).build()))
}

/// The stats with the RSS (which the rest of the process moves) left out.
fn without_rss(stats: PoolStats) -> PoolStats {
    PoolStats {
        physical_bytes: 0,
        ..stats
    }
}

#[test]
fn the_snapshot_reads_the_pools_counters_after_a_scripted_workload() {
    let source = own_source(1 << 20);
    let pool = source.pool();
    let a = pool.allocate(1000, 64).unwrap();
    let b = pool.allocate(40_000, 64).unwrap();
    let c = pool.allocate(1000, 64).unwrap();
    drop(a);
    drop(c);
    let (cap_a, cap_b) = (1024u64, b.capacity() as u64);
    let snap = stats::snapshot_of(&[source]);
    assert_eq!(snap.pools.len(), 1);
    assert_eq!(without_rss(snap.pools[0].stats), without_rss(pool.stats()));
    let c = &snap.pools[0].counters;
    assert_eq!(c.bytes.current, cap_b);
    assert_eq!(c.bytes.peak, Some(cap_b + 2 * cap_a));
    assert_eq!(c.bytes.allocated, cap_b + 2 * cap_a);
    assert_eq!(c.bytes.freed, 2 * cap_a);
    assert_eq!(
        c.count.map(|n| (n.current, n.allocated, n.freed)),
        Some((1, 3, 2))
    );
    // `a` and `c` were live at once (three blocks from the OS); both went to the cache.
    assert_eq!(c.reserved.current, cap_b + 2 * cap_a);
    assert_eq!(c.os_allocations, 3);
    assert_eq!(c.num_ooms, 0);
    assert_eq!(c.limit, Some(1 << 20));

    // One reset for every peak: the pool's live and used peaks fall to the figures now.
    stats::reset_peak_of(&[source]);
    let after = pool.stats();
    assert_eq!(after.peak_bytes, after.live_bytes);
    assert_eq!(after.peak_used_bytes, after.used_bytes);
    drop(b);
}

#[test]
fn every_pytorch_key_is_present_and_maps_to_its_figure() {
    let source = own_source(1 << 20);
    let block = source.pool().allocate(4096, 64).unwrap();
    let snap = stats::snapshot_of(&[source]);
    let keys: BTreeMap<String, u64> = snap.pytorch_keys().into_iter().collect();
    // This binary's global allocator is not `Tracking`: the heap's keys are left out
    // (tests/heap_tracking.rs has them).
    assert!(!snap.heap_tracked);
    let expected: Vec<&str> = PYTORCH_KEYS
        .iter()
        .copied()
        .filter(|k| !k.starts_with("ndmem.heap."))
        .collect();
    for key in &expected {
        assert!(keys.contains_key(*key), "missing {key}");
    }
    let not_device = keys.keys().filter(|k| !k.starts_with("ndmem.device."));
    assert_eq!(not_device.count(), expected.len(), "{keys:?}");
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "active_bytes.all.current",
        "allocation.all.current",
        "num_ooms",
        "num_alloc_retries",
    ] {
        assert!(keys.contains_key(key), "missing {key}");
    }
    assert_eq!(keys["allocated_bytes.all.current"], 4096);
    assert_eq!(keys["active_bytes.all.current"], 4096);
    assert_eq!(keys["reserved_bytes.all.current"], 4096);
    assert_eq!(keys["allocation.all.allocated"], 1);
    assert_eq!(keys["segment.all.current"], 1);
    assert_eq!(keys["num_ooms"], 0);
    drop(block);
}

#[test]
fn workspaces_of_other_threads_join_and_leave_the_registry() {
    let source = own_source(8 << 20);
    let config = WorkspaceConfig::builder().source(source).build().unwrap();
    let ready = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    let worker = {
        let (ready, done, config) = (ready.clone(), done.clone(), config.clone());
        std::thread::Builder::new()
            .name("stats-worker".into())
            .spawn(move || {
                let ws = workspaces();
                for _ in 0..3 {
                    let g = ws.get_and_activate(&config, "STATS_OTHER").unwrap();
                    g.alloc(Layout::from_size_align(1000, 16).unwrap()).unwrap();
                }
                let mine = ws.workspace("STATS_OTHER").unwrap();
                ready.wait();
                done.wait();
                mine
            })
            .unwrap()
    };
    ready.wait();
    let snap = stats::snapshot();
    let entry = snap
        .workspaces
        .iter()
        .find(|w| w.stats.id == "STATS_OTHER")
        .expect("another thread's workspace is in the snapshot");
    assert!(entry.thread.starts_with("stats-worker"), "{}", entry.thread);
    done.wait();
    let theirs = worker.join().unwrap();
    assert_eq!(entry.stats, theirs, "the figures its thread saw");
    assert_eq!(theirs.cycles, 3);
    let after = stats::snapshot();
    assert!(
        after.workspaces.iter().all(|w| w.stats.id != "STATS_OTHER"),
        "a thread's workspaces leave the registry when it exits"
    );
}

#[test]
fn this_threads_workspaces_are_exact_in_the_snapshot_and_in_the_summary() {
    let source = own_source(8 << 20);
    let config = WorkspaceConfig::builder().source(source).build().unwrap();
    let ws = workspaces();
    for _ in 0..2 {
        let _g = ws.get_and_activate(&config, "STATS_MINE").unwrap();
    }
    let g = ws.get_and_activate(&config, "STATS_MINE").unwrap();
    g.alloc(Layout::from_size_align(512, 16).unwrap()).unwrap();
    let snap = stats::snapshot_of(&[source]);
    let entry = snap
        .workspaces
        .iter()
        .find(|w| w.stats.id == "STATS_MINE")
        .unwrap();
    assert_eq!(entry.stats, g.stats(), "published at the snapshot: exact");
    assert!(entry.stats.open);
    let summary = snap.to_string();
    assert!(summary.contains("ndmem memory summary"), "{summary}");
    assert!(summary.contains("| budget"), "{summary}");
    assert!(summary.contains("pool [pool #1] live"), "{summary}");
    assert!(summary.contains("[STATS_MINE]"), "{summary}");
    assert!(summary.contains("devices: "), "{summary}");
    // The per-thread listing prints the same figures.
    assert!(ws
        .allocation_statistics()
        .contains(&entry.stats.to_string()));
    drop(g);
    ws.destroy("STATS_MINE").unwrap();
    assert!(stats::snapshot()
        .workspaces
        .iter()
        .all(|w| w.stats.id != "STATS_MINE"));
}

#[test]
fn scopes_report_bytes_counts_and_their_observed_peak() {
    let source = own_source(1 << 20);
    let scope = Scope::new_base_in("stats-scope", source);
    let child = scope.child("stats-child").unwrap();
    let _a = scope.zeros(DType::F32, &[256]).unwrap();
    let b = child.zeros(DType::U8, &[100]).unwrap();
    let snap = stats::snapshot_of(&[source]);
    let mine = |name: &str| {
        snap.scopes
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .unwrap()
    };
    let (s, c) = (mine("stats-scope"), mine("stats-child"));
    assert_eq!((s.tensors, s.bytes), (scope.tensor_count(), scope.bytes()));
    assert_eq!((s.tensors, s.bytes), (1, 1024));
    assert_eq!((c.tensors, c.bytes, c.depth), (1, 100, s.depth + 1));
    // 100 bytes hold a block of the 112-byte class: the bytes the pool counts.
    assert_eq!((s.held_bytes, c.held_bytes), (1024, 112));
    assert_eq!(snap.scopes[0].name, "root");
    // The dump prints the same figures.
    let dump = scope.debug_dump();
    assert!(
        dump.contains("[stats-scope]: 1 tensors, 1024 bytes"),
        "{dump}"
    );
    child.detach(&b).unwrap();
    let later = stats::snapshot_of(&[source]);
    let c = later
        .scopes
        .iter()
        .find(|s| s.name == "stats-child")
        .unwrap();
    assert_eq!((c.bytes, c.peak_bytes), (0, 100), "the peak stays");
    stats::reset_peak_of(&[source]);
    let reset = stats::snapshot_of(&[source]);
    let c = reset
        .scopes
        .iter()
        .find(|s| s.name == "stats-child")
        .unwrap();
    assert_eq!(c.peak_bytes, 0, "reset to the bytes now");
    drop(b);
}

#[test]
fn a_lent_tensor_counts_with_its_borrower_in_the_scope_figures() {
    // Semantics §7: every tensor is held by exactly one scope in the figures; one lent by
    // temp_attach is held by its borrower until it goes back.
    let source = own_source(1 << 20);
    let lender = Scope::new_base_in("lender", source);
    let borrower = Scope::new_base_in("borrower", source);
    let lent = lender.zeros(DType::U8, &[1000]).unwrap();
    let _kept = lender.zeros(DType::U8, &[24]).unwrap();
    borrower.temp_attach_all(&[&lent]).unwrap();
    let snap = stats::snapshot_of(&[source]);
    let find = |name: &str| snap.scopes.iter().find(|s| s.name == name).unwrap().clone();
    let (l, b) = (find("lender"), find("borrower"));
    assert_eq!((l.tensors, l.bytes, l.held_bytes), (1, 24, 64));
    assert_eq!(
        (b.borrowed, b.borrowed_bytes, b.held_bytes),
        (1, 1000, 1024)
    );
    let key = snap
        .pytorch_keys()
        .into_iter()
        .find(|(k, _)| k == "ndmem.scopes.bytes")
        .unwrap()
        .1;
    let all: u64 = snap.scopes.iter().map(|s| s.held_bytes as u64).sum();
    assert_eq!(key, all);
    assert!(key >= 64 + 1024);
    borrower.close().unwrap();
    let back = stats::snapshot_of(&[source]);
    let l = back.scopes.iter().find(|s| s.name == "lender").unwrap();
    assert_eq!((l.tensors, l.held_bytes), (2, 64 + 1024), "given back");
    drop(lent);
}

/// `(kind, space)` of this thread's events, in order.
fn my_events() -> Vec<(EventKind, Space, u64)> {
    let me = trace::thread_id();
    trace::events()
        .into_iter()
        .filter(|e| e.thread == me)
        .map(|e| (e.kind, e.space, e.bytes))
        .collect()
}

#[test]
fn retries_are_counted_per_pool() {
    // semantics §7: a pool's `num_alloc_retries` counts its own reliefs at a limit.
    let tight = own_source(1 << 20);
    let idle = own_source(1 << 20);
    let held = tight.pool().allocate(600 << 10, 16).unwrap();
    assert!(tight.pool().allocate(600 << 10, 16).is_err()); // relief, retry, refusal
    drop(held);
    let again = tight.pool().allocate(600 << 10, 16).unwrap(); // fits: no retry
    assert_eq!(tight.pool().stats().alloc_retries, 1);
    assert_eq!(tight.pool().stats().failed_allocations, 1);
    assert_eq!(idle.pool().stats().alloc_retries, 0);
    let snap = stats::snapshot_of(&[tight, idle]);
    let retries: Vec<u64> = snap
        .pools
        .iter()
        .map(|p| p.counters.num_alloc_retries)
        .collect();
    assert_eq!(retries, [1, 0]);
    drop(again);
}

#[test]
fn a_registered_pools_events_carry_its_registered_name() {
    // semantics §7: the timeline names a pool as the summary does once it is registered,
    // its events recorded before the registration included.
    let _lock = trace_lock();
    let source = own_source(1 << 20);
    trace::start(64).unwrap();
    drop(source.pool().allocate(100, 16).unwrap());
    stats::register("named-in-timeline", source);
    drop(source.pool().allocate(300, 16).unwrap());
    trace::stop();
    let me = trace::thread_id();
    let names: Vec<(EventKind, String)> = trace::events()
        .into_iter()
        .filter(|e| e.thread == me && e.space == Space::Pool)
        .map(|e| (e.kind, trace::name(e.name)))
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(
        names.iter().all(|(_, n)| n == "named-in-timeline"),
        "{names:?}"
    );
}

#[test]
fn the_trace_of_a_scripted_workload_has_exactly_the_expected_events() {
    let _lock = trace_lock();
    let source = own_source(4 << 20);
    let config = WorkspaceConfig::builder().source(source).build().unwrap();
    let ws = workspaces();
    trace::start(1024).unwrap();
    let block = source.pool().allocate(1000, 64).unwrap();
    drop(block);
    {
        let g = ws.get_and_activate(&config, "TRACED").unwrap();
        g.alloc(Layout::from_size_align(256, 16).unwrap()).unwrap(); // spills: no buffer yet
    } // the spill is freed, the buffer learned
    let size = ws.workspace("TRACED").unwrap().size as u64;
    {
        let g = ws.get_and_activate(&config, "TRACED").unwrap();
        g.alloc(Layout::from_size_align(256, 16).unwrap()).unwrap(); // a bump
    }
    ws.destroy("TRACED").unwrap();
    trace::stop();
    use EventKind::*;
    use Space::*;
    assert_eq!(
        my_events(),
        vec![
            (Alloc, Pool, 1024),
            (Free, Pool, 1024),
            (Alloc, Pool, 256),
            (Spill, Workspace, 256),
            (Free, Pool, 256),
            (Alloc, Pool, size),
            (CycleEnd, Workspace, 256),
            (Learn, Workspace, size),
            (Alloc, Workspace, 256),
            (CycleEnd, Workspace, 256),
            (Free, Pool, size),
        ]
    );
    let first = trace::events()
        .into_iter()
        .find(|e| e.thread == trace::thread_id());
    let line = first.unwrap().to_string();
    assert!(line.contains(" ms alloc pool [pool #"), "{line}");
    let json = trace::to_json();
    assert!(json.starts_with("{\"format\":\"ndmem-trace\""), "{json}");
    assert!(json.contains("\"name\":\"TRACED\""), "{json}");
}

/// The recorded pool events of `thread` for blocks of `bytes`: how many allocations, how
/// many frees, and their kinds in order.
fn pool_events_of(thread: u32, bytes: u64) -> (usize, usize, Vec<EventKind>) {
    let kinds: Vec<_> = trace::events()
        .into_iter()
        .filter(|e| e.thread == thread && e.space == Space::Pool && e.bytes == bytes)
        .map(|e| e.kind)
        .collect();
    let allocs = kinds.iter().filter(|k| **k == EventKind::Alloc).count();
    let frees = kinds.iter().filter(|k| **k == EventKind::Free).count();
    (allocs, frees, kinds)
}

#[test]
fn the_recorder_sees_every_operation_of_thread_caches_warmed_before_it_started() {
    // The cache hit paths test nothing of the recorder: its start sends every thread's
    // cache of every pool to the slow paths, which record. Two threads (this one and
    // another) warm their caches first, so their pairs are hits until the recorder starts.
    let _lock = trace_lock();
    let pool = Pool::new(Limits::unlimited());
    const PAIRS: usize = 50;
    let pairs = |pool: &Pool| {
        for _ in 0..PAIRS {
            drop(pool.allocate(256, 16).unwrap());
        }
    };
    let warmed = Barrier::new(2);
    let started = Barrier::new(2);
    // No assertion before the threads meet their barriers (a panic there would leave the
    // other thread waiting): the figures are checked once both are done.
    let (other, mine, warm_hits, started) = std::thread::scope(|s| {
        let other = s.spawn(|| {
            pairs(&pool);
            warmed.wait();
            started.wait();
            pairs(&pool);
            trace::thread_id()
        });
        pairs(&pool);
        warmed.wait();
        // The other thread waits now: these hits are this thread's.
        let hits = pool.stats().cache_hits;
        pairs(&pool);
        let warm_hits = pool.stats().cache_hits - hits;
        let on = trace::start(1 << 12);
        started.wait();
        pairs(&pool);
        (other.join().unwrap(), trace::thread_id(), warm_hits, on)
    });
    trace::stop();
    started.unwrap();
    assert_eq!(warm_hits, PAIRS as u64, "warm: every pair a hit");
    for thread in [mine, other] {
        let (allocs, frees, events) = pool_events_of(thread, 256);
        assert_eq!(
            (allocs, frees),
            (PAIRS, PAIRS),
            "thread {thread}: {events:?}"
        );
    }
    // Stopped, the hit paths serve again, unrecorded.
    let (hits, recorded) = (pool.stats().cache_hits, trace::events().len());
    pairs(&pool);
    assert_eq!(
        pool.stats().cache_hits - hits,
        PAIRS as u64,
        "hits after the stop"
    );
    assert_eq!(
        trace::events().len(),
        recorded,
        "nothing recorded after the stop"
    );
}

#[test]
fn a_pool_and_a_thread_made_while_recording_are_recorded_from_their_first_operation() {
    // A thread cache made after the recorder started starts forced, and its first
    // allocation sets its thresholds from the recorder's state (forced again, the recorder
    // being on): every one of its operations is recorded, hits included.
    let _lock = trace_lock();
    trace::start(1 << 12).unwrap();
    let pool = Pool::new(Limits::unlimited());
    const PAIRS: usize = 30;
    let thread = std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..PAIRS {
                drop(pool.allocate(512, 64).unwrap());
            }
            trace::thread_id()
        })
        .join()
        .unwrap()
    });
    trace::stop();
    let (allocs, frees, kinds) = pool_events_of(thread, 512);
    assert_eq!((allocs, frees), (PAIRS, PAIRS), "{kinds:?}");
    assert!(
        pool.stats().cache_hits >= PAIRS as u64 - 1,
        "served by the thread's cache"
    );
}

#[test]
fn while_recording_cache_hits_keep_the_peak_exact() {
    // The recorder forces the hit paths' thresholds; the recorded hits test the owner's
    // own, so a new high reached through cache hits is still published exactly, and a
    // reset's new epoch is still seen.
    let _lock = trace_lock();
    let pool = Pool::new(Limits::unlimited());
    let hold = |n: usize| {
        (0..n)
            .map(|_| pool.allocate(256, 16).unwrap())
            .collect::<Vec<_>>()
    };
    drop(hold(40)); // 40 blocks cached in this thread's list
    trace::start(1 << 12).unwrap();
    for round in 0..3 {
        pool.reset_peak();
        let n = 10 + 10 * round;
        drop(hold(n));
        // Read after the frees: the high of the round was published as it was reached.
        let stats = pool.stats();
        assert_eq!(stats.live_bytes, 0, "round {round}");
        assert_eq!(
            stats.peak_bytes,
            n * 256,
            "round {round}: the peak since the reset"
        );
    }
    let hits = pool.stats().cache_hits;
    trace::stop();
    assert!(
        hits >= 60,
        "the rounds were served from the cache: {hits} hits"
    );
}

#[test]
fn a_free_event_carries_the_pool_bytes_after_the_free() {
    // Semantics §7: each event carries the figure after it. A block above 1 GiB is never
    // cached: its free gives the bytes back to the OS, and the event says so.
    let _lock = trace_lock();
    let pool = Pool::new(Limits::builder().max_bytes(None).build());
    trace::start(64).unwrap();
    let block = pool.allocate((1 << 30) + 4096, 4096).unwrap();
    let held = pool.stats().used_bytes as u64;
    drop(block);
    let after = pool.stats().used_bytes as u64;
    trace::stop();
    let me = trace::thread_id();
    let figures: Vec<_> = trace::events()
        .into_iter()
        .filter(|e| e.thread == me && e.space == Space::Pool && e.bytes == held)
        .map(|e| (e.kind, e.value))
        .collect();
    assert_eq!(after, 0);
    assert_eq!(
        figures,
        [(EventKind::Alloc, held), (EventKind::Free, after)]
    );
}

#[test]
fn the_ring_never_grows_past_its_bound_and_recording_allocates_nothing() {
    let _lock = trace_lock();
    trace::start(8).unwrap();
    let name = trace::intern(Space::Scope, "bounded");
    let before = common::counting::heap_allocations_of_this_thread();
    for i in 0..100 {
        trace::record(EventKind::Alloc, Space::Scope, name, i, i);
    }
    let allocations = common::counting::heap_allocations_of_this_thread() - before;
    trace::stop();
    assert_eq!(allocations, 0, "recording allocated");
    let events = trace::events();
    assert_eq!(trace::capacity(), 8);
    assert!(events.len() <= 8, "{} events", events.len());
    let me = trace::thread_id();
    let mine: Vec<u64> = events
        .iter()
        .filter(|e| e.thread == me)
        .map(|e| e.bytes)
        .collect();
    assert_eq!(mine, (92..100).collect::<Vec<_>>(), "the newest eight");
    assert!(trace::dropped() >= 92);
    // Off: nothing more is recorded.
    trace::record(EventKind::Alloc, Space::Scope, name, 1, 1);
    assert_eq!(trace::events().len(), events.len());
}

#[test]
fn events_held_and_dropped_add_up_to_those_recorded_by_racing_threads() {
    // Semantics §7: an event the ring does not hold is counted dropped, once. Four threads
    // race for one slot, so events give way to older ones still being written, and later
    // leave the window: such an event was counted twice.
    if common::child::run_alone(common::test_name!(
        events_held_and_dropped_add_up_to_those_recorded_by_racing_threads
    )) {
        return;
    }
    let per_thread = 20_000u64;
    for capacity in [1, 2, 64] {
        trace::start(capacity).unwrap();
        let name = trace::intern(Space::Scope, "racing");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..per_thread {
                        trace::record(EventKind::Alloc, Space::Scope, name, i, i);
                    }
                });
            }
        });
        trace::stop();
        let (held, dropped) = (trace::events().len() as u64, trace::dropped());
        assert_eq!(
            held + dropped,
            4 * per_thread,
            "capacity {capacity}: held {held} + dropped {dropped}"
        );
    }
}

#[test]
fn a_pool_made_where_a_dropped_one_was_gets_a_name_of_its_own() {
    // Semantics §7: pools are named `pool #n` in order of first event. A pool is known by
    // its address, which a pool made after another was dropped may reuse: it took the
    // dropped pool's name (in one run, the global pool's events read `pool #4`, and
    // `pool #4`'s read `global pool`).
    let _lock = trace_lock();
    let _ = Pool::global();
    trace::start(1 << 12).unwrap();
    let mut seen: Vec<(usize, String)> = Vec::new();
    for _ in 0..64 {
        let pool = Pool::new(Limits::builder().max_bytes(1 << 20).build());
        drop(pool.allocate(100, 8).unwrap());
        let me = trace::thread_id();
        let named = trace::events()
            .iter()
            .rev()
            .find(|e| e.thread == me && e.space == Space::Pool)
            .map(|e| trace::name(e.name))
            .unwrap();
        assert!(
            !seen.iter().any(|(_, n)| *n == named),
            "a new pool reads {named:?}, the name of a dropped one ({} pools made)",
            seen.len() + 1
        );
        assert_ne!(named, "global pool");
        seen.push((pool.id(), named));
    }
    // (The C allocator reuses a freed pool's address within a few rounds; memcheck
    // delays reuse, and there the test only checks that names do not repeat.)
    trace::stop();
}

#[test]
fn a_timeline_that_cannot_be_written_says_where() {
    let _lock = trace_lock();
    let dir = std::env::temp_dir();
    let err = trace::dump(&dir).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("cannot write the timeline to ")
            && message.contains(&dir.display().to_string()),
        "{message}"
    );
    let missing = dir.join("ndmem-no-such-dir").join("t.json");
    let err = trace::dump(&missing).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("ndmem-no-such-dir"), "{err}");
}

#[test]
fn ndmem_trace_writes_the_timeline_at_exit() {
    let path = std::env::temp_dir().join(format!("ndmem-trace-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let test = common::test_name!(traced_child);
    common::child::Rerun::test(test)
        .env("NDMEM_TRACE", &path)
        .passes();
    let json = std::fs::read_to_string(&path).expect("the trace file is written at exit");
    let _ = std::fs::remove_file(&path);
    assert!(json.contains("\"format\":\"ndmem-trace\""), "{json}");
    assert!(json.contains("\"kind\":\"alloc\""), "{json}");
    assert!(json.contains("\"name\":\"global pool\""), "{json}");
}

/// Runs in the child of [`ndmem_trace_writes_the_timeline_at_exit`].
#[test]
#[ignore = "run by ndmem_trace_writes_the_timeline_at_exit"]
fn traced_child() {
    let block = Pool::global().allocate(4096, 64).unwrap();
    assert!(
        trace::is_on(),
        "NDMEM_TRACE starts the recorder with the global pool"
    );
    drop(block);
}

#[test]
fn an_invalid_ndmem_trace_is_a_clear_error() {
    let test = common::test_name!(invalid_trace_child);
    common::child::Rerun::test(test)
        .env("NDMEM_TRACE", std::env::temp_dir())
        .passes();
}

/// Runs in the child of [`an_invalid_ndmem_trace_is_a_clear_error`].
#[test]
#[ignore = "run by an_invalid_ndmem_trace_is_a_clear_error"]
fn invalid_trace_child() {
    let err = trace::env_error().expect("a directory is not a trace file");
    let text = err.to_string();
    assert!(text.starts_with("NDMEM_TRACE: "), "{text}");
    assert!(text.contains("is a directory"), "{text}");
    assert!(trace::init_from_env().is_err());
    assert!(!trace::is_on());
}

#[test]
fn a_refusal_by_a_pool_nothing_draws_on_names_no_other_pools_holders() {
    // Semantics §7: the holders are the refusing pool's. A private pool that no workspace
    // or scope uses has none, however much other pools' workspaces and scopes hold.
    let source = own_source(4 << 20);
    let config = WorkspaceConfig::builder()
        .initial_size(256 << 10)
        .source(source)
        .build()
        .unwrap();
    let ws = workspaces();
    drop(ws.get_and_activate(&config, "OTHER_POOL_WS").unwrap());
    let scope = Scope::new_base_in("other-pool-scope", source);
    let _held = scope.zeros(DType::U8, &[64 << 10]).unwrap();
    let small = own_source(64 << 10);
    let err = Tensor::zeros_in(&small, DType::U8, &[128 << 10]).unwrap_err();
    let report = err.oom_report().expect("a refusal at a limit");
    let text = report.to_string();
    assert!(
        report
            .holders
            .iter()
            .all(|h| !matches!(h.kind, HolderKind::Workspace | HolderKind::Scope)),
        "{text}"
    );
    assert!(
        !text.contains("OTHER_POOL_WS") && !text.contains("other-pool-scope"),
        "{text}"
    );
    ws.destroy("OTHER_POOL_WS").unwrap();
}

#[test]
fn an_oom_report_counts_what_each_scope_holds_of_the_refusing_pool_only() {
    // Semantics §7: a scope may hold tensors of several pools (attach takes any); the
    // report of one pool's refusal lists a scope by what it holds of that pool, and its
    // advice names the scope whose close would give that pool memory back.
    let small = own_source(1 << 20);
    let large = own_source(64 << 20);
    let keeper = Scope::new_base_in("holds-small-blocks", large);
    let other = Scope::new_base_in("holds-large-blocks", small);
    let of_small = Tensor::zeros_in(&small, DType::U8, &[768 << 10]).unwrap();
    keeper.attach(&of_small).unwrap();
    let of_large = Tensor::zeros_in(&large, DType::U8, &[4 << 20]).unwrap();
    other.attach(&of_large).unwrap();
    let extra = Tensor::zeros_in(&small, DType::U8, &[16 << 10]).unwrap();
    other.attach(&extra).unwrap();
    drop((of_small, of_large, extra));
    let err = other.zeros(DType::U8, &[512 << 10]).unwrap_err();
    let report = err
        .oom_report()
        .expect("a refusal at the small pool's limit");
    let text = report.to_string();
    let scope = |name: &str| {
        report
            .holders
            .iter()
            .find(|h| h.kind == HolderKind::Scope && h.name == format!("[{name}]"))
            .unwrap_or_else(|| panic!("{name} is not listed: {text}"))
    };
    assert_eq!(scope("holds-small-blocks").bytes, 768 << 10, "{text}");
    let mixed = scope("holds-large-blocks");
    assert_eq!(
        mixed.bytes,
        16 << 10,
        "only its block of the small pool: {text}"
    );
    assert!(mixed.detail.contains("1 of its 2 tensors"), "{text}");
    assert!(
        text.contains("close scope [holds-small-blocks]"),
        "the advice names the scope that holds this pool's memory: {text}"
    );
    keeper.close().unwrap();
    other.close().unwrap();
}

#[test]
fn an_oom_report_counts_the_host_copies_of_a_scopes_device_tensors() {
    // Semantics §7: a device tensor's host copy is a block of the device's host pool;
    // a scope that holds the tensor holds that block, which closing the scope frees.
    let host = own_source(2 << 20);
    let gpu = ndmem::device::sim(
        ndmem::device::SimConfig::new(0)
            .limit(ndmem::device::DeviceLimit::Unlimited)
            .host(host),
    )
    .unwrap();
    let scope = Scope::new_base_in("holds-device-tensors", host);
    let on_device = Tensor::zeros_in(&host, DType::U8, &[512 << 10])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    scope.attach(&on_device).unwrap();
    drop(on_device);
    // The upload's host tensor is gone; its copy on the host stays with the device tensor.
    let err = Tensor::zeros_in(&host, DType::U8, &[1792 << 10]).unwrap_err();
    let report = err
        .oom_report()
        .expect("a refusal at the host pool's limit");
    let text = report.to_string();
    let holder = report
        .holders
        .iter()
        .find(|h| h.kind == HolderKind::Scope && h.name == "[holds-device-tensors]")
        .unwrap_or_else(|| panic!("the scope is not listed: {text}"));
    assert_eq!(holder.bytes, 512 << 10, "its tensor's host copy: {text}");
    assert!(
        text.contains("close scope [holds-device-tensors]"),
        "{text}"
    );
    scope.close().unwrap();
}

#[test]
fn an_oom_report_calls_no_ring_idle_whose_slots_tensors_hold() {
    // Semantics §7: tensors kept from a circular workspace's earlier cycles (as a
    // prefetcher's batches are) hold its slots; the report lists the ring but neither
    // counts its buffer as unused nor advises destroying it, which would free nothing.
    let source = own_source(1 << 20);
    let config = WorkspaceConfig::builder()
        .initial_size(256 << 10)
        .overallocation_limit(3.0)
        .policy_reset(ndmem::ResetPolicy::EndOfBuffer)
        .source(source)
        .build()
        .unwrap();
    let ws = workspaces();
    let kept: Vec<Tensor> = (0..4)
        .map(|_| {
            let _g = ws.get_and_activate(&config, "KEPT_RING").unwrap();
            Tensor::zeros(DType::U8, &[32 << 10]).unwrap()
        })
        .collect();
    let err = Tensor::zeros_in(&source, DType::U8, &[900 << 10]).unwrap_err();
    let report = err.oom_report().expect("a refusal at the limit");
    let text = report.to_string();
    let ring = report
        .holders
        .iter()
        .find(|h| h.kind == HolderKind::Workspace && h.name.starts_with("[KEPT_RING]"))
        .unwrap_or_else(|| panic!("the ring is listed: {text}"));
    assert!(ring.detail.contains("circular"), "{text}");
    assert_eq!(report.fragmentation_bytes, 0, "{text}");
    assert!(!text.contains("destroy workspace [KEPT_RING]"), "{text}");
    assert!(kept.iter().all(Tensor::is_valid));
    drop(kept);
    ws.destroy("KEPT_RING").unwrap();
}

#[test]
fn an_oom_report_sees_the_spills_of_another_threads_running_cycle() {
    // Semantics §7: a spill is published when it happens, so the report of a refusal on
    // one thread lists what another thread's running cycle spilled, and does not count
    // that thread's running buffer as idle.
    let source = own_source(4 << 20);
    stats::register("spill pool", source);
    let (spilled_tx, spilled_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let busy = std::thread::Builder::new()
        .name("busy".into())
        .spawn(move || {
            let config = WorkspaceConfig::builder().source(source).build().unwrap();
            let ws = workspaces();
            let g = ws.get_and_activate(&config, "BUSY_WS").unwrap();
            // The first cycle has no buffer yet: this spills.
            g.alloc(Layout::from_size_align(1 << 20, 16).unwrap())
                .unwrap();
            spilled_tx.send(()).unwrap();
            end_rx.recv().unwrap();
            drop(g);
        })
        .unwrap();
    spilled_rx.recv().unwrap();
    let err = Tensor::zeros_in(&source, DType::U8, &[7 << 19]).unwrap_err();
    end_tx.send(()).unwrap();
    busy.join().unwrap();
    let report = err.oom_report().expect("a refusal at a limit");
    let text = report.to_string();
    let holder = report
        .holders
        .iter()
        .find(|h| h.kind == HolderKind::Workspace && h.name.starts_with("[BUSY_WS]"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(holder.bytes, 1 << 20, "{text}");
    assert!(holder.detail.contains("spilled 1.00 MiB"), "{text}");
    assert_eq!(report.fragmentation_bytes, 0, "{text}");
}

#[test]
fn an_oom_report_names_the_holders_and_the_knob() {
    static HOOKED: AtomicUsize = AtomicUsize::new(0);
    static NAMED: AtomicUsize = AtomicUsize::new(0);
    stats::on_oom(|report| {
        // What an OOM observer does: dump the snapshot and the timeline, from inside the
        // refused allocation.
        assert!(!stats::snapshot().pools.is_empty());
        assert!(trace::to_json().contains("ndmem-trace"));
        HOOKED.fetch_add(1, Ordering::Relaxed);
        if report.to_string().contains("OOM_WS") {
            NAMED.fetch_add(1, Ordering::Relaxed);
        }
    });
    let source = own_source(512 << 10);
    stats::register("oom pool", source);
    let config = WorkspaceConfig::builder()
        .initial_size(200 << 10)
        .source(source)
        .build()
        .unwrap();
    let ws = workspaces();
    drop(ws.get_and_activate(&config, "OOM_WS").unwrap());
    // A workspace of another pool holds nothing of this one: it is not named.
    let elsewhere = config
        .to_builder()
        .source(own_source(1 << 20))
        .build()
        .unwrap();
    drop(ws.get_and_activate(&elsewhere, "OOM_ELSEWHERE").unwrap());
    let scope = Scope::new_base_in("oom-scope", source);
    let _held = scope.zeros(DType::U8, &[100 << 10]).unwrap();
    let err = scope.zeros(DType::U8, &[300 << 10]).unwrap_err();
    // The API's pattern matches a refusal at a limit, and the report rides along.
    assert!(
        matches!(
            err,
            Error::Alloc(AllocError::OutOfMemory {
                report: Some(_),
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_out_of_memory());
    let report = err.oom_report().expect("the report is attached");
    assert!(matches!(
        err.alloc_error(),
        Some(AllocError::OutOfMemory { .. })
    ));
    let kinds: Vec<_> = report
        .holders
        .iter()
        .map(|h| (h.kind, h.name.clone()))
        .collect();
    let ws_holder = report
        .holders
        .iter()
        .find(|h| h.kind == HolderKind::Workspace && h.name.starts_with("[OOM_WS]"))
        .unwrap_or_else(|| panic!("{kinds:?}"));
    assert!(ws_holder.bytes >= 200 << 10);
    let scope_holder = report
        .holders
        .iter()
        .find(|h| h.kind == HolderKind::Scope && h.name == "[oom-scope]")
        .unwrap_or_else(|| panic!("{kinds:?}"));
    assert_eq!(
        scope_holder.bytes,
        112 << 10,
        "100 KiB hold a block of 112 KiB"
    );
    assert!(
        report.fragmentation_bytes >= ws_holder.bytes,
        "an idle buffer"
    );
    assert!(
        report
            .holders
            .iter()
            .all(|h| !h.name.contains("OOM_ELSEWHERE")),
        "{kinds:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("Can't allocate [HOST] memory: 307200 bytes"),
        "{text}"
    );
    assert!(text.contains("largest holders:"), "{text}");
    assert!(text.contains("Limits::builder().max_bytes"), "{text}");
    assert!(!text.contains("raise NDMEM_MAX_BYTES"), "{text}");
    assert!(text.contains("destroy workspace [OOM_WS]"), "{text}");
    assert!(text.contains("close scope [oom-scope]"), "{text}");
    assert!(HOOKED.load(Ordering::Relaxed) >= 1, "the hook ran");
    assert!(
        NAMED.load(Ordering::Relaxed) >= 1,
        "the hook saw the holders"
    );
    let snap = stats::snapshot();
    let pool = snap.pools.iter().find(|p| p.name == "oom pool").unwrap();
    assert_eq!(pool.counters.num_ooms, 1);
    ws.destroy("OOM_WS").unwrap();
    ws.destroy("OOM_ELSEWHERE").unwrap();
}

#[test]
fn statistics_print_in_a_few_readable_lines() {
    let source = own_source(1 << 20);
    let block = source.pool().allocate(4096, 64).unwrap();
    let text = source.pool().stats().to_string();
    assert!(
        text.starts_with("pool: used 4.00 KiB of 1.00 MiB (live 4.00 KiB"),
        "{text}"
    );
    assert!(text.lines().count() <= 5, "{text}");
    let heap = ndmem::alloc::heap::stats().to_string();
    assert!(heap.starts_with("heap: live "), "{heap}");
    let snap = stats::snapshot_of(&[source]);
    let counters = snap.pools[0].counters.to_string();
    assert!(
        counters.starts_with("live 4.00 KiB (peak 4.00 KiB"),
        "{counters}"
    );
    assert!(stats::memory_summary().contains("pool [global] live"));
    drop(block);
}

#[cfg(feature = "serde")]
#[test]
fn the_snapshot_and_the_report_serialize() {
    fn is_serialize<T: serde::Serialize>(_: &T) {}
    is_serialize(&stats::snapshot());
    is_serialize(&trace::events());
}

#[test]
fn recording_pool_and_bump_events_allocates_nothing() {
    let _lock = trace_lock();
    let source = own_source(1 << 20);
    let config = WorkspaceConfig::builder()
        .initial_size(64 << 10)
        .source(source)
        .build()
        .unwrap();
    let ws = workspaces();
    trace::start(1 << 10).unwrap();
    drop(source.pool().allocate(256, 16).unwrap()); // the pool's name is interned once
    let guard = ws.get_and_activate(&config, "TRACE_NO_ALLOC").unwrap();
    let before = common::counting::heap_allocations_of_this_thread();
    for _ in 0..100 {
        drop(source.pool().allocate(256, 16).unwrap());
        guard
            .alloc(Layout::from_size_align(64, 16).unwrap())
            .unwrap();
    }
    let allocations = common::counting::heap_allocations_of_this_thread() - before;
    trace::stop();
    drop(guard);
    ws.destroy("TRACE_NO_ALLOC").unwrap();
    let recorded = my_events()
        .iter()
        .filter(|(k, _, b)| *k == EventKind::Alloc && (*b == 256 || *b == 64))
        .count();
    assert_eq!(recorded, 201, "the pool's and the workspace's events");
    assert_eq!(allocations, 0, "recording allocated");
}

#[test]
fn a_refusal_inside_a_hook_leaves_the_error_its_own_report() {
    // semantics §7: a refusal inside a hook calls no hook again, and the error returned
    // for the first refusal carries the report of its own pool (holders and advice), not
    // of the pool that refused inside the hook.
    static HOOK_REPORTS: AtomicUsize = AtomicUsize::new(0);
    stats::on_oom(|report| {
        if report.to_string().contains("hook-reentry") {
            HOOK_REPORTS.fetch_add(1, Ordering::Relaxed);
            let tiny = Pool::new(Limits::builder().max_bytes(64).build());
            assert!(tiny.allocate(4096, 16).is_err());
        }
    });
    let source = own_source(1 << 20);
    let scope = Scope::new_base_in("hook-reentry", source);
    let _held = scope.zeros(DType::U8, &[600 << 10]).unwrap();
    let err = scope.zeros(DType::U8, &[600 << 10]).unwrap_err();
    let text = err.to_string();
    assert_eq!(HOOK_REPORTS.load(Ordering::Relaxed), 1);
    assert!(
        text.contains("640.0 KiB [hook-reentry]") && text.contains("close scope [hook-reentry]"),
        "{text}"
    );
}

#[test]
fn devices_join_the_snapshot_and_their_refusals_the_timeline() {
    use ndmem::device::{self, DeviceLimit, SimConfig};
    static DEVICE_OOMS: AtomicUsize = AtomicUsize::new(0);
    stats::on_oom(|report| {
        if report.to_string().contains("[DEVICE 7]") {
            DEVICE_OOMS.fetch_add(1, Ordering::Relaxed);
        }
    });
    let gpu = device::sim(
        SimConfig::new(7)
            .total_memory(64 << 20)
            .limit(DeviceLimit::Bytes(1 << 20)),
    )
    .unwrap();
    let mut held = gpu.allocate(300 << 10).unwrap();
    let snap = stats::snapshot();
    let d = snap
        .devices
        .iter()
        .find(|d| d.id == "sim:7")
        .expect("an open device is in the snapshot");
    assert_eq!(d.stats, gpu.stats());
    assert_eq!(d.counters.bytes.current, gpu.stats().live_bytes as u64);
    assert_eq!(d.counters.reserved.current, gpu.stats().used_bytes as u64);
    assert_eq!(d.counters.os_allocations, gpu.stats().driver_allocations);
    assert_eq!(d.counters.limit, Some(1 << 20));
    let keys: BTreeMap<String, u64> = snap.pytorch_keys().into_iter().collect();
    assert_eq!(
        keys["ndmem.device.sim:7.allocated_bytes.current"],
        gpu.stats().live_bytes as u64
    );
    assert!(snap.to_string().contains("device [sim:7] live"), "{snap}");

    let _lock = trace_lock();
    trace::start(64).unwrap();
    gpu.upload(&[7u8; 1024], &mut held).unwrap();
    let err = gpu.allocate(900 << 10).unwrap_err();
    trace::stop();
    assert!(err.to_string().contains("[DEVICE 7]"), "{err}");
    assert!(DEVICE_OOMS.load(Ordering::Relaxed) >= 1, "the hook ran");
    let mine = my_events();
    let device_events: Vec<_> = mine
        .iter()
        .filter(|(_, s, _)| *s == Space::Device)
        .collect();
    assert_eq!(
        device_events,
        [
            &(EventKind::Transfer, Space::Device, 1024),
            // The refusal carries the bytes asked for, not the block they would take.
            &(EventKind::Oom, Space::Device, 900 << 10)
        ],
        "{mine:?}"
    );
    drop(held);
}

#[test]
fn a_snapshots_device_and_recorder_parts_print_their_figures() {
    use ndmem::alloc::ByteSize;
    use ndmem::device::{self, SimConfig};
    let gpu = device::sim(SimConfig::new(8).total_memory(64 << 20)).unwrap();
    let mut held = gpu.allocate(300 << 10).unwrap();
    gpu.upload(&[7u8; 1024], &mut held).unwrap();
    let snap = stats::snapshot();
    let d = snap
        .devices
        .iter()
        .find(|d| d.id == "sim:8")
        .expect("an open device is in the snapshot");
    let printed = d.to_string();
    let stats = gpu.stats();
    for part in [
        "[sim:8] simulated device\ndevice: used ".to_string(),
        format!("(live {},", ByteSize(stats.live_bytes)),
        format!("driver allocations {},", stats.driver_allocations),
        format!("transfers 1 in ({}), 0 out", ByteSize(1024)),
    ] {
        assert!(printed.contains(&part), "{part:?} in\n{printed}");
    }
    assert_eq!(printed.lines().count(), 4, "{printed}");

    let _lock = trace_lock();
    trace::start(64).unwrap();
    let on = stats::snapshot().trace;
    trace::stop();
    let off = stats::snapshot().trace;
    assert_eq!(
        on.to_string(),
        format!("trace: on, ring of {} events, 0 dropped", on.capacity)
    );
    assert!(off.to_string().starts_with("trace: off, ring of "), "{off}");
    drop(held);
}

/// Panics unless every line of `summary` is as wide as the first, in characters.
fn assert_lines_equally_wide(summary: &str) {
    let width = summary.lines().next().unwrap().chars().count();
    for line in summary.lines() {
        assert_eq!(
            line.chars().count(),
            width,
            "line {line:?} is not {width} characters wide:\n{summary}"
        );
        assert!(line.starts_with('|') && line.ends_with('|'), "{line:?}");
    }
}

#[test]
fn every_line_of_the_summary_is_equally_wide() {
    // A fresh snapshot: an untouched pool of its own, nothing in it.
    let fresh = own_source(1 << 20);
    assert_lines_equally_wide(&stats::snapshot_of(&[fresh]).to_string());
    // Pool blocks, cache, a workspace with a cycle and a non-ASCII thread name.
    let source = own_source(8 << 20);
    let block = source.pool().allocate(40_000, 64).unwrap();
    drop(source.pool().allocate(3000, 64).unwrap());
    let config = WorkspaceConfig::builder().source(source).build().unwrap();
    std::thread::Builder::new()
        .name("größe-µ".into())
        .spawn(move || {
            let ws = workspaces();
            let g = ws.get_and_activate(&config, "STATS_WIDTH").unwrap();
            g.alloc(Layout::from_size_align(5000, 16).unwrap()).unwrap();
            let summary = stats::snapshot_of(&[source]).to_string();
            assert!(summary.contains("[STATS_WIDTH] größe-µ"), "{summary}");
            assert_lines_equally_wide(&summary);
            drop(g);
            ws.destroy("STATS_WIDTH").unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
    assert_lines_equally_wide(&stats::memory_summary());
    drop(block);
}

#[test]
fn without_the_tracking_allocator_the_heap_row_says_so() {
    // This binary's global allocator counts per thread; it is not `Tracking`.
    assert!(!ndmem::alloc::heap::is_tracking());
    let snap = stats::snapshot_of(&[own_source(1 << 20)]);
    assert!(!snap.heap_tracked);
    let summary = snap.to_string();
    let heap_rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("| heap"))
        .collect();
    assert_eq!(heap_rows.len(), 1, "{summary}");
    assert!(heap_rows[0].contains("not tracked"), "{summary}");
    assert!(
        heap_rows[0].contains("install ndmem_alloc::Tracking as #[global_allocator]"),
        "{summary}"
    );
    assert_lines_equally_wide(&summary);
    // The PyTorch-style keys leave the heap's figures out rather than give zeros, and
    // keep the rest.
    let keys: BTreeMap<_, _> = snap.pytorch_keys().into_iter().collect();
    assert!(
        !keys.keys().any(|k| k.starts_with("ndmem.heap.")),
        "{keys:?}"
    );
    assert!(keys.contains_key("allocated_bytes.all.current"), "{keys:?}");
    assert!(keys.contains_key("ndmem.reclaim.pending_bytes"), "{keys:?}");
}

#[test]
fn only_a_refusal_at_a_limit_carries_a_report_and_a_report_is_attached_once() {
    let invalid = Error::from(AllocError::InvalidLayout {
        size: 0,
        align: 1,
        reason: "zero-size allocations are not served",
    });
    assert!(!invalid.is_out_of_memory());
    assert!(invalid.oom_report().is_none());
    assert!(matches!(
        invalid,
        Error::Alloc(AllocError::InvalidLayout { .. })
    ));

    let pool = Pool::new(Limits::builder().max_bytes(64 << 10).build());
    let refusal = pool.allocate(128 << 10, 16).unwrap_err();
    assert!(matches!(
        refusal,
        AllocError::OutOfMemory { report: None, .. }
    ));
    let err = Error::from(refusal);
    assert!(err.is_out_of_memory());
    let report = err.oom_report().expect("attached on the way into Error");
    assert_eq!(
        report.error.to_string(),
        pool.allocate(128 << 10, 16).unwrap_err().to_string()
    );
    assert_eq!(
        err.to_string(),
        report.to_string(),
        "the error prints its report"
    );
    // Converting again keeps the report already attached.
    let Error::Alloc(inner) = err.clone() else {
        unreachable!()
    };
    assert_eq!(Error::from(inner), err);
}

#[test]
fn a_scope_peak_reset_is_not_undone_by_a_snapshot_that_read_before_it() {
    // Semantics §7: reset_peak restarts the scopes' observed peaks, and a peak is never
    // raised after the fact. Snapshots run on two threads while the main thread fills a
    // scope, empties it and resets: a snapshot that walked the tree before the reset must
    // not fold its figure in after it. (It did in about 2% of rounds.)
    let source = own_source(64 << 20);
    // A wide tree, so that a walk takes a while.
    let others: Vec<Scope> = (0..200)
        .map(|i| Scope::new_base_in(&format!("other{i}"), source))
        .collect();
    let scope = Scope::new_base_in("S", source);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let count = AtomicUsize::new(0);
    let bad = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = stats::snapshot_of(&[source]);
                    count.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        let mut bad = Vec::new();
        for round in 0..400 {
            let t = scope.zeros(DType::F32, &[1024]).unwrap();
            std::thread::yield_now();
            scope.detach(&t).unwrap();
            drop(t);
            stats::reset_peak_of(&[source]);
            let seen = count.load(Ordering::SeqCst);
            while count.load(Ordering::SeqCst) < seen + 3 {
                std::thread::yield_now();
            }
            let snap = stats::snapshot_of(&[source]);
            let peak = snap
                .scopes
                .iter()
                .find(|s| s.name == "S")
                .unwrap()
                .peak_bytes;
            if peak != 0 {
                bad.push((round, peak));
            }
        }
        stop.store(true, Ordering::Relaxed);
        bad
    });
    drop(others);
    assert!(
        bad.is_empty(),
        "rounds with a peak from before the reset: {bad:?}"
    );
}

#[test]
fn a_misconfigured_global_pool_reads_as_unusable_in_the_summary_and_snapshot() {
    // Semantics §1: garbage in NDMEM_MAX_BYTES makes the global pool refuse everything;
    // the summary and the snapshot say so and why, not "a limit of 0 B".
    let test = common::test_name!(misconfigured_global_child);
    common::child::Rerun::test(test)
        .env("NDMEM_MAX_BYTES", "garbage")
        .passes();
}

/// Runs in the child of
/// [`a_misconfigured_global_pool_reads_as_unusable_in_the_summary_and_snapshot`].
#[test]
#[ignore = "run by a_misconfigured_global_pool_reads_as_unusable_in_the_summary_and_snapshot"]
fn misconfigured_global_child() {
    let error = Pool::global().config_error().expect("garbage is an error");
    assert!(error.to_string().contains("NDMEM_MAX_BYTES"), "{error}");
    let snapshot = stats::snapshot();
    let global = snapshot
        .pools
        .iter()
        .find(|p| p.name == "global")
        .expect("the global pool is listed");
    assert_eq!(global.config_error.as_deref(), Some(&*error.to_string()));
    let summary = stats::memory_summary();
    assert!(summary.contains("[global] unusable:"), "{summary}");
    assert!(!summary.contains("[global] 0 B"), "{summary}");
    assert!(Pool::new(Limits::unlimited()).config_error().is_none());
}

#[test]
fn a_refusal_at_the_physical_limit_reaches_the_hooks_and_is_out_of_memory() {
    // Semantics §7: a refusal at the physical limit counts as an OOM everywhere (counters,
    // timeline), so the hooks see it too, and `is_out_of_memory()` says so; the advice
    // names the physical limit's knob. Alone in a process, so the RSS moves only by what
    // this test does.
    if common::child::run_alone(common::test_name!(
        a_refusal_at_the_physical_limit_reaches_the_hooks_and_is_out_of_memory
    )) {
        return;
    }
    static ADVICE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static HOLDERS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    stats::on_oom(|report| {
        if matches!(report.error, AllocError::PhysicalLimit { .. }) {
            ADVICE
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(report.advice.join("; "));
            HOLDERS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(report.holders.iter().map(|h| h.name.clone()));
        }
    });
    // Held in the global pool: the resident memory is the whole process's, so the report
    // of a private pool's physical refusal lists it too.
    let elsewhere = Scope::new_base("held-elsewhere");
    let _held = elsewhere.zeros(DType::U8, &[4 << 20]).unwrap();
    let limit = ndmem::alloc::physical_bytes() + (64 << 20);
    let source = MemorySource::new(Pool::new(
        Limits::builder()
            .max_bytes(None)
            .max_physical_bytes(limit)
            .build(),
    ));
    let scope = Scope::new_base_in("physical", source);
    let err = scope.zeros(DType::U8, &[256 << 20]).unwrap_err();
    assert!(
        matches!(err.alloc_error(), Some(AllocError::PhysicalLimit { .. })),
        "{err:?}"
    );
    assert!(err.is_out_of_memory());
    assert!(err.oom_report().is_none(), "the variant carries no report");
    let advice = ADVICE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(advice.len(), 1, "the hooks ran once: {advice:?}");
    assert!(
        advice[0].starts_with("raise Limits::max_physical_bytes of this pool (now ")
            && advice[0].contains("resident memory is"),
        "{advice:?}"
    );
    assert_eq!(source.pool().stats().failed_allocations, 1);
    let holders = HOLDERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(
        holders.iter().any(|h| h == "[held-elsewhere]"),
        "{holders:?}"
    );
}
