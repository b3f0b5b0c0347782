//! NDManager-style scopes (semantics §4) and epoch reclamation (semantics §6).
//!
//! Tests run on parallel threads: byte checks read the scope's own figures, or a pool of
//! the test's own ([`MemorySource::new`]). The tests that pin the epoch on purpose or count
//! the process-wide pending frees are in `reclaim`.

use std::time::{Duration, Instant};

use ndmem::alloc::AllocError;
use ndmem::{reclaim, DType, Error, MemorySource, Scope, Tensor};

use crate::{live, private};

/// Collects until `source`'s pool has no live bytes (other tests' threads may be pinned
/// for a moment, holding frees back); returns what is still live after ten seconds.
fn settle(source: &MemorySource) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        reclaim::collect();
        let live = live(source);
        if live == 0 || Instant::now() > deadline {
            return live;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_scope_with_its_own_pool_allocates_only_there_under_its_limit() {
    let source = private(Some(1 << 20));
    let global_scope = Scope::new_base("global");
    let scope = Scope::new_base_in("private", source);
    assert_eq!(scope.source(), source);
    let child = scope.child("child").unwrap();
    assert_eq!(child.source(), source, "children inherit the source");
    assert_eq!(global_scope.source(), MemorySource::global());

    let x = scope.zeros(DType::F32, &[1024]).unwrap(); // 4 KiB
    let y = child.ones(DType::F32, &[1024]).unwrap();
    let z = x.add(&y).unwrap(); // the first input's scope and source
    assert_eq!(z.source(), source);
    assert_eq!(
        live(&source),
        3 * 4096,
        "x, y and z, all from the private pool"
    );
    assert_eq!(scope.tensor_count(), 2);
    let elsewhere = global_scope.zeros(DType::F32, &[1024]).unwrap();
    assert_eq!(elsewhere.source(), MemorySource::global());
    assert_eq!(
        live(&source),
        3 * 4096,
        "a global scope draws nothing from it"
    );

    // The private pool's limit applies to the scope, whatever the global pool allows.
    let err = scope.zeros(DType::U8, &[1 << 20]).unwrap_err();
    assert!(
        matches!(err.alloc_error(), Some(AllocError::OutOfMemory { .. })),
        "{err}"
    );
    assert!(child.zeros(DType::U8, &[1 << 20]).is_err());

    scope.close().unwrap();
    assert!(child.is_closed());
    assert!(z.to_vec::<f32>().is_err());
    assert_eq!(
        settle(&source),
        0,
        "closing returned the pool's live bytes to 0"
    );
    assert_eq!(elsewhere.to_vec::<f32>().unwrap(), vec![0.0; 1024]);
}

#[test]
fn tensors_placed_in_a_source_keep_it_through_ops_and_copies() {
    let source = private(None);
    let t = Tensor::from_slice_in(&source, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    assert_eq!(t.source(), source);
    let doubled = t.mul_scalar(2.0).unwrap();
    let copy = doubled.copy().unwrap();
    let detached = copy.detach().unwrap();
    for u in [&doubled, &copy, &detached] {
        assert_eq!(u.source(), source);
    }
    assert_eq!(detached.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    let global = Tensor::ones(DType::F32, &[3]).unwrap();
    let mixed = global.add(&t).unwrap();
    assert_eq!(
        mixed.source(),
        MemorySource::global(),
        "the first input decides"
    );
    assert!(live(&source) >= 4 * 12, "four tensors in the private pool");
    drop((t, doubled, copy, detached));
    assert_eq!(
        settle(&source),
        0,
        "handle-owned tensors are freed to their pool"
    );
}

#[test]
fn scopes_and_reclamation_return_pool_memory_to_the_baseline() {
    let source = private(None);

    // Closing a scope frees what it owns once nobody is pinned.
    let scope = Scope::new_base_in("baseline", source);
    let batch = scope.child("batch").unwrap();
    let x = batch.ones(DType::F32, &[256, 256]).unwrap();
    let y = x.matmul(&x).unwrap().relu().unwrap();
    assert!(live(&source) >= 3 * 256 * 256 * 4);
    scope.close().unwrap();
    assert_eq!(settle(&source), 0, "scope close gave everything back");
    assert!(y.to_vec::<f32>().is_err());

    // Handle-owned tensors: freed through the epoch when the last handle drops, even
    // after another thread used them.
    let t = Tensor::zeros_in(&source, DType::F64, &[1 << 16]).unwrap();
    let shared = t.clone();
    std::thread::spawn(move || shared.sum().unwrap().scalar().unwrap())
        .join()
        .unwrap();
    assert!(live(&source) >= 8 << 16);
    drop(t);
    assert_eq!(settle(&source), 0, "after collect() the pool is back to 0");
}

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
    assert!(matches!(view.sum(), Err(Error::ScopeClosed { .. })));
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
fn a_capped_scopes_tensor_still_feeds_views_and_ops_whose_output_goes_to_a_workspace() {
    let scope = Scope::new_base("capped_views");
    let x = scope.ones(DType::F32, &[2, 3]).unwrap();
    scope.cap();
    // Views allocate nothing, so nothing is placed in the scope.
    assert_eq!(x.transpose().unwrap().shape(), &[3, 2]);
    assert_eq!(x.reshape(&[6]).unwrap().shape(), &[6]);
    assert_eq!(x.broadcast_to(&[4, 2, 3]).unwrap().shape(), &[4, 2, 3]);
    // An op that allocates is refused, unless its output goes to the current workspace;
    // so is the reshape of a transposed view, which copies its elements into row-major
    // order first.
    assert!(matches!(x.copy(), Err(Error::ScopeCapped { .. })));
    assert!(matches!(
        x.transpose().unwrap().reshape(&[6]),
        Err(Error::ScopeCapped { .. })
    ));
    let ws = ndmem::workspaces();
    let cfg = ndmem::WorkspaceConfig::default();
    let g = ws.get_and_activate(&cfg, "CAPPED_SCOPE_WS").unwrap();
    let y = x.add_scalar(1.0).unwrap();
    assert_eq!(y.workspace(), Some("CAPPED_SCOPE_WS"));
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0; 6]);
    drop((y, g));
}

#[test]
fn a_capped_scope_opens_no_child_and_keeps_the_ones_it_had() {
    // Semantics §4 (DJL: newSubManager of a capped manager throws).
    let scope = Scope::new_base("capped parent");
    let before = scope.child("opened before").unwrap();
    scope.cap();
    let refused = scope.child("after").err();
    assert_eq!(
        refused,
        Some(Error::ScopeCapped {
            scope: "capped parent".into()
        })
    );
    let message = refused.unwrap().to_string();
    assert!(message.contains("no child scope"), "{message}");
    let t = before.ones(DType::F32, &[2]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 2]);
    assert!(
        before.child("grandchild").is_ok(),
        "the child is not capped"
    );
    scope.close().unwrap();
    assert!(before.is_closed());
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
fn a_scope_closed_while_another_thread_reads_never_shows_freed_memory() {
    // semantics §6: one thread closes the scope (freeing the tensor while its handles live)
    // while another is inside reads of it; every read either sees the whole tensor or is
    // refused with ScopeClosed. (Pool byte checks: `reclaim`.)
    for round in 0..20 {
        let scope = Scope::new_base("shared");
        let t = scope.full(DType::F64, &[1 << 14], 1.5).unwrap();
        let reader = t.clone();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut ok = 0;
            loop {
                match reader.to_vec::<f64>() {
                    Ok(values) => {
                        assert!(values.iter().all(|v| *v == 1.5), "round {round}");
                        ok += 1;
                    }
                    Err(Error::ScopeClosed { scope, .. }) => {
                        assert_eq!(scope, "shared");
                        return ok;
                    }
                    Err(e) => panic!("{e}"),
                }
                if ok == 1 {
                    started_tx.send(()).unwrap();
                }
            }
        });
        started_rx.recv().unwrap();
        scope.close().unwrap();
        assert!(handle.join().unwrap() >= 1);
        assert!(matches!(t.to_vec::<f64>(), Err(Error::ScopeClosed { .. })));
    }
}

