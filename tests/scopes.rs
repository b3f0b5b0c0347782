//! NDManager-style scopes (SEMANTICS 4) and epoch reclamation (SEMANTICS 6).
//!
//! Pool figures are process-wide and tests run on parallel threads, so byte checks here
//! read the scope's own figures; the pool-baseline checks live in `tests/pool_baseline.rs`.

use ndmem::{reclaim, DType, Error, Scope, Tensor};

#[test]
fn outputs_belong_to_the_scope_of_their_first_input() {
    let scope = Scope::new_base("owner");
    let x = scope.zeros(DType::F32, &[10]).unwrap();
    let free = Tensor::ones(DType::F32, &[10]).unwrap();
    let y = x.add(&free).unwrap();
    let z = free.add(&x).unwrap();
    assert_eq!(
        scope.tensor_count(),
        2,
        "x and y; z follows its first input (no scope)"
    );
    assert_eq!(scope.bytes(), 80);
    scope.close().unwrap();
    assert!(matches!(y.to_vec::<f32>(), Err(Error::ScopeClosed { .. })));
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.0; 10]);
    assert_eq!(free.to_vec::<f32>().unwrap(), vec![1.0; 10]);
}

#[test]
fn using_a_tensor_of_a_closed_scope_is_an_error_naming_it() {
    let scope = Scope::new_base("batch-17");
    let x = scope.from_slice(&[1.0f64, 2.0], &[2]).unwrap();
    let view = x.reshape(&[2, 1]).unwrap();
    drop(scope); // dropping the handle closes the scope
    let err = x.relu().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Op [relu] X argument belongs to scope [batch-17], which is closed"
    );
    assert!(matches!(view.sum(None), Err(Error::ScopeClosed { .. })));
    assert!(x.detach().is_err());
}

#[test]
fn closing_a_parent_closes_its_children() {
    let parent = Scope::new_base("parent");
    let child = parent.child("child").unwrap();
    let grandchild = child.child("grandchild").unwrap();
    let t = grandchild.zeros(DType::U8, &[4]).unwrap();
    parent.close().unwrap();
    assert!(child.is_closed() && grandchild.is_closed());
    assert!(t.to_vec::<u8>().is_err());
    assert!(child.child("late").is_err());
}

#[test]
fn cap_trips_on_attach_and_on_new_outputs() {
    let scope = Scope::new_base("capped");
    let x = scope.ones(DType::F32, &[2]).unwrap();
    scope.cap();
    let err = x.add_scalar(1.0).unwrap_err();
    assert_eq!(
        err,
        Error::ScopeCapped {
            scope: "capped".into()
        }
    );
    assert!(err.to_string().contains("capped"));
    let free = Tensor::ones(DType::F32, &[2]).unwrap();
    assert!(matches!(
        scope.attach(&free),
        Err(Error::ScopeCapped { .. })
    ));
    assert!(matches!(
        scope.zeros(DType::F32, &[1]),
        Err(Error::ScopeCapped { .. })
    ));
    assert_eq!(
        x.to_vec::<f32>().unwrap(),
        vec![1.0; 2],
        "what it owns stays usable"
    );
}

#[test]
fn attach_and_detach_move_ownership() {
    let a = Scope::new_base("a");
    let b = Scope::new_base("b");
    let t = a.ones(DType::I32, &[3]).unwrap();
    b.attach(&t).unwrap();
    assert_eq!((a.tensor_count(), b.tensor_count()), (0, 1));
    a.close().unwrap();
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        vec![1; 3],
        "moved before a closed"
    );
    b.detach(&t).unwrap();
    assert_eq!(b.tensor_count(), 0);
    assert!(b.detach(&t).is_err(), "b no longer owns it");
    b.close().unwrap();
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        vec![1; 3],
        "the caller owns it now"
    );
}

