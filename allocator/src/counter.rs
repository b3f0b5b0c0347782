//! The two shared figures of this crate: exact byte [`Budget`]s (reserve before memory is
//! obtained, release after it is given back) and [`Counter`]s (a value with its peak and
//! running total), which both the pool's and the tracking allocator's statistics are made of;
//! and the tracking allocator's per-thread batching of a budget ([`Tally`], [`Ledger`],
//! [`Reserves`]: module `tally`), kept here, free of `GlobalAlloc`, so that loom runs it;
//! and the thresholds of the pool's per-thread hit paths that other threads can force
//! ([`Gate`]: module `gate`).
//!
//! Invariant of a budget: it keeps `headroom = limit - reserved` in **one** atomic word, and a
//! reservation succeeds only through a compare-and-swap that leaves the headroom `>= 0`. So
//! the reserved total never passes the limit, not even transiently, however many threads
//! race; and because the count is signed, a release can never wrap it (the `cap` crate's
//! unsigned `fetch_sub` can). Changing the limit moves the headroom by the difference in the
//! same single-word CAS, so a lower limit is refused while more than it is reserved.
//!
//! The figures (`used = limit - headroom`) need the limit and the headroom of the same
//! moment, which are two words. A limit change is therefore a *sequence lock* writer: it
//! makes `seq` odd, moves the headroom, stores the limit and makes `seq` even again. A
//! reader takes the pair only if `seq` was even and unchanged around it (every load
//! acquires, and every headroom update releases, so a reader that sees any part of a change
//! also sees `seq` moved), and reads again otherwise. A reservation itself never waits for
//! that lock (it only needs the headroom); only its reported total, if a limit change ran
//! during it, is read again once that change is done.

use std::fmt;

mod gate;
mod tally;

pub use gate::Gate;
pub use tally::{Counts, Ledger, Reserves, Tally};