#[test]
fn a_view_keeps_its_memory_through_a_scope_close_without_pinning_the_epoch() {
    let scope = Scope::new_base("viewed");
    let t = scope.full(DType::F32, &[1 << 12], 2.0).unwrap();
    let view = t.view::<f32>().unwrap();
    scope.close().unwrap();
    reclaim::collect();
    assert_eq!(view.sum(), 2.0 * (1 << 12) as f32, "the view still reads");
    assert_eq!(view.get(&[7][..]), Some(&2.0));
    assert_eq!(view.get(&[1 << 12][..]), None);
    assert!(matches!(t.view::<f32>(), Err(Error::ScopeClosed { .. })));
    drop(view);
    assert!(matches!(t.to_vec::<f32>(), Err(Error::ScopeClosed { .. })));
}

#[test]
fn a_borrowed_tensor_attached_elsewhere_stays_with_its_new_owner() {
    let original = Scope::new_base("original");
    let borrower = Scope::new_base("borrower");
    let owner = Scope::new_base("new-owner");
    let t = original.ones(DType::F32, &[3]).unwrap();
    borrower.temp_attach_all(&[&t]).unwrap();
    owner.attach(&t).unwrap();
    assert!(borrower
        .debug_dump()
        .contains("[borrower]: 0 tensors, 0 bytes\n"));
    borrower.close().unwrap();
    assert_eq!(
        original.tensor_count(),
        0,
        "not given back: new-owner owns it"
    );
    assert_eq!(owner.tensor_count(), 1);
    original.close().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 3]);
    owner.close().unwrap();
    assert!(
        matches!(t.to_vec::<f32>(), Err(Error::ScopeClosed { scope, .. }) if scope == "new-owner")
    );
}

