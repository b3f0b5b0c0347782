//! Device workspaces: the first cycle spills and learns; every later cycle bumps in one
//! buffer and asks the driver (and the pool) for nothing (semantics §2.3, §5).

use ndmem::device::{DeviceMemory, DeviceWorkspace};
use ndmem::{Error, LearningPolicy, MirroringPolicy, ResetPolicy, SpillPolicy, WorkspaceConfig};

use crate::sim;

fn one_step(ws: &mut DeviceWorkspace, sizes: &[usize]) {
    let gpu = ws.device().clone();
    let cycle = ws.enter();
    let mut slices = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let mut s = cycle.allocate(*size, 256).unwrap();
        assert_eq!(s.device_ptr() % 256, 0);
        gpu.fill(&mut s, i as u8).unwrap();
        slices.push(s);
    }
    // No two slices overlap: each still holds its own fill.
    for (i, s) in slices.iter().enumerate() {
        assert!(gpu.sim_bytes(s).unwrap().iter().all(|b| *b == i as u8));
    }
}

#[test]
fn after_the_first_cycle_a_workspace_asks_the_driver_for_nothing() {
    let gpu = sim(0, 1 << 30);
    let mut ws = DeviceWorkspace::new(&gpu, "LOOP", &WorkspaceConfig::default()).unwrap();
    let sizes = [4096, 100, 65536, 3000, 1 << 20];
    one_step(&mut ws, &sizes);
    let learned = ws.stats();
    assert_eq!(learned.cycles, 1);
    assert!(learned.spilled > 0);
    assert!(learned.buffer_bytes >= sizes.iter().sum::<usize>());
    crate::settle(&gpu);
    let before = gpu.stats();
    for _ in 0..50 {
        one_step(&mut ws, &sizes);
    }
    crate::settle(&gpu);
    let after = gpu.stats().since(&before);
    assert_eq!(after.driver_allocations, 0, "{after:?}");
    assert_eq!(after.pool_hits, 0, "not even the pool's cache");
    assert_eq!(ws.stats().total_spilled, learned.total_spilled);
    assert_eq!(ws.stats().cycles, 51);
}

#[test]
fn over_time_learns_after_the_configured_cycles() {
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(3)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "OT", &config).unwrap();
    for cycle in 1..=4u64 {
        one_step(&mut ws, &[1000 * cycle as usize]);
        let s = ws.stats();
        assert_eq!(s.buffer_bytes > 0, cycle >= 3, "cycle {cycle}");
    }
    assert_eq!(ws.stats().spilled, 0, "the fourth cycle fits");
}

#[test]
fn an_initial_size_takes_the_buffer_at_once_and_fail_refuses_overflow() {
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .initial_size(64 << 10)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "FIXED", &config).unwrap();
    assert!(ws.stats().buffer_bytes >= 64 << 10);
    assert_eq!(gpu.stats().driver_allocations, 1);
    let cycle = ws.enter();
    let _a = cycle.allocate(60 << 10, 256).unwrap();
    let err = cycle.allocate(1 << 20, 256).unwrap_err();
    assert!(matches!(err, Error::WorkspaceFull { .. }), "{err:?}");
    assert!(err.to_string().contains("FIXED"));
}

#[test]
fn reallocate_grows_the_buffer_after_a_spill() {
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "GROW", &config).unwrap();
    one_step(&mut ws, &[10_000]);
    let first = ws.stats().buffer_bytes;
    one_step(&mut ws, &[10_000, 50_000]);
    assert!(ws.stats().buffer_bytes > first);
    one_step(&mut ws, &[10_000, 50_000]);
    assert_eq!(ws.stats().spilled, 0);
}

