//! loom models of the freed/views hand-off of a pool block (`ndmem::handoff::Handoff`,
//! compiled from `src/memory/handoff.rs`), the protocol between a scope freeing a tensor's
//! block, borrowed views of it, and the last handle dropping.
//!
//! What they check, over every interleaving within the preemption bound:
//! - the block is released exactly once, whoever comes last (the closing scope, the last
//!   view, or the last handle);
//! - never while a granted view reads it: the release writes the block's bytes and a view
//!   reads them, through loom's `UnsafeCell`, so a release not ordered after every view's
//!   reads is reported as a race, and a view sees the bytes as they were before any free;
//! - a view created after the free is refused, and a refused view that was the last thing
//!   counted releases the block itself.
#![cfg(ndmem_loom)]
// loom's `UnsafeCell` hands out raw pointers: the model reads and writes through them.
#![allow(unsafe_code)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use ndmem::handoff::{Handoff, ViewEntry};
use ndmem_loom_tests::model;

const LIVE: u64 = 0x11;
const RELEASED: u64 = 0xdead;

/// A tensor's memory as the storage holds it: the hand-off, the block's bytes, and a
/// count of releases kept outside it (so it can be read after the last handle is gone).
struct Storage {
    handoff: Handoff,
    bytes: UnsafeCell<u64>,
    releases: Arc<AtomicUsize>,
}

impl Storage {
    fn new(releases: &Arc<AtomicUsize>) -> Storage {
        Storage {
            handoff: Handoff::new(),
            bytes: UnsafeCell::new(LIVE),
            releases: releases.clone(),
        }
    }

    /// What the storage does when the hand-off says "free it now": the block goes back to
    /// the pool (here: its bytes are overwritten, a write loom checks against every read).
    fn release(&self) {
        self.releases.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the hand-off names one releaser, ordered after every granted view's
        // read; if it did not, loom reports the concurrent access instead of running it.
        self.bytes.with_mut(|bytes| unsafe { *bytes = RELEASED });
    }

    /// The owning scope closes.
    fn free_for_scope(&self) {
        if self.handoff.free() {
            self.release();
        }
    }

    /// A borrowed view: read the bytes while counted. Returns whether it was granted.
    fn view(&self) -> bool {
        match self.handoff.enter_view() {
            ViewEntry::Granted => {
                // SAFETY: a granted view is counted, so nobody releases (writes) the block
                // until it leaves; loom reports it if that fails.
                let seen = self.bytes.with(|bytes| unsafe { *bytes });
                assert_eq!(seen, LIVE, "a granted view read a released block");
                if self.handoff.leave_view() {
                    self.release();
                }
                true
            }
            ViewEntry::Refused { free_now } => {
                assert!(
                    self.handoff.is_freed(),
                    "refused, but the block is not freed"
                );
                if free_now {
                    self.release();
                }
                false
            }
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.handoff.last_reference_dropped() {
            self.release();
        }
    }
}

/// Runs `threads` over one shared storage, drops the main handle while they run, and
/// checks that the block was released exactly once.
fn run(threads: Vec<fn(Arc<Storage>)>) {
    let releases = Arc::new(AtomicUsize::new(0));
    let storage = Arc::new(Storage::new(&releases));
    let handles: Vec<_> = threads
        .into_iter()
        .map(|body| {
            let storage = storage.clone();
            thread::spawn(move || body(storage))
        })
        .collect();
    drop(storage);
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(releases.load(Ordering::Relaxed), 1, "released exactly once");
}

#[test]
fn a_scope_closing_under_a_view_releases_once_after_the_view() {
    model(|| {
        run(vec![|s| s.free_for_scope(), |s| {
            s.view();
        }]);
    });
}

#[test]
fn two_views_racing_a_close_release_once_after_both() {
    model(|| {
        run(vec![
            |s| s.free_for_scope(),
            |s| {
                s.view();
            },
            |s| {
                s.view();
            },
        ]);
    });
}

#[test]
fn a_view_after_the_close_is_refused_and_nothing_is_released_twice() {
    model(|| {
        run(vec![|s| {
            s.free_for_scope();
            assert!(!s.view(), "a view after the free is refused");
            s.free_for_scope();
        }]);
    });
}

#[test]
fn without_a_close_the_last_handle_releases_the_block() {
    model(|| {
        run(vec![
            |s| {
                assert!(s.view(), "nothing freed the block");
            },
            |s| {
                assert!(s.view(), "nothing freed the block");
            },
        ]);
    });
}
