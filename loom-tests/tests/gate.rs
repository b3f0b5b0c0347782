//! loom models of `ndmem_alloc::counter::Gate`, the thresholds of a pool's per-thread hit
//! paths that the recorder's start forces (`rise` to `isize::MIN`, the free's gate to
//! `isize::MAX`) so that every operation takes the slow path, which records it.
//!
//! What they check, over every interleaving within the preemption bound: an owner setting
//! its gate from a switch it reads (as the pool's slow paths do, with `trace::is_on`)
//! while another thread switches on and then forces the gate (as `trace::start` does)
//! never leaves the gate unforced once both are done; whether the owner sets it whole
//! (`Gate::set`, the free's gate, from an armed gate) or replaces a value it read in a
//! loop (`Gate::replace`, the peak's `rise`, from a gate a reset forced). Either fails if
//! the owner does not read the switch again after a successful exchange, or if that
//! exchange does not acquire. A replace that finds another thread's store fails and changes
//! nothing.
#![cfg(ndmem_loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::counter::Gate;
use ndmem_loom_tests::model;

/// The switch, and a gate set to a normal value (as after the owner's first slow path).
fn armed(forced: isize) -> (Arc<AtomicBool>, Arc<Gate>) {
    let gate = Gate::new(forced);
    gate.set(10, || false);
    assert_eq!(gate.get(), 10);
    (Arc::new(AtomicBool::new(false)), Arc::new(gate))
}

/// The recorder's start: the switch on (relaxed, as `trace::start` publishes it through
/// the forcing store), then the gate forced.
fn switch_on_and_force(on: &AtomicBool, gate: &Gate) {
    on.store(true, Ordering::Relaxed);
    gate.force();
}

#[test]
fn a_gate_set_while_the_recorder_starts_ends_forced() {
    model(|| {
        let (on, gate) = armed(isize::MAX);
        let owner = {
            let (on, gate) = (on.clone(), gate.clone());
            thread::spawn(move || {
                for want in [20, 30] {
                    gate.set(want, || on.load(Ordering::Relaxed));
                }
            })
        };
        switch_on_and_force(&on, &gate);
        owner.join().unwrap();
        assert_eq!(
            gate.get(),
            isize::MAX,
            "the recorder is on: every free goes slow"
        );
    });
}

#[test]
fn a_rise_replaced_while_the_recorder_starts_ends_forced() {
    model(|| {
        // Forced already, as after a peak reset or in a new slot: the recorder's forcing
        // writes the value the owner may have read, and only the owner's second read of
        // the switch tells the two apart.
        let on = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::new(isize::MIN));
        let owner = {
            let (on, gate) = (on.clone(), gate.clone());
            thread::spawn(move || {
                // One `Slot::rose`: read, decide, replace; read again after a failure.
                loop {
                    let seen = gate.get();
                    if gate.replace(seen, 20, || on.load(Ordering::Relaxed)) {
                        break;
                    }
                }
            })
        };
        switch_on_and_force(&on, &gate);
        owner.join().unwrap();
        assert_eq!(
            gate.get(),
            isize::MIN,
            "the recorder is on: every allocation goes slow"
        );
    });
}

#[test]
fn a_replace_that_finds_another_threads_store_changes_nothing() {
    model(|| {
        let (_, gate) = armed(isize::MIN);
        let reset = {
            let gate = gate.clone();
            // A peak reset: forces without any switch.
            thread::spawn(move || gate.force())
        };
        let seen = gate.get();
        let replaced = gate.replace(seen, 50, || false);
        reset.join().unwrap();
        let now = gate.get();
        if replaced {
            // The reset came first (its store was the one read) or after (it stands).
            assert!(now == 50 || now == isize::MIN, "{now}");
        } else {
            assert_eq!(now, isize::MIN, "a failed replace wrote nothing");
        }
    });
}
