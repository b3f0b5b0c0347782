//! loom models of the recorder's event ring (`ndmem_alloc::trace::ring::Ring`, compiled
//! from `allocator/src/trace/ring.rs`): writers claim a slot by a compare-exchange of its
//! sequence word and fill it without a lock; readers copy a slot under that word, as a
//! sequence lock.
//!
//! What they check, over every interleaving within the preemption bound (and every value
//! a relaxed load may return):
//! - two writers whose events land in one slot never both write it, and the older never
//!   overwrites the newer: the slot ends with the newer event, or, if the newer gave way
//!   to the older still being written, with the older and the newer counted as lost;
//! - a reader never takes an event torn between two writers, nor one that is not the
//!   sequence number it asked for, whether the slot is being written for the first time
//!   or overwritten;
//! - a recording restarted while an event of the last one is being written neither shows
//!   that event nor loses its own first event to it;
//! - every event is accounted for: those the ring's window still holds plus those counted
//!   lost make up the window (the rest are older than it).
//!
//! Each event's four fields are equal (its writer's id), so a torn copy shows.
#![cfg(ndmem_loom)]

use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::trace::ring::{Fields, Ring};
use ndmem_loom_tests::model;

fn event(id: u64) -> Fields {
    (id, id, id, id)
}

/// `fields` are one writer's whole event: all four equal.
fn whole(fields: Fields) -> u64 {
    let (a, b, c, d) = fields;
    assert!(
        a == b && b == c && c == d,
        "a torn event was read: {fields:?}"
    );
    a
}

/// The events the window holds plus those counted lost make up the window.
fn accounted(ring: &Ring) {
    let window = ring.window();
    let held = window.clone().filter(|&s| ring.read(s).is_some()).count() as u64;
    assert_eq!(
        held + ring.lost(),
        window.end - window.start,
        "events held + lost != window"
    );
}

#[test]
fn two_writers_on_one_slot_with_a_reader_neither_tear_nor_overwrite_the_newer() {
    model(|| {
        let ring = Arc::new(Ring::new(1).expect("a one-slot ring"));
        let writers: Vec<_> = [10u64, 20]
            .into_iter()
            .map(|id| {
                let ring = ring.clone();
                thread::spawn(move || {
                    let (seq, kept) = ring.push(event(id));
                    (id, seq, kept)
                })
            })
            .collect();
        let reader = {
            let ring = ring.clone();
            thread::spawn(move || {
                (0..2u64)
                    .filter_map(|seq| ring.read(seq).map(|f| (seq, whole(f))))
                    .collect::<Vec<_>>()
            })
        };
        let mut pushed: Vec<(u64, u64, bool)> =
            writers.into_iter().map(|w| w.join().unwrap()).collect();
        pushed.sort_by_key(|&(_, seq, _)| seq);
        let seen = reader.join().unwrap();
        // What the reader took was the event of the sequence number it asked for.
        for (seq, id) in seen {
            assert_eq!(pushed[seq as usize].0, id, "read {id} as event {seq}");
        }
        let [(old_id, 0, old_kept), (new_id, 1, new_kept)] = pushed[..] else {
            panic!("sequence numbers were not 0 and 1: {pushed:?}");
        };
        if new_kept {
            assert_eq!(
                ring.read(1),
                Some(event(new_id)),
                "the newer event was lost"
            );
            assert_eq!(ring.read(0), None);
            assert_eq!(ring.lost(), 0);
        } else {
            // The newer gave way to the older, still being written when it came.
            assert!(old_kept, "neither event was written");
            assert_eq!(ring.read(0), Some(event(old_id)));
            assert_eq!(ring.lost(), 1, "an event that gave way was not counted");
        }
        accounted(&ring);
    });
}

#[test]
fn a_reader_of_an_event_being_overwritten_takes_it_whole_or_not_at_all() {
    model(|| {
        let ring = Arc::new(Ring::new(1).expect("a one-slot ring"));
        assert_eq!(ring.push(event(10)), (0, true));
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || ring.push(event(20)))
        };
        let old = ring.read(0).map(whole);
        let new = ring.read(1).map(whole);
        assert_eq!(writer.join().unwrap(), (1, true));
        assert!(matches!(old, None | Some(10)), "event 0 read as {old:?}");
        assert!(matches!(new, None | Some(20)), "event 1 read as {new:?}");
        assert_eq!(ring.read(1), Some(event(20)));
        assert_eq!(ring.read(0), None);
        accounted(&ring);
    });
}

#[test]
fn a_writer_a_lap_late_gives_up_its_slot_to_the_newer_event() {
    model(|| {
        // Two slots; the late writer took sequence 0 before the others took 1 and 2, and
        // writes only now, while event 2 (its slot's newer event) is written.
        let ring = Arc::new(Ring::new(2).expect("a two-slot ring"));
        ring.set_head(1);
        assert_eq!(ring.push(event(11)), (1, true));
        let late = {
            let ring = ring.clone();
            thread::spawn(move || ring.write_as(0, event(10)))
        };
        let (seq, kept) = ring.push(event(12));
        assert_eq!(seq, 2);
        let late_kept = late.join().unwrap();
        assert!(kept || late_kept, "neither event was written");
        if kept {
            assert_eq!(ring.read(2), Some(event(12)));
            assert_eq!(ring.read(0), None, "the late event overwrote the newer one");
        } else {
            assert_eq!(ring.read(0), Some(event(10)));
            assert_eq!(ring.lost(), 1);
        }
        assert_eq!(ring.read(1), Some(event(11)));
        accounted(&ring);
    });
}

#[test]
fn a_restart_while_an_event_is_written_keeps_the_new_recording_clean() {
    model(|| {
        let ring = Arc::new(Ring::new(1).expect("a one-slot ring"));
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || ring.push(event(10)))
        };
        ring.restart();
        let window = ring.window();
        // The old event is in the new recording only if it took its number after the
        // restart; either way nothing the window shows is torn or foreign.
        let (seq, kept) = ring.push(event(20));
        let (old_seq, _) = writer.join().unwrap();
        if seq > old_seq {
            // Ours is the newer: it is in the ring unless it gave way to the older,
            // still being written, which is then counted.
            assert!(kept || ring.lost() == 1, "the new event vanished uncounted");
        }
        for s in ring.window() {
            if let Some(f) = ring.read(s) {
                let id = whole(f);
                assert!(s >= window.start, "an event before the restart is shown");
                assert_eq!(id, if s == seq { 20 } else { 10 });
            }
        }
        accounted(&ring);
    });
}
