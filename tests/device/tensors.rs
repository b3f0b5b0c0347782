//! Tensors on a device (semantics §5.8): to_device/to_host, ops dispatched to the device,
//! and a training step whose only transfers are the batch in and the loss out.

use ndmem::device::Device;
use ndmem::{DType, Error, Tensor};

use crate::sim;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn to_device_and_back_counts_one_transfer_each_way() {
    let gpu = sim(0, 1 << 30);
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    assert!(t.device().is_none());
    let d = t.to_device(&gpu).unwrap();
    assert_eq!(d.device(), Some(gpu.clone()));
    assert!(d.is_on_device());
    assert_eq!(d.shape(), &[2, 2]);
    assert!(
        d.to_device(&gpu).unwrap().shares_storage(&d),
        "already there"
    );
    // The uploaded tensor keeps its host side current: reading it copies nothing.
    assert_eq!(
        d.to_host().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(gpu.stats().dtoh_transfers, 0);
    // A result computed on the device is downloaded once, on first host use.
    let twice = d.mul_scalar(2.0).unwrap();
    let back = twice.to_host().unwrap();
    assert!(!back.is_on_device());
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    assert_eq!(twice.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    let s = gpu.stats();
    assert_eq!((s.htod_transfers, s.dtoh_transfers), (1, 1));
}

#[test]
fn device_ops_match_host_ops() {
    let gpu = sim(0, 1 << 30);
    let a = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3]).unwrap();
    let b = Tensor::from_slice(&[0.5f32, 1.5, -2.5], &[3]).unwrap();
    let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let (da, db, dm) = (
        a.to_device(&gpu).unwrap(),
        b.to_device(&gpu).unwrap(),
        m.to_device(&gpu).unwrap(),
    );
    let before = gpu.stats();
    let pairs: Vec<(Tensor, Tensor)> = vec![
        (a.add(&b).unwrap(), da.add(&db).unwrap()),
        (a.sub(&b).unwrap(), da.sub(&db).unwrap()),
        (a.mul(&a).unwrap(), da.mul(&da).unwrap()),
        (a.div(&b).unwrap(), da.div(&db).unwrap()),
        (a.relu().unwrap(), da.relu().unwrap()),
        (a.relu_backward(&a).unwrap(), da.relu_backward(&da).unwrap()),
        (a.sigmoid().unwrap(), da.sigmoid().unwrap()),
        (a.tanh().unwrap(), da.tanh().unwrap()),
        (a.exp().unwrap(), da.exp().unwrap()),
        (a.add_scalar(2.0).unwrap(), da.add_scalar(2.0).unwrap()),
        (a.mul_scalar(-3.0).unwrap(), da.mul_scalar(-3.0).unwrap()),
        (a.sum().unwrap(), da.sum().unwrap()),
        (a.sum_axis(0).unwrap(), da.sum_axis(0).unwrap()),
        (a.sum_axis(1).unwrap(), da.sum_axis(1).unwrap()),
        (a.mean_axis(1).unwrap(), da.mean_axis(1).unwrap()),
        (a.softmax(1).unwrap(), da.softmax(1).unwrap()),
        (a.log_softmax(1).unwrap(), da.log_softmax(1).unwrap()),
        (a.matmul(&m).unwrap(), da.matmul(&dm).unwrap()),
        (
            a.transpose().unwrap().matmul(&a).unwrap(),
            da.transpose().unwrap().matmul(&da).unwrap(),
        ),
        (
            a.matmul(&a.transpose().unwrap()).unwrap(),
            da.matmul(&da.transpose().unwrap()).unwrap(),
        ),
    ];
    let ran = gpu.stats().since(&before);
    assert_eq!(ran.htod_transfers, 0, "operands were already there");
    assert!(ran.kernel_launches >= pairs.len() as u64);
    for (host, dev) in &pairs {
        assert!(dev.is_on_device(), "{dev:?}");
        assert_eq!(host.shape(), dev.shape());
        close(
            &dev.to_vec::<f32>().unwrap(),
            &host.to_vec::<f32>().unwrap(),
            1e-5,
        );
    }
}

