//! Workspaces: one test per clause of semantics §2, plus the validity stamps of semantics §3
//! and the allocator_api2 integration.
//!
//! Tests run on parallel threads of one process. Workspaces are per thread, so ids never
//! collide; nothing here reads the global pool's counters (see workspace_pool_counters.rs).

#![allow(unsafe_code)]

#[path = "workspaces/files.rs"]
mod files;

use std::alloc::Layout;
use std::ptr::NonNull;

use ndmem::alloc::{AllocError, Limits, Pool};
use ndmem::workspace::{
    allocate_in, allocate_in_current, allocate_in_parent, parent_of_current, WorkspaceMemory,
};
use ndmem::{
    workspaces, AllocationPolicy, Error, LearningPolicy, LocationPolicy, MemorySource,
    MirroringPolicy, ResetPolicy, SpillPolicy, WorkspaceConfig,
};

/// Bytes the pool really hands out for a request of `bytes` (its size class).
fn capacity(bytes: usize) -> usize {
    Pool::new(Limits::unlimited())
        .allocate(bytes, 16)
        .expect("a small block")
        .capacity()
}

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 1).expect("a valid layout")
}

fn strict() -> ndmem::workspace::WorkspaceConfigBuilder {
    WorkspaceConfig::builder().policy_allocation(AllocationPolicy::Strict)
}

/// Allocates `n` x `size` bytes in the guard's workspace and returns the pointers.
fn fill(guard: &ndmem::WorkspaceGuard, n: usize, size: usize) -> Vec<NonNull<[u8]>> {
    (0..n)
        .map(|_| guard.alloc(layout(size)).expect("allocation"))
        .collect()
}

fn write(memory: &WorkspaceMemory, byte: u8) {
    memory.stamp.check("write", "X").expect("valid memory");
    // SAFETY: the stamp says the memory is valid on this thread; it holds `len` bytes.
    unsafe { std::ptr::write_bytes(memory.ptr.as_ptr(), byte, memory.len) };
}

fn read(memory: &WorkspaceMemory) -> Vec<u8> {
    // SAFETY: callers only read memory they know is alive (checked, or a circular slot
    // that the ring has not wrapped over; circular stamps keep the buffer alive).
    unsafe { std::slice::from_raw_parts(memory.ptr.as_ptr(), memory.len).to_vec() }
}