#[test]
fn host_only_workspaces_take_pinned_memory_and_no_device_memory() {
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .policy_mirroring(MirroringPolicy::HostOnly)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "HOST", &config).unwrap();
    for _ in 0..3 {
        one_step(&mut ws, &[4096, 8192]);
    }
    crate::settle(&gpu);
    let stats = gpu.stats();
    assert_eq!(stats.driver_allocations, 0);
    assert_eq!(stats.live_bytes, 0);
    assert!(stats.pinned_bytes >= 4096 + 8192);
    // Its slices are pinned host memory (semantics §5.4: a copy or fill into one waits for
    // the device); a Full workspace's are not.
    let cycle = ws.enter();
    assert!(cycle.allocate(4096, 256).unwrap().is_host_memory());
    drop(cycle);
    let full = WorkspaceConfig::default();
    let mut on_device = DeviceWorkspace::new(&gpu, "DEVICE", &full).unwrap();
    let cycle = on_device.enter();
    assert!(!cycle.allocate(4096, 256).unwrap().is_host_memory());
}

#[test]
fn circular_device_workspaces_are_refused() {
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .build()
        .unwrap();
    let err = DeviceWorkspace::new(&gpu, "RING", &config).unwrap_err();
    assert!(err.to_string().contains("linear"), "{err}");
}

#[test]
fn bad_alignment_is_an_error() {
    let gpu = sim(0, 1 << 30);
    let mut ws = DeviceWorkspace::new(&gpu, "A", &WorkspaceConfig::default()).unwrap();
    let cycle = ws.enter();
    assert!(cycle.allocate(64, 3).is_err());
    assert!(cycle.allocate(64, 4096).unwrap().device_ptr() % 4096 == 0);
}

#[test]
fn a_workspace_aligned_beyond_device_memory_stops_spilling_once_learned() {
    // Device memory is 256-byte aligned; a strictly sized workspace aligned to 512 or more
    // learns from spills counted for an aligned buffer, so its buffer starts at an aligned
    // address (it took the difference more), wherever the device placed it: after learning,
    // no cycle spills. Several workspaces, so buffers land at both kinds of address.
    let gpu = sim(0, 1 << 30);
    for align in [512, 1024, 4096] {
        let cfg = WorkspaceConfig::builder()
            .alignment(align)
            .policy_allocation(ndmem::AllocationPolicy::Strict)
            .build()
            .unwrap();
        let mut workspaces: Vec<_> = (0..6)
            .map(|i| DeviceWorkspace::new(&gpu, &format!("A{align}_{i}"), &cfg).unwrap())
            .collect();
        for ws in &mut workspaces {
            for cycle in 0..4 {
                let c = ws.enter();
                let a = c.allocate(10, 1).unwrap();
                let b = c.allocate(10, 1).unwrap();
                assert_eq!(a.device_ptr() % align as u64, 0);
                assert_eq!(b.device_ptr() % align as u64, 0);
                let stats = c.stats();
                if cycle > 0 {
                    assert_eq!(stats.spilled, 0, "align {align}, cycle {cycle}: {stats:?}");
                    assert_eq!(stats.used, 2 * align, "align {align}: {stats:?}");
                }
            }
        }
    }
}

#[test]
fn a_bump_follows_the_workspace_alignment_and_rounds_sizes_as_on_the_host() {
    // semantics §5.6 and §2.1/§2.2: every allocation starts at a multiple of
    // max(alignment, align) and takes its size rounded up to the alignment.
    let gpu = sim(0, 1 << 30);
    let aligned = WorkspaceConfig::builder().alignment(256).build().unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "ALIGNED", &aligned).unwrap();
    for cycle in 0..2 {
        let c = ws.enter();
        let a = c.allocate(10, 1).unwrap();
        let b = c.allocate(10, 1).unwrap();
        assert_eq!(a.device_ptr() % 256, 0, "cycle {cycle}");
        assert_eq!(b.device_ptr() % 256, 0, "cycle {cycle}");
        if cycle == 1 {
            assert_eq!(
                b.device_ptr().wrapping_sub(a.device_ptr()),
                256,
                "bumped, one aligned step: {a:?} {b:?} {:?}",
                c.stats()
            );
            assert_eq!(c.stats().used, 512);
        }
    }
    let fixed = WorkspaceConfig::builder()
        .initial_size(4096)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "ROUNDED", &fixed).unwrap();
    let c = ws.enter();
    let _five_doubles = c.allocate(40, 8).unwrap();
    assert_eq!(
        c.stats().used,
        48,
        "5 doubles take 48 bytes at alignment 16"
    );
    let empty = c.allocate(0, 64).unwrap();
    assert_eq!(empty.device_ptr() % 64, 0);
    assert_eq!(c.stats().used, 48, "a zero-size request takes no bytes");
}

