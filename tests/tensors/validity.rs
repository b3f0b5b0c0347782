//! The scope-panic matrix of semantics §3: every misuse of workspace memory is an error
//! naming the op, the argument and the workspace; the four fixes of ND4J's guide work.

use ndmem::{workspaces, DType, Error, ResetPolicy, Tensor, WorkspaceConfig};

fn cfg() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(1 << 20)
        .build()
        .unwrap()
}

fn leaked(result: Result<Tensor, Error>, op: &str, arg: &str, ws: &str) {
    match result {
        Err(Error::LeakedWorkspacePointer {
            op: o,
            arg: a,
            workspace,
        }) => {
            assert_eq!((o.as_str(), a.as_str(), workspace.as_str()), (op, arg, ws));
        }
        other => panic!("expected a leaked pointer error, got {other:?}"),
    }
}

#[test]
fn a_tensor_used_after_its_workspace_closed_is_leaked() {
    // semantics §3: workspace no longer open -> LeakedWorkspacePointer.
    let ws = workspaces();
    let x = {
        let _g = ws.get_and_activate(&cfg(), "LOOP_EXTERNAL").unwrap();
        Tensor::ones(DType::F32, &[4]).unwrap()
    };
    assert_eq!(x.workspace(), Some("LOOP_EXTERNAL"));
    let y = Tensor::ones(DType::F32, &[4]).unwrap();
    leaked(x.add(&y), "add", "X", "LOOP_EXTERNAL");
    leaked(y.add(&x), "add", "Y", "LOOP_EXTERNAL");
    let msg = x.add(&y).unwrap_err().to_string();
    assert_eq!(
        msg,
        "Op [add] X argument uses leaked workspace pointer from workspace [LOOP_EXTERNAL]"
    );
    assert!(x.to_vec::<f32>().is_err());
    assert!(!x.is_valid());
}

#[test]
fn a_tensor_from_an_earlier_cycle_is_outdated() {
    // semantics §3: open but newer generation -> OutdatedWorkspacePointer.
    let ws = workspaces();
    let g1 = ws.get_and_activate(&cfg(), "WS").unwrap();
    let old = Tensor::ones(DType::F64, &[3]).unwrap();
    let generation = g1.generation();
    drop(g1);
    let _g2 = ws.get_and_activate(&cfg(), "WS").unwrap();
    let fresh = Tensor::ones(DType::F64, &[3]).unwrap();
    match fresh.mul(&old) {
        Err(Error::OutdatedWorkspacePointer {
            op,
            arg,
            workspace,
            allocated_in,
            current,
        }) => {
            assert_eq!(
                (op.as_str(), arg.as_str(), workspace.as_str()),
                ("mul", "Y", "WS")
            );
            assert_eq!(allocated_in, generation);
            assert_eq!(current, generation + 1);
        }
        other => panic!("{other:?}"),
    }
    let msg = old.exp().unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "(allocated in generation {generation}, now {})",
            generation + 1
        )),
        "{msg}"
    );
}

#[test]
fn a_tensor_of_a_destroyed_workspace_is_leaked_even_through_views() {
    let ws = workspaces();
    let (x, view, reshaped) = {
        let _g = ws.get_and_activate(&cfg(), "DESTROYED").unwrap();
        let x = Tensor::rand(DType::F32, &[2, 3], 1).unwrap();
        let view = x.transpose().unwrap();
        let reshaped = x.reshape(&[6]).unwrap();
        (x, view, reshaped)
    };
    ws.destroy("DESTROYED").unwrap();
    leaked(x.relu(), "relu", "X", "DESTROYED");
    leaked(view.relu(), "relu", "X", "DESTROYED");
    leaked(reshaped.sum(), "sum", "X", "DESTROYED");
    assert!(view.to_vec::<f32>().is_err());
}

