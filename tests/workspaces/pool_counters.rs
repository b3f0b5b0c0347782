//! Workspace figures that can only be read from process-wide counters: the global pool's
//! allocation count and live bytes. Each test runs alone in a process of its own
//! (`run_alone`), so no other test's pool traffic runs beside it. Heap allocations are
//! counted per thread by this binary's global allocator (`common::counting`), so they are
//! attributable exactly.

use std::alloc::Layout;

use ndmem::alloc::{Limits, Pool};
use ndmem::workspace::allocate_in_current;
use ndmem::{workspaces, LocationPolicy, MemorySource, ResetPolicy, SpillPolicy, WorkspaceConfig};

use crate::common::child::run_alone;
use crate::common::counting::heap_allocations_of_this_thread as heap_allocations;
use crate::common::test_name;

/// One cycle of a training-loop-like workload: nested workspaces, stamped allocations,
/// an allocator_api2 vector, and a scope-out.
fn cycle(outer: &WorkspaceConfig, inner: &WorkspaceConfig) -> u64 {
    let ws = workspaces();
    let g = ws.get_and_activate(outer, "COUNT_OUTER").expect("enter");
    let mut checksum = 0u64;
    for i in 0..100 {
        let p = g.alloc(Layout::from_size_align(4096, 64).unwrap()).unwrap();
        checksum += p.len() as u64 + i;
    }
    {
        let h = ws.get_and_activate(inner, "COUNT_INNER").expect("enter");
        let m = allocate_in_current(Layout::new::<[f32; 256]>())
            .expect("a current workspace")
            .expect("room");
        m.stamp.check("add", "X").unwrap();
        let mut v = allocator_api2::vec::Vec::with_capacity_in(512, &h);
        v.extend((0..512u64).map(|x| x * 2));
        checksum += v.iter().sum::<u64>();
        let _out = ws.scope_out();
        assert!(allocate_in_current(Layout::new::<u64>()).is_none());
    }
    checksum
}

#[test]
fn learned_cycles_touch_no_pool_and_no_heap_and_exits_release_everything() {
    if run_alone(test_name!(
        learned_cycles_touch_no_pool_and_no_heap_and_exits_release_everything
    )) {
        return;
    }
    let pool = Pool::global();
    let ws = workspaces();
    let outer = WorkspaceConfig::default();
    let inner = WorkspaceConfig::builder()
        .initial_size(64 << 10)
        .build()
        .unwrap();

    // Semantics §2: "after it has learned its size, a cycle allocates nothing from the pool
    // or the OS". The first cycle spills and learns, the second settles the stack and caches.
    let expected = cycle(&outer, &inner);
    assert_eq!(cycle(&outer, &inner), expected);
    let before = pool.stats();
    let heap_before = heap_allocations();
    for _ in 0..1000 {
        assert_eq!(cycle(&outer, &inner), expected);
    }
    let after = pool.stats();
    assert_eq!(
        after.allocations, before.allocations,
        "pool allocations per cycle"
    );
    assert_eq!(
        after.os_allocations, before.os_allocations,
        "OS allocations per cycle"
    );
    assert_eq!(
        heap_allocations(),
        heap_before,
        "heap allocations per cycle"
    );
    assert_eq!(after.live_bytes, before.live_bytes);
    for id in ["COUNT_OUTER", "COUNT_INNER"] {
        let s = ws.workspace(id).unwrap();
        assert_eq!(
            (s.cycles, s.spilled_bytes, s.total_spilled_bytes > 0),
            (1002, 0, id == "COUNT_OUTER")
        );
    }
    ws.destroy_all_for_current_thread();

    // Semantics §2.2: External spills are freed when the cycle ends; the buffer stays.
    let baseline = pool.stats().live_bytes;
    let small = WorkspaceConfig::builder()
        .initial_size(1024)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&small, "SPILLS").unwrap();
        let held = pool.stats().live_bytes;
        assert!(held > baseline, "the initial buffer is pool memory");
        for _ in 0..4 {
            g.alloc(Layout::from_size_align(100_000, 16).unwrap())
                .unwrap();
        }
        assert!(pool.stats().live_bytes >= held + 400_000);
        assert_eq!(
            pool.stats().workspace_bytes,
            pool.stats().live_bytes - baseline
        );
    }
    let size = ws.workspace("SPILLS").unwrap().size;
    assert_eq!(pool.stats().live_bytes, baseline + size);
    ws.destroy("SPILLS").unwrap();
    assert_eq!(
        pool.stats().live_bytes,
        baseline,
        "destroy frees the buffer"
    );

    // Semantics §2.2 Decision: a thread's workspaces are freed when it exits.
    let before_thread = pool.stats();
    let mapped = std::thread::spawn(|| {
        let ws = workspaces();
        let cfgs = [
            WorkspaceConfig::default(),
            WorkspaceConfig::builder()
                .initial_size(1 << 20)
                .build()
                .unwrap(),
            WorkspaceConfig::builder()
                .policy_reset(ResetPolicy::EndOfBuffer)
                .overallocation_limit(2.0)
                .build()
                .unwrap(),
            WorkspaceConfig::builder()
                .initial_size(256 << 10)
                .policy_location(LocationPolicy::Mmap { path: None })
                .build()
                .unwrap(),
            WorkspaceConfig::builder()
                .initial_size(4096)
                .policy_spill(SpillPolicy::Reallocate)
                .build()
                .unwrap(),
        ];
        for round in 0..3 {
            for (i, cfg) in cfgs.iter().enumerate() {
                let g = ws.get_and_activate(cfg, &format!("EXIT_{i}")).unwrap();
                for _ in 0..10 + round {
                    g.alloc(Layout::from_size_align(10_000, 16).unwrap())
                        .unwrap();
                }
            }
        }
        let held = Pool::global().stats();
        assert!(held.workspace_bytes > (1 << 20) + (256 << 10));
        ws.statistics().len()
    })
    .join()
    .unwrap();
    assert_eq!(mapped, 5);
    let after_thread = pool.stats();
    assert_eq!(after_thread.live_bytes, before_thread.live_bytes);
    assert_eq!(after_thread.workspace_bytes, before_thread.workspace_bytes);
}