#[test]
fn temp_attach_all_borrows_each_tensor_once_and_detach_of_a_borrowed_tensor_works() {
    let original = Scope::new_base("lender");
    let t = original.ones(DType::F64, &[2]).unwrap();
    let view_of_t = t.reshape(&[2, 1]).unwrap();
    let borrower = Scope::new_base("twice");
    borrower.temp_attach_all(&[&t, &t, &view_of_t]).unwrap();
    assert!(
        borrower.debug_dump().contains("(+1 borrowed, 16 bytes)"),
        "{}",
        borrower.debug_dump()
    );
    borrower.temp_attach_all(&[&t]).unwrap();
    assert!(borrower.debug_dump().contains("(+1 borrowed, 16 bytes)"));
    borrower.close().unwrap();
    assert_eq!(original.tensor_count(), 1, "given back once");
    assert!(original
        .debug_dump()
        .contains("[lender]: 1 tensors, 16 bytes"));

    // Detaching a borrowed tensor hands it to its handles.
    let u = original.ones(DType::F64, &[2]).unwrap();
    let borrower = Scope::new_base("detacher");
    borrower.temp_attach_all(&[&u]).unwrap();
    borrower.detach(&u).unwrap();
    assert!(borrower.detach(&u).is_err(), "no longer held");
    borrower.close().unwrap();
    original.close().unwrap();
    assert_eq!(
        u.to_vec::<f64>().unwrap(),
        vec![1.0; 2],
        "its handles own it"
    );
    assert!(t.to_vec::<f64>().is_err());
}

