//! loom models of `ndmem_alloc::counter::Budget`, the single-word CAS budget under both the
//! tracking allocator's heap limit and the pool's off-heap limit.
//!
//! What they check, over every interleaving within the preemption bound:
//! - concurrent `try_reserve`/`release` never let the bytes callers hold pass the limit;
//!   of two requests that cannot both fit exactly one succeeds, and the refusal reports
//!   the true figures;
//! - `set_limit` racing reservations never leaves more reserved than the limit, refuses a
//!   limit below what is reserved (changing nothing), and two racing `set_limit`s leave
//!   the limit and headroom consistent;
//! - `release` racing reservations and refusals never wraps the counter: `used` and
//!   `available` stay within `[0, limit]` and everything reserved comes back to zero;
//! - the figures read while `set_limit` runs (`used`, `peak`, a reservation's result, a
//!   refusal's) are totals that really were reserved;
//! - a `Counter` (the value, peak and total both the pool's and the heap's statistics are
//!   made of) updated by two threads, one per block and one in batches, ends exact, and its
//!   peak covers every excursion without passing what was ever live at once;
//! - a batch's high from before a peak reset, published while the reset runs, never
//!   raises the peak after it (the peak word carries the reset generation).
#![cfg(ndmem_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::counter::{Budget, Counter, Exhausted};
use ndmem_loom_tests::model;

/// Reserves `bytes`, records them in `held` (the bytes callers really hold), checks the
/// limit against both, and gives them back. Returns whether the reservation succeeded.
fn reserve_hold_release(budget: &Budget, held: &AtomicUsize, bytes: usize, limit: usize) -> bool {
    match budget.try_reserve(bytes) {
        Ok(used) => {
            assert!(used <= limit, "reservation reported {used} > limit {limit}");
            let now = held.fetch_add(bytes, Ordering::SeqCst) + bytes;
            assert!(now <= limit, "callers hold {now} bytes > limit {limit}");
            assert!(budget.used() <= limit);
            held.fetch_sub(bytes, Ordering::SeqCst);
            budget.release(bytes);
            true
        }
        Err(e) => {
            assert_eq!(e.limit, limit);
            assert!(e.used <= limit);
            false
        }
    }
}

#[test]
fn concurrent_reservations_never_pass_the_limit() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        let held = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = [6, 7]
            .into_iter()
            .map(|bytes| {
                let (budget, held) = (budget.clone(), held.clone());
                thread::spawn(move || reserve_hold_release(&budget, &held, bytes, 10))
            })
            .collect();
        // The main thread watches from outside: the figures stay within the limit.
        assert!(budget.used() <= 10);
        assert!(budget.available() <= 10);
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.available(), 10);
        assert!(budget.peak() <= 10);
    });
}

#[test]
fn of_two_requests_that_cannot_both_fit_exactly_one_succeeds() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        let workers: Vec<_> = [6, 5]
            .into_iter()
            .map(|bytes| {
                let budget = budget.clone();
                thread::spawn(move || (bytes, budget.try_reserve(bytes)))
            })
            .collect();
        let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let won: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(won.len(), 1, "{results:?}");
        let winner = won[0].0;
        for (bytes, result) in &results {
            match result {
                Ok(used) => assert_eq!(*used, *bytes),
                Err(e) => assert_eq!(
                    *e,
                    Exhausted {
                        used: winner,
                        limit: 10
                    }
                ),
            }
        }
        assert_eq!(budget.used(), winner);
        assert_eq!(budget.peak(), winner);
    });
}

#[test]
fn a_lower_limit_racing_a_reservation_never_leaves_use_above_it() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        let reserver = {
            let budget = budget.clone();
            thread::spawn(move || budget.try_reserve(6))
        };
        let lowered = budget.set_limit(Some(4));
        let reserved = reserver.join().unwrap();
        // Exactly one of them wins: 6 bytes never live under a limit of 4.
        match (&reserved, &lowered) {
            (Ok(6), Err(e)) => {
                assert_eq!(*e, Exhausted { used: 6, limit: 4 });
                assert_eq!(budget.limit(), Some(10));
                assert_eq!(budget.used(), 6);
                assert_eq!(budget.available(), 4);
            }
            (Err(e), Ok(())) => {
                // Refused under the new limit, with nothing reserved.
                assert_eq!(*e, Exhausted { used: 0, limit: 4 });
                assert_eq!(budget.limit(), Some(4));
                assert_eq!(budget.used(), 0);
                assert_eq!(budget.available(), 4);
            }
            _ => panic!("reserve {reserved:?}, set_limit {lowered:?}"),
        }
    });
}

