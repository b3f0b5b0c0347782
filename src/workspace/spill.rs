//! Spills: requests a workspace serves from its memory source's pool because they do not
//! fit in the running cycle's region (semantics §2.2, §2.4), and the figures about them.
//!
//! Invariant: a spill is freed only at a cycle end, never through an allocation. A
//! non-circular workspace frees its spills when the cycle that made them ends (the arena
//! keeps them while a view pins the cycle). A circular workspace hands each spill to the
//! stamps of its memory as an `Arc` and unpins its own reference [`PINNED_CYCLES`] cycles
//! later, so the block is freed only once no stamp and no recent cycle refers to it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use ndmem_alloc::Block;

use super::buffer::Buffer;
use super::sizing::PINNED_CYCLES;
use super::stamp::KeepAlive;

/// A workspace's spills and their byte counts.
#[derive(Debug, Default)]
pub(crate) struct Spills {
    /// Bytes this cycle spilled (padded as they would be in the buffer).
    this_cycle: Cell<usize>,
    /// Bytes spilled over the workspace's life.
    total: Cell<u64>,
    /// This cycle's spills (non-circular workspaces).
    blocks: RefCell<Vec<Block<'static>>>,
    /// Circular spills with the generation that made them.
    pinned: RefCell<VecDeque<(u64, Arc<Buffer>)>>,
    pinned_bytes: Cell<usize>,
}

impl Spills {
    /// Bytes spilled in the running (or last) cycle.
    pub(crate) fn this_cycle(&self) -> usize {
        self.this_cycle.get()
    }

    /// Starts counting a new cycle; returns what the last one spilled.
    pub(crate) fn new_cycle(&self) -> usize {
        self.this_cycle.replace(0)
    }

    /// Bytes spilled over the workspace's life.
    pub(crate) fn total(&self) -> u64 {
        self.total.get()
    }

    /// Bytes of circular spills still pinned.
    pub(crate) fn pinned_bytes(&self) -> usize {
        self.pinned_bytes.get()
    }

    /// Counts a spill of `counted` bytes (see [`super::sizing::spilled_bytes`]).
    fn count(&self, counted: usize) {
        self.this_cycle
            .set(self.this_cycle.get().saturating_add(counted));
        self.total
            .set(self.total.get().saturating_add(counted as u64));
    }

    /// Keeps `block` until the cycle ends (non-circular workspaces).
    pub(crate) fn keep(&self, block: Block<'static>, counted: usize) {
        self.count(counted);
        self.blocks.borrow_mut().push(block);
    }

    /// Pins `block`, made in cycle `generation`, for [`PINNED_CYCLES`] cycles and returns
    /// the reference its stamps keep (circular workspaces).
    pub(crate) fn pin(&self, block: Block<'static>, counted: usize, generation: u64) -> KeepAlive {
        self.count(counted);
        let spill = Arc::new(Buffer::from_block(block));
        self.pinned_bytes.set(self.pinned_bytes.get() + spill.len());
        self.pinned
            .borrow_mut()
            .push_back((generation, Arc::clone(&spill)));
        spill
    }

    /// Frees the spills of the cycle that ended (non-circular workspaces).
    pub(crate) fn free_cycle(&self) {
        self.blocks.borrow_mut().clear();
    }

    /// Unpins the circular spills made [`PINNED_CYCLES`] or more cycles before
    /// `generation` (stamps may keep them alive longer).
    pub(crate) fn unpin_before(&self, generation: u64) {
        let mut pinned = self.pinned.borrow_mut();
        while let Some((made_in, spill)) = pinned.front() {
            if made_in + PINNED_CYCLES > generation {
                break;
            }
            self.pinned_bytes.set(self.pinned_bytes.get() - spill.len());
            pinned.pop_front();
        }
    }

    /// Drops every spill (the workspace is destroyed).
    pub(crate) fn clear(&self) {
        self.blocks.borrow_mut().clear();
        self.pinned.borrow_mut().clear();
        self.pinned_bytes.set(0);
    }
}
