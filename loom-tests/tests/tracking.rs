//! loom models of the tracking allocator's per-thread protocol, `ndmem_alloc::counter::Tally`
//! against a shared `Ledger` (budget, reserves, live counter, counts): the code the
//! `#[global_allocator]` runs, driven here the way `Tracking` drives it, with an atomic
//! `held` standing for the memory the inner allocator hands out.
//!
//! What they check, over every interleaving within the preemption bound:
//! - the bytes handed out never pass the limit while threads take from their cells, refill
//!   from their reserves and the budget, spill back, and recall each other's reserves;
//! - the published live figure and its peak never pass the limit, and once every thread
//!   has retired the figures are exact: nothing reserved or live, every allocation, free and
//!   byte counted once;
//! - a refused allocation recalls what an idle thread holds in reserve: after the other
//!   thread has gone idle (without exiting), one thread can take the whole limit.
#![cfg(ndmem_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::counter::{Ledger, Tally};
use ndmem_loom_tests::model;

type Books = Ledger<2>;

const LIMIT: usize = 100;

/// An allocation of `size` bytes as `Tracking::alloc` makes it: the hot path counts it
/// before the memory is handed out; otherwise take from the cell (or the cold path), hand
/// out the memory, count it. Returns whether it was served.
fn alloc(tally: &Tally, books: &Books, held: &AtomicUsize, size: usize) -> bool {
    if tally.try_alloc(size, 1) {
        let now = held.fetch_add(size, Ordering::SeqCst) + size;
        assert!(now <= LIMIT, "{now} bytes handed out, limit {LIMIT}");
        return true;
    }
    if !tally.try_take(size) && !tally.take_slow(books, size, || {}) {
        return false;
    }
    let now = held.fetch_add(size, Ordering::SeqCst) + size;
    assert!(now <= LIMIT, "{now} bytes handed out, limit {LIMIT}");
    if !tally.allocated(size) {
        tally.settle(books);
    }
    true
}

/// A free as `Tracking::dealloc` makes it: count it, give the memory back, settle.
fn free(tally: &Tally, books: &Books, held: &AtomicUsize, size: usize) {
    let fast = tally.freed(books, size);
    held.fetch_sub(size, Ordering::SeqCst);
    if !fast {
        tally.settle(books);
    }
}

/// What a watcher may see at any moment: the published live figure within the limit
/// (the budget's own bound is modelled in `budget.rs`).
fn within_limit(books: &Books) {
    let live = books.live().value();
    assert!(live <= LIMIT, "{live} bytes published live, limit {LIMIT}");
}

#[test]
fn the_limit_holds_and_the_figures_end_exact() {
    model(|| {
        let books = Arc::new(Books::new(Some(LIMIT)));
        let held = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = [40, 70]
            .into_iter()
            .map(|size| {
                let (books, held) = (books.clone(), held.clone());
                thread::spawn(move || {
                    let tally = Tally::new();
                    let served = alloc(&tally, &books, &held, size);
                    if served {
                        free(&tally, &books, &held, size);
                    }
                    (served.then_some(size), tally)
                })
            })
            .collect();
        // The threads exit: their tallies retire (after the join, to keep the model small).
        let served: Vec<usize> = workers
            .into_iter()
            .filter_map(|w| {
                let (served, tally) = w.join().unwrap();
                tally.retire(&books);
                served
            })
            .collect();
        assert!(!served.is_empty(), "one of 40 and 70 always fits");
        let bytes: usize = served.iter().sum();
        assert_eq!(books.budget().used(), 0, "{books:?}");
        assert_eq!(books.reserves().total(), 0);
        let live = books.live().read();
        assert_eq!(live.value, 0);
        // The peak covers every published figure: none passed the limit.
        assert!(live.peak <= LIMIT && live.peak >= served[0], "{live:?}");
        assert_eq!(live.total, bytes as u64);
        let counts = books.counts();
        assert_eq!(counts.allocations, served.len() as u64);
        assert_eq!(counts.deallocations, served.len() as u64);
        assert_eq!(counts.freed_bytes, bytes as u64);
    });
}

#[test]
fn a_refusal_recalls_what_an_idle_thread_holds() {
    model(|| {
        let books = Arc::new(Books::new(Some(LIMIT)));
        let held = Arc::new(AtomicUsize::new(0));
        let idle = {
            let (books, held) = (books.clone(), held.clone());
            thread::spawn(move || {
                // Allocates and frees twice (the second time from its own reserve, racing
                // the recall), then goes idle without exiting: its tally is never retired.
                let tally = Tally::new();
                for _ in 0..2 {
                    if alloc(&tally, &books, &held, 50) {
                        free(&tally, &books, &held, 50);
                    }
                }
                tally.cell()
            })
        };
        let tally = Tally::new();
        // May be refused while the other thread holds its 50 bytes.
        if alloc(&tally, &books, &held, 60) {
            free(&tally, &books, &held, 60);
        }
        within_limit(&books);
        let idle_cell = idle.join().unwrap();
        // Only the idle thread's cell is out of reach (nothing at this headroom).
        assert_eq!(idle_cell, 0);
        assert!(
            alloc(&tally, &books, &held, LIMIT),
            "the idle thread's reserve was recalled: {books:?}"
        );
        free(&tally, &books, &held, LIMIT);
        tally.retire(&books);
        assert_eq!(books.budget().used(), 0, "{books:?}");
        assert_eq!(books.live().value(), 0);
    });
}