#[test]
fn a_lower_limit_is_accepted_once_the_bytes_are_released() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        let held = Arc::new(AtomicUsize::new(0));
        let reserver = {
            let (budget, held) = (budget.clone(), held.clone());
            thread::spawn(move || {
                if budget.try_reserve(6).is_ok() {
                    held.fetch_add(6, Ordering::SeqCst);
                    // Whatever the limit is now, the 6 bytes fit in it.
                    let limit = budget.limit().unwrap();
                    assert!(limit >= 6, "6 bytes held under a limit of {limit}");
                    held.fetch_sub(6, Ordering::SeqCst);
                    budget.release(6);
                }
            })
        };
        let lowered = budget.set_limit(Some(4));
        if lowered.is_ok() {
            // From here on nobody may hold more than 4 bytes.
            assert!(held.load(Ordering::SeqCst) <= 4);
        }
        reserver.join().unwrap();
        let limit = if lowered.is_ok() { 4 } else { 10 };
        assert_eq!(budget.limit(), Some(limit));
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.available(), limit);
    });
}

#[test]
fn racing_limit_changes_leave_limit_and_headroom_consistent() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        budget.try_reserve(3).unwrap();
        let other = {
            let budget = budget.clone();
            thread::spawn(move || budget.set_limit(Some(5)))
        };
        let mine = budget.set_limit(Some(8));
        let theirs = other.join().unwrap();
        assert!(mine.is_ok() && theirs.is_ok());
        // Whichever ran last decides; either way headroom = limit - reserved.
        let limit = budget.limit().unwrap();
        assert!(limit == 5 || limit == 8, "limit {limit}");
        assert_eq!(budget.used(), 3);
        assert_eq!(budget.available(), limit - 3);
        assert!(budget.try_reserve(limit - 3).is_ok());
        assert!(budget.try_reserve(1).is_err());
    });
}

#[test]
fn releases_racing_reservations_never_wrap() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(8)));
        budget.try_reserve(8).unwrap();
        let releaser = {
            let budget = budget.clone();
            thread::spawn(move || {
                budget.release(5);
                budget.release(3);
            })
        };
        // Racing requests: a huge one (refused without effect) and one that fits only
        // after the first release.
        assert!(budget.try_reserve(usize::MAX).is_err());
        let got = budget.try_reserve(4);
        let (used, available) = (budget.used(), budget.available());
        assert!(
            used <= 8 && available <= 8,
            "used {used}, available {available}"
        );
        releaser.join().unwrap();
        let expect = if got.is_ok() { 4 } else { 0 };
        assert_eq!(budget.used(), expect);
        assert_eq!(budget.available(), 8 - expect);
        if got.is_ok() {
            budget.release(4);
        }
        assert_eq!(budget.used(), 0);
        assert!(budget.peak() <= 8);
    });
}

#[test]
fn an_unlimited_budget_counts_exactly_under_races() {
    model(|| {
        let budget = Arc::new(Budget::new(None));
        let workers: Vec<_> = [3, 5]
            .into_iter()
            .map(|bytes| {
                let budget = budget.clone();
                thread::spawn(move || {
                    let used = budget.try_reserve(bytes).unwrap();
                    assert!(used >= bytes && used <= 8);
                    budget.release(bytes);
                })
            })
            .collect();
        let used = budget.used();
        assert!(used <= 8, "used {used}");
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.limit(), None);
        assert!(budget.peak() <= 8);
    });
}

