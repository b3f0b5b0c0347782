//! The references to a circular workspace's ring slots (semantics §2.4, §3): a cycle
//! starts only in a slot that no memory handed out earlier still refers to.
//!
//! Invariant: the ring holds one `Arc` per slot, made with the ring; a cycle clones its
//! slot's for the stamps of what it bumps, and they drop their clones on any thread (an
//! `Arc` drop decrements the count with `Release`). A slot is free when the ring's is the
//! only reference left, which `Arc::get_mut` tells with an `Acquire` read of the count, so
//! every access another thread made through a dropped clone happens before the owner's
//! next write to that slot. Nothing is allocated per cycle: the references live as long as
//! the ring. The loom models in `loom-tests/` check this.
//!
//! This file depends on `crate::sync` alone, so that under `--cfg ndmem_loom` it compiles
//! by itself as `ndmem::workspace_slots` (its items are `pub` for those models).

#![cfg_attr(not(ndmem_loom), allow(unreachable_pub))]

use std::fmt;

use crate::sync::Arc;

/// One reference per ring slot, each to a `T` (what a stamp keeps alive); empty for a
/// workspace that has no ring.
pub struct SlotRefs<T> {
    refs: Vec<Arc<T>>,
}

impl<T> SlotRefs<T> {
    /// No slots.
    pub fn empty() -> SlotRefs<T> {
        SlotRefs { refs: Vec::new() }
    }

    /// One reference per slot, to `make(slot)`; `None` if the heap cannot hold them (the
    /// count comes from a configuration, so they are allocated fallibly: the list, and,
    /// since each `Arc` is an allocation Rust makes infallibly, a probe of their total
    /// bytes taken and given back just before they are made).
    pub fn try_new(slots: usize, mut make: impl FnMut(usize) -> T) -> Option<SlotRefs<T>> {
        let mut refs = Vec::new();
        refs.try_reserve_exact(slots).ok()?;
        // An `Arc`'s allocation: its two counts and the value.
        let each = std::alloc::Layout::new::<(usize, usize, T)>()
            .pad_to_align()
            .size();
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(each.checked_mul(slots)?).ok()?;
        drop(probe);
        refs.extend((0..slots).map(|slot| Arc::new(make(slot))));
        Some(SlotRefs { refs })
    }

    /// Whether nothing but the ring refers to `slot`; when `true`, every access through a
    /// dropped reference happened before this call returned.
    pub fn is_free(&mut self, slot: usize) -> bool {
        Arc::get_mut(&mut self.refs[slot]).is_some()
    }

    /// Whether nothing but the ring refers to any slot (see [`SlotRefs::is_free`]).
    pub fn all_free(&mut self) -> bool {
        (0..self.refs.len()).all(|slot| self.is_free(slot))
    }

    /// The first free slot in ring order starting at `from` (`from`, `from + 1`, ...,
    /// wrapping), if any.
    pub fn first_free(&mut self, from: usize) -> Option<usize> {
        let slots = self.refs.len();
        (0..slots)
            .map(|i| (from + i) % slots)
            .find(|&slot| self.is_free(slot))
    }

    /// A reference to `slot`, for the cycle that starts there (and, cloned, its stamps).
    pub fn hold(&self, slot: usize) -> Arc<T> {
        Arc::clone(&self.refs[slot])
    }
}

impl<T> fmt::Debug for SlotRefs<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotRefs")
            .field("slots", &self.refs.len())
            .finish()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_free_again_once_every_reference_to_it_is_gone() {
        let mut refs = SlotRefs::try_new(3, |slot| slot).unwrap();
        assert_eq!(refs.first_free(1), Some(1));
        let held = refs.hold(1);
        let stamp = Arc::clone(&held);
        drop(held);
        assert_eq!(*stamp, 1);
        assert_eq!(refs.first_free(1), Some(2), "slot 1 is referenced");
        let (two, zero) = (refs.hold(2), refs.hold(0));
        assert_eq!(refs.first_free(1), None, "every slot is referenced");
        drop(stamp);
        assert_eq!(refs.first_free(2), Some(1), "the stamp is gone");
        drop((two, zero));
        assert!(SlotRefs::<u8>::empty().first_free(0).is_none());
    }
}