#[test]
fn a_workspace_with_its_own_source_leaves_the_global_pool_alone() {
    if run_alone(test_name!(
        a_workspace_with_its_own_source_leaves_the_global_pool_alone
    )) {
        return;
    }
    let source = MemorySource::new(Pool::new(Limits::unlimited()));
    let configs = [
        WorkspaceConfig::default(),
        WorkspaceConfig::builder()
            .initial_size(1 << 20)
            .policy_spill(SpillPolicy::Reallocate)
            .build()
            .unwrap(),
        WorkspaceConfig::builder()
            .policy_reset(ResetPolicy::EndOfBuffer)
            .overallocation_limit(2.0)
            .build()
            .unwrap(),
        WorkspaceConfig::builder()
            .initial_size(256 << 10)
            .policy_location(LocationPolicy::Mmap { path: None })
            .build()
            .unwrap(),
    ]
    .map(|cfg| cfg.to_builder().source(source).build().unwrap());
    let ws = workspaces();
    let global = Pool::global().stats();
    let mut kept = Vec::new();
    for round in 0..4 {
        for (i, cfg) in configs.iter().enumerate() {
            let g = ws.get_and_activate(cfg, &format!("OWN_{i}")).unwrap();
            for _ in 0..10 + round {
                g.alloc(Layout::from_size_align(100_000, 16).unwrap())
                    .unwrap();
            }
            kept.push(g.alloc_memory(Layout::new::<u64>()).unwrap());
        }
    }
    let own = source.pool().stats();
    assert!(
        own.workspace_bytes >= (1 << 20) + (256 << 10),
        "buffers, spills and the mapped file's bytes come from the source: {own:?}"
    );
    assert!(own.total_allocated_bytes >= 4 * 10 * 100_000);
    let after = Pool::global().stats();
    assert_eq!(
        (
            after.allocations,
            after.total_allocated_bytes,
            after.live_bytes
        ),
        (
            global.allocations,
            global.total_allocated_bytes,
            global.live_bytes
        ),
        "the global pool did not move"
    );
    drop(kept);
    ws.destroy_all_for_current_thread();
    assert_eq!(
        source.pool().stats().live_bytes,
        0,
        "destroy gives it all back"
    );
}
