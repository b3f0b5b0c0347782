//! Learning (semantics §2.3): FirstLoop, Strict, clamping, OverTime, None, a fixed initial
//! size, and Reallocate.

use ndmem::alloc::{Limits, Pool};
use ndmem::{workspaces, LearningPolicy, MemorySource, SpillPolicy, WorkspaceConfig};

use crate::{capacity, fill, strict};

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
fn a_first_loop_whose_first_cycle_asks_for_nothing_learns_from_the_first_that_does() {
    // Semantics §2.3: an empty cycle learns no buffer of zero bytes; the next cycle spills
    // and is the one learned from.
    let ws = workspaces();
    let cfg = strict().build().unwrap();
    drop(ws.get_and_activate(&cfg, "EMPTY_FIRST").unwrap());
    let s = ws.workspace("EMPTY_FIRST").unwrap();
    assert_eq!((s.cycles, s.max_cycle, s.size), (1, 0, 0));
    {
        let g = ws.get_and_activate(&cfg, "EMPTY_FIRST").unwrap();
        fill(&g, 2, 1000);
        assert_eq!(g.stats().spilled_bytes, 2 * 1008);
    }
    assert_eq!(ws.workspace("EMPTY_FIRST").unwrap().size, capacity(2016));
    let g = ws.get_and_activate(&cfg, "EMPTY_FIRST").unwrap();
    fill(&g, 2, 1000);
    assert_eq!(g.stats().spilled_bytes, 0, "the third cycle fits");
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
fn an_empty_cycle_learns_nothing_even_under_a_min_size() {
    // Semantics §2.3: a first cycle that asked for nothing learns nothing, min_size or not
    // (it used to learn a min_size buffer from a cycle of zero bytes); FirstLoop and
    // OverTime alike.
    let ws = workspaces();
    for (id, learning) in [
        ("EMPTY_MIN_FIRST", LearningPolicy::FirstLoop),
        ("EMPTY_MIN_OVER", LearningPolicy::OverTime),
    ] {
        let cfg = WorkspaceConfig::builder()
            .min_size(64 << 10)
            .policy_learning(learning)
            .build()
            .unwrap();
        drop(ws.get_and_activate(&cfg, id).unwrap());
        let s = ws.workspace(id).unwrap();
        assert_eq!((s.cycles, s.max_cycle, s.size), (1, 0, 0), "{id}");
        fill(&ws.get_and_activate(&cfg, id).unwrap(), 1, 100);
        assert_eq!(ws.workspace(id).unwrap().size, capacity(64 << 10), "{id}");
    }
}

#[test]
fn a_learned_buffer_stops_at_max_size_rounded_down_to_the_alignment() {
    // Semantics §2.3: clamped, then aligned, but never past max_size: a cycle bumps no
    // further than max_size, so a 5000..6000 buffer at alignment 4096 is 4096 bytes (it was
    // 8192, half of it beyond any bump, all of it counted against the pool's limit).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .alignment(4096)
        .min_size(5000)
        .max_size(6000)
        .build()
        .unwrap();
    fill(&ws.get_and_activate(&cfg, "MAX_ALIGNED").unwrap(), 1, 10);
    assert_eq!(ws.workspace("MAX_ALIGNED").unwrap().size, capacity(4096));
    let g = ws.get_and_activate(&cfg, "MAX_ALIGNED").unwrap();
    fill(&g, 1, 4096);
    assert_eq!(g.stats().spilled_bytes, 0, "the whole buffer is bumped");
    fill(&g, 1, 10);
    assert!(g.stats().spilled_bytes > 0, "max_size reached: spilled");
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

#[test]
fn a_first_learned_buffer_the_pool_refuses_is_learned_again_at_its_learned_size() {
    // Semantics §2.3: a refused learned buffer fails nothing; the workspace keeps spilling
    // and tries again at a later cycle end, for the learned size (max_cycle x (1 + limit)),
    // not the smaller size of a workspace that gave up its buffer for a larger one.
    let ws = workspaces();
    let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(160 << 10).build()));
    let cfg = WorkspaceConfig::builder()
        .overallocation_limit(1.0)
        .source(source)
        .build()
        .unwrap();
    let cycle = || {
        let g = ws.get_and_activate(&cfg, "REFUSED_LEARNING").unwrap();
        fill(&g, 1, 100 << 10);
        drop(g);
        ws.workspace("REFUSED_LEARNING").unwrap()
    };
    for _ in 0..3 {
        let s = cycle();
        assert_eq!(s.size, 0, "200 KiB does not fit a pool of 160 KiB: {s:?}");
    }
    source.pool().set_max_bytes(Some(1 << 20)).unwrap();
    let s = cycle();
    assert_eq!(
        s.size,
        capacity(2 * s.max_cycle),
        "learned with its overallocation"
    );
    ws.destroy("REFUSED_LEARNING").unwrap();
}