#[test]
fn views_and_reshapes_inherit_validity_within_the_cycle_and_lose_it_after() {
    let ws = workspaces();
    let (t, r) = {
        let _g = ws.get_and_activate(&cfg(), "VIEWS").unwrap();
        let x = Tensor::rand(DType::F32, &[4, 4], 2).unwrap();
        let t = x.transpose().unwrap();
        let r = x.reshape(&[16]).unwrap();
        assert!(t.matmul(&x).is_ok(), "valid inside the cycle");
        assert_eq!(r.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        (t, r)
    };
    leaked(t.matmul(&t), "matmul", "X", "VIEWS");
    leaked(r.reshape(&[4, 4]), "reshape", "X", "VIEWS");
}

#[test]
fn moving_data_out_checks_the_source_first() {
    // semantics §3: the check also runs in detach / leverage / leverage_to / migrate.
    let ws = workspaces();
    let x = {
        let _g = ws.get_and_activate(&cfg(), "MOVE").unwrap();
        Tensor::ones(DType::F32, &[2]).unwrap()
    };
    leaked(x.detach(), "detach", "X", "MOVE");
    leaked(x.leverage(), "leverage", "X", "MOVE");
    leaked(x.leverage_to("MOVE"), "leverage_to", "X", "MOVE");
    leaked(x.migrate(), "migrate", "X", "MOVE");
}

#[test]
fn fix_1_detach_makes_a_tensor_valid_forever() {
    let ws = workspaces();
    let kept = {
        let _g = ws.get_and_activate(&cfg(), "FIX1").unwrap();
        let y = Tensor::full(DType::F32, &[3], 2.0)
            .unwrap()
            .mul_scalar(3.0)
            .unwrap();
        let kept = y.detach().unwrap();
        assert_eq!(kept.workspace(), None);
        kept
    };
    ws.destroy("FIX1").unwrap();
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![6.0; 3]);
    assert_eq!(
        kept.add_scalar(1.0).unwrap().to_vec::<f32>().unwrap(),
        vec![7.0; 3]
    );
}

#[test]
fn fix_2_scope_out_allocates_outside_any_workspace() {
    let ws = workspaces();
    let kept = {
        let _g = ws.get_and_activate(&cfg(), "FIX2").unwrap();
        let _out = ws.scope_out();
        assert_eq!(ws.current(), None);
        Tensor::ones(DType::F32, &[3]).unwrap()
    };
    assert_eq!(kept.workspace(), None);
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

#[test]
fn fix_3_leverage_copies_into_the_parent_workspace() {
    let ws = workspaces();
    let _outer = ws.get_and_activate(&cfg(), "OUTER").unwrap();
    let kept = {
        let _inner = ws.get_and_activate(&cfg(), "INNER").unwrap();
        let y = Tensor::ones(DType::F32, &[3])
            .unwrap()
            .add_scalar(1.0)
            .unwrap();
        assert_eq!(y.workspace(), Some("INNER"));
        let kept = y.leverage().unwrap();
        assert_eq!(kept.workspace(), Some("OUTER"));
        let again = kept.leverage().unwrap();
        assert!(
            again.shares_storage(&kept),
            "already in the parent: unchanged"
        );
        kept
    };
    assert_eq!(ws.current().as_deref(), Some("OUTER"));
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![2.0; 3]);
}

#[test]
fn leverage_without_a_parent_detaches() {
    let ws = workspaces();
    let kept = {
        let _g = ws.get_and_activate(&cfg(), "LONELY").unwrap();
        Tensor::ones(DType::F32, &[2]).unwrap().leverage().unwrap()
    };
    assert_eq!(kept.workspace(), None);
    assert!(kept.is_valid());
}

