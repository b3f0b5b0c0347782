//! Device graphs (semantics §5.9): captured once, replayed on the same addresses, with
//! every operand inside the graph's memory and nothing but device operations inside a
//! capture.

use ndmem::device::{BinaryOp, UnaryOp};

use crate::sim;

/// `y = relu(a * x + b)` row-broadcast, then the sum of each row of `y`, on `rows x cols`.
#[test]
fn a_captured_sequence_runs_only_when_launched_and_follows_new_inputs() {
    let gpu = sim(0, 64 << 20);
    let (rows, cols) = (4, 8);
    let mut mem = gpu.graph_memory(1 << 16).unwrap();
    let x = mem.floats(rows * cols).unwrap();
    let b = mem.floats(cols).unwrap();
    let t = mem.floats(rows * cols).unwrap();
    let y = mem.floats(rows * cols).unwrap();
    let s = mem.floats(rows).unwrap();
    let input: Vec<f32> = (0..rows * cols).map(|i| i as f32 - 10.0).collect();
    let bias: Vec<f32> = (0..cols).map(|i| i as f32 * 0.5).collect();
    mem.upload_f32(x, &input).unwrap();
    mem.upload_f32(b, &bias).unwrap();
    mem.upload_f32(s, &vec![-1.0; rows]).unwrap();
    let before = gpu.stats();

    let (graph, ()) = mem
        .capture(|m| {
            let dev = m.device().clone();
            let ([xr, br], mut tr) = m.operands([x, b], t)?;
            dev.binary_f32(
                BinaryOp::Add,
                &xr,
                rows * cols,
                &br,
                cols,
                &mut tr,
                rows * cols,
            )?;
            let ([tr], mut yr) = m.operands([t], y)?;
            dev.unary_f32(UnaryOp::Relu, &tr, &mut yr, rows * cols)?;
            let ([yr], mut sr) = m.operands([y], s)?;
            dev.sum_f32(&yr, &mut sr, rows, cols, 1)
        })
        .unwrap();
    assert_eq!(graph.ops(), 3);
    // Captured, not run: the output still holds what was uploaded.
    assert_eq!(mem.download_f32(s).unwrap(), vec![-1.0; rows]);
    assert_eq!(gpu.stats().since(&before).kernel_launches, 0);

    let expected = |input: &[f32]| -> Vec<f32> {
        (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|c| (input[r * cols + c] + bias[c]).max(0.0))
                    .sum()
            })
            .collect()
    };
    mem.launch(&graph).unwrap();
    assert_eq!(mem.download_f32(s).unwrap(), expected(&input));
    // A new input between launches: the replay reads it where the capture saw `x`.
    let doubled: Vec<f32> = input.iter().map(|v| v * 2.0).collect();
    mem.upload_f32(x, &doubled).unwrap();
    mem.launch(&graph).unwrap();
    assert_eq!(mem.download_f32(s).unwrap(), expected(&doubled));

    let d = gpu.stats().since(&before);
    assert_eq!((d.graph_launches, d.kernel_launches), (2, 6));
    assert_eq!(d.driver_allocations, 0, "replays allocate nothing");
}

