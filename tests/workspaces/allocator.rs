//! The allocator_api2 integration: collections in a workspace, and grow and shrink that
//! move when they must and keep the bytes.

#![allow(unsafe_code)]

use std::alloc::Layout;

use ndmem::workspaces;

use crate::strict;

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

#[test]
fn alignments_above_a_page_are_served_by_the_spill_as_by_the_buffer() {
    // The pool aligns to 4096 at most; a workspace serves any alignment, whether the
    // request lands in the buffer (later cycles) or spills (the first cycle, learning).
    let ws = workspaces();
    let cfg = ndmem::WorkspaceConfig::default();
    for cycle in 0..3 {
        let g = ws.get_and_activate(&cfg, "BIG_ALIGN").unwrap();
        for align in [8192, 1 << 16, 1 << 20] {
            let layout = Layout::from_size_align(64, align).unwrap();
            let block = g
                .alloc(layout)
                .unwrap_or_else(|e| panic!("cycle {cycle}, align {align}: {e}"));
            let ptr = block.cast::<u8>().as_ptr();
            assert_eq!(ptr as usize % align, 0, "cycle {cycle}, align {align}");
            assert!(block.len() >= 64);
            // SAFETY: the block holds at least 64 writable bytes for this cycle.
            unsafe { ptr.write_bytes(7, 64) };
        }
        let spilled = g.stats().spilled_bytes;
        assert_eq!(spilled > 0, cycle == 0, "cycle {cycle} spilled {spilled}");
    }
}

#[test]
fn a_spill_counts_what_the_buffer_would_take_for_it() {
    // Spilled in the first cycle, then bumped in the learned buffer (workspace alignment
    // 16): 5 bytes take 16; aligned to 64 they also take the padding to a multiple of 64,
    // at most 48 bytes after a multiple of 16. The spill figures count that most, and the
    // buffer learned from them holds the same requests without spilling.
    let ws = workspaces();
    let cfg = strict().build().unwrap();
    let requests = [(5, 1), (5, 64), (5, 64)];
    {
        let g = ws.get_and_activate(&cfg, "SPILL_PAD").unwrap();
        let mut spilled = Vec::new();
        for (size, align) in requests {
            g.alloc(Layout::from_size_align(size, align).unwrap())
                .unwrap();
            spilled.push(g.stats().spilled_bytes);
        }
        assert_eq!(spilled, [16, 16 + 64, 16 + 64 + 64]);
    }
    let learned = ws.workspace("SPILL_PAD").unwrap();
    assert_eq!(learned.max_cycle, 144);
    let g = ws.get_and_activate(&cfg, "SPILL_PAD").unwrap();
    for (size, align) in requests {
        let block = g
            .alloc(Layout::from_size_align(size, align).unwrap())
            .unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % align, 0);
    }
    let stats = g.stats();
    assert_eq!(stats.spilled_bytes, 0, "{stats}");
    assert!(stats.used <= 144, "{stats}");
}

#[test]
fn a_bumped_cycle_counts_the_most_padding_its_over_aligned_requests_could_need() {
    // In a buffer (page-aligned, workspace alignment 16), 48 bytes then 16 bytes aligned to
    // 64 take 48 + 16 (padding) + 16 = 80 bytes. A buffer sized from that cycle could lie
    // 16 bytes past a multiple of 64, where the second request needs 48 bytes of padding:
    // the cycle counts 48 + 48 + 16 = 112, as spills count it, so a buffer learned or
    // reallocated from it holds the cycle wherever it lies.
    let ws = workspaces();
    let cfg = strict()
        .initial_size(4096)
        .policy_learning(ndmem::LearningPolicy::None)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "SLACK").unwrap();
        g.alloc(Layout::from_size_align(48, 1).unwrap()).unwrap();
        let block = g.alloc(Layout::from_size_align(16, 64).unwrap()).unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % 64, 0);
        let stats = g.stats();
        assert_eq!((stats.used, stats.spilled_bytes), (80, 0), "{stats}");
    }
    assert_eq!(ws.workspace("SLACK").unwrap().max_cycle, 112);
}
