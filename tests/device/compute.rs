//! Device compute on the simulated device: each operation against plain Rust arithmetic,
//! and one counted launch per operation (semantics §5).

use ndmem::device::{BinaryOp, Device, DeviceBuffer, UnaryOp};
use ndmem::Error;

use crate::{floats, sim};

fn upload(gpu: &Device, values: &[f32]) -> DeviceBuffer {
    let mut b = gpu.allocate(values.len().max(1) * 4).unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    gpu.upload(&bytes, &mut b).unwrap();
    b
}

fn download(gpu: &Device, b: &DeviceBuffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    gpu.download(b, &mut bytes).unwrap();
    floats(&bytes)
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn unary_and_affine() {
    let gpu = sim(0, 1 << 30);
    let xs = [-2.0f32, -0.5, 0.0, 0.5, 3.0];
    let x = upload(&gpu, &xs);
    let mut y = gpu.allocate(20).unwrap();
    for op in [
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Neg,
    ] {
        gpu.unary_f32(op, &x, &mut y, 5).unwrap();
        let want: Vec<f32> = xs
            .iter()
            .map(|v| match op {
                UnaryOp::Relu => v.max(0.0),
                UnaryOp::Sigmoid => 1.0 / (1.0 + (-v).exp()),
                UnaryOp::Tanh => v.tanh(),
                UnaryOp::Exp => v.exp(),
                _ => -v,
            })
            .collect();
        close(&download(&gpu, &y, 5), &want);
    }
    gpu.affine_f32(&x, &mut y, 5, 2.0, 1.0).unwrap();
    close(&download(&gpu, &y, 5), &[-3.0, 0.0, 1.0, 2.0, 7.0]);
    assert_eq!(gpu.stats().kernel_launches, 6);
}

#[test]
fn binary_with_row_and_scalar_broadcast() {
    let gpu = sim(0, 1 << 30);
    let a = upload(&gpu, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]); // [2, 3]
    let bias = upload(&gpu, &[10.0, 20.0, 30.0]);
    let two = upload(&gpu, &[2.0]);
    let mut y = gpu.allocate(24).unwrap();
    gpu.binary_f32(BinaryOp::Add, &a, 6, &bias, 3, &mut y, 6)
        .unwrap();
    close(
        &download(&gpu, &y, 6),
        &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0],
    );
    gpu.binary_f32(BinaryOp::Div, &a, 6, &two, 1, &mut y, 6)
        .unwrap();
    close(&download(&gpu, &y, 6), &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    let x = upload(&gpu, &[-1.0, 2.0, 0.0, 4.0, -5.0, 6.0]);
    gpu.binary_f32(BinaryOp::ReluBackward, &x, 6, &a, 6, &mut y, 6)
        .unwrap();
    close(&download(&gpu, &y, 6), &[0.0, 2.0, 0.0, 4.0, 0.0, 6.0]);
}

#[test]
fn sums_softmax_and_axpy() {
    let gpu = sim(0, 1 << 30);
    let xs = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
    let x = upload(&gpu, &xs);
    let mut rows = gpu.allocate(8).unwrap();
    let mut cols = gpu.allocate(12).unwrap();
    gpu.sum_f32(&x, &mut rows, 2, 3, 1).unwrap();
    gpu.sum_f32(&x, &mut cols, 2, 3, 0).unwrap();
    close(&download(&gpu, &rows, 2), &[6.0, 15.0]);
    close(&download(&gpu, &cols, 3), &[5.0, 7.0, 9.0]);
    let mut p = gpu.allocate(24).unwrap();
    gpu.softmax_f32(&x, &mut p, 2, 3, false).unwrap();
    let got = download(&gpu, &p, 6);
    let e: Vec<f32> = [0.0f32, 1.0, 2.0].iter().map(|v| v.exp()).collect();
    let s: f32 = e.iter().sum();
    close(&got[..3], &[e[0] / s, e[1] / s, e[2] / s]);
    close(&got[3..], &[e[0] / s, e[1] / s, e[2] / s]);
    gpu.softmax_f32(&x, &mut p, 2, 3, true).unwrap();
    close(
        &download(&gpu, &p, 3),
        &[-s.ln(), 1.0 - s.ln(), 2.0 - s.ln()],
    );
    let mut w = upload(&gpu, &[1.0, 1.0, 1.0]);
    gpu.axpy_f32(-0.5, &x, &mut w, 3).unwrap();
    close(&download(&gpu, &w, 3), &[0.5, 0.0, -0.5]);
    assert!(gpu.sum_f32(&x, &mut rows, 2, 3, 2).is_err());
}

#[test]
fn matmul_with_transposes() {
    let gpu = sim(0, 1 << 30);
    // a [2, 3], b [3, 2]
    let av = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let bv = [7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0];
    let a = upload(&gpu, &av);
    let b = upload(&gpu, &bv);
    let mut c = gpu.allocate(16).unwrap();
    gpu.matmul_f32(&a, &b, &mut c, 2, 3, 2, false, false)
        .unwrap();
    close(&download(&gpu, &c, 4), &[58.0, 64.0, 139.0, 154.0]);
    // a^T a: [3, 3] from a stored [2, 3] (trans_a: a is [k=2, m=3]).
    let mut g = gpu.allocate(36).unwrap();
    gpu.matmul_f32(&a, &a, &mut g, 3, 2, 3, true, false)
        .unwrap();
    close(
        &download(&gpu, &g, 9),
        &[17.0, 22.0, 27.0, 22.0, 29.0, 36.0, 27.0, 36.0, 45.0],
    );
    // a a^T: [2, 2] (trans_b: b is stored [n=2, k=3]).
    gpu.matmul_f32(&a, &a, &mut c, 2, 3, 2, false, true)
        .unwrap();
    close(&download(&gpu, &c, 4), &[14.0, 32.0, 32.0, 77.0]);
    // IEEE products, as the host and cuBLAS: 0 * inf and 0 * NaN are NaN, not skipped.
    let zero_one = upload(&gpu, &[0.0, 1.0]);
    let mut out = gpu.allocate(4).unwrap();
    for special in [f32::INFINITY, f32::NAN] {
        let column = upload(&gpu, &[special, 1.0]);
        gpu.matmul_f32(&zero_one, &column, &mut out, 1, 2, 1, false, false)
            .unwrap();
        assert!(download(&gpu, &out, 1)[0].is_nan(), "0 * {special} + 1");
    }
}

#[test]
fn operands_that_are_too_small_or_foreign_are_errors() {
    let gpu = sim(0, 1 << 30);
    let other = sim(1, 1 << 30);
    let x = upload(&gpu, &[1.0, 2.0]);
    let mut y = gpu.allocate(8).unwrap();
    let err = gpu.unary_f32(UnaryOp::Relu, &x, &mut y, 3).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err:?}");
    let foreign = upload(&other, &[1.0, 2.0]);
    let err = gpu
        .unary_f32(UnaryOp::Relu, &foreign, &mut y, 2)
        .unwrap_err();
    assert!(err.to_string().contains("another device"), "{err}");
}
