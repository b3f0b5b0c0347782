//! The lifecycle (semantics §2.2): enter and leave, rewinds, spills, the Fail policy,
//! nesting, destroy, statistics, and the workspaces freed at a thread's exit.

use ndmem::workspace::{allocate_in, allocate_in_current, allocate_in_parent, parent_of_current};
use ndmem::{workspaces, DType, Error, ResetPolicy, SpillPolicy, Tensor, WorkspaceConfig};

use crate::{capacity, fill, layout, read, strict, write};

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
    g.alloc(layout(size - 24)).unwrap(); // takes size - 16: rounded to the alignment
    let used = g.stats().used;
    assert_eq!(used, size - 16);
    match g.alloc(layout(100)) {
        Err(e @ Error::WorkspaceFull { .. }) => {
            assert_eq!(
                e,
                Error::WorkspaceFull {
                    workspace: "FAIL".into(),
                    requested: 112,
                    available: 16,
                }
            );
            assert!(e.to_string().contains("[FAIL]"), "{e}");
        }
        other => panic!("expected WorkspaceFull, got {other:?}"),
    }
    assert_eq!(g.stats().used, used, "the offset did not move");
    assert_eq!(g.stats().spilled_bytes, 0);
    g.alloc(layout(16)).unwrap(); // the remaining 16 bytes are still usable
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
        assert_eq!(
            ws.workspace("OUTER").unwrap().used,
            16,
            "8 bytes rounded to 16"
        );
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
fn each_cycle_has_the_parent_that_was_current_when_it_started() {
    // The parent is the workspace current at the start of *this* cycle: it follows the
    // caller from cycle to cycle, and a destroyed parent is none.
    let ws = workspaces();
    let cfg = WorkspaceConfig::default();
    let child_under = |parent: Option<&str>| {
        let _outer = parent.map(|p| ws.get_and_activate(&cfg, p).unwrap());
        let _child = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        parent_of_current()
    };
    assert_eq!(child_under(Some("PARENTS_A")).as_deref(), Some("PARENTS_A"));
    assert_eq!(child_under(None), None);
    assert_eq!(child_under(Some("PARENTS_B")).as_deref(), Some("PARENTS_B"));
    assert_eq!(child_under(Some("PARENTS_B")).as_deref(), Some("PARENTS_B"));
    assert_eq!(child_under(Some("PARENTS_A")).as_deref(), Some("PARENTS_A"));
    {
        // Entered under a scope-out while its last parent is open: no parent.
        let _a = ws.get_and_activate(&cfg, "PARENTS_A").unwrap();
        let _out = ws.scope_out();
        let _child = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        assert_eq!(parent_of_current(), None);
    }
    {
        // The parent's cycle ends before the child's: it is no parent any more.
        let outer = ws.get_and_activate(&cfg, "PARENTS_A").unwrap();
        let _child = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        drop(outer);
        assert_eq!(parent_of_current(), None);
    }
    {
        // The parent's cycle ends and a later cycle of it starts while the child's cycle
        // runs (the child re-entered only nests): that later cycle is not the child's
        // parent, so `leverage` from the child detaches.
        let outer = ws.get_and_activate(&cfg, "PARENTS_A").unwrap();
        let child = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        drop(outer);
        let _outer_again = ws.get_and_activate(&cfg, "PARENTS_A").unwrap();
        let _child_again = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        assert_eq!(ws.current().as_deref(), Some("PARENTS_CHILD"));
        assert_eq!(parent_of_current(), None);
        let t = Tensor::ones(DType::F32, &[4]).unwrap();
        let copy = t.leverage().unwrap();
        assert_eq!(copy.workspace(), None);
        assert_eq!(copy.to_vec::<f32>().unwrap(), vec![1.0; 4]);
        drop((copy, t));
        drop(child); // guards may be dropped in any order
    }
    {
        // Destroyed while the child's cycle runs: no parent either.
        let outer = ws.get_and_activate(&cfg, "PARENTS_B").unwrap();
        let _child = ws.get_and_activate(&cfg, "PARENTS_CHILD").unwrap();
        ws.destroy("PARENTS_B").unwrap();
        drop(outer);
        assert_eq!(parent_of_current(), None);
    }
    for id in ["PARENTS_A", "PARENTS_CHILD"] {
        ws.destroy(id).unwrap();
    }
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
fn a_destroyed_current_workspace_refuses_tensors_until_its_guard_drops() {
    // Semantics §2.2: it stays current (named, no longer existing); tensors created
    // meanwhile are WorkspaceNotOpen, not placed elsewhere unasked; scope_out works.
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    let g = ws.get_and_activate(&cfg, "DEAD_CURRENT").unwrap();
    ws.destroy("DEAD_CURRENT").unwrap();
    assert_eq!(ws.current().as_deref(), Some("DEAD_CURRENT"));
    assert!(!ws.exists("DEAD_CURRENT"));
    assert!(matches!(
        Tensor::ones(DType::F32, &[4]),
        Err(Error::WorkspaceNotOpen { .. })
    ));
    {
        let _out = ws.scope_out();
        assert_eq!(Tensor::ones(DType::F32, &[4]).unwrap().workspace(), None);
    }
    drop(g);
    assert_eq!(ws.current(), None);
    assert!(Tensor::ones(DType::F32, &[4]).is_ok());
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
        // 100 bytes take 112: each request is rounded up to the alignment (16).
        assert_eq!((s.used, s.open, s.generation, s.cycles), (112, true, 1, 0));
    }
    let s = ws.workspace("STATS").unwrap();
    assert_eq!(s.id, "STATS");
    assert_eq!((s.size, s.used, s.max_cycle), (capacity(2048), 0, 112));
    assert_eq!((s.spilled_bytes, s.pinned_bytes), (0, 0));
    assert!(ws.statistics().iter().any(|x| x == &s));
    let text = ws.allocation_statistics();
    assert!(
        text.contains("[STATS] size 2.00 KiB, used 0 B, max cycle 112 B"),
        "{text}"
    );
    assert!(text.contains("cycles 1, generation 1"), "{text}");
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

#[test]
fn a_guard_dropped_out_of_order_removes_its_own_entry_only() {
    // Semantics §2.5: guards may be dropped in any order. Each removes the entry it made,
    // not the topmost one of the same workspace (or the topmost scope-out).
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    {
        // A scope-out dropped while an inner one lives: the inner one stays in force.
        let outer = ws.scope_out();
        let g = ws.get_and_activate(&cfg, "ORDER_SO").unwrap();
        let inner = ws.scope_out();
        drop(outer);
        assert_eq!(ws.current(), None, "the inner scope-out is still alive");
        let t = Tensor::ones(DType::F32, &[2]).unwrap();
        assert_eq!(t.workspace(), None);
        drop(inner);
        assert_eq!(ws.current().as_deref(), Some("ORDER_SO"));
        drop(g);
        assert!(t.is_valid(), "a pool tensor outlives the cycle");
        assert_eq!(ws.current(), None);
    }
    {
        // A workspace entered twice around another: dropping the first guard leaves the
        // second entry, made last, current.
        let a = ws.get_and_activate(&cfg, "ORDER_A").unwrap();
        let b = ws.get_and_activate(&cfg, "ORDER_B").unwrap();
        let a2 = ws.get_and_activate(&cfg, "ORDER_A").unwrap();
        drop(a);
        assert_eq!(ws.current().as_deref(), Some("ORDER_A"));
        assert!(
            ws.workspace("ORDER_A").unwrap().open,
            "a2 keeps the cycle open"
        );
        drop(a2);
        assert_eq!(ws.current().as_deref(), Some("ORDER_B"));
        assert!(!ws.workspace("ORDER_A").unwrap().open);
        drop(b);
        assert_eq!(ws.current(), None);
    }
    for id in ["ORDER_SO", "ORDER_A", "ORDER_B"] {
        ws.destroy(id).unwrap();
    }
}
