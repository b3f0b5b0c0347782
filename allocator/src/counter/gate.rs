//! [`Gate`]: a threshold an owner thread's hit path tests its level against, which other
//! threads can force to a value that sends the owner to its slow path.
//!
//! Invariant: while a forcing thread's switch is on, a gate it forced after switching on
//! stays forced. Other threads only write the forced value (release, after their switch);
//! the owner changes the gate only by compare-exchange (acquire) from a value it read, and,
//! after a success, reads the switch again: a success that replaced a forcing store it had
//! not seen the switch of (the forcing store wrote the value the owner had read) made that
//! store happen before the second read, which then sees the switch on, and the owner forces
//! the gate itself. Leaving a gate as it is writes nothing, so it overwrites nothing.

#![forbid(unsafe_code)]

use crate::sync::{AtomicIsize, Ordering};

/// A threshold of an owner thread's hit path, with the value that forces its slow path.
pub struct Gate {
    value: AtomicIsize,
    forced: isize,
}

impl Gate {
    /// A gate that starts at `forced` (the owner's first operation takes its slow path,
    /// which sets the gate from the switches of that time).
    pub fn new(forced: isize) -> Gate {
        Gate {
            value: AtomicIsize::new(forced),
            forced,
        }
    }

    /// The threshold now (acquire: a forcing store's switch is seen with it).
    #[inline(always)]
    pub fn get(&self) -> isize {
        self.value.load(Ordering::Acquire)
    }

    /// The threshold now, ordering nothing (the hit path's test).
    #[inline(always)]
    pub fn get_relaxed(&self) -> isize {
        self.value.load(Ordering::Relaxed)
    }

    /// Another thread, after it switched on whatever the owner must take its slow path
    /// for: forces the gate.
    pub fn force(&self) {
        // A swap rather than a store (a slow path: the cost is nothing): a read-modify-write
        // is ordered against the owner's compare-exchanges in the models as on the
        // machine, where loom lets a plain store fall between the read and the write of a
        // concurrent read-modify-write (tokio-rs/loom#254).
        self.value.swap(self.forced, Ordering::AcqRel);
    }

    /// Owner: `seen` (a value it read) becomes `want`, or the forced value while
    /// `forcing()` says a switch is on. `false` if another thread wrote meanwhile, or a
    /// switch came on after the gate was set to `want`: then the caller reads the gate and
    /// decides again.
    pub fn replace(&self, seen: isize, want: isize, forcing: impl Fn() -> bool) -> bool {
        let on = forcing();
        let next = if on { self.forced } else { want };
        if next == seen {
            // Nothing to write (a forced gate while the switch is on, say): a forcing that
            // landed since stands, and no read-modify-write is paid on every slow path.
            return true;
        }
        self.value
            .compare_exchange(seen, next, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            && (on || !forcing())
    }

    /// Owner: sets the gate to `want`, or to the forced value while `forcing()` says a
    /// switch is on, never overwriting a forcing store whose switch it has not seen.
    pub fn set(&self, want: isize, forcing: impl Fn() -> bool) {
        loop {
            let seen = self.value.load(Ordering::Relaxed);
            let target = if forcing() { self.forced } else { want };
            if seen == target || self.replace(seen, want, &forcing) {
                return;
            }
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("value", &self.get_relaxed())
            .field("forced", &self.forced)
            .finish()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_gate_starts_forced_and_is_set_unless_a_switch_is_on() {
        let gate = Gate::new(isize::MAX);
        assert_eq!(gate.get(), isize::MAX);
        gate.set(5, || false);
        assert_eq!(gate.get(), 5);
        gate.set(9, || true);
        assert_eq!(gate.get(), isize::MAX, "a switch on: forced");
        gate.set(9, || false);
        assert_eq!(gate.get(), 9);
        gate.force();
        assert_eq!(gate.get_relaxed(), isize::MAX);
    }

    #[test]
    fn a_replace_from_a_stale_value_changes_nothing() {
        let gate = Gate::new(isize::MIN);
        gate.set(100, || false);
        gate.force();
        assert!(!gate.replace(100, 200, || false), "another thread wrote");
        assert_eq!(gate.get(), isize::MIN);
    }

    #[test]
    fn a_switch_that_comes_on_during_a_replace_is_obeyed() {
        // The switch reads off for the decision and on for the check after the store: the
        // replace reports failure, and the owner's next round forces the gate.
        let gate = Gate::new(isize::MIN);
        let reads = Cell::new(0);
        let forcing = || {
            reads.set(reads.get() + 1);
            reads.get() > 1
        };
        assert!(!gate.replace(isize::MIN, 7, forcing));
        assert_eq!(gate.get(), 7, "stored, then found stale");
        gate.set(7, forcing);
        assert_eq!(gate.get(), isize::MIN, "forced on the next round");
    }
}