fn config_error(result: Result<WorkspaceConfig, Error>) -> String {
    match result {
        Err(Error::Config(e)) => e.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

// ---- 2.1 configuration ---------------------------------------------------------------

#[test]
fn defaults_are_those_of_the_contract() {
    // Semantics §2.1
    let cfg = WorkspaceConfig::default();
    assert_eq!(cfg, WorkspaceConfig::builder().build().unwrap());
    assert_eq!(
        (cfg.initial_size(), cfg.min_size(), cfg.max_size()),
        (0, 0, 0)
    );
    assert_eq!(cfg.overallocation_limit(), 0.3);
    assert_eq!(cfg.alignment(), 16);
    assert_eq!(cfg.policy_allocation(), AllocationPolicy::Overallocate);
    assert_eq!(cfg.policy_learning(), LearningPolicy::FirstLoop);
    assert_eq!(cfg.cycles_before_initialization(), 0);
    assert_eq!(cfg.policy_spill(), SpillPolicy::External);
    assert_eq!(cfg.policy_reset(), ResetPolicy::BlockLeft);
    assert_eq!(cfg.policy_location(), &LocationPolicy::Ram);
    assert_eq!(cfg.policy_mirroring(), MirroringPolicy::Full);
    let all = WorkspaceConfig::builder()
        .initial_size(1)
        .min_size(2)
        .max_size(3)
        .overallocation_limit(1.5)
        .alignment(64)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(4)
        .policy_spill(SpillPolicy::Reallocate)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_mirroring(MirroringPolicy::HostOnly)
        .build()
        .unwrap();
    assert_eq!(
        (all.initial_size(), all.min_size(), all.max_size()),
        (1, 2, 3)
    );
    assert_eq!((all.overallocation_limit(), all.alignment()), (1.5, 64));
    assert_eq!(all.cycles_before_initialization(), 4);
    assert!(all.is_circular());
}

#[test]
fn every_invalid_combination_is_a_config_error_naming_field_and_value() {
    // Semantics §2.1: initial_size > max_size (when max_size > 0)
    let e = config_error(
        WorkspaceConfig::builder()
            .initial_size(200)
            .max_size(100)
            .build(),
    );
    assert!(
        e.contains("initial_size") && e.contains("200") && e.contains("100"),
        "{e}"
    );
    assert!(WorkspaceConfig::builder()
        .initial_size(200)
        .max_size(0)
        .build()
        .is_ok());
    // min_size > max_size
    let e = config_error(
        WorkspaceConfig::builder()
            .min_size(300)
            .max_size(100)
            .build(),
    );
    assert!(e.contains("min_size") && e.contains("300"), "{e}");
    // negative, NaN (and infinite) overallocation_limit
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        let e = config_error(WorkspaceConfig::builder().overallocation_limit(bad).build());
        assert!(
            e.contains("overallocation_limit") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
    // non-power-of-two alignment, and alignment out of range
    for bad in [0, 3, 24, 8192] {
        let e = config_error(WorkspaceConfig::builder().alignment(bad).build());
        assert!(
            e.contains("alignment") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
    for good in [1, 2, 16, 4096] {
        assert!(WorkspaceConfig::builder().alignment(good).build().is_ok());
    }
    // Mmap with learning other than None and initial_size 0
    let mmap = LocationPolicy::Mmap { path: None };
    for learning in [LearningPolicy::FirstLoop, LearningPolicy::OverTime] {
        let e = config_error(
            WorkspaceConfig::builder()
                .policy_location(mmap.clone())
                .policy_learning(learning)
                .build(),
        );
        assert!(e.contains("Mmap") && e.contains("initial_size 0"), "{e}");
    }
    assert!(WorkspaceConfig::builder()
        .policy_location(mmap.clone())
        .initial_size(4096)
        .build()
        .is_ok());
    assert!(WorkspaceConfig::builder()
        .policy_location(mmap)
        .policy_learning(LearningPolicy::None)
        .build()
        .is_ok());
    // circular + Overallocate with overallocation_limit < 1.0
    let e = config_error(
        WorkspaceConfig::builder()
            .policy_reset(ResetPolicy::EndOfBuffer)
            .overallocation_limit(0.5)
            .build(),
    );
    assert!(e.contains("EndOfBuffer") && e.contains("0.5"), "{e}");
    assert!(WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .build()
        .is_ok());
    assert!(strict()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(0.5)
        .build()
        .is_ok());
    // Fail without an initial buffer: every request would fail, so nothing is ever learned
    let e = config_error(
        WorkspaceConfig::builder()
            .policy_spill(SpillPolicy::Fail)
            .build(),
    );
    assert!(e.contains("Fail") && e.contains("initial_size 0"), "{e}");
    // circular + Reallocate on a user file: a rebuilt ring would map the same file again
    let user_file = LocationPolicy::Mmap {
        path: Some(std::env::temp_dir().join("ndmem-never-created")),
    };
    let circular_file = || {
        WorkspaceConfig::builder()
            .initial_size(4096)
            .policy_reset(ResetPolicy::EndOfBuffer)
            .overallocation_limit(1.0)
            .policy_location(user_file.clone())
    };
    let e = config_error(
        circular_file()
            .policy_spill(SpillPolicy::Reallocate)
            .build(),
    );
    assert!(
        e.contains("policy_spill") && e.contains("Reallocate"),
        "{e}"
    );
    assert!(circular_file().build().is_ok());
}

#[test]
fn every_allocation_is_aligned_to_the_workspace_or_the_layout() {
    // Semantics §2.1: offsets rounded to max(alignment, layout.align()); padding is used.
    let cfg = strict().initial_size(4096).alignment(64).build().unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "ALIGN").unwrap();
    let a = g.alloc(layout(1)).unwrap();
    let b = g.alloc(layout(1)).unwrap();
    let c = g.alloc(Layout::from_size_align(8, 256).unwrap()).unwrap();
    for p in [a, b] {
        assert_eq!(p.cast::<u8>().as_ptr() as usize % 64, 0);
    }
    assert_eq!(c.cast::<u8>().as_ptr() as usize % 256, 0);
    assert_eq!(
        b.cast::<u8>().as_ptr() as usize - a.cast::<u8>().as_ptr() as usize,
        64
    );
    let end = c.cast::<u8>().as_ptr() as usize + 8 - a.cast::<u8>().as_ptr() as usize;
    assert_eq!(g.stats().used, end, "padding counts toward the cycle");
}

#[test]
fn zero_size_requests_get_an_aligned_dangling_pointer_and_overflow_is_an_error() {
    let cfg = strict().initial_size(1024).alignment(32).build().unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "ZERO").unwrap();
    let z = g.alloc(Layout::from_size_align(0, 8).unwrap()).unwrap();
    assert_eq!(z.len(), 0);
    assert_eq!(z.cast::<u8>().as_ptr() as usize % 32, 0);
    assert_eq!(g.stats().used, 0, "a zero-size request takes no bytes");
    drop(g);
    let paged = strict().initial_size(4096).alignment(4096).build().unwrap();
    let g = ws.get_and_activate(&paged, "OVERFLOW").unwrap();
    let huge = Layout::from_size_align(isize::MAX as usize - 100, 1).unwrap();
    match g.alloc(huge) {
        Err(Error::Alloc(e)) => assert!(e.to_string().contains("overflows"), "{e}"),
        other => panic!("expected an overflow error, got {other:?}"),
    }
    assert_eq!(g.stats().used, 0);
}

// ---- 2.2 lifecycle -------------------------------------------------------------------

#[test]
fn enter_creates_increments_generation_and_leave_restores() {
    // Semantics §2.2: enter creates on first use, makes current, increments generation.
    let ws = workspaces();
    let cfg = WorkspaceConfig::default();
    assert!(ws.workspace("LIFE").is_none());
    assert_eq!(ws.current(), None);
    for generation in 1..=3 {
        let g = ws.get_and_activate(&cfg, "LIFE").unwrap();
        assert_eq!(g.generation(), generation);
        assert_eq!(ws.current().as_deref(), Some("LIFE"));
        assert!(ws.workspace("LIFE").unwrap().open);
    }
    let stats = ws.workspace("LIFE").unwrap();
    assert_eq!((stats.cycles, stats.generation, stats.open), (3, 3, false));
    assert_eq!(ws.current(), None);
}

#[test]
fn block_left_rewinds_every_cycle_to_the_same_memory() {
    // Semantics §2.2: with BlockLeft each cycle rewinds the offset to 0.
    let cfg = strict().initial_size(4096).build().unwrap();
    let ws = workspaces();
    let first = {
        let g = ws.get_and_activate(&cfg, "REWIND").unwrap();
        fill(&g, 3, 100)[0]
    };
    for _ in 0..3 {
        let g = ws.get_and_activate(&cfg, "REWIND").unwrap();
        assert_eq!(g.stats().used, 0);
        assert_eq!(fill(&g, 1, 100)[0], first);
    }
}

#[test]
fn external_spills_are_freed_at_cycle_end_and_the_buffer_does_not_grow() {
    // Semantics §2.2, §2.3: External spills count toward the cycle, are freed when it ends,
    // and the buffer keeps its size.
    let cfg = strict().initial_size(1024).build().unwrap();
    let ws = workspaces();
    let size = ws.get_and_activate(&cfg, "EXT").unwrap().stats().size;
    assert_eq!(size, capacity(1024));
    for _ in 0..3 {
        let g = ws.get_and_activate(&cfg, "EXT").unwrap();
        fill(&g, 1, size - 16); // fits
        let spilled = fill(&g, 2, 1000); // does not: two spills of 1008 counted bytes
        assert_ne!(spilled[0], spilled[1]);
        let s = g.stats();
        assert_eq!(s.spilled_bytes, 2016);
        assert_eq!(s.used, size - 16);
    }
    let s = ws.workspace("EXT").unwrap();
    assert_eq!(s.size, size, "External never grows the buffer");
    assert_eq!(s.spilled_bytes, 0, "spills are freed at cycle end");
    assert_eq!(s.max_cycle, size - 16 + 2016);
    assert_eq!(s.total_spilled_bytes, 3 * 2016);
}

#[test]
fn fail_policy_errors_and_leaves_the_offset_unchanged() {
    // Semantics §2.2: Fail returns a "workspace is full" error naming the workspace, the
    // request and the remaining bytes.
    let cfg = strict()
        .initial_size(1024)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "FAIL").unwrap();
    let size = g.stats().size;
    g.alloc(layout(size - 24)).unwrap();
    let used = g.stats().used;
    match g.alloc(layout(100)) {
        Err(e @ Error::WorkspaceFull { .. }) => {
            assert_eq!(
                e,
                Error::WorkspaceFull {
                    workspace: "FAIL".into(),
                    requested: 100 + 8,
                    available: 24,
                }
            );
            assert!(e.to_string().contains("[FAIL]"), "{e}");
        }
        other => panic!("expected WorkspaceFull, got {other:?}"),
    }
    assert_eq!(g.stats().used, used, "the offset did not move");
    assert_eq!(g.stats().spilled_bytes, 0);
    g.alloc(layout(16)).unwrap(); // the remaining 24 bytes (8 padding) are still usable
    assert_eq!(g.stats().used, size);
}

#[test]
fn nested_workspaces_restore_the_previous_current_one_and_track_parents() {
    // Semantics §2.5: entering B while A is current makes A B's parent; leaving B restores A.
    let cfg = strict().initial_size(4096).build().unwrap();
    let ws = workspaces();
    let a = ws.get_and_activate(&cfg, "OUTER").unwrap();
    assert_eq!(parent_of_current(), None);
    assert!(allocate_in_parent(layout(8)).is_none());
    {
        let _b = ws.get_and_activate(&cfg, "INNER").unwrap();
        assert_eq!(ws.current().as_deref(), Some("INNER"));
        assert_eq!(parent_of_current().as_deref(), Some("OUTER"));
        let here = allocate_in_current(layout(8)).unwrap().unwrap();
        let up = allocate_in_parent(layout(8)).unwrap().unwrap();
        assert_eq!(here.stamp.workspace_id(), "INNER");
        assert_eq!(up.stamp.workspace_id(), "OUTER");
        assert!(up.stamp.is_in("OUTER") && !up.stamp.is_in("INNER"));
        assert_eq!(ws.workspace("OUTER").unwrap().used, 8);
        {
            let _out = ws.scope_out();
            assert_eq!(ws.current(), None);
            assert!(allocate_in_current(layout(8)).is_none());
            assert!(allocate_in_parent(layout(8)).is_none());
        }
        assert_eq!(ws.current().as_deref(), Some("INNER"));
    }
    assert_eq!(ws.current().as_deref(), Some("OUTER"));
    assert!(ws.workspace("OUTER").unwrap().open);
    assert!(!ws.workspace("INNER").unwrap().open);
    drop(a);
    assert_eq!(ws.current(), None);
}

#[test]
fn reentering_the_current_workspace_only_nests() {
    // Semantics §2.2: re-entry increments a nesting counter: no new generation, no rewind.
    let cfg = strict().initial_size(4096).build().unwrap();
    let ws = workspaces();
    let outer = ws.get_and_activate(&cfg, "REENTER").unwrap();
    let kept = outer.alloc_memory(layout(64)).unwrap();
    write(&kept, 7);
    {
        let inner = ws.get_and_activate(&cfg, "REENTER").unwrap();
        assert_eq!(inner.generation(), 1);
        assert_eq!(inner.stats().used, 64, "no rewind");
        inner.alloc(layout(64)).unwrap();
        kept.stamp.check("add", "X").unwrap();
    }
    // Leaving the inner entry did not end the cycle.
    kept.stamp.check("add", "X").unwrap();
    assert_eq!(read(&kept), vec![7; 64]);
    assert_eq!(outer.stats().used, 128);
    assert_eq!(ws.workspace("REENTER").unwrap().cycles, 0);
    drop(outer);
    assert_eq!(ws.workspace("REENTER").unwrap().cycles, 1);
}

#[test]
fn destroy_frees_and_invalidates_and_unknown_ids_are_errors() {
    // Semantics §2.2 Destroy, §2.5 manager.
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    assert_eq!(
        ws.destroy("NOPE"),
        Err(Error::NoSuchWorkspace {
            workspace: "NOPE".into()
        })
    );
    assert!(matches!(
        allocate_in("NOPE", layout(8)),
        Err(Error::NoSuchWorkspace { .. })
    ));
    let memory = {
        let g = ws.get_and_activate(&cfg, "DESTROY").unwrap();
        g.alloc_memory(layout(8)).unwrap()
    };
    assert!(matches!(
        allocate_in("DESTROY", layout(8)),
        Err(Error::WorkspaceNotOpen { .. })
    ));
    ws.destroy("DESTROY").unwrap();
    assert!(ws.workspace("DESTROY").is_none());
    assert!(matches!(
        memory.stamp.check("add", "X"),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
    // A new workspace under the same id is a different workspace.
    let g = ws.get_and_activate(&cfg, "DESTROY").unwrap();
    assert_eq!(g.generation(), 1);
    assert!(!memory.stamp.is_in("DESTROY"));
    drop(g);
    ws.get_and_activate(&cfg, "OTHER").unwrap();
    assert!(ws.statistics().len() >= 2);
    assert_eq!(ws.destroy_all_for_current_thread(), 2);
    assert!(ws.statistics().is_empty());
}

#[test]
fn destroying_an_open_workspace_defers_the_free_to_its_last_guard() {
    // Semantics §2.2: destroy invalidates at once; the guard still owns the memory it lent.
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    let g = ws.get_and_activate(&cfg, "DEFER").unwrap();
    let mut v = allocator_api2::vec::Vec::new_in(&g);
    v.extend_from_slice(&[5u32; 100]);
    let stamped = g.alloc_memory(layout(4)).unwrap();
    ws.destroy("DEFER").unwrap();
    assert!(stamped.stamp.check("add", "X").is_err());
    assert!(matches!(
        g.alloc(layout(4)),
        Err(Error::WorkspaceNotOpen { .. })
    ));
    assert_eq!(v.iter().sum::<u32>(), 500, "lent memory is still there");
    drop(v);
    drop(g);
}

#[test]
fn statistics_have_every_figure_and_a_printed_form() {
    // Semantics §2.5: buffer size, used, max cycle, spilled, pinned, cycles, generation.
    let ws = workspaces();
    let cfg = strict().initial_size(2048).build().unwrap();
    {
        let g = ws.get_and_activate(&cfg, "STATS").unwrap();
        fill(&g, 1, 100);
        let s = ws.workspace("STATS").unwrap();
        assert_eq!((s.used, s.open, s.generation, s.cycles), (100, true, 1, 0));
    }
    let s = ws.workspace("STATS").unwrap();
    assert_eq!(s.id, "STATS");
    assert_eq!((s.size, s.used, s.max_cycle), (capacity(2048), 0, 100));
    assert_eq!((s.spilled_bytes, s.pinned_bytes), (0, 0));
    assert!(ws.statistics().iter().any(|x| x == &s));
    let text = ws.allocation_statistics();
    assert!(
        text.contains("[STATS] size 2.00 KiB, used 0 B, max cycle 100 B"),
        "{text}"
    );
    assert!(text.contains("cycles 1, generation 1"), "{text}");
}

// ---- 2.3 learning --------------------------------------------------------------------

#[test]
fn first_loop_learns_max_cycle_times_1_3_after_the_first_cycle() {
    // Semantics §2.3: FirstLoop from size 0: the first cycle spills everything; at its end
    // the buffer is max_cycle x 1.3.
    let ws = workspaces();
    let cfg = WorkspaceConfig::default();
    {
        let g = ws.get_and_activate(&cfg, "FIRST").unwrap();
        fill(&g, 10, 1000);
        let s = g.stats();
        assert_eq!((s.size, s.used, s.spilled_bytes), (0, 0, 10 * 1008));
    }
    let s = ws.workspace("FIRST").unwrap();
    assert_eq!(s.max_cycle, 10_080);
    assert_eq!(s.size, capacity(13_104)); // 10080 x 1.3
    let g = ws.get_and_activate(&cfg, "FIRST").unwrap();
    fill(&g, 10, 1000);
    assert_eq!(g.stats().spilled_bytes, 0, "the second cycle fits");
}

#[test]
fn strict_learns_exactly_max_cycle() {
    // Semantics §2.1, §2.3: Strict does not overallocate.
    let ws = workspaces();
    let cfg = strict().build().unwrap();
    fill(&ws.get_and_activate(&cfg, "STRICT").unwrap(), 10, 1000);
    assert_eq!(ws.workspace("STRICT").unwrap().size, capacity(10_080));
    let g = ws.get_and_activate(&cfg, "STRICT").unwrap();
    fill(&g, 10, 1000);
    assert_eq!(
        g.stats().spilled_bytes,
        0,
        "x 1.0 is enough for the same cycle"
    );
}

#[test]
fn learned_size_is_clamped_to_min_and_max() {
    // Semantics §2.3: clamped to [min_size, max_size].
    let ws = workspaces();
    let small = WorkspaceConfig::builder()
        .min_size(64 << 10)
        .build()
        .unwrap();
    fill(&ws.get_and_activate(&small, "MIN").unwrap(), 1, 100);
    assert_eq!(ws.workspace("MIN").unwrap().size, capacity(64 << 10));
    let big = WorkspaceConfig::builder().max_size(4096).build().unwrap();
    fill(&ws.get_and_activate(&big, "MAX").unwrap(), 10, 1000);
    assert_eq!(ws.workspace("MAX").unwrap().size, capacity(4096));
}

#[test]
fn over_time_learns_after_n_cycles_from_the_largest() {
    // Semantics §2.3: OverTime spills until cycles >= cycles_before_initialization.
    let ws = workspaces();
    let cfg = strict()
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(3)
        .build()
        .unwrap();
    for (cycle, bytes) in [(1, 1000), (2, 3000), (3, 2000)] {
        assert_eq!(ws.workspace("OVERTIME").map_or(0, |s| s.size), 0);
        fill(&ws.get_and_activate(&cfg, "OVERTIME").unwrap(), 1, bytes);
        assert_eq!(ws.workspace("OVERTIME").unwrap().cycles, cycle);
    }
    assert_eq!(ws.workspace("OVERTIME").unwrap().size, capacity(3008));
    // Decision: the default 0 means "after the first cycle".
    let zero = strict()
        .policy_learning(LearningPolicy::OverTime)
        .build()
        .unwrap();
    fill(&ws.get_and_activate(&zero, "OVERTIME0").unwrap(), 1, 500);
    assert_eq!(ws.workspace("OVERTIME0").unwrap().size, capacity(512));
}

#[test]
fn learning_none_never_creates_a_buffer() {
    // Semantics §2.3: None: the size never changes.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    for _ in 0..3 {
        let g = ws.get_and_activate(&cfg, "NONE").unwrap();
        fill(&g, 2, 100);
        assert_eq!(g.stats().spilled_bytes, 224);
    }
    assert_eq!(ws.workspace("NONE").unwrap().size, 0);
}

#[test]
fn initial_size_never_relearns() {
    // Semantics §2.3: with initial_size > 0 the buffer exists from the start and FirstLoop
    // does nothing more.
    let ws = workspaces();
    for learning in [LearningPolicy::FirstLoop, LearningPolicy::OverTime] {
        let id = format!("INITIAL_{learning:?}");
        let cfg = WorkspaceConfig::builder()
            .initial_size(1000)
            .policy_learning(learning)
            .build()
            .unwrap();
        let size = ws.get_and_activate(&cfg, &id).unwrap().stats().size;
        assert_eq!(size, capacity(1312), "initial x 1.3, rounded to 16");
        for _ in 0..3 {
            let g = ws.get_and_activate(&cfg, &id).unwrap();
            fill(&g, 4, 1000);
            assert!(g.stats().spilled_bytes > 0);
        }
        assert_eq!(ws.workspace(&id).unwrap().size, size);
    }
}

#[test]
fn reallocate_grows_the_buffer_to_max_cycle_at_cycle_end() {
    // Semantics §2.3: a cycle that spilled ends by reallocating the buffer to max_cycle
    // (clamped to max_size, no overallocation), so the next cycle fits.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1000)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "REALLOC").unwrap();
        fill(&g, 5, 1000);
        assert!(g.stats().spilled_bytes > 0);
    }
    let s = ws.workspace("REALLOC").unwrap();
    assert_eq!(s.size, capacity(s.max_cycle));
    let g = ws.get_and_activate(&cfg, "REALLOC").unwrap();
    fill(&g, 5, 1000);
    assert_eq!(g.stats().spilled_bytes, 0);
    drop(g);
    // Clamped to max_size.
    let capped = WorkspaceConfig::builder()
        .initial_size(1000)
        .max_size(2048)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    fill(
        &ws.get_and_activate(&capped, "REALLOC_MAX").unwrap(),
        5,
        1000,
    );
    assert_eq!(ws.workspace("REALLOC_MAX").unwrap().size, capacity(2048));
}

#[test]
fn reallocate_before_the_first_learning_only_frees_spills() {
    // Semantics §2.3: before the first learning, spills are only freed.
    let ws = workspaces();
    let cfg = strict()
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(2)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    fill(
        &ws.get_and_activate(&cfg, "REALLOC_EARLY").unwrap(),
        2,
        1000,
    );
    let s = ws.workspace("REALLOC_EARLY").unwrap();
    assert_eq!((s.size, s.spilled_bytes), (0, 0));
    fill(
        &ws.get_and_activate(&cfg, "REALLOC_EARLY").unwrap(),
        2,
        1000,
    );
    assert_eq!(ws.workspace("REALLOC_EARLY").unwrap().size, capacity(2016));
}

// ---- 2.4 circular --------------------------------------------------------------------

fn ring(slots: f64) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(slots - 1.0)
        .build()
        .unwrap()
}

#[test]
fn circular_first_cycle_learns_block_and_slots() {
    // Semantics §2.4: block = first cycle x 1.3, buffer = block x (1 + limit),
    // slots = floor(1 + limit).
    let ws = workspaces();
    let cfg = ring(3.5);
    fill(&ws.get_and_activate(&cfg, "RING_LEARN").unwrap(), 1, 1000);
    let s = ws.workspace("RING_LEARN").unwrap();
    assert_eq!(s.max_cycle, 1008);
    assert_eq!(s.slots, 3);
    assert_eq!(s.size, capacity(1312 * 7 / 2)); // block round16(1008 x 1.3) = 1312
    assert_eq!(
        s.pinned_bytes,
        capacity(1000),
        "the first cycle's spill is pinned"
    );
}

#[test]
fn circular_memory_stays_intact_until_the_ring_wraps() {
    // Semantics §2.4: each cycle starts at a slot boundary; a cycle's memory stays valid
    // until the ring wraps over it, and the ring never wraps over memory still referenced
    // (semantics §3 Decision: the safe API never reads memory being reused).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1024)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(2.0)
        .build()
        .unwrap();
    let mut batches = Vec::new();
    for cycle in 0..3u8 {
        let g = ws.get_and_activate(&cfg, "RING").unwrap();
        let m = g.alloc_memory(layout(1000)).unwrap();
        write(&m, cycle + 1);
        batches.push(m);
    }
    assert_eq!(ws.workspace("RING").unwrap().slots, 3);
    let base = batches[0].ptr.as_ptr() as usize;
    for (i, m) in batches.iter().enumerate() {
        assert_eq!(m.ptr.as_ptr() as usize - base, i * 1024, "slot {i}");
        assert_eq!(read(m), vec![i as u8 + 1; 1000], "cycle {i} intact");
        m.stamp.check("read", "X").unwrap(); // exempt from the generation check
    }
    // Every slot is still referenced: the fourth cycle spills instead of wrapping.
    {
        let g = ws.get_and_activate(&cfg, "RING").unwrap();
        let m = g.alloc_memory(layout(1000)).unwrap();
        assert!(
            (m.ptr.as_ptr() as usize) < base || m.ptr.as_ptr() as usize >= base + 3 * 1024,
            "a cycle with every slot in use lands outside the ring"
        );
        write(&m, 7);
        assert!(ws.workspace("RING").unwrap().spilled_bytes >= 1000);
    }
    for (i, m) in batches.iter().enumerate() {
        assert_eq!(read(m), vec![i as u8 + 1; 1000], "cycle {i} still intact");
    }
    // Once the first batch is dropped, the ring wraps to its slot and reuses it.
    let first = batches.remove(0).ptr;
    let g = ws.get_and_activate(&cfg, "RING").unwrap();
    let m = g.alloc_memory(layout(1000)).unwrap();
    assert_eq!(m.ptr, first);
    write(&m, 9);
    assert_eq!(read(&m), vec![9; 1000]);
    assert_eq!(read(&batches[0]), vec![2; 1000]);
    assert_eq!(read(&batches[1]), vec![3; 1000]);
}

#[test]
fn a_ring_skips_slots_in_use_and_reuses_them_once_free() {
    // Semantics §2.4 with the validity Decision of §3: a slot whose memory is referenced is
    // skipped; the cycle goes to the next free slot, in ring order.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(256)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .build()
        .unwrap();
    let held = {
        let g = ws.get_and_activate(&cfg, "RING_SKIP").unwrap();
        let m = g.alloc_memory(layout(256)).unwrap();
        write(&m, 1);
        m
    };
    assert_eq!(ws.workspace("RING_SKIP").unwrap().slots, 2);
    let mut other = None;
    for cycle in 2..8u8 {
        let g = ws.get_and_activate(&cfg, "RING_SKIP").unwrap();
        let m = g.alloc_memory(layout(256)).unwrap();
        assert_ne!(
            m.ptr, held.ptr,
            "cycle {cycle} must not reuse the held slot"
        );
        assert_eq!(ws.workspace("RING_SKIP").unwrap().spilled_bytes, 0);
        write(&m, cycle);
        *other.get_or_insert(m.ptr) = m.ptr;
        assert_eq!(
            read(&held),
            vec![1; 256],
            "held batch intact at cycle {cycle}"
        );
    }
    let held_ptr = held.ptr;
    drop(held);
    let g = ws.get_and_activate(&cfg, "RING_SKIP").unwrap();
    let m = g.alloc_memory(layout(256)).unwrap();
    assert!(
        m.ptr == held_ptr || Some(m.ptr) == other,
        "back in the ring"
    );
    assert_eq!(ws.workspace("RING_SKIP").unwrap().spilled_bytes, 0);
}

#[test]
fn a_one_slot_ring_spills_while_its_slot_is_in_use() {
    // Semantics §2.4: Strict makes a ring of one slot; it never overwrites live memory.
    let ws = workspaces();
    let cfg = strict()
        .initial_size(512)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap();
    let held = {
        let g = ws.get_and_activate(&cfg, "RING_ONE").unwrap();
        let m = g.alloc_memory(layout(512)).unwrap();
        write(&m, 3);
        m
    };
    assert_eq!(ws.workspace("RING_ONE").unwrap().slots, 1);
    {
        let g = ws.get_and_activate(&cfg, "RING_ONE").unwrap();
        let m = g.alloc_memory(layout(512)).unwrap();
        assert_ne!(m.ptr, held.ptr);
        write(&m, 4);
        assert_eq!(ws.workspace("RING_ONE").unwrap().spilled_bytes, 512);
    }
    assert_eq!(read(&held), vec![3; 512]);
    let held_ptr = held.ptr;
    drop(held);
    let g = ws.get_and_activate(&cfg, "RING_ONE").unwrap();
    assert_eq!(g.alloc_memory(layout(512)).unwrap().ptr, held_ptr);
}

#[test]
fn a_consumer_thread_never_sees_a_batch_overwritten() {
    // Semantics §2.4 and §6: a producer hands batches from a ring to a slower consumer; the
    // ring must not lap the consumer, so every batch reads back as it was written.
    let (to_consumer, batches) = std::sync::mpsc::channel::<(u8, WorkspaceMemory)>();
    let consumer = std::thread::spawn(move || {
        let mut seen = 0;
        for (tag, batch) in batches {
            std::thread::sleep(std::time::Duration::from_micros(300));
            batch.stamp.check("read", "X").unwrap();
            assert_eq!(
                read(&batch),
                vec![tag; batch.len],
                "batch {tag} was overwritten"
            );
            seen += 1;
        }
        seen
    });
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(2.0)
        .build()
        .unwrap();
    for tag in 0..60u8 {
        let g = ws.get_and_activate(&cfg, "RING_HANDOFF").unwrap();
        let m = g.alloc_memory(layout(4000)).unwrap();
        write(&m, tag);
        to_consumer.send((tag, m)).unwrap();
    }
    drop(to_consumer);
    assert_eq!(consumer.join().unwrap(), 60);
    ws.destroy("RING_HANDOFF").unwrap();
}

#[test]
fn circular_request_larger_than_the_buffer_spills_or_fails_without_looping() {
    // Semantics §2.4 Decision: never loop; spill or fail by policy. A cycle larger than a
    // block spills, and spills stay pinned for two cycles.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1024)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "RING_BIG").unwrap();
        let big = g.alloc_memory(layout(10_000)).unwrap();
        write(&big, 1);
        let over = g.alloc_memory(layout(1000)).unwrap(); // fits the block
        let spill = g.alloc_memory(layout(100)).unwrap(); // passes the block: spills
        assert_eq!(over.ptr.as_ptr() as usize % 16, 0);
        assert!(g.stats().spilled_bytes >= 10_000 + 112);
        drop((big, spill));
    }
    let pinned = ws.workspace("RING_BIG").unwrap().pinned_bytes;
    assert!(pinned >= 10_000 + 100);
    drop(ws.get_and_activate(&cfg, "RING_BIG").unwrap());
    assert_eq!(ws.workspace("RING_BIG").unwrap().pinned_bytes, pinned);
    drop(ws.get_and_activate(&cfg, "RING_BIG").unwrap());
    assert_eq!(
        ws.workspace("RING_BIG").unwrap().pinned_bytes,
        0,
        "released 2 cycles later"
    );

    let failing = cfg
        .to_builder()
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&failing, "RING_FAIL").unwrap();
    assert!(matches!(
        g.alloc(layout(10_000)),
        Err(Error::WorkspaceFull { .. })
    ));
}

