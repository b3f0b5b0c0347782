//! loom models of `ndmem::workspace_slots::SlotRefs`, the references that keep a circular
//! workspace from starting a cycle in a ring slot whose memory a reader (another thread,
//! through a stamp) still refers to.
//!
//! What they check, over every interleaving within the preemption bound:
//! - a cycle never starts in a slot a reader still refers to: the reader always reads the
//!   bytes written in its own cycle, never a later cycle's;
//! - the reader's accesses happen before the owner writes the slot again (loom's
//!   `UnsafeCell` tracks them: dropping a reference must release, the owner's test for a
//!   free slot must acquire);
//! - a one-slot ring whose slot is referenced gives the cycle no slot (it spills) rather
//!   than reusing it.

#![allow(unsafe_code)]
#![cfg(ndmem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use ndmem::workspace_slots::SlotRefs;
use ndmem_loom_tests::model;

/// One slot's memory: a word.
struct Slot {
    memory: UnsafeCell<u64>,
}

// SAFETY: the word is written by the owner only while nothing but the ring refers to the
// slot (and loom checks that every reader's access happened before), and read by readers
// that hold a reference.
unsafe impl Sync for Slot {}

impl Slot {
    /// A reader holding a reference reads the slot's bytes.
    fn read(&self) -> u64 {
        // SAFETY: the reader holds a reference, so the owner does not write the slot.
        self.memory.with(|p| unsafe { *p })
    }
}

/// The owner's ring: the slots' references.
fn ring(slots: usize) -> SlotRefs<Slot> {
    SlotRefs::try_new(slots, |_| Slot {
        memory: UnsafeCell::new(0),
    })
    .expect("a small ring")
}

/// The owner starts a cycle from `from`: the slot it bumps in, with the cycle's reference,
/// and the cycle's bytes written; `None` when every slot is referenced (the cycle spills).
fn start_cycle(refs: &mut SlotRefs<Slot>, from: usize, value: u64) -> Option<(usize, Arc<Slot>)> {
    let slot = refs.first_free(from)?;
    let held = refs.hold(slot);
    // SAFETY: the owner writes a slot only after `first_free` saw no other reference (and
    // loom checks that every reader's access happened before).
    held.memory.with_mut(|p| unsafe { *p = value });
    Some((slot, held))
}

#[test]
fn a_cycle_never_starts_in_a_slot_a_reader_still_refers_to() {
    model(|| {
        let mut refs = ring(2);
        // Cycle 1 in slot 0; its batch goes to a consumer thread with a stamp.
        let (slot, cycle) = start_cycle(&mut refs, 0, 1).expect("an empty ring has a free slot");
        assert_eq!(slot, 0);
        let stamp = Arc::clone(&cycle);
        let consumer = thread::spawn(move || {
            let value = stamp.read();
            drop(stamp);
            value
        });
        drop(cycle); // the cycle ends; the consumer's stamp keeps the slot
                     // Cycles 2 and 3 go round the ring while the consumer may still be reading.
        let mut from = 1;
        for value in 2..=3 {
            let (slot, cycle) = start_cycle(&mut refs, from, value).expect("slot 1 is never held");
            from = (slot + 1) % 2;
            drop(cycle);
        }
        assert_eq!(
            consumer.join().unwrap(),
            1,
            "the consumer read its own batch"
        );
    });
}

#[test]
fn a_one_slot_ring_spills_while_its_slot_is_referenced() {
    model(|| {
        let mut refs = ring(1);
        let (_, cycle) = start_cycle(&mut refs, 0, 1).expect("an empty ring has a free slot");
        let stamp = Arc::clone(&cycle);
        drop(cycle);
        let consumer = thread::spawn(move || {
            let value = stamp.read();
            drop(stamp);
            value
        });
        let second = start_cycle(&mut refs, 0, 2);
        let consumed = consumer.join().unwrap();
        assert_eq!(consumed, 1, "the slot was not reused under its reader");
        if second.is_none() {
            // It spilled; once the reader is gone the slot is free again.
            assert!(refs.is_free(0));
        }
    });
}
