//! loom models of `ndmem::workspace_slots::SlotCounts`, the reference counts that keep a
//! circular workspace from starting a cycle in a ring slot whose memory a reader (another
//! thread, through a stamp) still refers to.
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
use ndmem::workspace_slots::SlotCounts;
use ndmem_loom_tests::model;

/// A ring: its counts and one word of memory per slot.
struct Ring {
    counts: SlotCounts,
    memory: Vec<UnsafeCell<u64>>,
}

impl Ring {
    fn new(slots: usize) -> Arc<Ring> {
        Arc::new(Ring {
            counts: SlotCounts::new(slots),
            memory: (0..slots).map(|_| UnsafeCell::new(0)).collect(),
        })
    }

    /// The owner writes its cycle's bytes into `slot`.
    fn write(&self, slot: usize, value: u64) {
        // SAFETY: the owner writes a slot only after `first_free` saw its count at 0 (and
        // loom checks that every reader's access happened before).
        self.memory[slot].with_mut(|p| unsafe { *p = value });
    }

    /// A reader holding a reference reads the slot's bytes.
    fn read(&self, slot: usize) -> u64 {
        // SAFETY: the reader holds a counted reference, so the owner does not write the slot.
        self.memory[slot].with(|p| unsafe { *p })
    }
}

/// The counted reference the stamps of one cycle share, as in `workspace/ring.rs`.
struct SlotRef {
    ring: Arc<Ring>,
    slot: usize,
}

impl SlotRef {
    fn new(ring: &Arc<Ring>, slot: usize) -> SlotRef {
        ring.counts.hold(slot);
        SlotRef {
            ring: ring.clone(),
            slot,
        }
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        self.ring.counts.release(self.slot);
    }
}

/// The owner starts a cycle from `from`: the slot it bumps in, with the cycle's reference,
/// and the cycle's bytes written; `None` when every slot is referenced (the cycle spills).
fn start_cycle(ring: &Arc<Ring>, from: usize, value: u64) -> Option<Arc<SlotRef>> {
    let slot = ring.counts.first_free(from)?;
    let slot_ref = Arc::new(SlotRef::new(ring, slot));
    ring.write(slot, value);
    Some(slot_ref)
}

#[test]
fn a_cycle_never_starts_in_a_slot_a_reader_still_refers_to() {
    model(|| {
        let ring = Ring::new(2);
        // Cycle 1 in slot 0; its batch goes to a consumer thread with a stamp.
        let cycle = start_cycle(&ring, 0, 1).expect("an empty ring has a free slot");
        assert_eq!(cycle.slot, 0);
        let stamp = cycle.clone();
        let consumer = thread::spawn(move || {
            let value = stamp.ring.read(stamp.slot);
            drop(stamp);
            value
        });
        drop(cycle); // the cycle ends; the consumer's stamp keeps the slot
                     // Cycles 2 and 3 go round the ring while the consumer may still be reading.
        let mut from = 1;
        for value in 2..=3 {
            let cycle = start_cycle(&ring, from, value).expect("slot 1 is never held");
            from = (cycle.slot + 1) % 2;
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
        let ring = Ring::new(1);
        let cycle = start_cycle(&ring, 0, 1).expect("an empty ring has a free slot");
        let stamp = cycle.clone();
        drop(cycle);
        let consumer = thread::spawn(move || {
            let value = stamp.ring.read(stamp.slot);
            drop(stamp);
            value
        });
        let second = start_cycle(&ring, 0, 2);
        let consumed = consumer.join().unwrap();
        assert_eq!(consumed, 1, "the slot was not reused under its reader");
        if second.is_none() {
            // It spilled; once the reader is gone the slot is free again.
            assert!(ring.counts.is_free(0));
        }
    });
}