use crate::sync::{spin_loop, AtomicIsize, AtomicU64, AtomicUsize, Ordering};

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
    /// The limit `headroom` is measured from; written only while `seq` is odd.
    limit: AtomicUsize,
    peak: AtomicUsize,
    /// Odd while a limit change runs (the lock of `set_limit`, and the version readers of
    /// `limit` and `headroom` check).
    seq: AtomicUsize,
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
            seq: AtomicUsize::new(0),
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
            seq: AtomicUsize::new(0),
        }
    }

    /// Reserves `bytes`, or fails without changing anything if they would pass the limit.
    /// Returns the reserved total just after this reservation, which the peak includes.
    #[inline]
    pub fn try_reserve(&self, bytes: usize) -> Result<usize, Exhausted> {
        let used = self.try_reserve_unmarked(bytes)?;
        self.peak.fetch_max(used, Ordering::Relaxed);
        Ok(used)
    }

    /// [`Budget::try_reserve`] without raising the peak, for a caller that may still fail
    /// after reserving (and give the bytes back): it calls [`Budget::note_peak`] once it
    /// truly holds them, so that a refused request never shows in the peak.
    #[inline]
    pub fn try_reserve_unmarked(&self, bytes: usize) -> Result<usize, Exhausted> {
        let want = isize::try_from(bytes).map_err(|_| self.exhausted())?;
        // The limit that goes with the headroom this reservation sees, unless `seq` moves.
        let seq = self.seq.load(Ordering::Acquire);
        let limit = self.limit.load(Ordering::Acquire);
        let mut headroom = self.headroom.load(Ordering::Acquire);
        loop {
            if want > headroom {
                let (used, limit) = self.figures_since(seq, limit, headroom);
                return Err(Exhausted { used, limit });
            }
            match self.headroom.compare_exchange_weak(
                headroom,
                headroom - want,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => headroom = now,
            }
        }
        let (used, _) = self.figures_since(seq, limit, headroom - want);
        Ok(used)
    }

    /// Raises the peak to the reserved total now, for bytes reserved with
    /// [`Budget::try_reserve_unmarked`] that are now held.
    pub fn note_peak(&self) {
        self.peak.fetch_max(self.used(), Ordering::Relaxed);
    }

    /// Raises the high-water mark to `used` (a reading of the reserved total) if it is
    /// lower, and returns the mark: a reader that saw `used` never reports a lower peak,
    /// then or later.
    pub fn raise_peak(&self, used: usize) -> usize {
        self.peak.fetch_max(used, Ordering::Relaxed).max(used)
    }

    /// `(used, limit)` from `limit` and `headroom` read after `seq`, if no limit change
    /// began since `seq` was read (then they belong together); else a fresh snapshot, taken
    /// after the caller's headroom update and so including it.
    #[inline]
    fn figures_since(&self, seq: usize, limit: usize, headroom: isize) -> (usize, usize) {
        if seq % 2 == 0 && self.seq.load(Ordering::Acquire) == seq {
            (limit.saturating_sub(headroom.max(0) as usize), limit)
        } else {
            self.snapshot()
        }
    }

    /// `(used, limit)` of one moment: read between two equal, even values of `seq`.
    fn snapshot(&self) -> (usize, usize) {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq % 2 == 0 {
                let limit = self.limit.load(Ordering::Acquire);
                let headroom = self.headroom.load(Ordering::Acquire);
                if self.seq.load(Ordering::Acquire) == seq {
                    return (limit.saturating_sub(headroom.max(0) as usize), limit);
                }
            }
            spin_loop();
        }
    }

    /// Returns `bytes` reserved earlier.
    #[inline]
    pub fn release(&self, bytes: usize) {
        self.headroom.fetch_add(bytes as isize, Ordering::Release);
    }

    /// Bytes reserved now (a total that was reserved at one moment, even while the limit
    /// changes).
    pub fn used(&self) -> usize {
        self.snapshot().0
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
        let seq = self.lock_limit();
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
                    self.limit.store(new, Ordering::Release);
                    break Ok(());
                }
                Err(now) => headroom = now,
            }
        };
        self.seq.store(seq + 2, Ordering::Release);
        result
    }

    /// Takes the lock of [`Budget::set_limit`]: makes `seq` odd, from an even value, so one
    /// writer at a time. Returns the even value it started from.
    fn lock_limit(&self) -> usize {
        loop {
            let seq = self.seq.load(Ordering::Relaxed);
            if seq % 2 == 0
                && self
                    .seq
                    .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return seq;
            }
            spin_loop();
        }
    }

    /// Holds off limit changes (waiting for one under way to end) until
    /// [`Budget::allow_limit_changes`]: around a `fork()`, so that the child never starts
    /// with the lock taken by a thread it does not have (its readers would wait forever).
    pub fn hold_limit_changes(&self) {
        self.lock_limit();
    }

    /// Ends [`Budget::hold_limit_changes`] (in the parent and in the child of a fork).
    pub fn allow_limit_changes(&self) {
        let seq = self.seq.load(Ordering::Relaxed);
        debug_assert!(seq % 2 == 1, "limit changes were not held");
        self.seq.store(seq + 1, Ordering::Release);
    }

    fn exhausted(&self) -> Exhausted {
        let (used, limit) = self.snapshot();
        Exhausted { used, limit }
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("used", &self.used())
            .field("limit", &self.limit())
            .field("peak", &self.peak())
            .finish()
    }
}

