//! loom models of `ndmem::workspace_state::StateWord`, the word (`generation << 2 |
//! DESTROYED | OPEN`) a workspace's owner thread writes and `Stamp::check` reads, from any
//! thread, with one load.
//!
//! What they check, over every interleaving within the preemption bound:
//! - a thread whose load sees a cycle closed sees what the owner wrote in that cycle
//!   (loom's `UnsafeCell` tracks it: open/close/destroy must release, the load acquire);
//! - a reader never sees the generation go back, never sees a destroyed workspace open
//!   again, and a stamp of cycle 1 never passes the check once a later state was seen.

#![allow(unsafe_code)]
#![cfg(ndmem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use ndmem::workspace_state::{generation_of, opened, StateWord, DESTROYED, OPEN};
use ndmem_loom_tests::model;

struct Workspace {
    state: StateWord,
    /// Bytes written by the owner during a cycle.
    memory: UnsafeCell<u64>,
}

#[test]
fn a_reader_that_sees_a_cycle_closed_sees_what_it_wrote() {
    model(|| {
        let ws = Arc::new(Workspace {
            state: StateWord::new(),
            memory: UnsafeCell::new(0),
        });
        let reader = {
            let ws = ws.clone();
            thread::spawn(move || {
                let word = ws.state.load();
                if generation_of(word) >= 1 && word & OPEN == 0 {
                    // SAFETY: the owner wrote the memory before closing cycle 1 and never
                    // writes it again; loom checks the close happens before this read.
                    Some(ws.memory.with(|p| unsafe { *p }))
                } else {
                    None
                }
            })
        };
        ws.state.open(1);
        // SAFETY: the reader reads only after it saw cycle 1 closed.
        ws.memory.with_mut(|p| unsafe { *p = 42 });
        ws.state.close(1);
        if let Some(value) = reader.join().unwrap() {
            assert_eq!(value, 42, "a closed cycle's bytes are visible");
        }
    });
}

#[test]
fn readers_see_the_lifecycle_in_order_and_destroy_is_final() {
    model(|| {
        let state = Arc::new(StateWord::new());
        state.open(1);
        let stamp = opened(1);
        let reader = {
            let state = state.clone();
            thread::spawn(move || {
                let mut last_generation = 0;
                let mut destroyed = false;
                let mut outdated = false;
                for _ in 0..3 {
                    let word = state.load();
                    assert!(
                        generation_of(word) >= last_generation,
                        "generation went back"
                    );
                    last_generation = generation_of(word);
                    if destroyed {
                        assert_ne!(word & DESTROYED, 0, "destroyed came undone");
                    }
                    if word & DESTROYED != 0 {
                        destroyed = true;
                        assert_eq!(word & OPEN, 0, "a destroyed workspace is open");
                    }
                    let valid = word == stamp;
                    assert!(
                        !(outdated && valid),
                        "a stamp of cycle 1 passed after cycle 1 ended"
                    );
                    outdated |= !valid;
                }
            })
        };
        state.close(1);
        state.open(2);
        state.destroy();
        reader.join().unwrap();
        assert_eq!(state.load(), 2 << 2 | DESTROYED);
    });
}