#[test]
fn circular_reallocate_rebuilds_the_ring_two_cycles_after_a_spill() {
    // Semantics §2.4: with Reallocate the ring is rebuilt larger once the spills are no
    // longer reachable (2 cycles later).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1024)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    let size = ws.get_and_activate(&cfg, "RING_GROW").unwrap().stats().size;
    fill(&ws.get_and_activate(&cfg, "RING_GROW").unwrap(), 2, 1000); // spills
    drop(ws.get_and_activate(&cfg, "RING_GROW").unwrap());
    assert_eq!(ws.workspace("RING_GROW").unwrap().size, size);
    drop(ws.get_and_activate(&cfg, "RING_GROW").unwrap());
    let s = ws.workspace("RING_GROW").unwrap();
    assert_eq!(s.max_cycle, 1000 + 1008);
    assert_eq!(
        s.size,
        capacity(2008 * 2),
        "block = max_cycle, same slot count"
    );
    let g = ws.get_and_activate(&cfg, "RING_GROW").unwrap();
    fill(&g, 2, 1000);
    assert_eq!(g.stats().spilled_bytes, 0);
}

#[test]
fn circular_reallocate_stops_spilling_once_the_ring_is_rebuilt() {
    // Semantics §2.4: a ring that spills with Reallocate is rebuilt larger two cycles
    // later, whatever the pool's size classes make of the old ring's capacity: cycles that
    // outgrew the learned slot spill for a bounded number of cycles, not forever.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(3.0)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    fill(&ws.get_and_activate(&cfg, "RING_REBUILD").unwrap(), 2, 4000);
    let learned = ws.workspace("RING_REBUILD").unwrap();
    assert_eq!(learned.slots, 4, "slots = floor(1 + 3.0)");
    let mut spills = Vec::new();
    for _ in 0..8 {
        let g = ws.get_and_activate(&cfg, "RING_REBUILD").unwrap();
        fill(&g, 3, 4000);
        spills.push(g.stats().spilled_bytes);
    }
    assert_eq!(
        spills[0], 4000,
        "a 12,000-byte cycle outgrows a 10,400-byte slot"
    );
    assert!(
        spills[3..].iter().all(|&s| s == 0),
        "the ring is rebuilt two cycles after the spill; spills per cycle: {spills:?}"
    );
    let rebuilt = ws.workspace("RING_REBUILD").unwrap();
    assert_eq!(rebuilt.max_cycle, 12_000);
    assert_eq!(rebuilt.slots, 4, "a rebuilt ring keeps its slot count");
    assert_eq!(
        rebuilt.size,
        capacity(4 * 12_000),
        "slots of max_cycle bytes"
    );
}

