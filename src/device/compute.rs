//! Device compute: the f32 operations a training step needs (element-wise, broadcast,
//! reductions, softmax, matrix products) on device memory. On CUDA they are NVRTC kernels
//! (compiled once per device) and cuBLAS; on `sim` the same arithmetic on the simulated
//! device's (host) memory, so results and counts can be tested everywhere.
//!
//! Invariant: an operation runs only on ranges of this device whose lengths and alignment
//! were checked against the element counts first; outputs are `DeviceMemoryMut` borrowed
//! exclusively, inputs shared, so an output never aliases an input. Each operation counts
//! one kernel launch.

#![allow(unsafe_code)]

use super::backend::Backend;
use super::{Device, DeviceMemory, DeviceMemoryMut};
use crate::error::{Error, Result};

/// An element-wise function of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `e^x`.
    Exp,
    /// `ln(x)`.
    Log,
    /// `-x`.
    Neg,
}

/// An element-wise function of two operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `b` where `a > 0`, else 0 (the gradient of relu at `a`, for the gradient `b`).
    ReluBackward,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const BLOCK: u32 = 256;

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn grid(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32
}

impl UnaryOp {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn code(self) -> i32 {
        match self {
            UnaryOp::Relu => 0,
            UnaryOp::Sigmoid => 1,
            UnaryOp::Tanh => 2,
            UnaryOp::Exp => 3,
            UnaryOp::Log => 4,
            UnaryOp::Neg => 5,
        }
    }

    fn apply(self, v: f32) -> f32 {
        match self {
            // `x > 0 ? x : 0`, as the host and the CUDA kernel: NaN and -0.0 give +0.0
            // (`f32::max` may keep the sign of a zero).
            UnaryOp::Relu => {
                if v > 0.0 {
                    v
                } else {
                    0.0
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-v).exp()),
            UnaryOp::Tanh => v.tanh(),
            UnaryOp::Exp => v.exp(),
            UnaryOp::Log => v.ln(),
            UnaryOp::Neg => -v,
        }
    }
}

impl BinaryOp {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn code(self) -> i32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Sub => 1,
            BinaryOp::Mul => 2,
            BinaryOp::Div => 3,
            BinaryOp::ReluBackward => 4,
        }
    }

    fn apply(self, p: f32, q: f32) -> f32 {
        match self {
            BinaryOp::Add => p + q,
            BinaryOp::Sub => p - q,
            BinaryOp::Mul => p * q,
            BinaryOp::Div => p / q,
            BinaryOp::ReluBackward => {
                if p > 0.0 {
                    q
                } else {
                    0.0
                }
            }
        }
    }
}

impl Device {
    fn floats<M: DeviceMemory + ?Sized>(&self, op: &str, m: &M, count: usize) -> Result<u64> {
        let shape = |message: String| Error::Shape {
            op: op.into(),
            message,
        };
        if m.device_id() != std::sync::Arc::as_ptr(&self.inner) as usize {
            return Err(super::misuse(
                self.ordinal(),
                format!("{op}: an operand lives on another device (device {}); copy it to this one first", m.ordinal()),
            ));
        }
        let bytes = count
            .checked_mul(4)
            .ok_or_else(|| shape(format!("{count} floats overflow")))?;
        if m.len() < bytes {
            return Err(shape(format!(
                "an operand of {} bytes holds fewer than {count} floats",
                m.len()
            )));
        }
        if m.device_ptr() % 4 != 0 {
            return Err(shape("an operand is not aligned to 4 bytes".into()));
        }
        self.inner.check_captured(op, m.device_ptr(), bytes)?;
        Ok(m.device_ptr())
    }

    fn launched(&self) {
        self.inner.count_launch();
    }