#[test]
fn ops_without_a_device_kernel_run_on_the_host_copy() {
    let gpu = sim(0, 1 << 30);
    let a = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 9.0], &[2, 2]).unwrap();
    let d = a.to_device(&gpu).unwrap();
    let arg = d.argmax(1).unwrap();
    assert!(!arg.is_on_device());
    assert_eq!(arg.to_vec::<i64>().unwrap(), vec![1, 1]);
    // f64 tensors have no device kernels either.
    let f = Tensor::from_slice(&[1.0f64, 2.0], &[2])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    assert_eq!(f.add(&f).unwrap().to_vec::<f64>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(f.dtype(), DType::F64);
}

#[test]
fn a_host_operand_is_uploaded_and_another_device_s_is_copied() {
    let gpu0 = sim(0, 1 << 30);
    let gpu1 = sim(1, 1 << 30);
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let on0 = a.to_device(&gpu0).unwrap();
    // Computed on device 1: its only current copy is there.
    let on1 = a.to_device(&gpu1).unwrap().mul_scalar(1.0).unwrap();
    let sum = on0.add(&a).unwrap(); // host operand: uploaded to device 0
    assert_eq!(sum.device(), Some(gpu0.clone()));
    assert_eq!(gpu0.stats().htod_transfers, 2);
    let mixed = on0.add(&on1).unwrap(); // device 1's operand: through the host to device 0
    assert_eq!(mixed.device(), Some(gpu0.clone()));
    assert_eq!(mixed.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(gpu1.stats().dtoh_transfers, 1);
}

#[test]
fn in_place_device_updates_need_the_only_handle() {
    let gpu = sim(0, 1 << 30);
    let mut w = Tensor::from_slice(&[1.0f32, 1.0], &[2])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    let g = Tensor::from_slice(&[2.0f32, 4.0], &[2])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    w.scaled_add(-0.5, &g).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0, -1.0]);
    w.assign(&g).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    let other = w.clone();
    let err = w.scaled_add(1.0, &g).unwrap_err();
    assert!(matches!(err, Error::SharedTensor { .. }), "{err:?}");
    drop(other);
    // The host copy was stale after the device write: the read above downloaded it.
    assert_eq!(gpu.stats().dtoh_transfers, 2);
}

/// One SGD step of a 4-32-3 MLP (softmax cross-entropy); returns the loss.
pub(crate) struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    pub(crate) fn new(device: Option<&Device>) -> Mlp {
        let put = |t: Tensor| match device {
            Some(d) => t.to_device(d).unwrap(),
            None => t,
        };
        let init = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.5)
                .collect()
        };
        Mlp {
            w1: put(Tensor::from_slice(&init(4 * 32, 1), &[4, 32]).unwrap()),
            b1: put(Tensor::zeros(DType::F32, &[32]).unwrap()),
            w2: put(Tensor::from_slice(&init(32 * 3, 2), &[32, 3]).unwrap()),
            b2: put(Tensor::zeros(DType::F32, &[3]).unwrap()),
        }
    }

    pub(crate) fn step(&mut self, x: &Tensor, y: &Tensor, lr: f64) -> Tensor {
        let rows = x.shape()[0] as f64;
        let z1 = x.matmul(&self.w1).unwrap().add(&self.b1).unwrap();
        let h = z1.relu().unwrap();
        let logits = h.matmul(&self.w2).unwrap().add(&self.b2).unwrap();
        let loss = y
            .mul(&logits.log_softmax(1).unwrap())
            .unwrap()
            .sum()
            .unwrap()
            .mul_scalar(-1.0 / rows)
            .unwrap();
        let d_logits = logits
            .softmax(1)
            .unwrap()
            .sub(y)
            .unwrap()
            .mul_scalar(1.0 / rows)
            .unwrap();
        let gw2 = h.transpose().unwrap().matmul(&d_logits).unwrap();
        let gb2 = d_logits.sum_axis(0).unwrap();
        let d_h = d_logits.matmul(&self.w2.transpose().unwrap()).unwrap();
        let d_z1 = z1.relu_backward(&d_h).unwrap();
        let gw1 = x.transpose().unwrap().matmul(&d_z1).unwrap();
        let gb1 = d_z1.sum_axis(0).unwrap();
        self.w1.scaled_add(-lr, &gw1).unwrap();
        self.b1.scaled_add(-lr, &gb1).unwrap();
        self.w2.scaled_add(-lr, &gw2).unwrap();
        self.b2.scaled_add(-lr, &gb2).unwrap();
        loss
    }
}

