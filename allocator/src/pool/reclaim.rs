//! Reclaimers: callbacks a pool runs when an allocation reaches a limit, so that the
//! layers above can free what they no longer need before the request fails.
//!
//! Invariant: running the reclaimers allocates nothing (the list is an `Arc<[_]>`, cloned
//! under the lock and replaced, never grown, at each registration), and a thread never
//! runs one pool's reclaimers inside themselves: a reclaimer that allocates from the same
//! pool and reaches the limit again gets no second round (its request fails or is served
//! from the cache), whatever it does, panics included.

use std::cell::Cell;
use std::fmt;
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
    /// thread is already running that pool's reclaimers.
    pub(super) fn run(&self, pool: usize) {
        let outer = RECLAIMING.with(|r| r.get());
        if outer == pool {
            return;
        }
        let reclaimers = self.current();
        if reclaimers.is_empty() {
            return;
        }
        RECLAIMING.with(|r| r.set(pool));
        // Restores the outer pool's mark even if a reclaimer panics.
        let _restore = RestoreReclaiming(outer);
        for reclaim in reclaimers.iter() {
            reclaim();
        }
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
                inner.upgrade().unwrap().run(1);
                0
            });
        }
        reclaimers.run(1);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Run for pool 2, each reclaimer's nested run for pool 1 is not skipped (one
        // round of two more, whose own nested runs are), and the mark is restored after.
        reclaimers.run(2);
        assert_eq!(calls.load(Ordering::SeqCst), 2 + 2 * 3);
        assert_eq!(RECLAIMING.with(|r| r.get()), 0);
    }
}
