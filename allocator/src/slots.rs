//! A lock-free cache of at most `N` freed blocks of one size class.
//!
//! Invariant: each slot holds null or exactly one block pointer, and a pointer leaves a slot
//! only through `swap(null)`, so exactly one thread takes any cached block (no ABA: nothing
//! is ever read from inside a block, and no count and pointer must agree). A full cache
//! refuses a push and the caller frees the block instead, which bounds what is hoarded.

use crate::sync::{AtomicPtr, Ordering};
use std::{fmt, ptr};

/// A fixed set of slots for freed blocks.
pub struct Slots<const N: usize> {
    slots: [AtomicPtr<u8>; N],
}

impl<const N: usize> Default for Slots<N> {
    fn default() -> Self {
        Slots {
            slots: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }
}

impl<const N: usize> fmt::Debug for Slots<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let occupied = self
            .slots
            .iter()
            .filter(|s| !s.load(Ordering::Relaxed).is_null())
            .count();
        f.debug_struct("Slots")
            .field("capacity", &N)
            .field("occupied", &occupied)
            .finish()
    }
}

impl<const N: usize> Slots<N> {
    /// Offers `block` to the cache; gives it back if every slot is taken.
    pub fn push(&self, block: *mut u8) -> Result<(), *mut u8> {
        debug_assert!(!block.is_null());
        for slot in &self.slots {
            if slot.load(Ordering::Relaxed).is_null()
                && slot
                    .compare_exchange(ptr::null_mut(), block, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                return Ok(());
            }
        }
        Err(block)
    }

    /// Takes a cached block, if any.
    pub fn pop(&self) -> Option<*mut u8> {
        for slot in &self.slots {
            if !slot.load(Ordering::Relaxed).is_null() {
                let block = slot.swap(ptr::null_mut(), Ordering::Acquire);
                if !block.is_null() {
                    return Some(block);
                }
            }
        }
        None
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_n_and_returns_each_block_once() {
        let slots = Slots::<2>::default();
        let (a, b, c) = (8 as *mut u8, 16 as *mut u8, 24 as *mut u8);
        assert!(slots.push(a).is_ok());
        assert!(slots.push(b).is_ok());
        assert_eq!(slots.push(c), Err(c));
        let mut got = [slots.pop().unwrap(), slots.pop().unwrap()];
        got.sort();
        assert_eq!(got, [a, b]);
        assert_eq!(slots.pop(), None);
    }

    #[test]
    fn debug_shows_how_many_slots_are_taken() {
        let slots = Slots::<3>::default();
        slots.push(8 as *mut u8).unwrap();
        assert_eq!(format!("{slots:?}"), "Slots { capacity: 3, occupied: 1 }");
    }
}