/// A shared figure with its high-water mark and running total: bytes live, their peak and
/// the bytes ever added.
///
/// Invariant: `peak >= value` as of every [`Counter::add`] or [`Counter::publish`] (the
/// peak only grows, until [`Counter::reset_peak`]), and `total` only grows. Each update is
/// as cheap as the figures allow: the value is one `fetch_add`; the peak is *read* first
/// and written only when it rises (rare), so the cache line of a steady counter stays shared
/// between cores; and the total may be published separately, in batches
/// ([`Counter::add_total`]), by writers that tally per thread.
///
/// The value is signed: a writer that publishes its frees before another publishes the
/// allocations they free can take it below zero for a moment, and [`Counter::value`] reads
/// such a moment as 0 rather than wrapping.
pub struct Counter {
    value: AtomicIsize,
    /// The peak (low [`PEAK_BITS`] bits) and the low bits of the reset count it belongs
    /// to (the rest), in one word: a high-water mark that began before a reset is told
    /// apart by the very compare-exchange that would raise the peak with it.
    peak: AtomicU64,
    total: AtomicU64,
    /// Peak resets so far: a publisher whose high-water mark began before the last one
    /// publishes no high from it (see [`Counter::resets`]).
    resets: AtomicU64,
}

/// Bits of a [`Counter`]'s peak word that hold the peak (64 PiB); the rest hold the
/// reset count's low bits.
const PEAK_BITS: u32 = 56;

/// The peak part of a [`Counter`]'s peak word.
const PEAK_MASK: u64 = (1 << PEAK_BITS) - 1;

/// The reset generations a [`Counter`]'s peak word tells apart (its high bits).
const GENERATIONS: u64 = u64::MAX >> PEAK_BITS;

/// A peak word: `peak` (saturated at [`PEAK_MASK`]) in reset generation `resets`.
fn peak_word(resets: u64, peak: u64) -> u64 {
    (resets & GENERATIONS) << PEAK_BITS | peak.min(PEAK_MASK)
}

/// Whether a peak word belongs to reset generation `resets`.
fn same_generation(word: u64, resets: u64) -> bool {
    word >> PEAK_BITS == resets & GENERATIONS
}

/// The figures of a [`Counter`], read one after the other (see [`Counter::read`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterValues {
    /// The value (0 while it is transiently negative).
    pub value: usize,
    /// The highest value since creation or the last [`Counter::reset_peak`].
    pub peak: usize,
    /// Everything ever added.
    pub total: u64,
}

impl Counter {
    /// A counter at zero.
    #[cfg(not(ndmem_loom))]
    pub const fn new() -> Counter {
        Counter {
            value: AtomicIsize::new(0),
            peak: AtomicU64::new(0),
            total: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        }
    }

    /// A counter at zero.
    #[cfg(ndmem_loom)]
    pub fn new() -> Counter {
        Counter {
            value: AtomicIsize::new(0),
            peak: AtomicU64::new(0),
            total: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        }
    }