pub(crate) fn batch(step: usize) -> (Tensor, Tensor) {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for i in 0..16 {
        let class = (i + step) % 3;
        for f in 0..4 {
            xs.push(((class * 4 + f + step) % 7) as f32 / 7.0 + class as f32 * 0.5);
        }
        for c in 0..3 {
            ys.push(if c == class { 1.0f32 } else { 0.0 });
        }
    }
    (
        Tensor::from_slice(&xs, &[16, 4]).unwrap(),
        Tensor::from_slice(&ys, &[16, 3]).unwrap(),
    )
}

#[test]
fn a_training_step_transfers_only_the_batch_in_and_the_loss_out() {
    // In a process of its own: another test's thread holding the epoch pinned keeps a
    // step's frees from coming back within the step, so a step could need more blocks
    // than the first one left in the cache (a loaded machine saw a driver allocation in a
    // later step twice).
    if crate::common::child::run_alone(crate::common::test_name!(
        a_training_step_transfers_only_the_batch_in_and_the_loss_out
    )) {
        return;
    }
    let gpu = sim(0, 1 << 30);
    let mut host = Mlp::new(None);
    let mut dev = Mlp::new(Some(&gpu));
    let mut per_step = Vec::new();
    for step in 0..20 {
        let (x, y) = batch(step);
        crate::settle(&gpu);
        let before = gpu.stats();
        let (dx, dy) = (x.to_device(&gpu).unwrap(), y.to_device(&gpu).unwrap());
        let loss_dev = dev.step(&dx, &dy, 0.1).to_host().unwrap().scalar().unwrap();
        drop((dx, dy));
        crate::settle(&gpu);
        per_step.push(gpu.stats().since(&before));
        let loss_host = host.step(&x, &y, 0.1).scalar().unwrap();
        assert!(
            ((loss_dev - loss_host) / loss_host).abs() < 1e-4,
            "step {step}: {loss_dev} vs {loss_host}"
        );
    }
    for (step, s) in per_step.iter().enumerate() {
        assert_eq!(s.htod_transfers, 2, "step {step}: the batch in");
        assert_eq!(s.dtoh_transfers, 1, "step {step}: the loss out");
        if step > 0 {
            assert_eq!(
                s.driver_allocations, 0,
                "step {step}: the pool's cache serves it"
            );
        }
    }
}

