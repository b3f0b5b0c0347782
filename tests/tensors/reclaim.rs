//! Reclamation under the epoch (semantics §4, §6): frees wait for pinned readers, never
//! for long-lived views, and a pool at its limit collects pending frees before it refuses.
//!
//! Each test draws from a pool of its own, so its byte figures are its own. The epoch and
//! the pending-free count are process-wide, though, and these tests hold the epoch pinned
//! on purpose, count pending bytes, or need the limit path's own collection to be the one
//! that frees, while every other test of this binary frees tensors: each runs alone in a
//! process of its own (`run_alone`). Tests that only measure their own pool's bytes are in
//! `scopes`, run in parallel.

use std::sync::mpsc::channel;

use ndmem::{reclaim, DType, Scope, Tensor};

use crate::common::{child::run_alone, test_name};
use crate::{live, private};

#[test]
fn a_scope_closed_under_a_pinned_reader_is_freed_only_after_it_unpins() {
    if run_alone(test_name!(
        a_scope_closed_under_a_pinned_reader_is_freed_only_after_it_unpins
    )) {
        return;
    }
    let source = private(None);
    let scope = Scope::new_base_in("pinned", source);
    let t = scope.full(DType::F32, &[1 << 16], 3.0).unwrap();
    let reader = t.clone();
    let (pinned_tx, pinned_rx) = channel();
    let (closed_tx, closed_rx) = channel::<()>();
    let handle = std::thread::spawn(move || {
        // Inside a read: pinned, the check passed, the data read.
        let pin = reclaim::pin();
        let values = reader.to_vec::<f32>().unwrap();
        pinned_tx.send(()).unwrap();
        closed_rx.recv().unwrap();
        drop(pin);
        values
    });
    pinned_rx.recv().unwrap();
    scope.close().unwrap();
    reclaim::collect();
    assert!(
        live(&source) >= 1 << 18,
        "the free waits for the pinned reader"
    );
    assert!(reclaim::pending_bytes() >= 1 << 18);
    closed_tx.send(()).unwrap();
    assert!(handle.join().unwrap().iter().all(|v| *v == 3.0));
    assert!(t.to_vec::<f32>().is_err());
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0);
    assert_eq!(live(&source), 0, "freed once the reader unpinned");
}

#[test]
fn a_long_lived_view_neither_stalls_reclamation_nor_lets_pending_bytes_grow() {
    if run_alone(test_name!(
        a_long_lived_view_neither_stalls_reclamation_nor_lets_pending_bytes_grow
    )) {
        return;
    }
    reclaim::collect();
    let source = private(None);
    // Another thread holds a view for the whole loop (the old epoch-pinning views
    // stopped every free in the process).
    let kept = Tensor::full_in(&source, DType::F32, &[1024], 1.0).unwrap();
    let (viewing_tx, viewing_rx) = channel();
    let (done_tx, done_rx) = channel::<()>();
    let viewer = std::thread::spawn(move || {
        let view = kept.view::<f32>().unwrap();
        viewing_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        view.sum()
    });
    viewing_rx.recv().unwrap();
    for i in 0..100 {
        let t = Tensor::zeros_in(&source, DType::F32, &[1 << 18]).unwrap(); // 1 MiB
        let other = t.clone();
        std::thread::spawn(move || other.sum().unwrap().scalar().unwrap())
            .join()
            .unwrap();
        drop(t);
        assert!(
            reclaim::pending_bytes() <= reclaim::AUTO_COLLECT_BYTES + (1 << 20),
            "iteration {i}: {} bytes pending",
            reclaim::pending_bytes()
        );
    }
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0, "nothing held back by the view");
    assert_eq!(live(&source), 4096, "only the viewed tensor is live");
    done_tx.send(()).unwrap();
    assert_eq!(viewer.join().unwrap(), 1024.0);
    reclaim::collect();
    assert_eq!(live(&source), 0);
}