#[test]
fn a_cycle_bumps_no_further_than_max_size() {
    // semantics §2.1: a cycle bumps no further than `max_size` even where the buffer is
    // larger (here the device's 256-byte granularity rounds 1,000 up).
    let gpu = sim(0, 1 << 30);
    let config = WorkspaceConfig::builder()
        .initial_size(1000)
        .max_size(1000)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "MAX", &config).unwrap();
    assert!(ws.stats().buffer_bytes > 1000, "{:?}", ws.stats());
    let c = ws.enter();
    c.allocate(992, 16).unwrap();
    match c.allocate(16, 16) {
        Err(Error::WorkspaceFull {
            workspace,
            requested,
            available,
        }) => assert_eq!((workspace.as_str(), requested, available), ("MAX", 16, 8)),
        other => panic!("{other:?}"),
    }
    // Even 8 bytes take 16 at alignment 16: the 8 left below `max_size` cannot hold them.
    assert!(matches!(
        c.allocate(8, 8),
        Err(Error::WorkspaceFull { available: 8, .. })
    ));
    assert_eq!(c.stats().used, 992);
}

/// The host-side cost of a learned device workspace's allocation (a bump, no driver call).
/// Timing only: `cargo test --release -p ndmem --test device -- --ignored bump_cost`.
#[test]
#[ignore = "timing; run in release"]
fn bump_cost() {
    let gpu = sim(0, 1 << 30);
    let mut ws = DeviceWorkspace::new(&gpu, "TIMED", &WorkspaceConfig::default()).unwrap();
    let sizes = [4096usize, 256, 65536, 1024];
    let rounds = 200_000;
    for _ in 0..2 {
        let cycle = ws.enter();
        for s in sizes {
            std::hint::black_box(cycle.allocate(s, 256).unwrap());
        }
    }
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        let cycle = ws.enter();
        for s in sizes {
            std::hint::black_box(cycle.allocate(s, 256).unwrap());
        }
    }
    let per = start.elapsed().as_nanos() as f64 / (rounds * sizes.len()) as f64;
    eprintln!("device workspace allocation (cycle enter/exit included): {per:.1} ns");
    assert_eq!(ws.stats().spilled, 0);
}