// ---- memory source -------------------------------------------------------------------

#[test]
fn a_workspace_draws_from_its_own_source_within_its_limit() {
    // The buffer and the spills come from the configured source's pool, whose limit
    // applies; the global pool is checked in workspace_pool_counters.rs.
    let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(64 << 10).build()));
    let cfg = WorkspaceConfig::builder().source(source).build().unwrap();
    assert_eq!(cfg.source(), source);
    assert_eq!(WorkspaceConfig::default().source(), MemorySource::global());
    let ws = workspaces();
    {
        let g = ws.get_and_activate(&cfg, "OWN_SOURCE").unwrap();
        fill(&g, 4, 1000);
        let spills = source.pool().stats();
        assert_eq!(
            spills.live_bytes,
            4 * capacity(1000),
            "the first cycle spills into it"
        );
        assert_eq!(spills.workspace_bytes, spills.live_bytes);
    }
    let size = ws.workspace("OWN_SOURCE").unwrap().size;
    assert_eq!(size, capacity(5248), "learned: 4,032 x 1.3, rounded to 16");
    assert_eq!(
        source.pool().stats().live_bytes,
        size,
        "the learned buffer is its block"
    );
    let g = ws.get_and_activate(&cfg, "OWN_SOURCE").unwrap();
    fill(&g, 4, 1000);
    assert_eq!(g.stats().spilled_bytes, 0);
    match g.alloc(layout(100 << 10)) {
        Err(Error::Alloc(e @ AllocError::OutOfMemory { requested, .. })) => {
            assert_eq!(requested, 100 << 10);
            assert!(e.to_string().contains("102400 bytes"), "{e}");
        }
        other => panic!("a spill over the source's limit must fail, got {other:?}"),
    }
    drop(g);
    // The configuration of the first creation wins, as for every other setting.
    let other = MemorySource::new(Pool::new(Limits::unlimited()));
    let again = cfg.to_builder().source(other).build().unwrap();
    let before = source.pool().stats().total_allocated_bytes;
    {
        let g = ws.get_and_activate(&again, "OWN_SOURCE").unwrap();
        fill(&g, 2, 10_000);
        assert!(g.stats().spilled_bytes > 0);
    }
    assert_eq!(other.pool().stats().total_allocated_bytes, 0);
    assert!(source.pool().stats().total_allocated_bytes > before);
    ws.destroy("OWN_SOURCE").unwrap();
    assert_eq!(
        source.pool().stats().live_bytes,
        0,
        "destroy gives the buffer back"
    );
}