/// A pool of 1 MiB, and a Reallocate workspace of 512 KiB drawing on it.
fn tight_reallocating() -> (MemorySource, WorkspaceConfig) {
    let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
    let cfg = strict()
        .initial_size(512 << 10)
        .policy_spill(SpillPolicy::Reallocate)
        .source(source)
        .build()
        .unwrap();
    (source, cfg)
}

#[test]
fn reallocate_in_a_pool_with_room_for_the_new_buffer_alone_frees_the_old_one_first() {
    // Semantics §2.3: a cycle that spilled with Reallocate ends by replacing the buffer,
    // so the next cycle fits. The pool (1 MiB) holds the old buffer and the cycle's spill
    // (512 + 320 KiB), and the new buffer alone (768 KiB), but not old and new together:
    // the old one goes first, as ND4J frees a workspace's buffer before the larger one.
    let ws = workspaces();
    let (source, cfg) = tight_reallocating();
    {
        let g = ws.get_and_activate(&cfg, "TIGHT_REALLOC").unwrap();
        fill(&g, 1, 400 << 10);
        fill(&g, 1, 300 << 10);
        assert_eq!(g.stats().spilled_bytes, 300 << 10);
    }
    let s = ws.workspace("TIGHT_REALLOC").unwrap();
    assert_eq!(s.size, capacity(700 << 10), "reallocated: {s:?}");
    let g = ws.get_and_activate(&cfg, "TIGHT_REALLOC").unwrap();
    fill(&g, 1, 400 << 10);
    fill(&g, 1, 300 << 10);
    assert_eq!(g.stats().spilled_bytes, 0, "the next cycle fits");
    assert_eq!(source.pool().stats().live_bytes, capacity(700 << 10));
}

#[test]
fn reallocate_refused_even_alone_keeps_a_buffer_of_the_old_size() {
    // Semantics §2.3: if the pool refuses a reallocated buffer, nothing fails and the
    // workspace keeps its buffer. A 1 MiB pool holds the 512 KiB buffer, a 64 KiB spill
    // and 448 KiB held outside the workspace; the new buffer (576 KiB, a 640 KiB block)
    // does not fit even with the old one freed: the workspace gets one of the old size.
    let ws = workspaces();
    let (source, cfg) = tight_reallocating();
    let _outside = source.pool().allocate(448 << 10, 16).unwrap();
    {
        let g = ws.get_and_activate(&cfg, "TIGHT_KEEP").unwrap();
        fill(&g, 1, 512 << 10);
        fill(&g, 1, 64 << 10);
        assert_eq!(g.stats().spilled_bytes, 64 << 10);
    }
    let s = ws.workspace("TIGHT_KEEP").unwrap();
    assert_eq!(
        (s.max_cycle, s.size),
        (576 << 10, 512 << 10),
        "the old size: {s:?}"
    );
    // The refusal says the new buffer cannot fit even with the old one freed: the old one
    // is kept, not freed and asked for back (one refusal at the cycle end, not two).
    assert_eq!(source.pool().stats().failed_allocations, 1);
    let g = ws.get_and_activate(&cfg, "TIGHT_KEEP").unwrap();
    fill(&g, 1, 512 << 10);
    assert_eq!(
        g.stats().spilled_bytes,
        0,
        "the buffer still serves a cycle"
    );
}
