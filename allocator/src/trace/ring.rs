//! The recorder's ring of events: a fixed number of slots that writers on any thread fill
//! without a lock, and readers copy out without stopping them.
//!
//! Invariant: each slot has a sequence word, odd (`2 x sequence + 1`) while the event of
//! that sequence number is being written and `2 x sequence + 2` once it is written. A
//! writer takes the next sequence number with one `fetch_add` on `head` and claims its
//! slot (`sequence % capacity`) by a compare-exchange of the word, only from an even word
//! of an older event; it then writes the fields and stores the even word with release.
//! So the ring never holds more than its capacity, an older event never overwrites a
//! newer one (a writer preempted for a whole lap of the ring finds a newer word and
//! gives up), two writers never write one slot at once (a writer that finds the slot
//! still being written with an older event gives way and counts itself in `lost`), and a
//! reader takes an event only if the slot's word said that event, fully written, both
//! before and after it copied the fields (a sequence lock: the fields written after a
//! release fence, read before an acquire fence). Sequence numbers never go back: a new
//! recording starts the window at the next one ([`Ring::restart`]), so every word left in
//! the ring is older than the new recording's events. The loom model `trace_ring` checks
//! it.
//!
//! Built with `--cfg ndmem_loom`, the atomics are loom's and the type is public, for the
//! model; otherwise it is private to the recorder.

#![forbid(unsafe_code)]

use crate::sync::{fence, AtomicU64, Ordering};

/// One event's fields as a writer gave them: `(time, bytes, value, meta)`.
pub type Fields = (u64, u64, u64, u64);

/// One slot: `seq` is odd while written and `2 x sequence + 2` once written.
#[derive(Debug)]
struct Slot {
    seq: AtomicU64,
    time: AtomicU64,
    bytes: AtomicU64,
    value: AtomicU64,
    meta: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            time: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            value: AtomicU64::new(0),
            meta: AtomicU64::new(0),
        }
    }
}

/// Bytes one event takes in a ring.
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// A ring of a power of two of event slots.
#[derive(Debug)]
pub struct Ring {
    slots: Vec<Slot>,
    /// `slots.len() - 1`: a sequence number's slot is `seq & mask`.
    mask: u64,
    head: AtomicU64,
    /// The first sequence number of the current recording ([`Ring::restart`]).
    start: AtomicU64,
    /// Events given up because their slot was still being written with an older event.
    lost: AtomicU64,
}

impl Ring {
    /// A ring of `capacity` slots (a power of two, at least 1); `None` if the heap
    /// refuses them.
    pub fn new(capacity: usize) -> Option<Ring> {
        debug_assert!(capacity.is_power_of_two());
        let mut slots = Vec::new();
        slots.try_reserve_exact(capacity).ok()?;
        slots.extend((0..capacity).map(|_| Slot::new()));
        Some(Ring {
            slots,
            mask: capacity as u64 - 1,
            head: AtomicU64::new(0),
            start: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        })
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Starts a new recording: the events before it leave the window. Sequence numbers
    /// go on from where they were, so that a writer that took its number before (and
    /// writes only now) can neither pass for an event of the new recording nor block one:
    /// every word in the ring stays older than the new recording's.
    pub fn restart(&self) {
        self.start
            .store(self.head.load(Ordering::Acquire), Ordering::Release);
        self.lost.store(0, Ordering::Relaxed);
    }

    /// The sequence numbers the ring may hold of the current recording: from its start
    /// or `capacity` before the next one, whichever is later, to the next one.
    pub fn window(&self) -> std::ops::Range<u64> {
        let start = self.start.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire).max(start);
        start.max(head.saturating_sub(self.capacity() as u64))..head
    }

    /// The first sequence number of the current recording.
    pub fn start(&self) -> u64 {
        self.start.load(Ordering::Acquire)
    }

    /// Events of the current recording the ring does not hold: those recorded less those
    /// in the window that their slots hold, fully written. Each missing event counts
    /// once, whether it is older than the window, gave way ([`Ring::lost`]; such an
    /// event later leaves the window too, so a count of the two kinds added would count
    /// it twice), or is being written. Reads every slot of the window.
    pub fn dropped(&self) -> u64 {
        let window = self.window();
        let held = window
            .clone()
            .filter(|&seq| self.read(seq).is_some())
            .count() as u64;
        (window.end - self.start()).saturating_sub(held)
    }

