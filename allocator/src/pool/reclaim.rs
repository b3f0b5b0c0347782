//! Reclaimers: callbacks a pool runs when an allocation reaches a limit, so that the
//! layers above can free what they no longer need before the request fails.
//!
//! Invariant: running the reclaimers allocates nothing (the list is an `Arc<[_]>`, cloned
//! under the lock and replaced, never grown, at each registration), and a thread never
//! runs one pool's reclaimers inside themselves: a reclaimer that allocates from the same
//! pool and reaches the limit again gets no second round (its request fails or is served
//! from the cache), whatever it does, panics included. A reclaimer's panic is caught and
//! becomes the error of the request it ran for: it never unwinds out of the pool.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

type Reclaimer = Arc<dyn Fn() -> usize + Send + Sync>;

/// A pool's registered reclaimers.
pub(super) struct Reclaimers {
    list: Mutex<Arc<[Reclaimer]>>,
}

impl fmt::Debug for Reclaimers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reclaimers")
            .field("registered", &self.current().len())
            .finish()
    }
}

std::thread_local! {
    /// The pool (by address) whose reclaimers this thread is running; 0 when none.
    static RECLAIMING: Cell<usize> = const { Cell::new(0) };
}

/// Puts back the outer `RECLAIMING` mark when reclaimers finish (or panic).
struct RestoreReclaiming(usize);

impl Drop for RestoreReclaiming {
    fn drop(&mut self) {
        RECLAIMING.with(|r| r.set(self.0));
    }
}

impl Reclaimers {
    pub(super) fn new() -> Reclaimers {
        Reclaimers {
            list: Mutex::new(Arc::new([])),
        }
    }

    /// The list now (a poisoned lock still holds a whole list: it is only ever replaced).
    fn current(&self) -> Arc<[Reclaimer]> {
        match self.list.lock() {
            Ok(list) => Arc::clone(&list),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Adds `reclaim` to the list.
    pub(super) fn register(&self, reclaim: impl Fn() -> usize + Send + Sync + 'static) {
        let mut list = match self.list.lock() {
            Ok(list) => list,
            Err(poisoned) => poisoned.into_inner(),
        };
        let grown: Arc<[Reclaimer]> = list
            .iter()
            .cloned()
            .chain(std::iter::once(Arc::new(reclaim) as Reclaimer))
            .collect();
        *list = grown;
    }

    /// Runs every reclaimer once on behalf of the pool at address `pool`, unless this
    /// thread is already running that pool's reclaimers. A reclaimer that panics stops the
    /// round: `Err` carries its panic message.
    pub(super) fn run(&self, pool: usize) -> Result<usize, String> {
        let outer = RECLAIMING.with(|r| r.get());
        if outer == pool {
            return Ok(0);
        }
        let reclaimers = self.current();
        if reclaimers.is_empty() {
            return Ok(0);
        }
        RECLAIMING.with(|r| r.set(pool));
        // Restores the outer pool's mark whatever the reclaimers do.
        let _restore = RestoreReclaiming(outer);
        let mut freed = 0usize;
        for reclaim in reclaimers.iter() {
            // AssertUnwindSafe: the pool's own state is consistent while a reclaimer runs
            // (no lock is held, no count is half-updated), and whatever a panicking
            // reclaimer leaves half-done is its own state, which it shares with every
            // thread anyway (it is `Sync`); the closure is only borrowed from the list.
            match catch_unwind(AssertUnwindSafe(|| reclaim())) {
                Ok(bytes) => freed = freed.saturating_add(bytes),
                Err(payload) => return Err(panic_message(&*payload)),
            }
        }
        Ok(freed)
    }
}

/// The message of a panic payload (`panic!` makes a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a payload that is not a string".to_string()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn reclaimers_run_in_order_and_never_inside_themselves() {
        let reclaimers = Arc::new(Reclaimers::new());
        let calls = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let (inner, calls) = (Arc::downgrade(&reclaimers), calls.clone());
            reclaimers.register(move || {
                calls.fetch_add(1, Ordering::SeqCst);
                // A nested run for the same pool (an allocation at the limit) is skipped.
                inner.upgrade().unwrap().run(1).unwrap();
                0
            });
        }
        reclaimers.run(1).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Run for pool 2, each reclaimer's nested run for pool 1 is not skipped (one
        // round of two more, whose own nested runs are), and the mark is restored after.
        reclaimers.run(2).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2 + 2 * 3);
        assert_eq!(RECLAIMING.with(|r| r.get()), 0);
    }

    #[test]
    fn a_panicking_reclaimer_is_an_error_and_stops_the_round() {
        let reclaimers = Reclaimers::new();
        let after = Arc::new(AtomicUsize::new(0));
        reclaimers.register(|| panic!("reclaimer {} failed", 7));
        let calls = after.clone();
        reclaimers.register(move || calls.fetch_add(1, Ordering::SeqCst));
        assert_eq!(reclaimers.run(3), Err("reclaimer 7 failed".to_string()));
        assert_eq!(after.load(Ordering::SeqCst), 0);
        assert_eq!(RECLAIMING.with(|r| r.get()), 0, "the mark is restored");
    }
}
