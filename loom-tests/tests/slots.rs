//! loom models of `ndmem_alloc::Slots`, the pool's lock-free cache of freed blocks.
//!
//! What they check, over every interleaving within the preemption bound:
//! - concurrent `push`/`pop`: every block pushed is taken exactly once (by a `pop`, by the
//!   final drain, or handed back to its pusher by a refused `push`), never twice, never
//!   lost;
//! - a full cache refuses a `push` and gives the block back, so at most `N` are hoarded;
//! - two `pop`s racing for one block: exactly one gets it;
//! - a block's contents written before `push` are visible to whoever `pop`s it, and its
//!   new owner's writes do not race the old owner's (loom's `UnsafeCell` tracks the
//!   accesses: push must release, pop must acquire).

#![allow(unsafe_code)]
#![cfg(ndmem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use ndmem_alloc::Slots;
use ndmem_loom_tests::model;

/// A stand-in block address (never dereferenced by `Slots`).
fn block(n: usize) -> *mut u8 {
    (n * 64) as *mut u8
}

/// Pointers cross threads in these models as addresses.
fn addr(p: *mut u8) -> usize {
    p as usize
}

/// Every pointer in `seen` appears exactly once and they are exactly `expected`.
fn assert_each_once(mut seen: Vec<usize>, expected: &[usize]) {
    seen.sort_unstable();
    let mut expected = expected.to_vec();
    expected.sort_unstable();
    assert_eq!(seen, expected, "blocks taken more or less than once");
}

fn drain<const N: usize>(slots: &Slots<N>) -> Vec<usize> {
    std::iter::from_fn(|| slots.pop()).map(addr).collect()
}

#[test]
fn concurrent_push_and_pop_take_every_block_exactly_once() {
    model(|| {
        let slots = Arc::new(Slots::<2>::default());
        assert!(slots.push(block(1)).is_ok());
        // Two threads each free a block and take one back (a pool's free-then-allocate
        // cycle), while the cache starts with one block in it.
        let workers: Vec<_> = [2, 3]
            .into_iter()
            .map(|n| {
                let slots = slots.clone();
                thread::spawn(move || {
                    let mut mine = Vec::new();
                    if let Err(p) = slots.push(block(n)) {
                        mine.push(addr(p)); // refused: still the caller's
                    }
                    mine.extend(slots.pop().map(addr));
                    mine
                })
            })
            .collect();
        let mut seen: Vec<usize> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        seen.extend(drain(&slots));
        assert_each_once(seen, &[addr(block(1)), addr(block(2)), addr(block(3))]);
    });
}

#[test]
fn a_full_cache_refuses_and_hoards_at_most_n() {
    model(|| {
        let slots = Arc::new(Slots::<2>::default());
        assert!(slots.push(block(1)).is_ok());
        let workers: Vec<_> = [2, 3]
            .into_iter()
            .map(|n| {
                let slots = slots.clone();
                thread::spawn(move || slots.push(block(n)).err().map(addr))
            })
            .collect();
        let refused: Vec<usize> = workers
            .into_iter()
            .filter_map(|w| w.join().unwrap())
            .collect();
        // One slot was free for two pushes: exactly one is refused, and given back intact.
        assert_eq!(refused.len(), 1);
        assert!(refused[0] == addr(block(2)) || refused[0] == addr(block(3)));
        let cached = drain(&slots);
        assert_eq!(cached.len(), 2);
        let mut all = cached;
        all.extend(refused);
        assert_each_once(all, &[addr(block(1)), addr(block(2)), addr(block(3))]);
    });
}

#[test]
fn racing_pops_give_one_block_to_one_thread() {
    model(|| {
        let slots = Arc::new(Slots::<2>::default());
        assert!(slots.push(block(7)).is_ok());
        let other = {
            let slots = slots.clone();
            thread::spawn(move || slots.pop().map(addr))
        };
        let mine = slots.pop().map(addr);
        let theirs = other.join().unwrap();
        let got: Vec<usize> = mine.into_iter().chain(theirs).collect();
        assert_eq!(got, vec![addr(block(7))]);
        assert!(slots.pop().is_none());
    });
}

/// A block with contents whose accesses loom checks for data races.
struct Payload {
    value: UnsafeCell<usize>,
}

#[test]
fn contents_written_before_push_are_seen_by_the_popper() {
    model(|| {
        let slots = Arc::new(Slots::<1>::default());
        let payload = Box::into_raw(Box::new(Payload {
            value: UnsafeCell::new(0),
        }));
        let address = payload as usize;
        let owner = {
            let slots = slots.clone();
            thread::spawn(move || {
                let payload = address as *mut Payload;
                // SAFETY: this thread owns the block until it pushes it.
                unsafe { (*payload).value.with_mut(|v| *v = 42) };
                assert!(slots.push(payload.cast()).is_ok());
            })
        };
        let taken = loop {
            if let Some(p) = slots.pop() {
                break p;
            }
            thread::yield_now();
        };
        assert_eq!(addr(taken), address);
        let payload = taken.cast::<Payload>();
        // SAFETY: the pop made this thread the block's only owner.
        unsafe {
            assert_eq!((*payload).value.with(|v| *v), 42);
            (*payload).value.with_mut(|v| *v = 7);
        }
        owner.join().unwrap();
        // SAFETY: `payload` came from Box::into_raw above and nobody else holds it.
        drop(unsafe { Box::from_raw(payload) });
    });
}