#[test]
fn an_operand_outside_the_graph_memory_is_refused_and_the_device_stays_usable() {
    let gpu = sim(0, 64 << 20);
    let outside = gpu.allocate(256).unwrap();
    let mut other = gpu.allocate(256).unwrap();
    let mut mem = gpu.graph_memory(4096).unwrap();
    let y = mem.floats(64).unwrap();
    let err = mem
        .capture(|m| {
            let dev = m.device().clone();
            let mut yr = m.get_mut(y)?;
            dev.unary_f32(UnaryOp::Neg, &outside, &mut yr, 64)
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the graph's memory"), "{err}");
    // The capture ended with the error: operations run directly again.
    gpu.upload(&[0u8; 256], &mut other).unwrap();
    gpu.unary_f32(UnaryOp::Neg, &outside, &mut other, 64)
        .unwrap();
    let (graph, ()) = mem.capture(|_| Ok(())).unwrap();
    assert_eq!(graph.ops(), 0);
}

#[test]
fn allocations_copies_and_waits_cannot_be_captured() {
    let gpu = sim(0, 64 << 20);
    let mut mem = gpu.graph_memory(4096).unwrap();
    let r = mem.floats(4).unwrap();
    let attempts: Vec<String> = [
        mem.capture(|m| m.device().allocate(64).map(drop)),
        mem.capture(|m| m.upload_f32(r, &[1.0; 4])),
        mem.capture(|m| m.download_f32(r).map(drop)),
        mem.capture(|m| m.device().synchronize()),
        mem.capture(|m| m.device().record_event().map(drop)),
    ]
    .into_iter()
    .map(|res| res.unwrap_err().to_string())
    .collect();
    for err in &attempts {
        assert!(err.contains("cannot be part of a graph"), "{err}");
    }
    // None of it leaked out: after the captures, all of it works.
    mem.upload_f32(r, &[1.0; 4]).unwrap();
    assert_eq!(mem.download_f32(r).unwrap(), vec![1.0; 4]);
    gpu.synchronize().unwrap();
}

#[test]
fn a_graph_replays_only_on_the_memory_it_was_captured_on() {
    let gpu = sim(0, 64 << 20);
    let mut a = gpu.graph_memory(4096).unwrap();
    let mut b = gpu.graph_memory(4096).unwrap();
    let (ra, rb) = (a.floats(4).unwrap(), b.floats(4).unwrap());
    let xa = a.floats(4).unwrap();
    let (graph, ()) = a
        .capture(|m| {
            let dev = m.device().clone();
            let ([x], mut y) = m.operands([xa], ra)?;
            dev.affine_f32(&x, &mut y, 4, 2.0, 1.0)
        })
        .unwrap();
    let err = b.launch(&graph).unwrap_err().to_string();
    assert!(err.contains("another graph memory"), "{err}");
    // A region of one memory is refused by the other.
    let err = b.get(ra).unwrap_err().to_string();
    assert!(err.contains("another graph memory"), "{err}");
    assert!(b.get(rb).is_ok());
    // As an operand too, even at the offset of one of its own (`ra` and `rb` both start
    // at 0): the reason is the memory, not an overlap.
    let err = b.operands([ra], rb).unwrap_err().to_string();
    assert!(err.contains("another graph memory"), "{err}");
    let err = b.operands([rb], ra).unwrap_err().to_string();
    assert!(err.contains("another graph memory"), "{err}");
    a.upload_f32(xa, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    a.launch(&graph).unwrap();
    assert_eq!(a.download_f32(ra).unwrap(), vec![3.0, 5.0, 7.0, 9.0]);
}

#[test]
fn another_thread_cannot_launch_on_a_device_that_is_capturing() {
    let gpu = sim(0, 64 << 20);
    let mut mem = gpu.graph_memory(4096).unwrap();
    let y = mem.floats(16).unwrap();
    let x = mem.floats(16).unwrap();
    let (graph, err) = mem
        .capture(|m| {
            let dev = m.device().clone();
            let err = std::thread::scope(|s| {
                s.spawn(|| {
                    let src = dev.allocate(64).unwrap();
                    let mut dst = dev.allocate(64).unwrap();
                    dev.unary_f32(UnaryOp::Exp, &src, &mut dst, 16)
                        .unwrap_err()
                        .to_string()
                })
                .join()
                .unwrap()
            });
            let ([xr], mut yr) = m.operands([x], y)?;
            dev.unary_f32(UnaryOp::Exp, &xr, &mut yr, 16)?;
            Ok(err)
        })
        .unwrap();
    assert!(err.contains("capturing a graph on another thread"), "{err}");
    assert_eq!(graph.ops(), 1);
}

/// A replay from another thread while a capture is under way would run in the middle of
/// it; it is refused like any other operation from another thread (§5.9).
#[test]
fn another_thread_cannot_replay_a_graph_on_a_device_that_is_capturing() {
    let gpu = sim(0, 64 << 20);
    let mut other = gpu.graph_memory(4096).unwrap();
    let (ox, oy) = (other.floats(4).unwrap(), other.floats(4).unwrap());
    let (replay, ()) = other
        .capture(|m| {
            let dev = m.device().clone();
            let ([x], mut y) = m.operands([ox], oy)?;
            dev.affine_f32(&x, &mut y, 4, 2.0, 1.0)
        })
        .unwrap();
    let mut mem = gpu.graph_memory(4096).unwrap();
    let (x, y) = (mem.floats(4).unwrap(), mem.floats(4).unwrap());
    let before = gpu.stats();
    let (_graph, err) = mem
        .capture(|m| {
            let err = std::thread::scope(|s| {
                s.spawn(|| other.launch(&replay).unwrap_err().to_string())
                    .join()
                    .unwrap()
            });
            let dev = m.device().clone();
            let ([xr], mut yr) = m.operands([x], y)?;
            dev.affine_f32(&xr, &mut yr, 4, 2.0, 1.0)?;
            Ok(err)
        })
        .unwrap();
    assert!(
        err.contains("launching a graph") && err.contains("capturing a graph on another thread"),
        "{err}"
    );
    let since = gpu.stats().since(&before);
    assert_eq!((since.graph_launches, since.kernel_launches), (0, 0));
    // Once the capture is over, the replay runs.
    other.upload_f32(ox, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    other.launch(&replay).unwrap();
    assert_eq!(other.download_f32(oy).unwrap(), vec![3.0, 5.0, 7.0, 9.0]);
}

/// The closure borrows the memory mutably and could put other memory behind it; the
/// graph would then be stamped for memory its operations do not lie in. The capture
/// returns an error instead, and no graph.
#[test]
fn a_capture_whose_closure_replaces_its_memory_gives_no_graph() {
    let gpu = sim(0, 64 << 20);
    let mut a = gpu.graph_memory(4096).unwrap();
    let mut b = gpu.graph_memory(4096).unwrap();
    let (xa, ya) = (a.floats(4).unwrap(), a.floats(4).unwrap());
    let err = a
        .capture(|m| {
            let dev = m.device().clone();
            let ([x], mut y) = m.operands([xa], ya)?;
            dev.affine_f32(&x, &mut y, 4, 0.0, 7.0)?;
            std::mem::swap(m, &mut b);
            Ok(())
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("replaced the graph memory"), "{err}");
    // The device is not left capturing: both memories capture and replay again.
    for mem in [&mut a, &mut b] {
        let (x, y) = (mem.floats(4).unwrap(), mem.floats(4).unwrap());
        let (graph, ()) = mem
            .capture(|m| {
                let dev = m.device().clone();
                let ([xr], mut yr) = m.operands([x], y)?;
                dev.affine_f32(&xr, &mut yr, 4, 2.0, 1.0)
            })
            .unwrap();
        mem.upload_f32(x, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        mem.launch(&graph).unwrap();
        assert_eq!(mem.download_f32(y).unwrap(), vec![3.0, 5.0, 7.0, 9.0]);
    }
}

/// Swapped for another device's memory, the capture still ends on its own device, which
/// then allocates, waits and releases the frees it held during the capture.
#[test]
fn a_capture_whose_memory_is_swapped_for_another_devices_still_ends_on_its_device() {
    let g0 = sim(0, 64 << 20);
    let g1 = sim(1, 64 << 20);
    let mut a = g0.graph_memory(4096).unwrap();
    let mut b = g1.graph_memory(4096).unwrap();
    let outside = g0.allocate(8192).unwrap();
    let live = g0.stats().live_bytes;
    let err = a
        .capture(|m| {
            drop(outside);
            ndmem::reclaim::collect();
            std::mem::swap(m, &mut b);
            Ok(())
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("replaced the graph memory"), "{err}");
    // The held free is done (it never is if the capture ended on the other device).
    crate::settle(&g0);
    let stats = g0.stats();
    assert_eq!(stats.deferred_bytes, 0);
    assert_eq!(stats.live_bytes, live - 8192);
    g0.allocate(64).unwrap();
    g0.synchronize().unwrap();
    // `b` now holds device 0's memory, and device 0 captures again.
    assert_eq!(b.device().ordinal(), 0);
    b.capture(|_| Ok(())).unwrap();
}

#[test]
fn regions_are_aligned_bounded_and_outputs_never_overlap_inputs() {
    let gpu = sim(0, 64 << 20);
    let mut mem = gpu.graph_memory(1024).unwrap();
    let a = mem.region(10).unwrap();
    let b = mem.region(10).unwrap();
    assert_eq!(mem.used(), ndmem::device::REGION_ALIGN + 10);
    let err = mem.region(1024).unwrap_err().to_string();
    assert!(err.contains("does not fit"), "{err}");
    let err = mem.operands([a, b], a).unwrap_err().to_string();
    assert!(err.contains("overlaps input 0"), "{err}");
    assert!(mem.operands([a], b).is_ok());
    let err = mem.upload(a, &[0u8; 9]).unwrap_err().to_string();
    assert!(err.contains("9 bytes into a region of 10"), "{err}");
}

#[test]
fn a_panic_inside_a_capture_ends_it() {
    let gpu = sim(0, 64 << 20);
    let mut mem = gpu.graph_memory(4096).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = mem.capture(|_| -> ndmem::Result<()> { panic!("inside the capture") });
    }));
    assert!(panicked.is_err());
    // The device runs work again, from any thread, and captures again.
    let src = gpu.allocate(64).unwrap();
    let mut dst = gpu.allocate(64).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| gpu.unary_f32(UnaryOp::Neg, &src, &mut dst, 16).unwrap());
    });
    assert!(mem.capture(|_| Ok(())).is_ok());
}

#[test]
fn frees_that_come_due_on_the_capturing_thread_wait_for_the_capture_to_end() {
    // Semantics §5.9: nothing but device operations inside a capture. A deferred free of
    // device memory runs on whichever thread flushes the epoch; on the capturing thread
    // its fence wait and driver free would end a CUDA capture (and the memory would
    // leak), so it is held until the capture ends, then done.
    let gpu = sim(0, 64 << 20);
    let mut mem = gpu.graph_memory(1 << 16).unwrap();
    let x = mem.floats(16).unwrap();
    let y = mem.floats(16).unwrap();
    let outside = gpu.allocate(4096).unwrap();
    let (graph, held) = mem
        .capture(|m| {
            drop(outside);
            for _ in 0..8 {
                ndmem::reclaim::collect();
            }
            let held = m.device().stats().deferred_bytes;
            let dev = m.device().clone();
            let ([xr], mut yr) = m.operands([x], y)?;
            dev.unary_f32(UnaryOp::Relu, &xr, &mut yr, 16)?;
            Ok(held)
        })
        .unwrap();
    assert_eq!(graph.ops(), 1);
    assert_eq!(held, 4096, "the free came due in the capture and was held");
    assert_eq!(gpu.stats().deferred_bytes, 0, "done once the capture ended");
}