#[test]
fn the_pool_limit_path_collects_pending_frees_before_failing() {
    if run_alone(test_name!(
        the_pool_limit_path_collects_pending_frees_before_failing
    )) {
        return;
    }
    reclaim::collect();
    const SIZE: usize = 4 << 20;
    // Room for one SIZE tensor, not two.
    let source = private(Some(SIZE + SIZE / 2));
    let scope = Scope::new_base_in("limited", source);
    let t = scope.zeros(DType::U8, &[SIZE]).unwrap();
    assert!(
        Tensor::zeros_in(&source, DType::U8, &[SIZE]).is_err(),
        "at the limit"
    );
    // Close the scope while another thread is pinned, so the free stays pending.
    let (pinned_tx, pinned_rx) = channel();
    let (closed_tx, closed_rx) = channel::<()>();
    let pinner = std::thread::spawn(move || {
        let _pin = reclaim::pin();
        pinned_tx.send(()).unwrap();
        closed_rx.recv().unwrap();
    });
    pinned_rx.recv().unwrap();
    scope.close().unwrap();
    closed_tx.send(()).unwrap();
    pinner.join().unwrap();
    assert!(reclaim::pending_bytes() >= SIZE, "the free is pending");
    assert!(live(&source) >= SIZE);
    // Only collecting the pending free makes room: the limit path must do it.
    let u =
        Tensor::zeros_in(&source, DType::U8, &[SIZE]).expect("the pool collected, then allocated");
    assert_eq!(reclaim::pending_bytes(), 0);
    assert!(t.to_vec::<u8>().is_err());
    drop(u);
    reclaim::collect();
    assert_eq!(live(&source), 0);
}

#[test]
fn an_op_at_the_limit_collects_frees_deferred_just_before_it() {
    if run_alone(test_name!(
        an_op_at_the_limit_collects_frees_deferred_just_before_it
    )) {
        return;
    }
    reclaim::collect();
    const SIZE: usize = 4 << 20;
    // Room for two SIZE tensors, not three.
    let source = private(Some(2 * SIZE + SIZE / 2));
    let x = Tensor::zeros_in(&source, DType::U8, &[SIZE]).unwrap();
    let scope = Scope::new_base_in("closed", source);
    let t = scope.zeros(DType::U8, &[SIZE]).unwrap();
    // No thread is pinned: the free is pending only until the epoch moves on twice.
    scope.close().unwrap();
    assert!(reclaim::pending_bytes() >= SIZE, "the free is pending");
    // The op's output (in `x`'s pool) needs the pending bytes: the limit path collects,
    // and an op that pinned before allocating its output would hold back what was
    // deferred in the epoch it pinned in, and fail.
    let y = x
        .add_scalar(1.0)
        .expect("the limit path collected the free deferred before the op");
    assert_eq!(y.to_vec::<u8>().unwrap()[SIZE - 1], 1);
    assert_eq!(reclaim::pending_bytes(), 0);
    let z = x.sum().expect("every op allocates before it pins");
    assert_eq!(z.scalar().unwrap(), 0.0);
    assert!(t.to_vec::<u8>().is_err());
    drop((x, y, z));
    reclaim::collect();
    assert_eq!(live(&source), 0);
}