    /// Adds `n` to the value and the total, raising the peak if the value passes it.
    #[inline]
    pub fn add(&self, n: usize) {
        // The high is the value after the addition: current in whatever generation.
        self.publish(n as isize, n as isize, self.resets());
        self.total.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Takes `n` off the value (the total and the peak stay).
    #[inline]
    pub fn sub(&self, n: usize) {
        self.value.fetch_sub(n as isize, Ordering::Relaxed);
    }

    /// Publishes a batch: adds `net` to the value, and raises the peak to the value before
    /// the batch plus `high`, the highest the batch's running sum reached (0 when it never
    /// rose above its start), if the batch's mark began in reset generation `resets`
    /// ([`Counter::resets`] when it began); a mark from before the last reset raises the
    /// peak to the value after the batch alone. The total is not touched (see
    /// [`Counter::add_total`]).
    ///
    /// The peak so published is exact when no other writer publishes meanwhile; otherwise
    /// this writer's excursion is added to the others' figures as published at that moment.
    /// A reset that lands while this runs is seen by the compare-exchange that raises the
    /// peak (the word carries the generation), so a high from before it never gets in.
    #[inline]
    pub fn publish(&self, net: isize, high: isize, resets: u64) {
        self.publish_capped(net, high, resets, usize::MAX);
    }

    /// [`Counter::publish`], the peak raised no higher than `cap`: a bound the value can
    /// never pass (a limit that reservations never exceed). Added to the others' figures as
    /// published, which may still hold bytes their writers have since freed, a writer's
    /// excursion can otherwise read above anything the value ever was.
    #[inline]
    pub fn publish_capped(&self, net: isize, high: isize, resets: u64, cap: usize) {
        if high <= 0 {
            // The batch never rose above the published figure: no new peak.
            if net != 0 {
                self.value.fetch_add(net, Ordering::Relaxed);
            }
            return;
        }
        let before = if net == 0 {
            self.value.load(Ordering::Relaxed)
        } else {
            self.value.fetch_add(net, Ordering::Relaxed)
        };
        let cap = cap.min(isize::MAX as usize) as isize;
        let top = before.saturating_add(high).min(cap);
        let after = before.saturating_add(net).min(cap);
        // A new peak is rare: read first, so the usual case is no second write.
        let mut word = self.peak.load(Ordering::Relaxed);
        loop {
            let candidate = if same_generation(word, resets) {
                top
            } else {
                after
            };
            if candidate <= 0 || candidate as u64 <= word & PEAK_MASK {
                return;
            }
            let raised = (word & !PEAK_MASK) | (candidate as u64).min(PEAK_MASK);
            match self.peak.compare_exchange_weak(
                word,
                raised,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// Adds `n` to the total alone (a batch of additions whose value was published through
    /// [`Counter::publish`]).
    #[inline]
    pub fn add_total(&self, n: u64) {
        if n != 0 {
            self.total.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The value now (0 while it is transiently negative).
    #[inline]
    pub fn value(&self) -> usize {
        self.value.load(Ordering::Relaxed).max(0) as usize
    }

    /// The highest value since creation or the last [`Counter::reset_peak`].
    #[inline]
    pub fn peak(&self) -> usize {
        (self.peak.load(Ordering::Relaxed) & PEAK_MASK) as usize
    }

    /// Everything ever added.
    #[inline]
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The value, then the peak (never below the value read), then the total. The total
    /// is read last: it only grows, so `total - value` (what was ever taken off, for a
    /// writer whose value and total move together) never comes out negative.
    pub fn read(&self) -> CounterValues {
        let value = self.value();
        // A publisher adds to the value before it raises the peak: a reading between the
        // two sees the new value, which the peak already is.
        let peak = self.peak().max(value);
        let total = self.total();
        CounterValues { value, peak, total }
    }

    /// Restarts the peak from the current value.
    pub fn reset_peak(&self) {
        let resets = self.resets.fetch_add(1, Ordering::AcqRel) + 1;
        // The new generation's word goes in by compare-exchange: a publisher's
        // compare-exchange that read the old generation then fails, and one that came first
        // is overwritten. A reset that counted after this one and installed its word first
        // stands: overwriting it would stamp the peak with an older generation than the
        // count, and every later batch's high would be refused until the next reset (the
        // loom model `budget` checks two resets at once).
        let mine = resets & GENERATIONS;
        let mut word = self.peak.load(Ordering::Relaxed);
        loop {
            let ahead = (word >> PEAK_BITS).wrapping_sub(mine) & GENERATIONS;
            if ahead != 0 && ahead < GENERATIONS / 2 {
                return;
            }
            let reset = peak_word(resets, self.value() as u64);
            match self
                .peak
                .compare_exchange_weak(word, reset, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// How many times the peak was reset. A thread that keeps a high-water mark between
    /// publications reads this when it starts one and again when it publishes: if it
    /// changed, the mark may hold a high from before the reset, which would raise the new
    /// peak after the fact, so it publishes its net bytes alone as the high.
    #[inline]
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Counter::new()
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.read(), f)
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
    fn a_peak_raised_to_a_reading_never_falls_below_it() {
        // What a stats reading does between a reservation and its note_peak.
        let budget = Budget::new(Some(100));
        assert_eq!(budget.try_reserve_unmarked(70), Ok(70));
        assert_eq!(budget.peak(), 0);
        assert_eq!(budget.raise_peak(budget.used()), 70);
        budget.release(70); // handed back (say, refused by the physical limit)
        assert_eq!(budget.peak(), 70, "a later reading shows no lower peak");
        assert_eq!(budget.raise_peak(budget.used()), 70);
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
    fn a_counter_keeps_value_peak_and_total() {
        let counter = Counter::new();
        counter.add(100);
        counter.add(50);
        counter.sub(120);
        assert_eq!(
            counter.read(),
            CounterValues {
                value: 30,
                peak: 150,
                total: 150
            }
        );
        counter.reset_peak();
        assert_eq!(counter.peak(), 30);
        counter.add(10);
        assert_eq!(counter.peak(), 40);
    }

    #[test]
    fn a_published_batch_raises_the_peak_by_its_own_excursion() {
        let counter = Counter::new();
        counter.publish(100, 100, 0);
        // A batch that went up 80 and came back down to 20 net.
        counter.publish(20, 80, 0);
        assert_eq!(counter.value(), 120);
        assert_eq!(counter.peak(), 180);
        assert_eq!(counter.total(), 0, "publish leaves the total to add_total");
        counter.add_total(120);
        assert_eq!(counter.total(), 120);
        // Net frees with no rise: the value falls, the peak stays.
        counter.publish(-200, 0, 0);
        assert_eq!(counter.value(), 0, "a negative value reads as 0");
        assert_eq!(counter.peak(), 180);
        counter.publish(90, 90, 0);
        assert_eq!(
            counter.value(),
            10,
            "the negative moment was kept, not clamped"
        );
        assert_eq!(counter.peak(), 180);
    }

    #[test]
    fn a_capped_batch_raises_the_peak_no_higher_than_its_cap() {
        // Another writer published 100 and has since freed 60 it has not published; this
        // writer's excursion of 50 on top reads 150, above a limit of 120 that live bytes
        // never pass: the peak stops at the cap (it read 150 unbounded).
        let counter = Counter::new();
        counter.publish(100, 100, 0);
        counter.publish_capped(0, 50, 0, 120);
        assert_eq!(counter.peak(), 120);
        assert_eq!(counter.value(), 100, "the value is not capped");
        // Under the cap the peak is raised as before.
        counter.publish_capped(-60, 0, 0, 120);
        counter.publish_capped(10, 15, 0, 120);
        assert_eq!((counter.value(), counter.peak()), (50, 120));
        counter.publish_capped(0, 100, 0, 200);
        assert_eq!(counter.peak(), 150);
    }

    #[test]
    fn a_batch_that_began_before_a_reset_publishes_no_high_from_it() {
        let counter = Counter::new();
        counter.publish(50, 50, counter.resets());
        let before = counter.resets();
        counter.reset_peak();
        assert_eq!(counter.peak(), 50);
        // A mark begun before the reset: its high of 200 is not this generation's.
        counter.publish(10, 200, before);
        assert_eq!(
            counter.peak(),
            60,
            "the value after the batch, not its old high"
        );
        counter.publish(0, 5, counter.resets());
        assert_eq!(counter.peak(), 65);
        // Peaks beyond the word's 56 bits saturate rather than wrap into the generation.
        counter.publish(0, isize::MAX - 100, counter.resets());
        assert_eq!(counter.peak() as u64, PEAK_MASK);
        assert!(same_generation(
            counter.peak.load(Ordering::Relaxed),
            counter.resets()
        ));
    }

    #[test]
    fn concurrent_counters_add_up() {
        let counter = Counter::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        counter.add(3);
                        counter.sub(3);
                    }
                });
            }
        });
        let v = counter.read();
        assert_eq!(v.value, 0);
        assert_eq!(v.total, 4 * 10_000 * 3);
        assert!(v.peak >= 3 && v.peak <= 12, "peak {}", v.peak);
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