// ---- location ------------------------------------------------------------------------

#[test]
fn mmap_workspace_round_trips_data_in_a_nameless_temp_file() {
    // Semantics §2.1: policy_location Mmap; data written in a cycle reads back intact.
    let ws = workspaces();
    let cfg = strict()
        .initial_size(64 << 10)
        .policy_location(LocationPolicy::Mmap { path: None })
        .build()
        .unwrap();
    let ours = |dir: &std::path::Path| -> usize {
        let pid = format!("ndmem-workspace-{}-", std::process::id());
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&pid))
            })
            .count()
    };
    {
        let g = ws.get_and_activate(&cfg, "MMAP").unwrap();
        assert_eq!(g.stats().size, 64 << 10);
        let m = g.alloc_memory(layout(60 << 10)).unwrap();
        let pattern: Vec<u8> = (0..m.len).map(|i| (i * 7 % 251) as u8).collect();
        m.stamp.check("write", "X").unwrap();
        // SAFETY: fresh workspace memory of `m.len` bytes, checked just before.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), m.ptr.as_ptr(), m.len) };
        assert_eq!(read(&m), pattern);
        assert_eq!(g.stats().spilled_bytes, 0);
    }
    // The temporary file has no name while mapped, nor after (see files.rs).
    let dir = std::env::temp_dir();
    assert_eq!(ours(&dir), 0);
    ws.destroy("MMAP").unwrap();
    drop(ws.get_and_activate(&cfg, "MMAP2").unwrap());
    ws.destroy("MMAP2").unwrap();
    assert_eq!(ours(&dir), 0);
}