    /// `y[i] = op(x[i])` for `i < n`.
    pub fn unary_f32<X, Y>(&self, op: UnaryOp, x: &X, y: &mut Y, n: usize) -> Result<()>
    where
        X: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        let (xp, yp) = (self.floats("unary", x, n)?, self.floats("unary", y, n)?);
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: checked, aligned ranges of `n` floats of this (host-memory)
                    // device; `y` is borrowed exclusively, so it does not alias `x`. Run
                    // now, they are live for the call; replayed from a graph, they lie in
                    // its memory, which the replay borrows exclusively (see `graph`).
                    let (xs, ys) = unsafe { (sim_in(xp, n), sim_out(yp, n)) };
                    for (o, v) in ys.iter_mut().zip(xs) {
                        *o = op.apply(*v);
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::U64(n as u64),
                    Arg::I32(op.code()),
                ];
                // SAFETY: arguments match `nd_unary`; the ranges are live and checked.
                unsafe { c.launch(Kernel::Unary, grid(n), BLOCK, &mut args) }
            }
        }
    }

    /// `y[i] = alpha * x[i] + beta` for `i < n` (scalar multiply and add).
    pub fn affine_f32<X, Y>(&self, x: &X, y: &mut Y, n: usize, alpha: f32, beta: f32) -> Result<()>
    where
        X: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        let (xp, yp) = (self.floats("affine", x, n)?, self.floats("affine", y, n)?);
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`.
                    let (xs, ys) = unsafe { (sim_in(xp, n), sim_out(yp, n)) };
                    for (o, v) in ys.iter_mut().zip(xs) {
                        *o = alpha * *v + beta;
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::U64(n as u64),
                    Arg::F32(alpha),
                    Arg::F32(beta),
                ];
                // SAFETY: arguments match `nd_affine`; the ranges are live and checked.
                unsafe { c.launch(Kernel::Affine, grid(n), BLOCK, &mut args) }
            }
        }
    }

    /// `y[i] = op(a[i % a_len], b[i % b_len])` for `i < n`: same shapes (`a_len = b_len =
    /// n`), a row broadcast (`b_len` = the row length), or a scalar (`b_len = 1`).
    #[allow(clippy::too_many_arguments)]
    pub fn binary_f32<A, B, Y>(
        &self,
        op: BinaryOp,
        a: &A,
        a_len: usize,
        b: &B,
        b_len: usize,
        y: &mut Y,
        n: usize,
    ) -> Result<()>
    where
        A: DeviceMemory + ?Sized,
        B: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        if n > 0 && (a_len == 0 || b_len == 0) {
            return Err(Error::Shape {
                op: "binary".into(),
                message: "an operand of no elements cannot be broadcast".into(),
            });
        }
        let ap = self.floats("binary", a, a_len)?;
        let bp = self.floats("binary", b, b_len)?;
        let yp = self.floats("binary", y, n)?;
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`; `a` and `b` are only read.
                    let (av, bv, ys) =
                        unsafe { (sim_in(ap, a_len), sim_in(bp, b_len), sim_out(yp, n)) };
                    for (i, o) in ys.iter_mut().enumerate() {
                        *o = op.apply(av[i % a_len], bv[i % b_len]);
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::Ptr(ap),
                    Arg::U64(a_len as u64),
                    Arg::Ptr(bp),
                    Arg::U64(b_len as u64),
                    Arg::Ptr(yp),
                    Arg::U64(n as u64),
                    Arg::I32(op.code()),
                ];
                // SAFETY: arguments match `nd_binary`; the ranges are live and checked.
                unsafe { c.launch(Kernel::Binary, grid(n), BLOCK, &mut args) }
            }
        }
    }

    /// `y[i] += alpha * x[i]` for `i < n` (an SGD update).
    pub fn axpy_f32<X, Y>(&self, alpha: f32, x: &X, y: &mut Y, n: usize) -> Result<()>
    where
        X: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        let (xp, yp) = (self.floats("axpy", x, n)?, self.floats("axpy", y, n)?);
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`.
                    let (xs, ys) = unsafe { (sim_in(xp, n), sim_out(yp, n)) };
                    for (o, v) in ys.iter_mut().zip(xs) {
                        *o += alpha * *v;
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::F32(alpha),
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::U64(n as u64),
                ];
                // SAFETY: arguments match `nd_axpy`; the ranges are live and checked.
                unsafe { c.launch(Kernel::Axpy, grid(n), BLOCK, &mut args) }
            }
        }
    }

    /// Sums of a row-major `[rows, cols]` matrix: over each row (`axis` 1, `out[rows]`) or
    /// over each column (`axis` 0, `out[cols]`). The sum of everything is `axis` 1 of a
    /// single row.
    pub fn sum_f32<X, Y>(
        &self,
        x: &X,
        out: &mut Y,
        rows: usize,
        cols: usize,
        axis: usize,
    ) -> Result<()>
    where
        X: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        let n = rows.checked_mul(cols).ok_or_else(|| Error::Shape {
            op: "sum".into(),
            message: "the shape overflows".into(),
        })?;
        let out_len = match axis {
            0 => cols,
            1 => rows,
            _ => {
                return Err(Error::Shape {
                    op: "sum".into(),
                    message: format!("axis {axis} of a matrix"),
                })
            }
        };
        let (xp, op) = (self.floats("sum", x, n)?, self.floats("sum", out, out_len)?);
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`.
                    let (xs, os) = unsafe { (sim_in(xp, n), sim_out(op, out_len)) };
                    os.fill(0.0);
                    for r in 0..rows {
                        for c in 0..cols {
                            let v = xs[r * cols + c];
                            if axis == 1 {
                                os[r] += v;
                            } else {
                                os[c] += v;
                            }
                        }
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::Ptr(xp),
                    Arg::Ptr(op),
                    Arg::U64(rows as u64),
                    Arg::U64(cols as u64),
                ];
                let (kernel, blocks) = if axis == 1 {
                    (Kernel::SumRows, rows.clamp(1, 65_535) as u32)
                } else {
                    (Kernel::SumCols, grid(cols))
                };
                // SAFETY: arguments match `nd_sum_rows` / `nd_sum_cols`; ranges checked.
                unsafe { c.launch(kernel, blocks, BLOCK, &mut args) }
            }
        }
    }

    /// Softmax (or log-softmax) of each row of a row-major `[rows, cols]` matrix.
    pub fn softmax_f32<X, Y>(
        &self,
        x: &X,
        y: &mut Y,
        rows: usize,
        cols: usize,
        log: bool,
    ) -> Result<()>
    where
        X: DeviceMemory + ?Sized,
        Y: DeviceMemoryMut + ?Sized,
    {
        let n = rows.checked_mul(cols).ok_or_else(|| Error::Shape {
            op: "softmax".into(),
            message: "the shape overflows".into(),
        })?;
        let (xp, yp) = (self.floats("softmax", x, n)?, self.floats("softmax", y, n)?);
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`.
                    let (xs, ys) = unsafe { (sim_in(xp, n), sim_out(yp, n)) };
                    for r in 0..rows {
                        let row = &xs[r * cols..(r + 1) * cols];
                        let out = &mut ys[r * cols..(r + 1) * cols];
                        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let total: f32 = row.iter().map(|v| (v - m).exp()).sum();
                        for (o, v) in out.iter_mut().zip(row) {
                            *o = if log {
                                (v - m) - total.ln()
                            } else {
                                (v - m).exp() / total
                            };
                        }
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                use super::kernels::{Arg, Kernel};
                let mut args = [
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::U64(rows as u64),
                    Arg::U64(cols as u64),
                    Arg::I32(i32::from(log)),
                ];
                // SAFETY: arguments match `nd_softmax_rows`; the ranges are live and checked.
                unsafe {
                    c.launch(
                        Kernel::Softmax,
                        rows.clamp(1, 65_535) as u32,
                        BLOCK,
                        &mut args,
                    )
                }
            }
        }
    }

    /// Row-major `c[m, n] = op(a) op(b)`, `op(a)` being `[m, k]` (`a` stored `[k, m]` when
    /// `trans_a`) and `op(b)` `[k, n]` (`b` stored `[n, k]` when `trans_b`). cuBLAS on CUDA.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_f32<A, B, C>(
        &self,
        a: &A,
        b: &B,
        c: &mut C,
        m: usize,
        k: usize,
        n: usize,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<()>
    where
        A: DeviceMemory + ?Sized,
        B: DeviceMemory + ?Sized,
        C: DeviceMemoryMut + ?Sized,
    {
        let count = |x: usize, y: usize| {
            x.checked_mul(y).ok_or_else(|| Error::Shape {
                op: "matmul".into(),
                message: "the shape overflows".into(),
            })
        };
        let ap = self.floats("matmul", a, count(m, k)?)?;
        let bp = self.floats("matmul", b, count(k, n)?)?;
        let cp = self.floats("matmul", c, count(m, n)?)?;
        self.launched();
        match &self.inner.backend {
            Backend::Sim(_) => {
                self.inner.sim_run(move || {
                    // SAFETY: as in `unary_f32`.
                    let (av, bv, cv) =
                        unsafe { (sim_in(ap, m * k), sim_in(bp, k * n), sim_out(cp, m * n)) };
                    cv.fill(0.0);
                    for i in 0..m {
                        for p in 0..k {
                            let x = if trans_a {
                                av[p * m + i]
                            } else {
                                av[i * k + p]
                            };
                            for j in 0..n {
                                let y = if trans_b {
                                    bv[j * k + p]
                                } else {
                                    bv[p * n + j]
                                };
                                cv[i * n + j] += x * y;
                            }
                        }
                    }
                });
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => {
                if m == 0 || n == 0 {
                    return Ok(());
                }
                if k == 0 {
                    // Zeros, as the simulated device writes them, captured like a kernel.
                    // SAFETY: a checked live range of `m * n` floats, borrowed exclusively.
                    return unsafe { cuda.memset_launched(cp, 0, m * n * 4) };
                }
                // SAFETY: the ranges hold the floats the dimensions say (checked above).
                unsafe { cuda.sgemm(ap, bp, cp, m, k, n, trans_a, trans_b) }
            }
        }
    }
}

/// `n` floats of a simulated device, read-only.
///
/// # Safety
/// `ptr` is a live, 4-aligned range of a simulated device holding `n` floats, not written
/// while the slice lives.
unsafe fn sim_in<'a>(ptr: u64, n: usize) -> &'a [f32] {
    if n == 0 {
        return &[];
    }
    // SAFETY: by the caller's contract (sim device memory is host memory).
    unsafe { std::slice::from_raw_parts(ptr as *const f32, n) }
}

/// `n` floats of a simulated device, writable.
///
/// # Safety
/// As [`sim_in`], and nothing else reads or writes the range while the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn sim_out<'a>(ptr: u64, n: usize) -> &'a mut [f32] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: by the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, n) }
}