#[test]
fn fix_4_leverage_to_copies_into_a_named_open_workspace() {
    let ws = workspaces();
    let _outer = ws.get_and_activate(&cfg(), "TARGET").unwrap();
    let kept = {
        let _a = ws.get_and_activate(&cfg(), "MIDDLE").unwrap();
        let _b = ws.get_and_activate(&cfg(), "DEEP").unwrap();
        let y = Tensor::ones(DType::I32, &[2]).unwrap();
        assert!(matches!(
            y.leverage_to("NOPE"),
            Err(Error::NoSuchWorkspace { .. })
        ));
        y.leverage_to("TARGET").unwrap()
    };
    assert_eq!(kept.workspace(), Some("TARGET"));
    assert_eq!(kept.to_vec::<i32>().unwrap(), vec![1, 1]);
}

#[test]
fn migrate_copies_into_the_current_workspace() {
    let ws = workspaces();
    let pool_tensor = Tensor::ones(DType::F32, &[2]).unwrap();
    let _g = ws.get_and_activate(&cfg(), "MIGRATE").unwrap();
    let moved = pool_tensor.migrate().unwrap();
    assert_eq!(moved.workspace(), Some("MIGRATE"));
    assert_eq!(moved.to_vec::<f32>().unwrap(), vec![1.0; 2]);
}

#[test]
fn a_workspace_tensor_sent_to_another_thread_is_refused_there() {
    let ws = workspaces();
    let _g = ws.get_and_activate(&cfg(), "OWNED").unwrap();
    let x = Tensor::ones(DType::F32, &[8]).unwrap();
    let err = std::thread::scope(|s| s.spawn(|| x.add_scalar(1.0).unwrap_err()).join().unwrap());
    match err {
        Error::WrongThread {
            op, arg, workspace, ..
        } => {
            assert_eq!(
                (op.as_str(), arg.as_str(), workspace.as_str()),
                ("add_scalar", "X", "OWNED")
            );
        }
        other => panic!("{other:?}"),
    }
    let copy = x.detach().unwrap();
    let sent = std::thread::scope(|s| s.spawn(|| copy.to_vec::<f32>().unwrap()).join().unwrap());
    assert_eq!(sent, vec![1.0; 8], "a detached copy crosses threads");
}

#[test]
fn circular_workspaces_are_exempt_from_the_generation_check() {
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1 << 20)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(2.0)
        .build()
        .unwrap();
    let first = {
        let _g = ws.get_and_activate(&cfg, "RING").unwrap();
        Tensor::full(DType::F32, &[16], 3.0).unwrap()
    };
    {
        let _g = ws.get_and_activate(&cfg, "RING").unwrap();
        let second = Tensor::ones(DType::F32, &[16]).unwrap();
        assert_eq!(
            first.add(&second).unwrap().to_vec::<f32>().unwrap(),
            vec![4.0; 16]
        );
    }
    assert!(first.is_valid(), "valid until the ring wraps over it");
    ws.destroy("RING").unwrap();
    leaked(first.relu(), "relu", "X", "RING");
}

#[test]
fn a_live_view_keeps_its_workspace_from_recycling_the_memory() {
    // semantics §3 "never undefined behaviour": a borrowed view pins the cycle's memory.
    let ws = workspaces();
    let cfg = cfg();
    let x = {
        let _g = ws.get_and_activate(&cfg, "PINNED").unwrap();
        Tensor::full(DType::F32, &[8], 5.0).unwrap()
    };
    {
        let _g = ws.get_and_activate(&cfg, "PINNED").unwrap();
        assert!(x.view::<f32>().is_err(), "an outdated tensor gives no view");
    }
    // Now hold a view across the end of the cycle.
    let g = ws.get_and_activate(&cfg, "PINNED").unwrap();
    let t = Tensor::full(DType::F32, &[8], 9.0).unwrap();
    let view = t.view::<f32>().unwrap();
    drop(g);
    match ws.get_and_activate(&cfg, "PINNED") {
        Err(Error::WorkspaceInUse {
            workspace, views, ..
        }) => {
            assert_eq!((workspace.as_str(), views), ("PINNED", 1));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ws.destroy("PINNED"),
        Err(Error::WorkspaceInUse { .. })
    ));
    assert_eq!(view.sum(), 72.0, "the memory was not reused under the view");
    drop(view);
    let _g = ws.get_and_activate(&cfg, "PINNED").unwrap();
    assert!(
        t.view::<f32>().is_err(),
        "after the view, the cycle moves on as usual"
    );
}