#[test]
fn in_place_updates_count_scope_references_exactly() {
    let original = Scope::new_base("params-owner");
    let mut w = original.ones(DType::F32, &[2]).unwrap();
    let borrower = Scope::new_base("step");
    borrower.temp_attach_all(&[&w, &w]).unwrap();
    w.scaled_add(1.0, &Tensor::ones(DType::F32, &[2]).unwrap())
        .unwrap();
    let reader = w.clone();
    match w.scaled_add(1.0, &reader.copy().unwrap()) {
        Err(Error::SharedTensor { others, .. }) => assert_eq!(others, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(reader.to_vec::<f32>().unwrap(), vec![2.0; 2]);
    drop(reader);
    borrower.close().unwrap();
    w.assign(&Tensor::full(DType::F32, &[1], 5.0).unwrap())
        .unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![5.0; 2]);
}

#[test]
fn closed_scopes_refuse_with_scope_closed_and_freed_tensors_cannot_be_adopted() {
    let parent = Scope::new_base("gone");
    let child = parent.child("gone-child").unwrap();
    let t = child.ones(DType::U8, &[8]).unwrap();
    parent.close().unwrap();
    assert!(
        matches!(child.zeros(DType::F32, &[1]), Err(Error::ScopeClosed { scope, .. }) if scope == "gone-child")
    );
    assert!(matches!(
        child.child("late"),
        Err(Error::ScopeClosed { .. })
    ));
    let free = Tensor::ones(DType::F32, &[1]).unwrap();
    assert!(matches!(
        child.attach(&free),
        Err(Error::ScopeClosed { .. })
    ));
    assert!(matches!(
        child.temp_attach_all(&[&free]),
        Err(Error::ScopeClosed { .. })
    ));

    // The freed tensor: no scope may adopt it, and none counts its bytes.
    let other = Scope::new_base("adopter");
    let other_child = other.child("adopter-child").unwrap();
    match other.attach(&t) {
        Err(Error::ScopeClosed { op, scope, .. }) => {
            assert_eq!((op.as_str(), scope.as_str()), ("attach", "gone-child"))
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        other.temp_attach_all(&[&free, &t]),
        Err(Error::ScopeClosed { .. })
    ));
    assert!(free.is_valid());
    assert_eq!(
        other.debug_dump().lines().next().unwrap(),
        "scope [adopter]: 0 tensors, 0 bytes"
    );
    assert!(matches!(
        other_child.ret(&t),
        Err(Error::ScopeClosed { .. })
    ));
    assert_eq!((other.tensor_count(), other.bytes()), (0, 0));
}

#[test]
fn ret_to_a_capped_parent_keeps_the_tensor_in_the_child() {
    let parent = Scope::new_base("capped-parent");
    let child = parent.child("keeper").unwrap();
    let t = child.ones(DType::F32, &[4]).unwrap();
    parent.cap();
    assert!(matches!(child.ret(&t), Err(Error::ScopeCapped { .. })));
    assert_eq!((child.tensor_count(), parent.tensor_count()), (1, 0));
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    child.close().unwrap();
    assert!(
        t.to_vec::<f32>().is_err(),
        "still the child's: freed with it"
    );
}

#[test]
fn ret_racing_cap_never_loses_ownership() {
    for _ in 0..200 {
        let parent = Scope::new_base("racy-parent");
        let child = parent.child("racy-child").unwrap();
        let t = child.ones(DType::F32, &[1]).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| parent.cap());
            let returned = child.ret(&t).is_ok();
            let counts = (child.tensor_count(), parent.tensor_count());
            assert_eq!(counts, if returned { (0, 1) } else { (1, 0) });
        });
        drop(child);
        assert_eq!(t.is_valid(), parent.tensor_count() == 1);
    }
}

#[test]
fn children_created_while_the_parent_closes_are_closed_with_it() {
    for round in 0..200 {
        let base = Scope::new_base("closing-base");
        let parent = base.child("closing").unwrap();
        let children = std::thread::scope(|s| {
            let parent = &parent;
            let maker = s.spawn(move || {
                (0..20)
                    .filter_map(|i| match parent.child(&format!("c{i}")) {
                        Ok(child) => Some(child),
                        Err(Error::ScopeClosed { .. }) => None,
                        Err(e) => panic!("{e}"),
                    })
                    .collect::<Vec<_>>()
            });
            s.spawn(move || base.close().unwrap()).join().unwrap();
            maker.join().unwrap()
        });
        assert!(parent.is_closed());
        for child in &children {
            assert!(
                child.is_closed(),
                "round {round}: {} left open",
                child.name()
            );
            assert!(matches!(
                child.zeros(DType::F32, &[1]),
                Err(Error::ScopeClosed { .. })
            ));
        }
    }
}

