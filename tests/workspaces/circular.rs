//! Circular workspaces (semantics §2.4): the ring's slots, memory intact until the ring
//! wraps, slots in use skipped, spills instead of loops, and the ring rebuilt larger.

use ndmem::alloc::{Limits, Pool};
use ndmem::workspace::WorkspaceMemory;
use ndmem::{workspaces, Error, MemorySource, ResetPolicy, SpillPolicy, WorkspaceConfig};

use crate::{capacity, fill, layout, read, strict, write};

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
fn a_failing_ring_whose_slots_are_all_held_refuses_until_one_is_dropped() {
    // Semantics §2.4: every slot referenced, the cycle has no slot; with Fail every request
    // is WorkspaceFull, and a dropped holder gives its slot back.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1024)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let held: Vec<WorkspaceMemory> = (0..2)
        .map(|_| {
            let g = ws.get_and_activate(&cfg, "RING_HELD").unwrap();
            g.alloc_memory(layout(100)).unwrap()
        })
        .collect();
    {
        let g = ws.get_and_activate(&cfg, "RING_HELD").unwrap();
        assert!(matches!(
            g.alloc_memory(layout(100)),
            Err(Error::WorkspaceFull { available: 0, .. })
        ));
    }
    drop(held);
    let g = ws.get_and_activate(&cfg, "RING_HELD").unwrap();
    let m = g.alloc_memory(layout(100)).unwrap();
    write(&m, 7);
    assert_eq!(read(&m), vec![7; 100]);
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
    assert_eq!(
        s.max_cycle,
        1008 + 1008,
        "each request rounded to the alignment"
    );
    assert_eq!(
        s.size,
        capacity(2016 * 2),
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

#[test]
fn statistics_say_when_a_ring_has_not_learned_its_slots_yet() {
    let ws = workspaces();
    let cfg = ring(3.5);
    {
        let g = ws.get_and_activate(&cfg, "RING_SHOWN").unwrap();
        fill(&g, 1, 100);
        let before = g.stats().to_string();
        assert!(
            before.contains("circular (slots not learned yet)"),
            "{before}"
        );
    }
    let after = ws.workspace("RING_SHOWN").unwrap().to_string();
    assert!(after.contains("circular (3 slots)"), "{after}");
}

#[test]
fn a_circular_cycle_bumps_no_further_than_max_size_off_the_alignment() {
    // Semantics §2.1: a cycle bumps no further than max_size. A circular workspace has no
    // bump limit of its own, so its ring must fit under max_size rounded down to the
    // alignment (5000 at 4096: one 4096-byte slot, not 8192 bytes).
    let ws = workspaces();
    let cfg = strict()
        .alignment(4096)
        .initial_size(5000)
        .max_size(5000)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "CIRC_MAX").unwrap();
        let page = layout(4096);
        let _first = g.alloc_memory(page).unwrap();
        let _second = g.alloc_memory(page).unwrap();
        let s = g.stats();
        assert!(s.used <= 5000, "bumped {} bytes", s.used);
        assert_eq!(
            (s.used, s.spilled_bytes),
            (4096, 4096),
            "the second page spilled"
        );
    }
    // Learned: a 3000-byte first cycle under max_size 1000 gives a ring within 1000 bytes.
    let cfg = strict()
        .max_size(1000)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "CIRC_MAX_LEARNED").unwrap();
        let _big = g.alloc_memory(layout(3000)).unwrap();
    }
    {
        let g = ws.get_and_activate(&cfg, "CIRC_MAX_LEARNED").unwrap();
        let _fill = g.alloc_memory(layout(1000)).unwrap();
        let s = g.stats();
        assert!(s.used <= 1000, "bumped {} bytes", s.used);
    }
    for id in ["CIRC_MAX", "CIRC_MAX_LEARNED"] {
        ws.destroy(id).unwrap();
    }
}

/// A Reallocate ring of 400 KiB slots (one, `Strict`) drawing on a pool of 1 MiB.
fn tight_ring() -> WorkspaceConfig {
    strict()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .initial_size(400 << 10)
        .policy_spill(SpillPolicy::Reallocate)
        .source(MemorySource::new(Pool::new(
            Limits::builder().max_bytes(1 << 20).build(),
        )))
        .build()
        .unwrap()
}

#[test]
fn a_ring_rebuilt_in_a_pool_with_room_for_the_new_ring_alone_frees_the_old_one_first() {
    // Semantics §2.4: a ring that spilled is rebuilt two cycles later if the new ring is
    // larger. The pool (1 MiB) holds the old ring (448 KiB) and the cycle's spill, and
    // the new ring alone (768 KiB), not both: nothing refers to the old ring any more, so
    // it goes first.
    let ws = workspaces();
    let cfg = tight_ring();
    let before = {
        let g = ws.get_and_activate(&cfg, "TIGHT_RING").unwrap();
        fill(&g, 1, 300 << 10);
        fill(&g, 1, 400 << 10);
        assert!(g.stats().spilled_bytes > 0);
        g.stats().size
    };
    for _ in 0..2 {
        fill(&ws.get_and_activate(&cfg, "TIGHT_RING").unwrap(), 1, 100);
    }
    let s = ws.workspace("TIGHT_RING").unwrap();
    assert!(s.size >= 700 << 10 && s.size > before, "rebuilt: {s:?}");
    let g = ws.get_and_activate(&cfg, "TIGHT_RING").unwrap();
    fill(&g, 1, 300 << 10);
    fill(&g, 1, 400 << 10);
    assert_eq!(
        g.stats().spilled_bytes,
        0,
        "the rebuilt ring holds the cycle"
    );
}

#[test]
fn a_ring_whose_old_slots_are_held_is_not_freed_for_a_rebuild() {
    // Semantics §2.4: memory of a ring stays intact while a stamp holds its slot; a
    // rebuild the pool cannot fit beside the old ring waits, and the held memory keeps
    // its bytes.
    let ws = workspaces();
    let cfg = tight_ring();
    let held = {
        let g = ws.get_and_activate(&cfg, "HELD_RING").unwrap();
        let memory = g.alloc_memory(layout(300 << 10)).unwrap();
        write(&memory, 7);
        fill(&g, 1, 400 << 10);
        memory
    };
    for _ in 0..2 {
        fill(&ws.get_and_activate(&cfg, "HELD_RING").unwrap(), 1, 100);
    }
    assert!(
        ws.workspace("HELD_RING").unwrap().size < 700 << 10,
        "not rebuilt"
    );
    assert!(
        read(&held).iter().all(|&b| b == 7),
        "the held slot kept its bytes"
    );
}
