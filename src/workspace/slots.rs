//! Reference counts of a circular workspace's ring slots (semantics §2.4, §3): a cycle
//! starts only in a slot that no memory handed out earlier still refers to.
//!
//! Invariant: a count rises only on the owner thread, while it holds a reference already
//! (the cycle's own), so a relaxed increment suffices; it falls on any thread with
//! `Release`; and the owner writes a slot again only after an `Acquire` load saw its count
//! at 0. Every access another thread made through a dropped reference therefore happens
//! before the owner's next write to that slot. The loom models in `loom-tests/` check this.
//!
//! This file depends on `crate::sync` alone, so that under `--cfg ndmem_loom` it compiles
//! by itself as `ndmem::workspace_slots` (its items are `pub` for those models).

#![cfg_attr(not(ndmem_loom), allow(unreachable_pub))]

use std::fmt;

use crate::sync::{AtomicUsize, Ordering};

/// One reference count per ring slot; empty for a buffer that is not a ring.
pub struct SlotCounts {
    counts: Box<[AtomicUsize]>,
}

impl SlotCounts {
    /// `slots` counts at 0 (none for 0).
    pub fn new(slots: usize) -> SlotCounts {
        SlotCounts {
            counts: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// `slots` counts at 0, or `None` if the heap cannot hold them (the count comes from a
    /// configuration, so the bookkeeping is allocated fallibly).
    pub fn try_new(slots: usize) -> Option<SlotCounts> {
        let mut counts = Vec::new();
        counts.try_reserve_exact(slots).ok()?;
        counts.extend((0..slots).map(|_| AtomicUsize::new(0)));
        Some(SlotCounts {
            counts: counts.into_boxed_slice(),
        })
    }

    /// Adds a reference to `slot`. Called by the owner thread only, when it starts a
    /// cycle in a slot it has just seen free (the only reader of the counts' zero is that
    /// same thread, and it is not looking while it holds the new reference).
    pub fn hold(&self, slot: usize) {
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a reference to `slot`, from any thread. `Release`: the dropping thread's
    /// accesses to the slot happen before the owner's `Acquire` load that sees 0.
    pub fn release(&self, slot: usize) {
        self.counts[slot].fetch_sub(1, Ordering::Release);
    }

    /// Whether no reference to `slot` is alive; when `true`, every access through a
    /// dropped reference happened before this call returned.
    pub fn is_free(&self, slot: usize) -> bool {
        self.counts[slot].load(Ordering::Acquire) == 0
    }

    /// The first free slot in ring order starting at `from` (`from`, `from + 1`, ...,
    /// wrapping), if any.
    pub fn first_free(&self, from: usize) -> Option<usize> {
        let slots = self.counts.len();
        (0..slots)
            .map(|i| (from + i) % slots)
            .find(|&slot| self.is_free(slot))
    }
}

impl fmt::Debug for SlotCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .finish()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_first_free_slot_is_found_in_ring_order() {
        let counts = SlotCounts::new(3);
        assert_eq!(counts.first_free(1), Some(1));
        counts.hold(1);
        assert_eq!(counts.first_free(1), Some(2));
        counts.hold(2);
        counts.hold(0);
        assert_eq!(counts.first_free(1), None, "every slot referenced");
        counts.release(2);
        assert_eq!(counts.first_free(0), Some(2));
        assert!(SlotCounts::new(0).first_free(0).is_none());
        assert_eq!(format!("{counts:?}"), "[1, 1, 0]");
    }
}
