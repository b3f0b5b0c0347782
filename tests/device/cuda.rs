//! The CUDA backend on a real GPU. Each test returns early, printing why, when no CUDA
//! driver (or no device) is present; without one, opening a device is `Error::NoDevice`
//! and nothing panics (semantics §5).

use ndmem::device::{self, DeviceMemory, DeviceWorkspace, Mirror};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ndmem::{Error, MirroringPolicy, WorkspaceConfig};

/// Held by each test while it uses the GPU: `device::cuda(0)` is one device for the
/// whole process (a simulated device is new for each test), so tests that count its
/// transfers and driver allocations, or capture a graph on it, must not overlap.
static GPU: Mutex<()> = Mutex::new(());

/// CUDA device 0 and the GPU lock, or `None` after printing why the test is skipped.
fn gpu() -> Option<(MutexGuard<'static, ()>, ndmem::Device)> {
    let lock = GPU.lock().unwrap_or_else(PoisonError::into_inner);
    match device::cuda(0) {
        Ok(d) => Some((lock, d)),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Whether this test ran in a process of its own (the caller then returns): with a driver
/// present, a test that counts driver allocations runs alone, since another test's thread
/// holding the epoch pinned keeps deferred frees from reaching the cache in time.
fn ran_alone(test: &str) -> bool {
    device::cuda_driver_present() && crate::common::child::run_alone(test)
}

#[test]
fn without_a_driver_opening_a_device_is_no_device() {
    if device::cuda_driver_present() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    let err = device::cuda(0).unwrap_err();
    assert!(matches!(err, Error::NoDevice { .. }), "{err:?}");
    // Built without the `cuda` feature, the error says so instead.
    let reason = if cfg!(feature = "cuda") {
        "no CUDA driver found"
    } else {
        "built without its `cuda` feature"
    };
    assert!(err.to_string().contains(reason), "{err}");
    assert!(matches!(
        device::cuda_device_count(),
        Err(Error::NoDevice { .. })
    ));
}

#[test]
fn opening_twice_gives_the_same_device_and_a_limit_within_its_memory() {
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    assert_eq!(device::cuda(0).unwrap(), gpu);
    let info = gpu.memory_info().unwrap();
    assert!(info.total > 0 && info.free <= info.total);
    assert!(gpu.limit().unwrap_or(0) <= info.total);
    eprintln!("{}", gpu.describe());
    let count = device::cuda_device_count().unwrap();
    let err = device::cuda(count).unwrap_err();
    assert!(matches!(err, Error::NoDevice { .. }), "{err:?}");
}

#[test]
fn round_trips_through_staging_and_pinned_memory() {
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let n = device::STAGING_BYTES + 4097;
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let mut buffer = gpu.allocate(n).unwrap();
    gpu.upload(&data, &mut buffer).unwrap();
    let mut back = vec![0u8; n];
    gpu.download(&buffer, &mut back).unwrap();
    assert!(back == data);
    let mut pinned = gpu.allocate_pinned(4096).unwrap();
    gpu.fill(&mut buffer, 7).unwrap();
    gpu.download_pinned(&buffer, &mut pinned).unwrap();
    assert!(pinned.as_slice().iter().all(|b| *b == 7));
    gpu.synchronize().unwrap();
    let event = gpu.record_event().unwrap();
    event.synchronize().unwrap();
    assert!(event.is_complete().unwrap());
}

#[test]
fn mirrors_copy_only_stale_sides_on_the_gpu() {
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let before = gpu.stats();
    let mut m = Mirror::from_host(&gpu, &[3u8; 1 << 16], MirroringPolicy::Full).unwrap();
    let _ = m.device().unwrap();
    let _ = m.device().unwrap();
    {
        let mut side = m.device_mut().unwrap();
        gpu.fill(&mut side, 9).unwrap();
    }
    assert!(m.host().unwrap().iter().all(|b| *b == 9));
    assert!(m.host().unwrap().iter().all(|b| *b == 9));
    let s = gpu.stats().since(&before);
    assert_eq!((s.htod_transfers, s.dtoh_transfers), (1, 1));

    let mut host_only = Mirror::new(&gpu, 4096, MirroringPolicy::HostOnly).unwrap();
    host_only.host_overwrite().unwrap().fill(5);
    {
        // The device reads and writes the mapped pinned memory in place.
        let mut side = host_only.device_mut().unwrap();
        gpu.fill(&mut side, 6).unwrap();
    }
    gpu.synchronize().unwrap();
    assert!(host_only.host().unwrap().iter().all(|b| *b == 6));
}

#[test]
fn a_learned_workspace_asks_the_driver_for_nothing() {
    if ran_alone(crate::common::test_name!(
        a_learned_workspace_asks_the_driver_for_nothing
    )) {
        return;
    }
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let mut ws = DeviceWorkspace::new(&gpu, "CUDA_LOOP", &WorkspaceConfig::default()).unwrap();
    let step = |ws: &mut DeviceWorkspace| {
        let cycle = ws.enter();
        for size in [4096usize, 1 << 20, 300] {
            let mut s = cycle.allocate(size, 256).unwrap();
            gpu.fill(&mut s, 1).unwrap();
            assert_eq!(s.len(), size);
        }
    };
    step(&mut ws);
    ndmem::reclaim::collect();
    let before = gpu.stats();
    let start = std::time::Instant::now();
    for _ in 0..100 {
        step(&mut ws);
    }
    let elapsed = start.elapsed();
    let after = gpu.stats().since(&before);
    assert_eq!(after.driver_allocations, 0);
    eprintln!("100 learned cycles (3 allocations + 3 memsets each): {elapsed:?}");
}

#[test]
fn kernels_and_cublas_match_the_simulated_device() {
    use ndmem::device::{BinaryOp, Device, DeviceBuffer, UnaryOp};
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let sim = crate::sim(0, 1 << 30);
    let (m, k, n) = (37usize, 129usize, 65usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0)
        .collect();
    let run = |d: &Device| -> Vec<Vec<f32>> {
        let up = |v: &[f32]| -> DeviceBuffer {
            let mut buf = d.allocate(v.len() * 4).unwrap();
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
            d.upload(&bytes, &mut buf).unwrap();
            buf
        };
        let down = |buf: &DeviceBuffer, len: usize| -> Vec<f32> {
            let mut bytes = vec![0u8; len * 4];
            d.download(buf, &mut bytes).unwrap();
            crate::floats(&bytes)
        };
        let (da, db) = (up(&a), up(&b));
        let mut c = d.allocate(m * n * 4).unwrap();
        let mut out = Vec::new();
        d.matmul_f32(&da, &db, &mut c, m, k, n, false, false)
            .unwrap();
        out.push(down(&c, m * n));
        let mut g = d.allocate(k * k * 4).unwrap();
        d.matmul_f32(&da, &da, &mut g, k, m, k, true, false)
            .unwrap();
        out.push(down(&g, k * k));
        let mut y = d.allocate(m * k * 4).unwrap();
        for op in [UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Exp] {
            d.unary_f32(op, &da, &mut y, m * k).unwrap();
            out.push(down(&y, m * k));
        }
        let bias = up(&b[..k]);
        d.binary_f32(BinaryOp::Add, &da, m * k, &bias, k, &mut y, m * k)
            .unwrap();
        out.push(down(&y, m * k));
        d.softmax_f32(&da, &mut y, m, k, true).unwrap();
        out.push(down(&y, m * k));
        let mut s = d.allocate(k.max(m) * 4).unwrap();
        d.sum_f32(&da, &mut s, m, k, 1).unwrap();
        out.push(down(&s, m));
        d.sum_f32(&da, &mut s, m, k, 0).unwrap();
        out.push(down(&s, k));
        out
    };
    let (on_gpu, on_sim) = (run(&gpu), run(&sim));
    for (i, (g, s)) in on_gpu.iter().zip(&on_sim).enumerate() {
        for (x, y) in g.iter().zip(s) {
            assert!(
                (x - y).abs() <= 1e-3 * (1.0 + y.abs()),
                "result {i}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn a_training_step_on_the_gpu_matches_the_cpu_and_transfers_only_batch_and_loss() {
    use crate::tensors::{batch, Mlp};
    if ran_alone(crate::common::test_name!(
        a_training_step_on_the_gpu_matches_the_cpu_and_transfers_only_batch_and_loss
    )) {
        return;
    }
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let mut host = Mlp::new(None);
    let mut dev = Mlp::new(Some(&gpu));
    let steps = 200;
    let mut last = (0.0, 0.0);
    let mut transfers = Vec::new();
    let start = std::time::Instant::now();
    for step in 0..steps {
        let (x, y) = batch(step);
        let before = gpu.stats();
        let (dx, dy) = (x.to_device(&gpu).unwrap(), y.to_device(&gpu).unwrap());
        let loss_dev = dev.step(&dx, &dy, 0.1).to_host().unwrap().scalar().unwrap();
        transfers.push(gpu.stats().since(&before));
        let loss_host = host.step(&x, &y, 0.1).scalar().unwrap();
        last = (loss_dev, loss_host);
    }
    let elapsed = start.elapsed();
    let (d, h) = last;
    assert!(
        ((d - h) / h).abs() < 1e-3,
        "final loss {d} on the GPU vs {h} on the CPU"
    );
    for (step, s) in transfers.iter().enumerate() {
        assert_eq!((s.htod_transfers, s.dtoh_transfers), (2, 1), "step {step}");
    }
    let late: u64 = transfers[10..].iter().map(|s| s.driver_allocations).sum();
    eprintln!(
        "{steps} steps (GPU and CPU alternating) in {elapsed:?}; device allocations after step 10: {late}"
    );
    assert_eq!(late, 0);
}

#[test]
fn a_captured_graph_replays_kernels_and_cublas_as_launched() {
    use ndmem::device::{BinaryOp, UnaryOp};
    let Some((_gpu_lock, gpu)) = gpu() else {
        return;
    };
    let (m, k, n) = (8, 5, 3);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let bias = [0.25f32, -1.0, 2.0];
    let mut mem = gpu.graph_memory(1 << 16).unwrap();
    let (ra, rb, rbias) = (
        mem.floats(m * k).unwrap(),
        mem.floats(k * n).unwrap(),
        mem.floats(n).unwrap(),
    );
    let (rc, rd, re, rs) = (
        mem.floats(m * n).unwrap(),
        mem.floats(m * n).unwrap(),
        mem.floats(m * n).unwrap(),
        mem.floats(n).unwrap(),
    );
    mem.upload_f32(ra, &a).unwrap();
    mem.upload_f32(rb, &b).unwrap();
    mem.upload_f32(rbias, &bias).unwrap();
    let (graph, ()) = mem
        .capture(|g| {
            let dev = g.device().clone();
            let ([x, y], mut z) = g.operands([ra, rb], rc)?;
            dev.matmul_f32(&x, &y, &mut z, m, k, n, false, false)?;
            let ([x, y], mut z) = g.operands([rc, rbias], rd)?;
            dev.binary_f32(BinaryOp::Add, &x, m * n, &y, n, &mut z, m * n)?;
            let ([x], mut z) = g.operands([rd], re)?;
            dev.unary_f32(UnaryOp::Relu, &x, &mut z, m * n)?;
            let ([x], mut z) = g.operands([re], rs)?;
            dev.sum_f32(&x, &mut z, m, n, 0)
        })
        .unwrap();
    assert_eq!(graph.ops(), 4);
    let expected = |a: &[f32]| -> Vec<f32> {
        let mut sums = vec![0.0f32; n];
        for i in 0..m {
            for j in 0..n {
                let dot: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                sums[j] += (dot + bias[j]).max(0.0);
            }
        }
        sums
    };
    for round in 0..3 {
        let a: Vec<f32> = a.iter().map(|v| v * (round + 1) as f32).collect();
        mem.upload_f32(ra, &a).unwrap();
        mem.launch(&graph).unwrap();
        let got = mem.download_f32(rs).unwrap();
        for (g, e) in got.iter().zip(expected(&a)) {
            assert!(
                (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                "round {round}: {got:?}"
            );
        }
    }
    assert_eq!(gpu.stats().graph_launches, 3);
}