#[test]
fn a_reallocation_a_view_deferred_happens_at_the_next_cycle_end() {
    // semantics §2.2 and §2.3: a cycle that spilled and ended under a view leaves its
    // work (freeing the spills, `Reallocate`) to a later cycle end; that end reallocates
    // even though its own cycle spilled nothing, so the next large cycle fits.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(256)
        .policy_allocation(ndmem::AllocationPolicy::Strict)
        .policy_spill(ndmem::SpillPolicy::Reallocate)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&cfg, "DEFERRED_REALLOC").unwrap();
    let t = Tensor::full(DType::F32, &[250], 2.0).unwrap(); // 1,000 bytes: spills
    let view = t.view::<f32>().unwrap();
    drop(g);
    let stats = ws.workspace("DEFERRED_REALLOC").unwrap();
    assert_eq!(stats.size, 256, "nothing replaced under the view");
    assert!(stats.max_cycle >= 1000, "{stats:?}");
    drop(view);
    drop(t);
    {
        let _g = ws.get_and_activate(&cfg, "DEFERRED_REALLOC").unwrap(); // spills nothing
    }
    let stats = ws.workspace("DEFERRED_REALLOC").unwrap();
    assert!(stats.size >= stats.max_cycle, "{stats:?}");
    {
        let _g = ws.get_and_activate(&cfg, "DEFERRED_REALLOC").unwrap();
        let _t = Tensor::full(DType::F32, &[250], 3.0).unwrap();
        let stats = ws.workspace("DEFERRED_REALLOC").unwrap();
        assert_eq!(
            stats.spilled_bytes, 0,
            "the large cycle fits now: {stats:?}"
        );
    }
    ws.destroy("DEFERRED_REALLOC").unwrap();
}

#[test]
fn an_empty_tensor_takes_one_element_of_its_workspace() {
    // semantics §3: a tensor with no elements still has a home (one element, rounded to
    // the alignment), so a full `Fail` workspace refuses it by name.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(64)
        .policy_allocation(ndmem::AllocationPolicy::Strict)
        .policy_spill(ndmem::SpillPolicy::Fail)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&cfg, "EMPTY_FULL").unwrap();
    let empty = Tensor::zeros(DType::F32, &[0]).unwrap();
    assert_eq!((empty.len(), empty.workspace()), (0, Some("EMPTY_FULL")));
    assert_eq!(ws.workspace("EMPTY_FULL").unwrap().used, 16);
    let _rest = Tensor::zeros(DType::F32, &[12]).unwrap(); // 48 bytes: the buffer is full
    match Tensor::zeros(DType::F32, &[0, 3]) {
        Err(Error::WorkspaceFull {
            workspace,
            requested,
            available,
        }) => assert_eq!(
            (workspace.as_str(), requested, available),
            ("EMPTY_FULL", 16, 0)
        ),
        other => panic!("{other:?}"),
    }
    drop((empty, _rest, g));
    ws.destroy("EMPTY_FULL").unwrap();
}

#[test]
fn a_circular_tensor_under_a_view_is_never_overwritten_by_later_cycles() {
    // semantics §2.4 and §3: the ring never starts a cycle in a slot a live tensor uses, so a
    // borrowed view of circular memory reads what was written, however many cycles run.
    let ws = workspaces();
    let ring = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(1.0)
        .build()
        .unwrap();
    let kept = {
        let _g = ws.get_and_activate(&ring, "RING_VIEW").unwrap();
        Tensor::full(DType::F32, &[1024], 7.0).unwrap()
    };
    let view = kept.view::<f32>().unwrap();
    for step in 0..6 {
        let _g = ws.get_and_activate(&ring, "RING_VIEW").unwrap();
        let fresh = Tensor::full(DType::F32, &[1024], step as f64).unwrap();
        assert_eq!(fresh.sum().unwrap().scalar().unwrap(), 1024.0 * step as f64);
        assert!(
            view.iter().all(|&v| v == 7.0),
            "overwritten at cycle {step}"
        );
    }
    drop(view);
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![7.0; 1024]);
}

