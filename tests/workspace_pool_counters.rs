//! Workspace figures that can only be read from process-wide counters: the pool's
//! allocation count and live bytes. One test in its own binary, so no other test's pool
//! traffic runs beside it. Heap allocations are counted per thread by the counting
//! allocator of tests/common/counting.rs, so they are attributable exactly.

use std::alloc::Layout;

use ndmem::alloc::Pool;
use ndmem::workspace::allocate_in_current;
use ndmem::{workspaces, LocationPolicy, ResetPolicy, SpillPolicy, WorkspaceConfig};

#[path = "common/counting.rs"]
mod counting;

/// Heap allocations are counted per thread, so a test can check a path allocates nothing.
#[global_allocator]
static GLOBAL: counting::CountingPerThread = counting::CountingPerThread;
use counting::heap_allocations_of_this_thread as heap_allocations;

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
    let pool = Pool::global();
    let ws = workspaces();
    let outer = WorkspaceConfig::default();
    let inner = WorkspaceConfig::builder()
        .initial_size(64 << 10)
        .build()
        .unwrap();

    // SEMANTICS 2: "after it has learned its size, a cycle allocates nothing from the pool
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

    // SEMANTICS 2.2: External spills are freed when the cycle ends; the buffer stays.
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

    // SEMANTICS 2.2 Decision: a thread's workspaces are freed when it exits.
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