#[test]
fn mmap_workspace_with_a_user_path_keeps_the_file_and_claims_it() {
    let path = std::env::temp_dir().join(format!("ndmem-test-user-{}.bin", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let ws = workspaces();
    let cfg = strict()
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.clone()),
        })
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "MMAP_USER").unwrap();
        write(&g.alloc_memory(layout(100)).unwrap(), 0xAB);
        // A second workspace may not map the same file.
        match ws.get_and_activate(&cfg, "MMAP_USER2") {
            Err(Error::WorkspaceFile { message, .. }) => {
                assert!(message.contains("MMAP_USER"), "{message}")
            }
            other => panic!("expected the file to be claimed, got {other:?}"),
        }
    }
    ws.destroy("MMAP_USER").unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        bytes.len(),
        4096usize.next_multiple_of(ndmem::alloc::page_size())
    );
    assert_eq!(&bytes[..100], &[0xAB; 100][..]);
    // Released on destroy: another workspace may map it now.
    drop(ws.get_and_activate(&cfg, "MMAP_USER2").unwrap());
    ws.destroy("MMAP_USER2").unwrap();
    std::fs::remove_file(&path).unwrap();
}

// ---- allocator_api2 ------------------------------------------------------------------

#[test]
fn allocator_api2_vec_lives_in_the_workspace() {
    let ws = workspaces();
    let cfg = strict().initial_size(64 << 10).build().unwrap();
    for _ in 0..3 {
        let g = ws.get_and_activate(&cfg, "VEC").unwrap();
        let mut v: allocator_api2::vec::Vec<u64, _> = allocator_api2::vec::Vec::new_in(&g);
        for i in 0..1000u64 {
            v.push(i); // grows in place: it is the last allocation
        }
        assert_eq!(v.iter().sum::<u64>(), 999 * 1000 / 2);
        let s = g.stats();
        assert_eq!(s.spilled_bytes, 0);
        assert!(
            s.used >= 8000 && s.used < 16_000,
            "grew in place: {}",
            s.used
        );
        let mut w: allocator_api2::vec::Vec<u8, _> = allocator_api2::vec::Vec::new_in(&g);
        w.extend_from_slice(b"workspace");
        w.shrink_to_fit();
        assert_eq!(&w[..], b"workspace");
    }
}