#[test]
fn threads_reading_a_device_result_download_it_once() {
    let gpu = sim(0, 1 << 30);
    let t = Tensor::from_slice(&[1.0f32; 1024], &[1024])
        .unwrap()
        .to_device(&gpu)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (t, barrier) = (t.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                assert!(t.to_vec::<f32>().unwrap().iter().all(|v| *v == 3.0));
                // Device ops from several threads read the current device side.
                let u = t.add_scalar(1.0).unwrap();
                assert!(u.to_vec::<f32>().unwrap().iter().all(|v| *v == 4.0));
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    // One download of `t`, one of each thread's result.
    assert_eq!(gpu.stats().dtoh_transfers, 5);
}

#[test]
fn a_scope_that_owns_a_device_tensor_makes_it_unusable_when_it_closes() {
    let gpu = sim(0, 1 << 30);
    let scope = ndmem::Scope::new_base("device");
    let t = Tensor::from_slice(&[1.0f32, 2.0], &[2])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    scope.attach(&t).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    scope.close().unwrap();
    let err = t.relu().unwrap_err();
    assert!(matches!(err, Error::ScopeClosed { .. }), "{err:?}");
    assert!(matches!(t.to_vec::<f32>(), Err(Error::ScopeClosed { .. })));
}

/// Every device op reads a transposed or broadcast view of a device tensor as the host
/// reads it (its strides), not as its memory lies (the views are made contiguous on the
/// device first; semantics §5.8); each result stays on the device.
#[test]
fn device_ops_read_transposed_and_broadcast_views_as_the_host_does() {
    let gpu = sim(0, 1 << 30);
    let a = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[3, 2]).unwrap();
    let row = Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap();
    let col = Tensor::from_slice(&[-1.5f32, 2.5], &[2, 1]).unwrap();
    let one = Tensor::from_slice(&[0.75f32], &[1]).unwrap();
    let tall = Tensor::from_slice(&[0.5f32, -1.0], &[2]).unwrap();
    // Each view of (a, row, col, one, tall), by name.
    type View = fn(&[&Tensor; 5]) -> Tensor;
    let views: [(&str, View); 5] = [
        ("transposed", |t| t[0].transpose().unwrap()),
        ("row broadcast", |t| t[1].broadcast_to(&[2, 3]).unwrap()),
        ("column broadcast", |t| t[2].broadcast_to(&[2, 3]).unwrap()),
        ("scalar broadcast", |t| t[3].broadcast_to(&[2, 3]).unwrap()),
        ("transposed broadcast", |t| {
            t[4].broadcast_to(&[3, 2]).unwrap().transpose().unwrap()
        }),
    ];
    let dev = |t: &Tensor| t.to_device(&gpu).unwrap();
    let (da, drow, dcol, done, dtall) = (dev(&a), dev(&row), dev(&col), dev(&one), dev(&tall));
    let other = Tensor::from_slice(&[0.5f32, 1.0, -1.5, 2.0, -2.5, 3.0], &[2, 3]).unwrap();
    let dother = dev(&other);
    let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let dm = dev(&m);
    for (name, view) in &views {
        let h = view(&[&a, &row, &col, &one, &tall]);
        let d = view(&[&da, &drow, &dcol, &done, &dtall]);
        assert_eq!(h.shape(), &[2, 3], "{name}");
        let cases: Vec<(&str, Tensor, Tensor)> = vec![
            ("relu", h.relu().unwrap(), d.relu().unwrap()),
            ("exp", h.exp().unwrap(), d.exp().unwrap()),
            ("tanh", h.tanh().unwrap(), d.tanh().unwrap()),
            ("sigmoid", h.sigmoid().unwrap(), d.sigmoid().unwrap()),
            (
                "mul_scalar",
                h.mul_scalar(3.0).unwrap(),
                d.mul_scalar(3.0).unwrap(),
            ),
            (
                "add_scalar",
                h.add_scalar(1.0).unwrap(),
                d.add_scalar(1.0).unwrap(),
            ),
            ("add", h.add(&other).unwrap(), d.add(&dother).unwrap()),
            (
                "add (host Y)",
                h.add(&other).unwrap(),
                d.add(&other).unwrap(),
            ),
            (
                "sub (view as Y)",
                other.sub(&h).unwrap(),
                dother.sub(&d).unwrap(),
            ),
            ("mul (itself)", h.mul(&h).unwrap(), d.mul(&d).unwrap()),
            ("add row", h.add(&row).unwrap(), d.add(&drow).unwrap()),
            (
                "relu_backward",
                h.relu_backward(&other).unwrap(),
                d.relu_backward(&dother).unwrap(),
            ),
            ("sum", h.sum().unwrap(), d.sum().unwrap()),
            (
                "sum_axis(0)",
                h.sum_axis(0).unwrap(),
                d.sum_axis(0).unwrap(),
            ),
            (
                "sum_axis(1)",
                h.sum_axis(1).unwrap(),
                d.sum_axis(1).unwrap(),
            ),
            (
                "mean_axis(1)",
                h.mean_axis(1).unwrap(),
                d.mean_axis(1).unwrap(),
            ),
            ("softmax(1)", h.softmax(1).unwrap(), d.softmax(1).unwrap()),
            (
                "log_softmax(1)",
                h.log_softmax(1).unwrap(),
                d.log_softmax(1).unwrap(),
            ),
            ("matmul", h.matmul(&m).unwrap(), d.matmul(&dm).unwrap()),
            (
                "matmul (view as Y)",
                m.matmul(&h).unwrap(),
                dm.matmul(&d).unwrap(),
            ),
        ];
        for (op, host, device) in cases {
            assert!(device.is_on_device(), "{name} {op}: ran on the host");
            assert_eq!(device.shape(), host.shape(), "{name} {op}");
            let (dv, hv) = (
                device.to_vec::<f32>().unwrap(),
                host.to_vec::<f32>().unwrap(),
            );
            let near = dv.len() == hv.len()
                && dv
                    .iter()
                    .zip(&hv)
                    .all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs()));
            assert!(near, "{name} {op}: device {dv:?}, host {hv:?}");
        }
        // As the source of an in-place update of a contiguous device tensor.
        let mut w = dev(&other);
        let mut hw = other.copy().unwrap();
        w.scaled_add(-0.5, &d).unwrap();
        hw.scaled_add(-0.5, &h).unwrap();
        assert_eq!(
            w.to_vec::<f32>().unwrap(),
            hw.to_vec::<f32>().unwrap(),
            "{name} scaled_add"
        );
        w.assign(&d).unwrap();
        hw.assign(&h).unwrap();
        assert_eq!(
            w.to_vec::<f32>().unwrap(),
            hw.to_vec::<f32>().unwrap(),
            "{name} assign"
        );
        assert_eq!(
            w.to_vec::<f32>().unwrap(),
            h.to_vec::<f32>().unwrap(),
            "{name} assign"
        );
    }
    // The gather costs one upload, and a download only while the host copy is stale.
    let moved = |f: &dyn Fn() -> Tensor| {
        let before = gpu.stats();
        let out = f();
        let after = gpu.stats();
        assert!(out.is_on_device());
        (
            after.htod_transfers - before.htod_transfers,
            after.dtoh_transfers - before.dtoh_transfers,
        )
    };
    assert_eq!(moved(&|| da.transpose().unwrap().relu().unwrap()), (1, 0));
    let twice = da.mul_scalar(2.0).unwrap();
    assert_eq!(
        moved(&|| twice.transpose().unwrap().relu().unwrap()),
        (1, 1)
    );
    assert_eq!(
        moved(&|| twice.transpose().unwrap().relu().unwrap()),
        (1, 0)
    );
    // The view's own tensor is unchanged, and so are its device bytes.
    assert_eq!(da.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    assert_eq!(
        da.transpose()
            .unwrap()
            .relu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0, 3.0, 5.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn a_second_operand_of_higher_rank_gives_the_hosts_broadcast_shape() {
    // Semantics §5.8: a broadcast first operand runs on the host; a one-element second
    // operand of higher rank broadcasts the first to its rank.
    let gpu = sim(0, 1 << 30);
    for (a_shape, b_shape, want) in [
        (&[3][..], &[1, 1][..], &[1, 3][..]),
        (&[][..], &[1][..], &[1][..]),
        (&[2, 3][..], &[1, 1, 1][..], &[1, 2, 3][..]),
    ] {
        let n: usize = a_shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let a = Tensor::from_slice(&values, a_shape).unwrap();
        let b = Tensor::from_slice(&[10.0f32], b_shape).unwrap();
        let host = a.add(&b).unwrap();
        assert_eq!(host.shape(), want);
        let on_device = a
            .to_device(&gpu)
            .unwrap()
            .add(&b.to_device(&gpu).unwrap())
            .unwrap();
        assert_eq!(on_device.shape(), want, "{a_shape:?} + {b_shape:?}");
        assert_eq!(
            on_device.to_vec::<f32>().unwrap(),
            host.to_vec::<f32>().unwrap()
        );
    }
}

#[test]
fn mul_scalar_on_the_device_keeps_the_sign_of_zero() {
    // Semantics §5.8: device ops give the host's results; `x * -1` of 0.0 is -0.0.
    let gpu = sim(0, 1 << 30);
    let a = Tensor::from_slice(&[0.0f32, -0.0, 1.5, -2.0], &[4]).unwrap();
    let d = a.to_device(&gpu).unwrap();
    for value in [-1.0, 0.0, 2.0] {
        let bits = |t: Tensor| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(
            bits(d.mul_scalar(value).unwrap()),
            bits(a.mul_scalar(value).unwrap()),
            "x * {value}"
        );
    }
}

#[test]
fn relu_on_the_device_is_x_gt_0_then_x_else_0_for_signed_zeros_and_nan() {
    // Semantics §3: `relu` is `x > 0 ? x : 0` on every device: -0.0 and NaN give +0.0.
    let gpu = sim(0, 1 << 30);
    let a = Tensor::from_slice(&[-0.0f32, 0.0, f32::NAN, -1.0, 2.0], &[5]).unwrap();
    let on_device = a.to_device(&gpu).unwrap().relu().unwrap();
    let bits: Vec<u32> = on_device
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(bits, [0.0f32, 0.0, 0.0, 0.0, 2.0].map(f32::to_bits));
}

#[test]
fn a_device_matmul_whose_dimensions_multiply_past_usize_is_an_error_not_a_panic() {
    // Semantics §3: operations never panic on their input; m x k x n overflows here
    // (debug builds checked the product).
    let gpu = sim(0, 1 << 30);
    let one = Tensor::ones(DType::F32, &[1, 1])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    let a = one.broadcast_to(&[1 << 30, 1 << 30]).unwrap();
    assert!(a.matmul(&a).is_err());
}