#[test]
fn circular_tensors_cross_threads_and_stay_intact_while_the_producer_runs_on() {
    // semantics §3: circular workspaces are exempt from WrongThread; semantics §6: a batch a
    // consumer holds is not overwritten by the producer's later cycles.
    let (to_consumer, batches) = std::sync::mpsc::sync_channel::<(f64, Tensor)>(4);
    let consumer = std::thread::spawn(move || {
        let mut total = 0.0;
        for (value, batch) in batches {
            std::thread::sleep(std::time::Duration::from_micros(200));
            let data = batch.to_vec::<f64>().unwrap();
            assert!(
                data.iter().all(|&v| v == value),
                "batch {value} overwritten"
            );
            total += batch.add_scalar(1.0).unwrap().to_vec::<f64>().unwrap()[0];
        }
        total
    });
    let ws = workspaces();
    let ring = WorkspaceConfig::builder()
        .initial_size(8 * 512)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(2.0)
        .build()
        .unwrap();
    for i in 0..40 {
        let _g = ws.get_and_activate(&ring, "RING_THREADS").unwrap();
        let batch = Tensor::full(DType::F64, &[512], i as f64).unwrap();
        to_consumer.send((i as f64, batch)).unwrap();
    }
    drop(to_consumer);
    assert_eq!(consumer.join().unwrap(), (1..=40).sum::<i32>() as f64);
    ws.destroy("RING_THREADS").unwrap();
}

#[test]
fn a_view_that_outlives_its_thread_never_sees_its_memory_reused() {
    // semantics §2.2 Decision (workspaces freed at thread exit) against semantics §3 (never
    // undefined behaviour): a view kept in a thread-local that is torn down after the
    // workspaces still reads the values it was given, even when the pool is asked for
    // memory before the view reads.
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    const LEN: usize = 64 << 10;
    thread_local! {
        static HELD: RefCell<Option<LateReader>> = const { RefCell::new(None) };
    }
    struct LateReader {
        view: ndmem::TensorView<'static, f32>,
        intact: Arc<Mutex<Option<bool>>>,
    }
    impl Drop for LateReader {
        fn drop(&mut self) {
            // Runs after the workspaces were torn down: churn the pool, then read.
            let blocks: Vec<_> = (0..4)
                .filter_map(|_| {
                    let mut b = ndmem::alloc::Pool::global().allocate(LEN * 4, 64).ok()?;
                    b.as_slice_mut().fill(0xAB);
                    Some(b)
                })
                .collect();
            let intact = self.view.iter().all(|&v| v == 2.5);
            drop(blocks);
            *self.intact.lock().unwrap() = Some(intact);
        }
    }
    let intact = Arc::new(Mutex::new(None));
    let reported = Arc::clone(&intact);
    let registered = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&registered);
    std::thread::spawn(move || {
        // Registered first, so torn down after the workspace manager.
        HELD.with(|h| h.borrow_mut().take());
        let ws = workspaces();
        let cfg = WorkspaceConfig::builder()
            .initial_size(LEN * 4)
            .policy_allocation(ndmem::AllocationPolicy::Strict)
            .build()
            .unwrap();
        let g = ws.get_and_activate(&cfg, "OUTLIVED").unwrap();
        let tensor: &'static Tensor =
            Box::leak(Box::new(Tensor::full(DType::F32, &[LEN], 2.5).unwrap()));
        let view = tensor.view::<f32>().unwrap();
        drop(g);
        HELD.with(|h| {
            *h.borrow_mut() = Some(LateReader {
                view,
                intact: reported,
            })
        });
        flag.store(true, Ordering::SeqCst);
    })
    .join()
    .unwrap();
    assert!(registered.load(Ordering::SeqCst));
    assert_eq!(
        *intact.lock().unwrap(),
        Some(true),
        "the view saw reused memory"
    );
}

