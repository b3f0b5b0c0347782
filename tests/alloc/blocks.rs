//! Blocks: every alignment up to a page, zeroed memory even from the cache.

use crate::{pool_with, MIB};

#[test]
fn blocks_honour_every_alignment_up_to_a_page() {
    let pool = pool_with(256 * MIB);
    let mut held = Vec::new();
    for shift in 0..=12 {
        let align = 1usize << shift;
        for size in [1, 7, 64, 100, 1000, 4096, 5000, 300_000, 3 * MIB + 5] {
            let mut block = pool.allocate(size, align).unwrap();
            assert_eq!(block.ptr().as_ptr() as usize % align, 0, "{size} @ {align}");
            assert!(block.capacity() >= size && block.len() == size);
            block.as_slice_mut().fill(0xAB);
            held.push(block);
        }
    }
    assert!(held.iter().all(|b| b.as_slice().iter().all(|x| *x == 0xAB)));
}

#[test]
fn zeroed_blocks_are_zero_even_when_reused() {
    let pool = pool_with(64 * MIB);
    for size in [100, 100_000, 2 * MIB] {
        let mut dirty = pool.allocate(size, 16).unwrap();
        dirty.as_slice_mut().fill(0xFF);
        drop(dirty);
        let clean = pool.allocate_zeroed(size, 16).unwrap();
        assert!(clean.as_slice().iter().all(|b| *b == 0), "{size}");
    }
}

#[test]
fn a_block_is_three_words_and_knows_its_length_capacity_and_usage() {
    use ndmem_alloc::{Block, Usage};
    // Pointer, pool, and one word packing the length, the usage and the class: an array
    // of blocks is three words a block, and an empty slot of `Option<Block>` costs none.
    assert_eq!(size_of::<Block<'_>>(), 3 * size_of::<usize>());
    assert_eq!(size_of::<Option<Block<'_>>>(), 3 * size_of::<usize>());
    let pool = pool_with(256 * MIB);
    let page = 4096;
    for (size, usage) in [
        (1, Usage::Tensor),
        (100, Usage::Workspace),
        (64 << 10, Usage::Mirror),
        (300_000, Usage::Other),
        (3 * MIB + 5, Usage::Tensor),
        (256 * MIB - page, Usage::Workspace),
    ] {
        let live = pool.stats().live_bytes;
        let block = pool.allocate_for(size, 16, usage).unwrap();
        assert_eq!((block.len(), block.usage()), (size, usage));
        // The capacity the block reports is what the pool counted live for it.
        assert_eq!(pool.stats().live_bytes - live, block.capacity(), "{size}");
        assert!(block.capacity() >= size, "{size}");
        drop(block);
        assert_eq!(pool.stats().live_bytes, live, "{size}: given back whole");
    }
}

#[test]
fn small_blocks_of_a_class_lie_side_by_side_with_nothing_between() {
    // Carved from slabs: a block takes its capacity and no more. (One at a time from the C
    // allocator, a 7 KiB block at its 1 KiB alignment lay 8 KiB from the next.)
    let pool = pool_with(64 * MIB);
    let blocks: Vec<_> = (0..100)
        .map(|_| pool.allocate(7 << 10, 16).unwrap())
        .collect();
    assert!(blocks.iter().all(|b| b.capacity() == 7 << 10));
    let mut addresses: Vec<usize> = blocks.iter().map(|b| b.ptr().as_ptr() as usize).collect();
    addresses.sort_unstable();
    let adjacent = addresses
        .windows(2)
        .filter(|w| w[1] - w[0] == 7 << 10)
        .count();
    // 36 blocks to a 256 KiB slab: at most three slabs' edges (more only if another test
    // took blocks of this class meanwhile).
    assert!(adjacent >= 90, "{adjacent} of 99 neighbours adjacent");
}