    /// The next sequence number.
    #[cfg(any(test, ndmem_loom))]
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Events given up because their slot was still being written with an older one.
    #[cfg(any(test, ndmem_loom))]
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Records an event; returns its sequence number and whether it is in the ring (it
    /// is not if it gave way to an older event still being written, or if newer events
    /// already took its slot).
    #[inline]
    pub fn push(&self, (time, bytes, value, meta): Fields) -> (u64, bool) {
        let seq = self.head.fetch_add(1, Ordering::Relaxed);
        (seq, self.write(seq, (time, bytes, value, meta)))
    }

    /// Writes the event of sequence number `seq` into its slot, if it claims it.
    #[inline]
    fn write(&self, seq: u64, (time, bytes, value, meta): Fields) -> bool {
        let slot = &self.slots[(seq & self.mask) as usize];
        // Claim the slot from an older, fully written event only: a writer that lost the
        // processor for a whole lap of the ring must neither overwrite the newer event
        // there nor write its fields beside another writer's.
        let claim = 2 * seq + 1;
        let mut word = slot.seq.load(Ordering::Relaxed);
        loop {
            if word >= claim {
                // A newer event holds it: this one is older than the ring's window, which
                // the recorder's count of dropped events covers already.
                return false;
            }
            if word & 1 == 1 {
                // An older event is still being written there: this one gives way.
                self.lost.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            // Acquire: the claim reads the even word the last writer stored with release,
            // so its field writes happen before ours and cannot land after them (without
            // it, the fields' own order could put the older event's values last: the
            // loom model `trace_ring` finds that interleaving).
            match slot
                .seq
                .compare_exchange_weak(word, claim, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        // The odd word is ordered before the fields: a reader that sees a field written
        // here sees the slot claimed when it checks the word again.
        fence(Ordering::Release);
        slot.time.store(time, Ordering::Relaxed);
        slot.bytes.store(bytes, Ordering::Relaxed);
        slot.value.store(value, Ordering::Relaxed);
        slot.meta.store(meta, Ordering::Relaxed);
        slot.seq.store(2 * seq + 2, Ordering::Release);
        true
    }

    /// The event of sequence number `seq`, if its slot holds it, fully written.
    pub fn read(&self, seq: u64) -> Option<Fields> {
        let slot = &self.slots[(seq & self.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != 2 * seq + 2 {
            return None;
        }
        let fields = (
            slot.time.load(Ordering::Relaxed),
            slot.bytes.load(Ordering::Relaxed),
            slot.value.load(Ordering::Relaxed),
            slot.meta.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        (slot.seq.load(Ordering::Relaxed) == 2 * seq + 2).then_some(fields)
    }

    /// Sets the next sequence number (a writer that took `seq` long ago, in tests).
    #[cfg(any(test, ndmem_loom))]
    pub fn set_head(&self, seq: u64) {
        self.head.store(seq, Ordering::Relaxed);
    }

    /// Writes `seq`'s event as [`Ring::push`] would once it took `seq` (a writer whose
    /// `fetch_add` came long before its write, in tests and models).
    #[cfg(any(test, ndmem_loom))]
    pub fn write_as(&self, seq: u64, fields: Fields) -> bool {
        self.write(seq, fields)
    }

    /// Sets the sequence word of `seq`'s slot as if `seq` were being written (`odd`) or
    /// written (in tests).
    #[cfg(test)]
    fn mark(&self, seq: u64, odd: bool) {
        let word = 2 * seq + if odd { 1 } else { 2 };
        self.slots[(seq & self.mask) as usize]
            .seq
            .store(word, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> Fields {
        (n, n, n, n * 11)
    }

    #[test]
    fn a_late_writer_neither_overwrites_a_newer_event_nor_shares_a_slot() {
        // One slot: every sequence number lands in it.
        let ring = Ring::new(1).unwrap();
        ring.set_head(5);
        assert_eq!(ring.push(event(5)), (5, true));
        assert_eq!(ring.read(5), Some(event(5)));
        // A writer that claimed sequence 2 long ago and writes only now: event 5 stays.
        assert!(!ring.write_as(2, event(2)));
        assert_eq!(ring.read(5), Some(event(5)));
        assert_eq!(ring.read(2), None);
        // Sequence 7 is being written (its word odd); event 8 gives way, counted as lost.
        ring.mark(7, true);
        ring.set_head(8);
        assert_eq!(ring.push(event(8)), (8, false));
        assert_eq!(ring.read(8), None);
        assert_eq!(ring.lost(), 1);
        // Once 7 is written, the next event claims the slot as usual.
        ring.mark(7, false);
        assert_eq!(ring.push(event(9)), (9, true));
        assert_eq!(ring.read(9), Some(event(9)));
        assert_eq!(ring.read(7), None);
    }

    #[test]
    fn a_full_ring_keeps_the_newest_capacity_events() {
        let ring = Ring::new(4).unwrap();
        for n in 0..10 {
            assert_eq!(ring.push(event(n)), (n, true));
        }
        assert_eq!(ring.head(), 10);
        assert_eq!(ring.window(), 6..10);
        assert_eq!(ring.dropped(), 6);
        let held: Vec<u64> = (0..10).filter(|&n| ring.read(n).is_some()).collect();
        assert_eq!(held, [6, 7, 8, 9]);
        ring.restart();
        assert_eq!((ring.window(), ring.dropped()), (10..10, 0));
        assert_eq!(ring.push(event(10)), (10, true));
        assert_eq!((ring.window(), ring.dropped()), (10..11, 0));
    }

    #[test]
    fn an_event_that_gave_way_and_then_left_the_window_is_dropped_once() {
        let ring = Ring::new(1).unwrap();
        // Sequence 0 is being written; event 1 gives way.
        ring.mark(0, true);
        ring.set_head(1);
        assert_eq!(ring.push(event(1)), (1, false));
        assert_eq!(
            (ring.lost(), ring.dropped()),
            (1, 2),
            "0 in flight, 1 given up"
        );
        ring.mark(0, false);
        // Event 2 takes the slot: 0 and 1 are older than the window, dropped once each.
        assert_eq!(ring.push(event(2)), (2, true));
        assert_eq!(ring.dropped(), 2);
        for n in 3..10 {
            ring.push(event(n));
        }
        assert_eq!(ring.dropped(), 9, "10 recorded, 1 held");
    }

    #[test]
    fn a_writer_that_finishes_after_a_restart_neither_blocks_nor_joins_the_new_recording() {
        let ring = Ring::new(1).unwrap();
        ring.set_head(1000);
        ring.restart();
        // Sequence 999 was taken before the restart and is written only now.
        assert!(ring.write_as(999, event(999)));
        assert_eq!(ring.window(), 1000..1000);
        // The new recording's first event takes the slot all the same.
        assert_eq!(ring.push(event(1)), (1000, true));
        assert_eq!(ring.window(), 1000..1001);
        assert_eq!(ring.read(1000), Some(event(1)));
        assert_eq!(ring.dropped(), 0);
    }
}