/// Opens workspace `id`, allocates a tensor in it and leaves the workspace open.
fn open_with_tensor(id: &str) -> (ndmem::WorkspaceGuard, Tensor) {
    let guard = workspaces().get_and_activate(&cfg(), id).unwrap();
    let tensor = Tensor::ones(DType::F32, &[2]).unwrap();
    (guard, tensor)
}

#[test]
fn a_thread_with_more_workspaces_than_table_slots_checks_every_one_exactly() {
    // The fast check keeps a slot per workspace of a thread, for the first 255; the rest
    // are checked through their stamps. Both must give the same answers.
    let ws = workspaces();
    let ids: Vec<String> = (0..300).map(|i| format!("MANY_{i}")).collect();
    let mut guards = Vec::new();
    let mut tensors = Vec::new();
    for id in &ids {
        let (guard, tensor) = open_with_tensor(id);
        guards.push(guard);
        tensors.push(tensor);
    }
    assert!(tensors.iter().all(Tensor::is_valid), "300 open workspaces");
    let other = std::thread::scope(|s| {
        s.spawn(|| tensors.iter().filter(|t| t.is_valid()).count())
            .join()
            .unwrap()
    });
    assert_eq!(other, 0, "no other thread may use them");
    // Leave them innermost first (the last-opened is the innermost).
    while let Some(guard) = guards.pop() {
        drop(guard);
    }
    for (tensor, id) in tensors.iter().zip(&ids).step_by(37) {
        leaked(tensor.add_scalar(1.0), "add_scalar", "X", id);
    }
    assert!(tensors.iter().all(|t| !t.is_valid()), "all left");
    // A later cycle of the last (slotless) workspace: its old tensor is outdated, a new
    // one valid until the cycle ends.
    let last = ids.last().unwrap();
    let (guard, fresh) = open_with_tensor(last);
    assert!(fresh.is_valid());
    assert!(matches!(
        tensors.last().unwrap().add_scalar(1.0),
        Err(Error::OutdatedWorkspacePointer { .. })
    ));
    drop(guard);
    assert!(!fresh.is_valid());
    for id in &ids {
        ws.destroy(id).unwrap();
    }
}

#[test]
fn a_destroyed_workspaces_slot_serves_the_next_and_its_old_tensors_stay_refused() {
    let ws = workspaces();
    let (guard, old) = open_with_tensor("FIRST");
    ws.destroy("FIRST").unwrap();
    assert!(!old.is_valid(), "destroyed while open");
    drop(guard);
    // The next workspaces take the freed slot and open cycles in it; a workspace under
    // the same id is another one.
    let (_g1, next) = open_with_tensor("SECOND");
    let (_g2, again) = open_with_tensor("FIRST");
    assert!(next.is_valid() && again.is_valid());
    leaked(old.add_scalar(1.0), "add_scalar", "X", "FIRST");
    leaked(old.add(&again), "add", "X", "FIRST");
}

#[test]
fn a_thread_with_open_workspaces_of_its_own_still_refuses_another_threads_tensors() {
    let (_guard, x) = open_with_tensor("MINE");
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            // Same slots, same order, open cycles: still another thread's memory.
            let (_g, own) = open_with_tensor("MINE");
            assert!(own.is_valid());
            assert!(!x.is_valid());
            x.add(&own).unwrap_err()
        })
        .join()
        .unwrap()
    });
    assert!(
        matches!(err, Error::WrongThread { ref arg, .. } if arg == "X"),
        "{err:?}"
    );
    assert!(x.is_valid(), "still valid on its own thread");
}