#[test]
fn a_view_across_a_close_releases_its_block_to_its_pool_when_it_drops() {
    let source = private(None);
    let scope = Scope::new_base_in("viewed-private", source);
    let t = scope.full(DType::F32, &[1024], 4.0).unwrap();
    let view = t.view::<f32>().unwrap();
    scope.close().unwrap();
    reclaim::collect();
    assert_eq!(
        live(&source),
        4096,
        "the view holds the block through the close"
    );
    assert_eq!(view.sum(), 4096.0);
    assert!(t.view::<f32>().is_err(), "no new view of a freed block");
    drop(view);
    assert_eq!(settle(&source), 0, "the last view handed it to reclamation");
    drop(t);
    assert_eq!(
        settle(&source),
        0,
        "and the last handle frees nothing twice"
    );
}

/// A workspace on a pool of its own hands that pool to what leaves it: its tensors report
/// the workspace's source, and a detached copy is drawn from the same pool, not the global one.
#[test]
fn detach_from_a_workspace_copies_into_the_workspace_source() {
    let source = private(Some(1 << 20));
    let cfg = ndmem::WorkspaceConfig::builder()
        .initial_size(1 << 16)
        .source(source)
        .build()
        .unwrap();
    let ws = ndmem::workspaces();
    let kept = {
        let _cycle = ws.get_and_activate(&cfg, "OWN_SOURCE_DETACH").unwrap();
        let x = Tensor::full(DType::F32, &[16], 3.0).unwrap();
        assert_eq!(x.workspace(), Some("OWN_SOURCE_DETACH"));
        assert_eq!(
            x.source(),
            source,
            "workspace memory reports its workspace's source"
        );
        let before = source.pool().stats().live_bytes;
        let kept = x.detach().unwrap();
        assert_eq!(kept.workspace(), None);
        assert_eq!(kept.source(), source);
        assert!(
            source.pool().stats().live_bytes >= before + 64,
            "the copy is in the private pool"
        );
        kept
    };
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![3.0; 16]);
    ws.destroy("OWN_SOURCE_DETACH").unwrap();
}

#[test]
fn a_closed_scope_refuses_detach_and_ret_naming_itself_not_the_tensor() {
    // Semantics §4: a scope closed (here through its parent) can no longer detach or
    // return. A tensor it owned was freed by the close: ScopeClosed, naming the scope. A
    // tensor it never owned is untouched and usable: the error says the scope is closed,
    // not that the tensor belongs to it.
    let parent = Scope::new_base("closed-parent");
    let child = parent.child("closed-child").unwrap();
    let its = child.zeros(DType::F32, &[4]).unwrap();
    let other = Tensor::zeros(DType::F32, &[4]).unwrap();
    parent.close().unwrap();
    match child.detach(&its) {
        Err(Error::ScopeClosed { scope, .. }) => assert_eq!(scope, "closed-child"),
        other => panic!("expected ScopeClosed, got {other:?}"),
    }
    for result in [child.detach(&other).map(drop), child.ret(&other).map(drop)] {
        match result {
            Err(Error::Scope { scope, message }) => {
                assert_eq!(scope, "closed-child");
                assert!(message.contains("is closed"), "{message}");
            }
            other => panic!("expected Error::Scope, got {other:?}"),
        }
    }
    assert_eq!(other.to_vec::<f32>().unwrap(), vec![0.0; 4], "still usable");
    assert!(its.to_vec::<f32>().is_err(), "freed by the close");
    // A tensor a grandchild owned, freed by the same close, asked of its parent: closed,
    // naming the scope that owned it (not "not freed, stays usable").
    let grand = Scope::new_base("closed-grand");
    let middle = grand.child("closed-middle").unwrap();
    let leaf = middle.child("closed-leaf").unwrap();
    let deep = leaf.zeros(DType::F32, &[4]).unwrap();
    grand.close().unwrap();
    match middle.detach(&deep) {
        Err(Error::ScopeClosed { scope, .. }) => assert_eq!(scope, "closed-leaf"),
        other => panic!("expected ScopeClosed, got {other:?}"),
    }
}