#[test]
fn allocator_grow_and_shrink_move_when_they_must_and_keep_the_bytes() {
    use allocator_api2::alloc::Allocator;
    let ws = workspaces();
    let cfg = strict().initial_size(64 << 10).build().unwrap();
    let g = ws.get_and_activate(&cfg, "VEC_MOVE").unwrap();
    // Interleaved pushes: neither vector is the last allocation when it grows, so every
    // growth moves it and copies its elements.
    let mut a: allocator_api2::vec::Vec<u32, _> = allocator_api2::vec::Vec::new_in(&g);
    let mut b: allocator_api2::vec::Vec<u32, _> = allocator_api2::vec::Vec::new_in(&g);
    for i in 0..1000u32 {
        a.push(i);
        b.push(i * 3);
    }
    assert!(a.iter().copied().eq(0..1000));
    assert!(b.iter().copied().eq((0..1000).map(|i| i * 3)));
    // Shrinking to a stricter alignment than the block has moves it, keeping the prefix.
    let old = Layout::from_size_align(100, 16).unwrap();
    let block = loop {
        let p = (&g).allocate(old).unwrap().cast::<u8>();
        if p.as_ptr() as usize % 256 != 0 {
            break p;
        }
    };
    // SAFETY: `block` is a fresh allocation of 100 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping((0..100u8).collect::<Vec<_>>().as_ptr(), block.as_ptr(), 100)
    };
    let new = Layout::from_size_align(50, 256).unwrap();
    // SAFETY: `block` was allocated by this allocator with `old`; `new` is not larger.
    let moved = unsafe { (&g).shrink(block, old, new) }
        .unwrap()
        .cast::<u8>();
    assert_ne!(moved, block);
    assert_eq!(moved.as_ptr() as usize % 256, 0);
    // SAFETY: `moved` holds 50 bytes, valid until the cycle ends.
    let bytes = unsafe { std::slice::from_raw_parts(moved.as_ptr(), 50) };
    assert!(bytes.iter().copied().eq(0..50u8));
    assert_eq!(g.stats().spilled_bytes, 0);
}