#[test]
fn temp_attach_all_gives_back_on_close() {
    let owner = Scope::new_base("owner");
    let t = owner.ones(DType::F32, &[4]).unwrap();
    let free = Tensor::ones(DType::F32, &[4]).unwrap();
    let borrower = Scope::new_base("borrower");
    borrower.temp_attach_all(&[&t, &free]).unwrap();
    assert_eq!(owner.tensor_count(), 0);
    assert!(borrower.debug_dump().contains("+2 borrowed"));
    borrower.close().unwrap();
    assert_eq!(owner.tensor_count(), 1, "given back to its owner");
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    assert_eq!(free.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    owner.close().unwrap();
    assert!(t.to_vec::<f32>().is_err());
    assert!(free.is_valid(), "its handles owned it before the borrow");
}

#[test]
fn ret_moves_a_tensor_to_the_parent() {
    let model = Scope::new_base("model");
    let batch = model.child("batch").unwrap();
    let x = batch.ones(DType::F64, &[2]).unwrap();
    let y = x.mul_scalar(5.0).unwrap();
    let kept = batch.ret(&y).unwrap();
    assert_eq!((batch.tensor_count(), model.tensor_count()), (1, 1));
    batch.close().unwrap();
    assert!(x.to_vec::<f64>().is_err());
    assert_eq!(kept.to_vec::<f64>().unwrap(), vec![5.0; 2]);
    assert!(Scope::root().ret(&kept).is_err(), "the root has no parent");
}

#[test]
fn the_root_cannot_be_closed_and_debug_dump_shows_bytes() {
    assert!(Scope::root().close().is_err());
    let base = Scope::new_base("dumped");
    let child = base.child("kid").unwrap();
    let _a = base.zeros(DType::F64, &[100]).unwrap();
    let _b = child.zeros(DType::F32, &[10]).unwrap();
    let dump = base.debug_dump();
    assert!(
        dump.contains("scope [dumped]: 1 tensors, 800 bytes"),
        "{dump}"
    );
    assert!(
        dump.contains("  scope [kid]: 1 tensors, 40 bytes"),
        "{dump}"
    );
    assert!(Scope::root().debug_dump().contains("[dumped]"));
}

#[test]
fn a_tensor_dropped_on_one_thread_stays_readable_on_another() {
    // SEMANTICS 6: frees are deferred until no thread can still be reading.
    let t = Tensor::rand(DType::F64, &[1 << 16], 3).unwrap();
    let expected: f64 = t.view::<f64>().unwrap().sum();
    let reader = t.clone();
    let (start_tx, start_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let view = reader.view::<f64>().unwrap();
        start_tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        reclaim::collect();
        view.sum()
    });
    start_rx.recv().unwrap();
    drop(t); // the last handle is gone while the other thread still reads
    reclaim::collect();
    assert_eq!(handle.join().unwrap(), expected);
}

#[test]
fn a_closed_scope_does_not_free_under_a_pinned_reader() {
    let scope = Scope::new_base("racing");
    let t = scope.full(DType::F32, &[1 << 16], 2.0).unwrap();
    let view = t.view::<f32>().unwrap();
    scope.close().unwrap();
    reclaim::collect();
    assert!(
        reclaim::pending_bytes() >= 1 << 18,
        "held back by the pinned view"
    );
    assert_eq!(
        view.sum(),
        2.0 * (1 << 16) as f32,
        "the pinned view still reads"
    );
    drop(view);
    assert!(t.to_vec::<f32>().is_err());
}

#[test]
fn pending_bytes_stay_bounded_when_shared_tensors_are_dropped_in_a_loop() {
    for i in 0..200 {
        let t = Tensor::zeros(DType::F32, &[1 << 18]).unwrap(); // 1 MiB
        let other = t.clone();
        std::thread::scope(|s| {
            s.spawn(move || other.sum(None).unwrap());
        });
        drop(t);
        assert!(
            reclaim::pending_bytes() <= reclaim::AUTO_COLLECT_BYTES + (1 << 20) * 8,
            "iteration {i}: {} bytes pending",
            reclaim::pending_bytes()
        );
    }
}