/// Only 4 bytes are ever reserved, while another thread lowers the limit from 100 to 50:
/// every figure read meanwhile must be a total that existed (at most 4), and a refusal
/// while the limit drops from 10 to 4 with nothing reserved must report `used: 0`.
///
/// `set_limit` moves `headroom` by CAS and stores `limit` afterwards, and every figure is
/// `limit - headroom`. Without the sequence lock around that pair, a reservation (or
/// `used()`, or a refusal) that sees the new headroom with the old limit reports
/// `old_limit - new_headroom`: `try_reserve(4)` returned `Ok(54)` and `peak()` stayed 54,
/// above the new limit of 50, though 4 bytes were reserved.
#[test]
fn figures_read_during_a_limit_change_are_real_totals() {
    model(|| {
        let budget = Arc::new(Budget::new(Some(100)));
        let changer = {
            let budget = budget.clone();
            thread::spawn(move || budget.set_limit(Some(50)).unwrap())
        };
        let reported = budget.try_reserve(4).unwrap();
        let used = budget.used();
        changer.join().unwrap();
        assert!(
            reported <= 4,
            "try_reserve reported {reported} bytes in use"
        );
        assert!(used <= 4, "used() read {used}");
        assert!(budget.peak() <= 4, "peak {}", budget.peak());
    });
    model(|| {
        let budget = Arc::new(Budget::new(Some(10)));
        let changer = {
            let budget = budget.clone();
            // Refused if the 6 bytes got in first.
            thread::spawn(move || budget.set_limit(Some(4)))
        };
        let reserved = budget.try_reserve(6);
        let lowered = changer.join().unwrap();
        match (reserved, lowered) {
            (Ok(used), Err(e)) => {
                assert_eq!(used, 6);
                assert_eq!(e, Exhausted { used: 6, limit: 4 });
            }
            (Err(e), Ok(())) => {
                assert_eq!(
                    e,
                    Exhausted { used: 0, limit: 4 },
                    "refusal with nothing reserved"
                );
            }
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn counters_add_up_and_their_peak_covers_every_excursion() {
    model(|| {
        let counter = Arc::new(Counter::new());
        let per_block = {
            let counter = counter.clone();
            thread::spawn(move || {
                counter.add(5);
                counter.sub(5);
            })
        };
        // A batch that rose by 10 and ended 4 up, then one that gave the 4 back.
        counter.publish(4, 10, 0);
        let seen = counter.read();
        assert!(seen.value <= 9, "value {} > everything live", seen.value);
        assert!(
            seen.peak >= 10,
            "peak {} misses the batch's excursion",
            seen.peak
        );
        counter.publish(-4, 0, 0);
        counter.add_total(10);
        per_block.join().unwrap();
        let end = counter.read();
        assert_eq!(end.value, 0);
        assert_eq!(end.total, 15);
        assert!(
            (10..=15).contains(&end.peak),
            "peak {} outside [10, 15]",
            end.peak
        );
    });
}

#[test]
fn a_high_from_before_a_peak_reset_never_raises_the_peak_after_it() {
    model(|| {
        // A thread's batch rose 100 above the value and came back (net 0) in reset
        // generation 0; it publishes while another thread resets the peak. Published
        // before the reset, the reset erases it; after, the generation in the peak word
        // refuses it: either way the peak after both is the value, 0.
        let counter = Arc::new(Counter::new());
        let reset = {
            let counter = counter.clone();
            thread::spawn(move || counter.reset_peak())
        };
        counter.publish(0, 100, 0);
        reset.join().unwrap();
        assert_eq!(counter.peak(), 0, "a high from before the reset got in");
        // A batch of the new generation raises it as usual.
        counter.publish(0, 7, counter.resets());
        assert_eq!(counter.peak(), 7);
    });
}

#[test]
fn two_peak_resets_at_once_leave_the_peak_counting_this_generations_highs() {
    model(|| {
        // Two resets race: whichever installs its word last, the word must carry the
        // generation of the count, or every later batch's high is refused (the peak then
        // missed a single thread's excursions until the next reset).
        let counter = Arc::new(Counter::new());
        let other = {
            let counter = counter.clone();
            thread::spawn(move || counter.reset_peak())
        };
        counter.reset_peak();
        other.join().unwrap();
        counter.publish(0, 100, counter.resets());
        assert_eq!(
            counter.peak(),
            100,
            "a batch of the current generation was refused"
        );
    });
}