#[test]
fn one_collect_frees_every_pending_block_once_no_thread_is_pinned() {
    // Semantics §6: collect() forces pending frees; only a thread still pinned holds some
    // back. Each free is its own batch and an epoch advance frees a few batches: one
    // collect stopped after 16 advances, with 1.25 MiB of 200 blocks still waiting, and
    // the pool refused a request those bytes would have served.
    if run_alone(test_name!(
        one_collect_frees_every_pending_block_once_no_thread_is_pinned
    )) {
        return;
    }
    const LIMIT: usize = 4 << 20;
    let source = private(Some(LIMIT));
    let (pinned_tx, pinned_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    let pinner = std::thread::spawn(move || {
        let pin = reclaim::pin();
        pinned_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        drop(pin);
    });
    pinned_rx.recv().unwrap();
    for _ in 0..200 {
        drop(Tensor::zeros_in(&source, DType::U8, &[16 << 10]).unwrap());
    }
    assert!(
        reclaim::pending_bytes() >= 200 * (16 << 10),
        "held back by the pin"
    );
    release_tx.send(()).unwrap();
    pinner.join().unwrap();
    // Nothing is live and nobody is pinned: a request near the limit fits.
    let big = Tensor::zeros_in(&source, DType::U8, &[3584 << 10]);
    assert!(big.is_ok(), "{:?}", big.map(drop));
    drop(big);
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0, "one collect frees everything");
}

#[test]
fn threads_that_pin_for_a_moment_do_not_make_the_limit_refuse_waiting_bytes() {
    // Semantics §1: an allocation is refused only when the bytes truly are live. Eight
    // threads each allocate a 16 KiB tensor, add a scalar and drop both, 3000 times, on an
    // 8 MiB pool (at most 256 KiB live at once); every op and free pins for a moment, and
    // a pool at its limit met one of those pins and refused (every run).
    if run_alone(test_name!(
        threads_that_pin_for_a_moment_do_not_make_the_limit_refuse_waiting_bytes
    )) {
        return;
    }
    let source = private(Some(8 << 20));
    let refusals = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..3000 {
                    match Tensor::zeros_in(&source, DType::F32, &[4 << 10])
                        .and_then(|t| t.add_scalar(1.0))
                    {
                        Ok(t) => drop(t),
                        Err(e) => {
                            refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            eprintln!("{e}");
                        }
                    }
                }
            });
        }
    });
    assert_eq!(
        refusals.into_inner(),
        0,
        "refused while the bytes were only waiting"
    );
    reclaim::collect();
    assert_eq!(live(&source), 0);
}

#[test]
fn a_request_that_cannot_fit_waits_for_a_pinned_thread_once_not_once_a_round() {
    // Semantics §1: at a limit the reclaimers run again only after a round in which they
    // freed something. With frees held back by a pinned thread, each run of ndmem's
    // reclaimer waits its second; while other threads' blocks churn through the cache,
    // every round's trim frees something, and a request that can never fit went through
    // all 16 rounds, waiting in each: refused after 16 s (1 s before the relief went on
    // in rounds; 1 s again now).
    if run_alone(test_name!(
        a_request_that_cannot_fit_waits_for_a_pinned_thread_once_not_once_a_round
    )) {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let source = private(Some(8 << 20));
    let scope = Scope::new_base_in("held-back", source);
    scope.zeros(DType::F32, &[1 << 20]).unwrap(); // 4 MiB, the scope's
    let (pinned_tx, pinned_rx) = channel();
    let (done_tx, done_rx) = channel::<()>();
    let pinner = std::thread::spawn(move || {
        let _pin = reclaim::pin();
        pinned_tx.send(()).unwrap();
        done_rx.recv().unwrap();
    });
    pinned_rx.recv().unwrap();
    scope.close().unwrap(); // its 4 MiB wait behind the pin
    let stop = AtomicBool::new(false);
    let (took, refused) = std::thread::scope(|s| {
        // Threads that each take a block and give it back as they exit: the cache churns.
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::spawn(move || drop(source.pool().allocate(64 << 10, 64).unwrap()))
                    .join()
                    .unwrap();
            }
        });
        let started = Instant::now();
        let refused = Tensor::zeros_in(&source, DType::F32, &[4 << 20]).is_err(); // 16 MiB
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        (took, refused)
    });
    done_tx.send(()).unwrap();
    pinner.join().unwrap();
    assert!(refused, "16 MiB never fit an 8 MiB limit");
    assert!(took < Duration::from_secs(4), "refused after {took:?}");
    reclaim::collect();
    assert_eq!(live(&source), 0);
}
