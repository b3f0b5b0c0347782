//! Exact byte budgets: reserve before memory is obtained, release after it is given back.
//!
//! Invariant: the budget keeps `headroom = limit - reserved` in **one** atomic word, and a
//! reservation succeeds only through a compare-and-swap that leaves the headroom `>= 0`. So
//! the reserved total never passes the limit, not even transiently, however many threads
//! race; and because the count is signed, a release can never wrap it (the `cap` crate's
//! unsigned `fetch_sub` can). Changing the limit moves the headroom by the difference in the
//! same single-word CAS, so a lower limit is refused while more than it is reserved.

use crate::sync::{spin_loop, AtomicBool, AtomicIsize, AtomicUsize, Ordering};

/// The limit of a budget without one: large enough never to be reached, small enough that
/// `headroom` arithmetic cannot overflow an `isize`.
pub const UNLIMITED: usize = 1 << 62;

/// A reservation failed: `requested` bytes did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted {
    /// Bytes reserved when the request failed.
    pub used: usize,
    /// The limit in force.
    pub limit: usize,
}

/// A byte budget with an exact limit and a high-water mark.
pub struct Budget {
    headroom: AtomicIsize,
    /// The limit `headroom` is measured from; written only under `limit_lock`.
    limit: AtomicUsize,
    peak: AtomicUsize,
    limit_lock: AtomicBool,
}

impl Budget {
    /// A budget with nothing reserved; `limit` of `None` is [`UNLIMITED`].
    #[cfg(not(ndmem_loom))]
    pub const fn new(limit: Option<usize>) -> Budget {
        let limit = match limit {
            Some(l) if l < UNLIMITED => l,
            _ => UNLIMITED,
        };
        Budget {
            headroom: AtomicIsize::new(limit as isize),
            limit: AtomicUsize::new(limit),
            peak: AtomicUsize::new(0),
            limit_lock: AtomicBool::new(false),
        }
    }

    /// A budget with nothing reserved; `limit` of `None` is [`UNLIMITED`].
    #[cfg(ndmem_loom)]
    pub fn new(limit: Option<usize>) -> Budget {
        let limit = limit.filter(|l| *l < UNLIMITED).unwrap_or(UNLIMITED);
        Budget {
            headroom: AtomicIsize::new(limit as isize),
            limit: AtomicUsize::new(limit),
            peak: AtomicUsize::new(0),
            limit_lock: AtomicBool::new(false),
        }
    }

    /// Reserves `bytes`, or fails without changing anything if they would pass the limit.
    /// Returns the reserved total just after this reservation.
    #[inline]
    pub fn try_reserve(&self, bytes: usize) -> Result<usize, Exhausted> {
        let want = isize::try_from(bytes).map_err(|_| self.exhausted())?;
        let mut headroom = self.headroom.load(Ordering::Relaxed);
        loop {
            if want > headroom {
                return Err(Exhausted {
                    used: self
                        .limit
                        .load(Ordering::Relaxed)
                        .saturating_sub(headroom.max(0) as usize),
                    limit: self.limit.load(Ordering::Relaxed),
                });
            }
            match self.headroom.compare_exchange_weak(
                headroom,
                headroom - want,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => headroom = now,
            }
        }
        let used = self
            .limit
            .load(Ordering::Relaxed)
            .saturating_sub((headroom - want) as usize);
        self.peak.fetch_max(used, Ordering::Relaxed);
        Ok(used)
    }

    /// Returns `bytes` reserved earlier.
    #[inline]
    pub fn release(&self, bytes: usize) {
        self.headroom.fetch_add(bytes as isize, Ordering::Release);
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        let headroom = self.headroom.load(Ordering::Acquire);
        self.limit
            .load(Ordering::Relaxed)
            .saturating_sub(headroom.max(0) as usize)
    }

    /// Bytes that can still be reserved.
    pub fn available(&self) -> usize {
        self.headroom.load(Ordering::Acquire).max(0) as usize
    }

    /// The limit, `None` when unlimited.
    pub fn limit(&self) -> Option<usize> {
        let limit = self.limit.load(Ordering::Relaxed);
        (limit < UNLIMITED).then_some(limit)
    }

    /// The highest reserved total since creation or the last [`Budget::reset_peak`].
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Restarts the high-water mark from the current reserved total.
    pub fn reset_peak(&self) {
        self.peak.store(self.used(), Ordering::Relaxed);
    }

    /// Changes the limit. Fails, changing nothing, when more than the new limit is reserved.
    pub fn set_limit(&self, limit: Option<usize>) -> Result<(), Exhausted> {
        let new = limit.filter(|l| *l < UNLIMITED).unwrap_or(UNLIMITED);
        while self
            .limit_lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spin_loop();
        }
        let old = self.limit.load(Ordering::Relaxed);
        let delta = new as isize - old as isize;
        let mut headroom = self.headroom.load(Ordering::Relaxed);
        let result = loop {
            if headroom + delta < 0 {
                break Err(Exhausted {
                    used: old.saturating_sub(headroom.max(0) as usize),
                    limit: new,
                });
            }
            match self.headroom.compare_exchange_weak(
                headroom,
                headroom + delta,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.limit.store(new, Ordering::Relaxed);
                    break Ok(());
                }
                Err(now) => headroom = now,
            }
        };
        self.limit_lock.store(false, Ordering::Release);
        result
    }

    fn exhausted(&self) -> Exhausted {
        Exhausted {
            used: self.used(),
            limit: self.limit.load(Ordering::Relaxed),
        }
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_exactly_at_the_limit() {
        let budget = Budget::new(Some(100));
        assert_eq!(budget.try_reserve(60), Ok(60));
        assert_eq!(budget.try_reserve(40), Ok(100));
        assert_eq!(
            budget.try_reserve(1),
            Err(Exhausted {
                used: 100,
                limit: 100
            })
        );
        budget.release(50);
        assert_eq!(budget.used(), 50);
        assert_eq!(budget.peak(), 100);
        budget.reset_peak();
        assert_eq!(budget.peak(), 50);
    }

    #[test]
    fn a_lower_limit_below_use_is_refused_and_changes_nothing() {
        let budget = Budget::new(None);
        budget.try_reserve(500).unwrap();
        assert_eq!(budget.limit(), None);
        assert_eq!(
            budget.set_limit(Some(499)),
            Err(Exhausted {
                used: 500,
                limit: 499
            })
        );
        assert_eq!(budget.used(), 500);
        assert_eq!(budget.limit(), None);
        budget.set_limit(Some(600)).unwrap();
        assert_eq!(budget.available(), 100);
        assert!(budget.try_reserve(101).is_err());
        budget.set_limit(None).unwrap();
        assert!(budget.try_reserve(1 << 40).is_ok());
    }

    #[test]
    fn huge_requests_fail_instead_of_wrapping() {
        let budget = Budget::new(Some(10));
        assert!(budget.try_reserve(usize::MAX).is_err());
        assert!(Budget::new(None).try_reserve(usize::MAX / 2).is_err());
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let budget = Budget::new(Some(1000));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        if budget.try_reserve(7).is_ok() {
                            assert!(budget.used() <= 1000);
                            budget.release(7);
                        }
                    }
                });
            }
        });
        assert_eq!(budget.used(), 0);
        assert!(budget.peak() <= 1000);
    }
}
