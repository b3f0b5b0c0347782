//! Pool live bytes return to their baseline when scopes close and when reclamation runs
//! (SEMANTICS 4, 6). The global pool's figures and the reclamation epoch are process-wide,
//! so these tests live in their own binary and run one at a time (the `SERIAL` lock):
//! nothing else allocates or pins meanwhile.

use std::sync::mpsc::channel;
use std::sync::Mutex;

use ndmem::alloc::Pool;
use ndmem::{reclaim, DType, Scope, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn live() -> usize {
    Pool::global().stats().live_bytes
}

#[test]
fn scopes_and_reclamation_return_pool_memory_to_the_baseline() {
    let _serial = serial();
    reclaim::collect();
    let baseline = live();

    // Closing a scope frees what it owns once nobody is pinned.
    let scope = Scope::new_base("baseline");
    let batch = scope.child("batch").unwrap();
    let x = batch.ones(DType::F32, &[256, 256]).unwrap();
    let y = x.matmul(&x).unwrap().relu().unwrap();
    assert!(live() >= baseline + 3 * 256 * 256 * 4);
    scope.close().unwrap();
    reclaim::collect();
    assert_eq!(live(), baseline, "scope close gave everything back");
    assert!(y.to_vec::<f32>().is_err());

    // Handle-owned tensors: freed through the epoch when the last handle drops.
    let t = Tensor::rand(DType::F64, &[1 << 16], 9).unwrap();
    let shared = t.clone();
    std::thread::spawn(move || shared.sum(None).unwrap().scalar().unwrap())
        .join()
        .unwrap();
    assert!(live() > baseline);
    drop(t);
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0);
    assert_eq!(
        live(),
        baseline,
        "after collect() the pool is back to the baseline"
    );
}

#[test]
fn a_scope_closed_under_a_pinned_reader_is_freed_only_after_it_unpins() {
    let _serial = serial();
    reclaim::collect();
    let baseline = live();
    let scope = Scope::new_base("pinned");
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
        live() >= baseline + (1 << 18),
        "the free waits for the pinned reader"
    );
    assert!(reclaim::pending_bytes() >= 1 << 18);
    closed_tx.send(()).unwrap();
    assert!(handle.join().unwrap().iter().all(|v| *v == 3.0));
    assert!(t.to_vec::<f32>().is_err());
    reclaim::collect();
    assert_eq!(reclaim::pending_bytes(), 0);
    assert_eq!(live(), baseline, "freed once the reader unpinned");
}

#[test]
fn a_long_lived_view_neither_stalls_reclamation_nor_lets_pending_bytes_grow() {
    let _serial = serial();
    reclaim::collect();
    let baseline = live();
    // Another thread holds a view for the whole loop (the old epoch-pinning views
    // stopped every free in the process).
    let kept = Tensor::ones(DType::F32, &[1024]).unwrap();
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
        let t = Tensor::zeros(DType::F32, &[1 << 18]).unwrap(); // 1 MiB
        let other = t.clone();
        std::thread::spawn(move || other.sum(None).unwrap().scalar().unwrap())
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
    assert!(
        live() <= baseline + (64 << 10),
        "only the viewed tensor is live"
    );
    done_tx.send(()).unwrap();
    assert_eq!(viewer.join().unwrap(), 1024.0);
    reclaim::collect();
    assert_eq!(live(), baseline);
}

/// Puts the global pool's limit back however the test ends.
struct Unlimit;

impl Drop for Unlimit {
    fn drop(&mut self) {
        Pool::global().set_max_bytes(None).unwrap();
    }
}

#[test]
fn the_pool_limit_path_collects_pending_frees_before_failing() {
    let _serial = serial();
    reclaim::collect();
    Pool::global().trim();
    const SIZE: usize = 4 << 20;
    let baseline = live();
    // Room for one SIZE tensor, not two.
    let used = Pool::global().stats().used_bytes;
    let _unlimit = Unlimit;
    Pool::global()
        .set_max_bytes(Some(used + SIZE + SIZE / 2))
        .unwrap();
    let scope = Scope::new_base("limited");
    let t = scope.zeros(DType::U8, &[SIZE]).unwrap();
    assert!(Tensor::zeros(DType::U8, &[SIZE]).is_err(), "at the limit");
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
    assert!(live() >= baseline + SIZE);
    // Only collecting the pending free makes room: the limit path must do it.
    let u = Tensor::zeros(DType::U8, &[SIZE]).expect("the pool collected, then allocated");
    assert_eq!(reclaim::pending_bytes(), 0);
    assert!(t.to_vec::<u8>().is_err());
    drop(u);
    reclaim::collect();
    assert_eq!(live(), baseline);
}
