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