/// A zero-size request is free, as on the host (semantics §2.2, §5.6): a dangling, aligned,
/// empty slice that takes no bytes (none bumped, none spilled, nothing learned, no driver
/// call), whether the workspace has a buffer or not, and even where the buffer is full
/// under `Fail`; the empty slice is a valid (empty) operand.
#[test]
fn a_zero_size_request_takes_no_bytes_and_never_spills() {
    let gpu = sim(0, 1 << 30);
    let ready = gpu.stats();
    for (name, mirroring) in [
        ("ZERO", MirroringPolicy::Full),
        ("ZERO-PINNED", MirroringPolicy::HostOnly),
    ] {
        let config = WorkspaceConfig::builder()
            .policy_mirroring(mirroring)
            .build()
            .unwrap();
        let mut ws = DeviceWorkspace::new(&gpu, name, &config).unwrap();
        for _ in 0..3 {
            let c = ws.enter();
            for align in [1, 16, 64, 4096, 1 << 16] {
                let mut empty = c.allocate(0, align).unwrap();
                assert_eq!(empty.len(), 0);
                assert_eq!(empty.device_ptr() % align as u64, 0, "{name} align {align}");
                assert_eq!(gpu.sim_bytes(&empty), Some(&[][..]));
                gpu.fill(&mut empty, 7).unwrap();
                let other = c.allocate(0, 8).unwrap();
                gpu.copy(&other, &mut empty).unwrap();
            }
            let s = c.stats();
            assert_eq!((s.used, s.spilled), (0, 0), "{name}: {s:?}");
        }
        let s = ws.stats();
        assert_eq!(
            (s.max_cycle, s.total_spilled, s.buffer_bytes, s.cycles),
            (0, 0, 0, 3),
            "{name}: nothing learned: {s:?}"
        );
    }
    let now = gpu.stats();
    assert_eq!(now.driver_allocations, ready.driver_allocations);
    assert_eq!(now.pinned_allocations, ready.pinned_allocations);
    assert_eq!(now.holders.workspaces, 0);

    // With a buffer: a zero-size request between two others moves nothing, and one past
    // the end of a full buffer succeeds under `Fail`.
    let config = WorkspaceConfig::builder()
        .initial_size(1024)
        .policy_allocation(ndmem::AllocationPolicy::Strict)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "ZERO-FAIL", &config).unwrap();
    let c = ws.enter();
    let a = c.allocate(100, 16).unwrap();
    let empty = c.allocate(0, 4096).unwrap();
    assert_eq!(empty.device_ptr() % 4096, 0);
    let b = c.allocate(100, 16).unwrap();
    assert_eq!(
        b.device_ptr() - a.device_ptr(),
        112,
        "the empty request took nothing"
    );
    c.allocate(800, 16).unwrap();
    assert_eq!(c.stats().used, 1024);
    for align in [16, 4096] {
        let empty = c.allocate(0, align).unwrap();
        assert_eq!(
            (empty.len() as u64, empty.device_ptr() % align as u64),
            (0, 0)
        );
    }
    let s = c.stats();
    assert_eq!((s.used, s.spilled), (1024, 0), "{s:?}");
    drop(c);
    assert_eq!(ws.stats().max_cycle, 1024);
}

/// A learned buffer is a pool block of its size class, and the workspace uses all of it
/// and reports it (semantics §2.3: a learned 672 bytes is a 768-byte block), bumping no
/// further than `max_size` where that is below the block (§2.1).
#[test]
fn a_learned_buffer_uses_and_reports_its_size_class() {
    let gpu = sim(0, 1 << 30);
    let strict = || WorkspaceConfig::builder().policy_allocation(ndmem::AllocationPolicy::Strict);
    let mut ws = DeviceWorkspace::new(&gpu, "CLASS", &strict().build().unwrap()).unwrap();
    {
        let c = ws.enter();
        c.allocate(672, 16).unwrap();
    }
    crate::settle(&gpu); // the first cycle's spill, freed through the epoch
    assert_eq!(gpu.stats().holders.workspaces, 768);
    assert_eq!(ws.stats().buffer_bytes, 768, "{:?}", ws.stats());
    for _ in 0..2 {
        let c = ws.enter();
        let a = c.allocate(512, 16).unwrap();
        let b = c.allocate(256, 16).unwrap();
        assert_eq!(b.device_ptr() - a.device_ptr(), 512);
        let s = c.stats();
        assert_eq!(
            (s.used, s.spilled),
            (768, 0),
            "the whole block is bumped: {s:?}"
        );
    }
    assert_eq!(ws.stats().buffer_bytes, 768, "nothing relearned");
    assert_eq!(gpu.stats().holders.workspaces, 768);

    // `max_size` below the block: the block is reported, the bump stops at `max_size`.
    let capped = strict().max_size(700).build().unwrap();
    let mut ws = DeviceWorkspace::new(&gpu, "CAPPED", &capped).unwrap();
    {
        let c = ws.enter();
        c.allocate(672, 16).unwrap();
    }
    assert_eq!(ws.stats().buffer_bytes, 768);
    let c = ws.enter();
    c.allocate(688, 16).unwrap();
    assert_eq!(c.stats().spilled, 0);
    c.allocate(16, 16).unwrap();
    let s = c.stats();
    assert_eq!(
        (s.used, s.spilled),
        (688, 16),
        "past max_size it spills: {s:?}"
    );
}