#[test]
fn a_hashbrown_map_lives_in_the_workspace() {
    // The guard is an allocator_api2 Allocator, so hashbrown's maps can live in a cycle.
    let ws = workspaces();
    let cfg = strict().initial_size(256 << 10).build().unwrap();
    for cycle in 0..3u64 {
        let g = ws.get_and_activate(&cfg, "MAP").unwrap();
        let mut counts = hashbrown::HashMap::new_in(&g);
        for word in (0..5000u64).map(|i| (i * 7 + cycle) % 97) {
            *counts.entry(word).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 97);
        assert_eq!(counts.values().map(|&c| c as u64).sum::<u64>(), 5000);
        let s = g.stats();
        assert_eq!(
            s.spilled_bytes, 0,
            "the map's tables were bumped in the buffer"
        );
        assert!(
            s.used > 97 * 12,
            "the map's tables live in the workspace: {s:?}"
        );
    }
}

// ---- 3 stamps ------------------------------------------------------------------------

#[test]
fn stamps_refuse_leaked_outdated_destroyed_and_foreign_memory() {
    // Semantics §3
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    let old = {
        let g = ws.get_and_activate(&cfg, "STAMP").unwrap();
        let m = allocate_in_current(layout(8)).unwrap().unwrap();
        m.stamp.check("add", "X").unwrap();
        assert_eq!((m.stamp.workspace_id(), m.stamp.generation()), ("STAMP", 1));
        assert!(!m.stamp.is_circular() && m.stamp.is_in("STAMP"));
        // Another thread may not use it.
        let foreign = m.clone();
        let err = std::thread::spawn(move || foreign.stamp.check("mul", "Y"))
            .join()
            .unwrap();
        assert!(
            matches!(err, Err(Error::WrongThread { ref workspace, .. }) if workspace == "STAMP")
        );
        drop(g);
        m
    };
    assert_eq!(
        old.stamp.check("add", "X"),
        Err(Error::LeakedWorkspacePointer {
            op: "add".into(),
            arg: "X".into(),
            workspace: "STAMP".into()
        })
    );
    let g = ws.get_and_activate(&cfg, "STAMP").unwrap();
    let err = old.stamp.check("add", "Y").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Op [add] Y argument uses outdated workspace pointer from workspace [STAMP] (allocated in generation 1, now 2)"
    );
    let fresh = allocate_in("STAMP", layout(8)).unwrap();
    drop(g);
    ws.destroy("STAMP").unwrap();
    for m in [&old, &fresh] {
        assert!(matches!(
            m.stamp.check("add", "X"),
            Err(Error::LeakedWorkspacePointer { .. })
        ));
    }
}

#[test]
fn circular_stamps_are_exempt_but_destroyed_is_an_error_and_memory_stays_alive() {
    // Semantics §3: circular workspaces are exempt from the generation (and thread) check.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(3.0)
        .build()
        .unwrap();
    let batch = {
        let _g = ws.get_and_activate(&cfg, "CIRC_STAMP").unwrap();
        let m = allocate_in_current(layout(256)).unwrap().unwrap();
        write(&m, 42);
        m
    };
    drop(ws.get_and_activate(&cfg, "CIRC_STAMP").unwrap());
    assert!(batch.stamp.is_circular());
    batch.stamp.check("read", "X").unwrap();
    let sent = batch.clone();
    let on_consumer = std::thread::spawn(move || {
        sent.stamp.check("read", "X")?;
        Ok::<_, Error>(read(&sent))
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(on_consumer, vec![42; 256]);
    ws.destroy("CIRC_STAMP").unwrap();
    assert!(matches!(
        batch.stamp.check("read", "X"),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
    // The stamp keeps the ring alive: reading after destroy is not a use-after-free
    // (valgrind checks this), though the check says the data is no longer valid.
    assert_eq!(read(&batch), vec![42; 256]);
}

#[test]
fn a_thread_exit_destroys_its_workspaces() {
    // Semantics §2.2 Decision: a thread's workspaces are freed when it exits.
    let (memory, circular) = std::thread::spawn(|| {
        let ws = workspaces();
        let g = ws
            .get_and_activate(&WorkspaceConfig::default(), "EXITING")
            .unwrap();
        let m = g.alloc_memory(layout(64)).unwrap();
        let ring = WorkspaceConfig::builder()
            .initial_size(1024)
            .policy_reset(ResetPolicy::EndOfBuffer)
            .overallocation_limit(1.0)
            .build()
            .unwrap();
        let c = ws
            .get_and_activate(&ring, "EXITING_RING")
            .unwrap()
            .alloc_memory(layout(64))
            .unwrap();
        drop(g);
        (m, c)
    })
    .join()
    .unwrap();
    assert!(matches!(
        memory.stamp.check("add", "X"),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
    assert!(matches!(
        circular.stamp.check("add", "X"),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
}
