//! Tensor operations: shape logic here, kernels from ndarray (`Zip`, `sum`, `mean`,
//! `general_mat_mul`; integer matmul and sums wrap, so they fold with wrapping arithmetic).
//!
//! Contiguous operands (row-major, the layout every op's output has) take a path over
//! plain slices instead: elementwise ops where each operand has the output's shape or
//! repeats whole along it (a bias row, a scalar), sums, softmax along the last axis, the
//! in-place updates and copies, and the small matmul kernel. Building ndarray's
//! dynamic-rank views and iterators cost more than the arithmetic at the sizes a training
//! step uses. The slice path gives the bits ndarray gives on the same layout (the same
//! operations in the same order; for sums, ndarray's unrolled order on adjacent elements
//! and in order from zero on strided ones), which `tests/tensors/ops.rs` checks.
//!
//! Invariant: every op checks each input (by taking its checked view) and writes only into
//! a fresh output, placed by the allocation flow with the first input's scope and memory
//! source; no op mutates an input. Argument names follow ND4J's messages: `X`, `Y`.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView1, ArrayViewD, ArrayViewMut1, Axis, Ix2, ShapeBuilder, Zip};

use super::dtype::sealed::Sealed;
use super::storage::Placement;
use super::{
    contiguous_strides, element_count, with_dtype, DType, Dims, Element, Float, Output, Tensor,
};
use crate::device::{BinaryOp, UnaryOp};
use crate::error::{Error, Result};
use crate::memory::owner::Owned;
use crate::reclaim;

/// The shape two shapes broadcast to (NumPy rules), or a shape error naming both.
fn broadcast_shape(op: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let mut out = Dims::from_elem(0, n);
    for (i, slot) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        *slot = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Shape {
                    op: op.into(),
                    message: format!("shapes {a:?} and {b:?} cannot be broadcast together"),
                })
            }
        };
    }
    Ok(out)
}

/// Float products of at most this many multiply-adds (`m * k * n`) run ndmem's own
/// row-by-row kernel, which allocates nothing; larger ones run matrixmultiply (through
/// ndarray's `general_mat_mul`), whose packing buffer is one heap allocation per call.
/// The choice depends only on the shapes, so results never depend on placement.
const SMALL_MATMUL: usize = 64 * 64 * 64;

fn float_only(op: &str, dtype: DType) -> Error {
    Error::DType {
        op: op.into(),
        message: format!("X argument is {dtype}; this op needs f32 or f64"),
    }
}

fn check_axis(op: &str, axis: usize, ndim: usize) -> Result<()> {
    if axis >= ndim {
        return Err(Error::Shape {
            op: op.into(),
            message: format!("axis {axis} is out of range for a tensor of {ndim} axes"),
        });
    }
    Ok(())
}

impl Tensor {
    fn same_dtype(&self, op: &str, other: &Tensor) -> Result<()> {
        if self.dtype != other.dtype {
            return Err(Error::DType {
                op: op.into(),
                message: format!(
                    "X argument is {} but Y argument is {}",
                    self.dtype, other.dtype
                ),
            });
        }
        Ok(())
    }

    /// Elementwise `f(x, y)` with broadcasting.
    fn zip_with<T: Element>(
        &self,
        op: &str,
        other: &Tensor,
        f: impl Fn(T, T) -> T,
    ) -> Result<Tensor> {
        self.zip_checked(op, other, f, || Ok(()))
    }

    /// [`Tensor::zip_with`], then `verdict` decides (before the output is shared) whether
    /// the result stands: a kernel that met undefined arithmetic records it for `verdict`.
    fn zip_checked<T: Element>(
        &self,
        op: &str,
        other: &Tensor,
        f: impl Fn(T, T) -> T,
        verdict: impl FnOnce() -> Result<()>,
    ) -> Result<Tensor> {
        self.same_dtype(op, other)?;
        let shape = broadcast_shape(op, &self.shape, &other.shape)?;
        self.storage.check(op, "X")?;
        other.storage.check(op, "Y")?;
        let out = Tensor::output::<T>(op, &shape, Placement::Auto(Some(&*self.storage)))?;
        let pin = reclaim::pin();
        if let Some(repeat) = Repeat::of(&shape, &self.shape, &other.shape) {
            if let (Some(x), Some(y)) = (
                self.flat::<T>(op, "X", &pin)?,
                other.flat::<T>(op, "Y", &pin)?,
            ) {
                return out.fill_flat(op, |out| {
                    repeat.zip(out, x, y, &f);
                    verdict()
                });
            }
        }
        let x = self.array::<T>(op, "X", &pin)?;
        let y = other.array::<T>(op, "Y", &pin)?;
        out.fill(op, |mut out| {
            let dim = out.raw_dim();
            Zip::from(&mut out)
                .and_broadcast(&x.broadcast(dim.clone()).expect("shapes were checked"))
                .and_broadcast(&y.broadcast(dim).expect("shapes were checked"))
                .for_each(|o, &a, &b| *o = f(a, b));
            verdict()
        })
    }

    /// The output of an op reading this tensor as `T` (its first operand): the operand
    /// checked (element type and validity, no pin needed), then `shape` of `U` allocated
    /// where the operand's memory says, before the op pins to read (see [`Output`]).
    fn output_for<T: Element, U: Element>(&self, op: &str, shape: &[usize]) -> Result<Output<U>> {
        self.check_dtype::<T>(op, "X")?;
        self.storage.check(op, "X")?;
        Tensor::output::<U>(op, shape, Placement::Auto(Some(&*self.storage)))
    }

    /// Elementwise `f(x)`.
    fn map<T: Element, U: Element>(&self, op: &str, f: impl Fn(T) -> U) -> Result<Tensor> {
        let out = self.output_for::<T, U>(op, &self.shape)?;
        let pin = reclaim::pin();
        if let Some(x) = self.flat::<T>(op, "X", &pin)? {
            return out.fill_flat(op, |out| {
                for (o, &a) in out.iter_mut().zip(x) {
                    *o = f(a);
                }
                Ok(())
            });
        }
        let x = self.array::<T>(op, "X", &pin)?;
        out.fill(op, |mut out| {
            Zip::from(&mut out).and(&x).for_each(|o, &a| *o = f(a));
            Ok(())
        })
    }

    fn map_float(
        &self,
        op: &str,
        f32_fn: fn(f32) -> f32,
        f64_fn: fn(f64) -> f64,
    ) -> Result<Tensor> {
        match self.dtype {
            DType::F32 => self.map::<f32, f32>(op, f32_fn),
            DType::F64 => self.map::<f64, f64>(op, f64_fn),
            other => Err(float_only(op, other)),
        }
    }

    /// `self + other`, broadcasting. Integers wrap on overflow (like NumPy and PyTorch).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        if let Some(on_device) = self.device_binary("add", BinaryOp::Add, other) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.zip_with::<T>("add", other, T::add_wrapping))
    }

    /// `self - other`, broadcasting. Integers wrap on overflow.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        if let Some(on_device) = self.device_binary("sub", BinaryOp::Sub, other) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.zip_with::<T>("sub", other, T::sub_wrapping))
    }

    /// `self * other` elementwise, broadcasting. Integers wrap on overflow.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        if let Some(on_device) = self.device_binary("mul", BinaryOp::Mul, other) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.zip_with::<T>("mul", other, T::mul_wrapping))
    }

    /// `self / other` elementwise, broadcasting. Integer division truncates toward zero;
    /// an integer division by zero, or `MIN / -1`, is [`Error::Arithmetic`] (floats follow
    /// IEEE 754: `inf`, `NaN`).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        if let Some(on_device) = self.device_binary("div", BinaryOp::Div, other) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let failed: std::cell::Cell<Option<(T, T)>> = std::cell::Cell::new(None);
            self.zip_checked::<T>(
                "div",
                other,
                |a, b| {
                    a.div_checked(b).unwrap_or_else(|| {
                        if failed.get().is_none() {
                            failed.set(Some((a, b)));
                        }
                        T::from_f64(0.0)
                    })
                },
                || match failed.get() {
                    None => Ok(()),
                    Some((a, b)) => Err(Error::Arithmetic {
                        op: "div".into(),
                        message: format!(
                            "integer division {a:?} / {b:?} has no {} result{}",
                            T::DTYPE,
                            if b == T::from_f64(0.0) { " (division by zero)" } else { " (overflow)" }
                        ),
                    }),
                },
            )
        })
    }

    /// `self + value` (`value` converted to the dtype like `as`). Integers wrap.
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        if let Some(on_device) = self.device_affine("add_scalar", 1.0, value as f32) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let v = T::from_f64(value);
            self.map::<T, T>("add_scalar", move |a| a.add_wrapping(v))
        })
    }

    /// `self * value` (`value` converted to the dtype like `as`). Integers wrap.
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        if let Some(on_device) = self.device_affine("mul_scalar", value as f32, -0.0) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let v = T::from_f64(value);
            self.map::<T, T>("mul_scalar", move |a| a.mul_wrapping(v))
        })
    }

    /// `max(self, 0)`.
    ///
    /// `relu(NaN)` is 0 here and on every device (the kernels compute `x > 0 ? x : 0`),
    /// where PyTorch keeps the NaN.
    pub fn relu(&self) -> Result<Tensor> {
        if let Some(on_device) = self.device_unary("relu", UnaryOp::Relu) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let zero = T::from_f64(0.0);
            self.map::<T, T>("relu", move |a| if a > zero { a } else { zero })
        })
    }

    /// The gradient through a ReLU: `grad` where `self > 0`, else 0 (`self` is the ReLU's
    /// input or output).
    pub fn relu_backward(&self, grad: &Tensor) -> Result<Tensor> {
        if let Some(on_device) = self.device_binary("relu_backward", BinaryOp::ReluBackward, grad) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let zero = T::from_f64(0.0);
            self.zip_with::<T>("relu_backward", grad, move |x, g| if x > zero { g } else { zero })
        })
    }

    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(&self) -> Result<Tensor> {
        if let Some(on_device) = self.device_unary("sigmoid", UnaryOp::Sigmoid) {
            return on_device;
        }
        self.map_float(
            "sigmoid",
            |x| 1.0 / (1.0 + (-x).exp()),
            |x| 1.0 / (1.0 + (-x).exp()),
        )
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        if let Some(on_device) = self.device_unary("tanh", UnaryOp::Tanh) {
            return on_device;
        }
        self.map_float("tanh", f32::tanh, f64::tanh)
    }

    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        if let Some(on_device) = self.device_unary("exp", UnaryOp::Exp) {
            return on_device;
        }
        self.map_float("exp", f32::exp, f64::exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        if let Some(on_device) = self.device_unary("log", UnaryOp::Log) {
            return on_device;
        }
        self.map_float("log", f32::ln, f64::ln)
    }

    /// The sum of every element, as a 0-d tensor (the API's `sum`; [`Tensor::sum_axis`]
    /// sums over one axis). Floats use ndarray's `sum`; integers wrap on overflow. An empty
    /// sum is 0.
    pub fn sum(&self) -> Result<Tensor> {
        self.reduce_over("sum", None, false)
    }

    /// The sum over `axis`, which the result no longer has (ndarray's `sum_axis`); an axis
    /// the tensor lacks is [`Error::Shape`].
    pub fn sum_axis(&self, axis: usize) -> Result<Tensor> {
        self.reduce_over("sum", Some(axis), false)
    }

    /// The mean of every element, as a 0-d tensor, by ndarray's `mean`
    /// ([`Tensor::mean_axis`] for one axis). The mean of no elements is undefined, as in
    /// ndarray (`None` there): [`Error::Shape`]. Integer means are computed in `f64` and
    /// converted back like `as` (truncating toward zero).
    pub fn mean(&self) -> Result<Tensor> {
        self.reduce_over("mean", None, true)
    }

    /// The mean over `axis`, which the result no longer has (ndarray's `mean_axis`); an
    /// axis of length 0 has no mean ([`Error::Shape`]), nor has an axis the tensor lacks.
    pub fn mean_axis(&self, axis: usize) -> Result<Tensor> {
        self.reduce_over("mean", Some(axis), true)
    }

    /// [`Tensor::sum`] / [`Tensor::mean`] (`None`) or their `_axis` forms: on the device
    /// when the tensor lives there, else by element type.
    fn reduce_over(&self, op: &str, axis: Option<usize>, mean: bool) -> Result<Tensor> {
        if let Some(on_device) = self.device_reduce(op, axis, mean) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.reduce::<T>(op, axis, mean))
    }

    fn reduce<T: Element>(&self, op: &str, axis: Option<usize>, mean: bool) -> Result<Tensor> {
        if let Some(axis) = axis {
            check_axis(op, axis, self.ndim())?;
        }
        let lanes = axis.map_or(self.len(), |a| self.shape[a]);
        if mean && lanes == 0 {
            return Err(Error::Shape {
                op: op.into(),
                message: format!(
                    "the mean of no elements is undefined (X argument has shape {:?}{})",
                    self.shape,
                    axis.map_or(String::new(), |a| format!(", axis {a}"))
                ),
            });
        }
        let mut shape = self.shape.clone();
        match axis {
            Some(axis) => {
                shape.remove(axis);
            }
            None => shape.clear(),
        }
        let out = self.output_for::<T, T>(op, &shape)?;
        let pin = reclaim::pin();
        if !mean {
            if let Some(x) = self.flat::<T>(op, "X", &pin)? {
                return self.sum_flat(op, out, x, axis);
            }
        }
        let x = self.array::<T>(op, "X", &pin)?;
        let reduce_lane = |lane: ArrayViewD<'_, T>| -> T {
            if mean {
                // Never empty here (checked above), so the mean is `Some`.
                T::mean_of(lane).unwrap_or_else(T::zero)
            } else {
                T::sum_of(lane)
            }
        };
        match axis {
            None => {
                let value = reduce_lane(x.view());
                out.fill(op, |mut out| {
                    out.fill(value);
                    Ok(())
                })
            }
            Some(axis) => out.fill(op, |mut out| {
                Zip::from(&mut out)
                    .and(x.lanes(Axis(axis)))
                    .for_each(|o, lane| *o = reduce_lane(lane.into_dyn()));
                Ok(())
            }),
        }
    }

    /// [`Tensor::sum`] of this tensor's contiguous elements `x`, bit for bit what the
    /// ndarray path computes: a lane whose elements are adjacent (the last axis, or the
    /// whole tensor) by [`Element::sum_slice`], as ndarray's `sum` does a contiguous lane;
    /// a strided lane by adding its elements in order from zero, as ndarray does one that
    /// is not, here a row at a time into the whole output row.
    fn sum_flat<T: Element>(
        &self,
        op: &str,
        out: Output<T>,
        x: &[T],
        axis: Option<usize>,
    ) -> Result<Tensor> {
        let Some(axis) = axis else {
            let value = T::sum_slice(x);
            return out.fill_flat(op, |out| {
                out.fill(value);
                Ok(())
            });
        };
        let lanes = self.shape[axis];
        let inner: usize = self.shape[axis + 1..].iter().product();
        out.fill_flat(op, |out| {
            if out.is_empty() {
                return Ok(());
            }
            if lanes == 0 {
                out.fill(T::sum_slice(&[]));
            } else if inner == 1 {
                for (o, lane) in out.iter_mut().zip(x.chunks_exact(lanes)) {
                    *o = T::sum_slice(lane);
                }
            } else if lanes == 1 {
                for (o, v) in out.iter_mut().zip(x) {
                    *o = T::sum_slice(std::slice::from_ref(v));
                }
            } else {
                for (o, block) in out
                    .chunks_exact_mut(inner)
                    .zip(x.chunks_exact(lanes * inner))
                {
                    o.fill(T::zero());
                    for row in block.chunks_exact(inner) {
                        for (o, &v) in o.iter_mut().zip(row) {
                            *o = o.add_wrapping(v);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// Index of the largest element along `axis` (an `i64` tensor without that axis; the
    /// first on ties; ndarray has no argmax kernel, so this one is ndmem's). A NaN counts as
    /// the largest, so a lane holding one answers its first NaN, as NumPy's and PyTorch's
    /// `argmax` do. An axis of length 0 has no largest element: [`Error::Shape`].
    pub fn argmax(&self, axis: usize) -> Result<Tensor> {
        check_axis("argmax", axis, self.ndim())?;
        if self.shape[axis] == 0 {
            return Err(Error::Shape {
                op: "argmax".into(),
                message: format!(
                    "axis {axis} of X argument (shape {:?}) is empty: no largest element",
                    self.shape
                ),
            });
        }
        let mut shape = self.shape.clone();
        shape.remove(axis);
        with_dtype!(self.dtype, T => {
            let out = self.output_for::<T, i64>("argmax", &shape)?;
            let pin = reclaim::pin();
            let x = self.array::<T>("argmax", "X", &pin)?;
            out.fill("argmax", |mut out| {
                Zip::from(&mut out).and(x.lanes(Axis(axis))).for_each(|o, lane| {
                    // NaN is the only value that is not comparable with itself.
                    let is_nan = |v: &T| v.partial_cmp(v).is_none();
                    let mut best = 0;
                    for (i, v) in lane.iter().enumerate() {
                        if is_nan(&lane[best]) {
                            break;
                        }
                        if is_nan(v) || *v > lane[best] {
                            best = i;
                        }
                    }
                    *o = best as i64;
                });
                Ok(())
            })
        })
    }

    /// Softmax along `axis` (numerically stable: the lane's maximum is subtracted first).
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        if let Some(on_device) = self.device_softmax("softmax", axis, false) {
            return on_device;
        }
        match self.dtype {
            DType::F32 => self.softmax_typed::<f32>(axis),
            DType::F64 => self.softmax_typed::<f64>(axis),
            other => Err(float_only("softmax", other)),
        }
    }

    fn softmax_typed<T: Float>(&self, axis: usize) -> Result<Tensor> {
        check_axis("softmax", axis, self.ndim())?;
        let out = self.output_for::<T, T>("softmax", &self.shape)?;
        let pin = reclaim::pin();
        if axis + 1 == self.ndim() {
            if let Some(x) = self.flat::<T>("softmax", "X", &pin)? {
                return self.last_axis_lanes("softmax", out, x, |o, lane| {
                    exp_less_max(o, lane);
                    let total = T::sum_slice(o);
                    for o in o.iter_mut() {
                        *o /= total;
                    }
                });
            }
        }
        let x = self.array::<T>("softmax", "X", &pin)?;
        out.fill("softmax", |mut out| {
            Zip::from(out.lanes_mut(Axis(axis)))
                .and(x.lanes(Axis(axis)))
                .for_each(|mut o, lane| {
                    exp_less_max_lane(&mut o, &lane);
                    let total = o.sum();
                    o.mapv_inplace(|v| v / total);
                });
            Ok(())
        })
    }

    /// Log-softmax along `axis`: `x - max - ln(sum(exp(x - max)))` per lane, finite
    /// wherever the inputs are (the log of a `softmax` underflows to `-inf` for confident
    /// lanes; cross-entropy needs this form).
    pub fn log_softmax(&self, axis: usize) -> Result<Tensor> {
        if let Some(on_device) = self.device_softmax("log_softmax", axis, true) {
            return on_device;
        }
        match self.dtype {
            DType::F32 => self.log_softmax_typed::<f32>(axis),
            DType::F64 => self.log_softmax_typed::<f64>(axis),
            other => Err(float_only("log_softmax", other)),
        }
    }

    fn log_softmax_typed<T: Float>(&self, axis: usize) -> Result<Tensor> {
        check_axis("log_softmax", axis, self.ndim())?;
        let out = self.output_for::<T, T>("log_softmax", &self.shape)?;
        let pin = reclaim::pin();
        if axis + 1 == self.ndim() {
            if let Some(x) = self.flat::<T>("log_softmax", "X", &pin)? {
                return self.last_axis_lanes("log_softmax", out, x, |o, lane| {
                    // (x - max) - ln(sum), in that order: max + ln(sum) first would round
                    // ln(sum) away beside a large max (log_softmax([1e8, 1e8]) gave 0s).
                    let max = exp_less_max(o, lane);
                    let log_sum = T::sum_slice(o).ln();
                    for (o, &v) in o.iter_mut().zip(lane) {
                        *o = (v - max) - log_sum;
                    }
                });
            }
        }
        let x = self.array::<T>("log_softmax", "X", &pin)?;
        out.fill("log_softmax", |mut out| {
            Zip::from(out.lanes_mut(Axis(axis)))
                .and(x.lanes(Axis(axis)))
                .for_each(|mut o, lane| {
                    let max = exp_less_max_lane(&mut o, &lane);
                    let log_sum = o.sum().ln();
                    Zip::from(&mut o)
                        .and(&lane)
                        .for_each(|o, &v| *o = (v - max) - log_sum);
                });
            Ok(())
        })
    }

    /// A tensor of this one's shape whose every lane along the last axis is `lane(out,
    /// x)` of the matching lane of the contiguous elements `x` (the softmax kernels' fast
    /// path: the same arithmetic, in the same order, as on ndarray lanes).
    fn last_axis_lanes<T: Element>(
        &self,
        op: &str,
        out: Output<T>,
        x: &[T],
        lane: impl Fn(&mut [T], &[T]),
    ) -> Result<Tensor> {
        let width = self.shape.last().copied().unwrap_or(1);
        out.fill_flat(op, |out| {
            if width > 0 {
                for (o, x) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
                    lane(o, x);
                }
            }
            Ok(())
        })
    }

    /// Matrix product of two 2-d tensors (`[m, k] x [k, n] -> [m, n]`): large float
    /// products by matrixmultiply (ndarray's `general_mat_mul`), small ones and integers
    /// (wrapping) by a row-by-row kernel that allocates nothing.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.same_dtype("matmul", other)?;
        if self.ndim() != 2 || other.ndim() != 2 || self.shape[1] != other.shape[0] {
            return Err(Error::Shape {
                op: "matmul".into(),
                message: format!(
                    "cannot multiply {:?} by {:?}: need [m, k] and [k, n]",
                    self.shape, other.shape
                ),
            });
        }
        if let Some(on_device) = self.device_matmul(other) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.matmul_typed::<T>(other))
    }

    fn matmul_typed<T: Element>(&self, other: &Tensor) -> Result<Tensor> {
        let (m, k, n) = (self.shape[0], self.shape[1], other.shape[1]);
        self.storage.check("matmul", "X")?;
        other.storage.check("matmul", "Y")?;
        // Both operands checked above (X first): the output beside X, without checking
        // it again.
        let out = Tensor::output::<T>("matmul", &[m, n], Placement::Auto(Some(&*self.storage)))?;
        let pin = reclaim::pin();
        if T::DTYPE.is_float() && m.saturating_mul(k).saturating_mul(n) > SMALL_MATMUL {
            let a = two_d(self.array::<T>("matmul", "X", &pin)?);
            let b = two_d(other.array::<T>("matmul", "Y", &pin)?);
            return out.fill("matmul", |out| {
                let mut c = out.into_dimensionality::<Ix2>().map_err(|e| Error::Shape {
                    op: "matmul".into(),
                    message: format!("output is not 2-d: {e}"),
                })?;
                // Packs through a buffer matrixmultiply allocates per call: one heap
                // allocation, over more than SMALL_MATMUL multiply-adds.
                general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
                Ok(())
            });
        }
        let a = self.elements::<T>("matmul", "X", &pin)?;
        let b = other.elements::<T>("matmul", "Y", &pin)?;
        let (a_strides, b_strides) = (
            (self.strides[0], self.strides[1]),
            (other.strides[0], other.strides[1]),
        );
        out.fill_flat("matmul", |c| {
            small_matmul(a, a_strides, b, b_strides, (m, k, n), c);
            Ok(())
        })
    }

    // ---- in place: only on the sole handle of a tensor ---------------------------

    /// Copies `src` (broadcast to this shape) into this tensor's memory (ND4J `assign`).
    /// Needs the only handle to the memory ([`Error::SharedTensor`] otherwise).
    pub fn assign(&mut self, src: &Tensor) -> Result<()> {
        if let Some(on_device) = self.device_update("assign", None, src) {
            return on_device;
        }
        with_dtype!(self.dtype, T => self.update::<T>("assign", src, |_, s| s))
    }

    /// `self += alpha * x` in place (BLAS `axpy`; an SGD step is `w.scaled_add(-lr, &g)`).
    /// Needs the only handle to the memory. On an integer tensor `alpha` is converted to the
    /// dtype first, like `as` (as the scalar of [`Tensor::add_scalar`]: `-0.5` is 0, and
    /// `-1.0` is 0 on `U8`), then the products and sums wrap on overflow.
    pub fn scaled_add(&mut self, alpha: f64, x: &Tensor) -> Result<()> {
        if let Some(on_device) = self.device_update("scaled_add", Some(alpha as f32), x) {
            return on_device;
        }
        with_dtype!(self.dtype, T => {
            let alpha = T::from_f64(alpha);
            self.update::<T>("scaled_add", x, move |d, s| d.add_wrapping(alpha.mul_wrapping(s)))
        })
    }

    fn update<T: Element>(&mut self, op: &str, src: &Tensor, f: impl Fn(T, T) -> T) -> Result<()> {
        self.same_dtype(op, src)?;
        let shape = broadcast_shape(op, &self.shape, &src.shape)?;
        if shape[..] != self.shape[..] {
            return Err(Error::Shape {
                op: op.into(),
                message: format!(
                    "Y argument {:?} does not broadcast to {:?}",
                    src.shape, self.shape
                ),
            });
        }
        let pin = reclaim::pin();
        if src.shape[..] == self.shape[..] && self.is_contiguous() {
            if let Some(source) = src.flat::<T>(op, "Y", &pin)? {
                let (offset, n) = (self.offset, self.len());
                // `src` cannot alias: a second handle to this memory makes this refuse.
                let bytes = Owned::write_exclusive(&mut self.storage, op, &pin)?;
                let data: &mut [T] = bytemuck::cast_slice_mut(bytes);
                let dest = data
                    .get_mut(offset..offset + n)
                    .ok_or_else(|| Error::Shape {
                        op: op.into(),
                        message: format!(
                            "X argument's shape {:?} does not fit its memory",
                            self.shape
                        ),
                    })?;
                for (d, &s) in dest.iter_mut().zip(source) {
                    *d = f(*d, s);
                }
                return Ok(());
            }
        }
        let source = src.array::<T>(op, "Y", &pin)?;
        // `src` cannot alias: a second handle to this memory makes the write below refuse.
        let (shape, strides, offset) = (self.shape.clone(), self.strides.clone(), self.offset);
        let bytes = Owned::write_exclusive(&mut self.storage, op, &pin)?;
        if shape.contains(&0) {
            // No element to write (the arguments were checked): as NumPy's `a[...] = b`.
            // (The view below could not be made: an empty tensor's memory holds one
            // element, fewer than its strides span.)
            return Ok(());
        }
        let data: &mut [T] = bytemuck::cast_slice_mut(bytes);
        let layout = ndarray::IxDyn(&shape).strides(ndarray::IxDyn(&strides));
        let mut dest =
            ndarray::ArrayViewMutD::from_shape(layout, &mut data[offset..]).map_err(|_| {
                Error::Shape {
                    op: op.into(),
                    message:
                        "X argument is a broadcast view; its elements alias and cannot be written"
                            .into(),
                }
            })?;
        Zip::from(&mut dest)
            .and_broadcast(&source)
            .for_each(|d, &s| *d = f(*d, s));
        Ok(())
    }

    // ---- views: share storage, and so validity ------------------------------------

    /// The axes reversed (a 2-d tensor transposed), without copying.
    pub fn transpose(&self) -> Result<Tensor> {
        self.storage.check("transpose", "X")?;
        let mut t = self.clone();
        t.shape.reverse();
        t.strides.reverse();
        Ok(t)
    }

    /// The same elements in `shape` (row-major order); a view when the tensor is
    /// contiguous, else a contiguous copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        self.storage.check("reshape", "X")?;
        let n = element_count("reshape", shape, self.dtype.size())?;
        if n != self.len() {
            return Err(Error::Shape {
                op: "reshape".into(),
                message: format!(
                    "cannot reshape {:?} ({} elements) into {shape:?}",
                    self.shape,
                    self.len()
                ),
            });
        }
        let strides = contiguous_strides("reshape", shape)?;
        // Row-major already (the strides of axes of length 1 do not matter): a view.
        let base = if self.is_contiguous() {
            self.clone()
        } else {
            self.copy()?
        };
        Ok(Tensor {
            shape: Dims::from_slice(shape),
            strides,
            ..base
        })
    }

    /// A read-only broadcast of this tensor to `shape` (NumPy rules), without copying.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        self.storage.check("broadcast_to", "X")?;
        let target = broadcast_shape("broadcast_to", &self.shape, shape)?;
        element_count("broadcast_to", shape, self.dtype.size())?;
        if target[..] != *shape {
            return Err(Error::Shape {
                op: "broadcast_to".into(),
                message: format!("{:?} cannot be broadcast to {shape:?}", self.shape),
            });
        }
        let lead = shape.len() - self.ndim();
        let strides = shape
            .iter()
            .enumerate()
            .map(|(i, _)| {
                if i < lead || self.shape[i - lead] == 1 {
                    0
                } else {
                    self.strides[i - lead]
                }
            })
            .collect();
        Ok(Tensor {
            shape: Dims::from_slice(shape),
            strides,
            ..self.clone()
        })
    }
}

/// `o[i] = exp(lane[i] - max)` with `max` the lane's largest element (returned): the first
/// half of both softmax kernels on a contiguous lane.
fn exp_less_max<T: Float>(o: &mut [T], lane: &[T]) -> T {
    let max = lane.iter().fold(T::neg_infinity(), |m, v| m.max(*v));
    for (o, &v) in o.iter_mut().zip(lane) {
        *o = (v - max).exp();
    }
    max
}

/// [`exp_less_max`] on ndarray lanes (the softmax kernels on strided operands): the same
/// arithmetic in the same order.
fn exp_less_max_lane<T: Float>(o: &mut ArrayViewMut1<'_, T>, lane: &ArrayView1<'_, T>) -> T {
    let max = lane.fold(T::neg_infinity(), |m, v| m.max(*v));
    Zip::from(o)
        .and(lane)
        .for_each(|o, &v| *o = (v - max).exp());
    max
}

/// How the operands of an elementwise op on contiguous elements line up with its output,
/// when one of them repeats whole (the fast path of [`Tensor::zip_with`]): the other has
/// the output's shape, and this one's shape, less leading axes of length 1, is the
/// output's trailing axes (a bias row added to every row of a batch, a scalar to every
/// element). Other broadcasts take the ndarray path.
#[derive(Clone, Copy)]
enum Repeat {
    /// Both operands have the output's shape.
    Neither,
    /// X has the output's shape; Y repeats every `n` elements.
    Y(usize),
    /// Y has the output's shape; X repeats every `n` elements.
    X(usize),
}

impl Repeat {
    fn of(out: &[usize], x: &[usize], y: &[usize]) -> Option<Repeat> {
        let repeats = |small: &[usize]| -> Option<usize> {
            let first = small.iter().position(|&d| d != 1).unwrap_or(small.len());
            let tail = &small[first..];
            out.ends_with(tail).then(|| tail.iter().product())
        };
        match (x == out, y == out) {
            (true, true) => Some(Repeat::Neither),
            (true, false) => repeats(y).filter(|&n| n > 0).map(Repeat::Y),
            (false, true) => repeats(x).filter(|&n| n > 0).map(Repeat::X),
            (false, false) => None,
        }
    }

    /// `out[i] = f(x[i], y[i])`, the repeating operand indexed modulo its length.
    fn zip<T: Copy>(self, out: &mut [T], x: &[T], y: &[T], f: &impl Fn(T, T) -> T) {
        match self {
            Repeat::Neither => {
                for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
                    *o = f(a, b);
                }
            }
            Repeat::Y(n) => {
                for (o, a) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                    for ((o, &a), &b) in o.iter_mut().zip(a).zip(y) {
                        *o = f(a, b);
                    }
                }
            }
            Repeat::X(n) => {
                for (o, b) in out.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
                    for ((o, &a), &b) in o.iter_mut().zip(x).zip(b) {
                        *o = f(a, b);
                    }
                }
            }
        }
    }
}

/// `c = a @ b` for an `[m, k]` matrix `a` and a `[k, n]` matrix `b`, each given as its
/// elements from its first one and its strides in elements, into the row-major `[m, n]`
/// slice `c`, tile by tile: each tile of `c` (up to 4 rows by 8 columns, or for a product
/// 1 to 3 columns wide up to 8 rows by all of them) is summed in registers over all of
/// `p`, then stored. Each `c[i, j]` starts at zero and adds
/// `a[i, p] * b[p, j]` for `p` in order (integers wrap), so the result depends only on the
/// values, never on the tiling.
fn small_matmul<T: Element>(
    a: &[T],
    a_strides: (usize, usize),
    b: &[T],
    b_strides: (usize, usize),
    (m, k, n): (usize, usize, usize),
    c: &mut [T],
) {
    let operands = Operands {
        a,
        a_strides,
        b,
        b_strides,
        k,
        n,
    };
    if k == 0 {
        // An empty sum: the operands may have no elements to slice rows from.
        c.fill(T::zero());
        return;
    }
    // One copy of the kernel for each pair of layouts, so that it slices contiguous runs
    // instead of indexing element by element: the arithmetic, and so the result, is the
    // same in all of them.
    let (a_layout, b_layout) = (layout(a_strides), layout(b_strides));
    match (a_layout, b_layout) {
        (ROWS, ROWS) => operands.rows::<ROWS, ROWS>(m, c),
        (ROWS, COLUMNS) => operands.rows::<ROWS, COLUMNS>(m, c),
        (ROWS, _) => operands.rows::<ROWS, STRIDED>(m, c),
        (COLUMNS, ROWS) => operands.rows::<COLUMNS, ROWS>(m, c),
        (COLUMNS, COLUMNS) => operands.rows::<COLUMNS, COLUMNS>(m, c),
        (COLUMNS, _) => operands.rows::<COLUMNS, STRIDED>(m, c),
        (_, ROWS) => operands.rows::<STRIDED, ROWS>(m, c),
        (_, COLUMNS) => operands.rows::<STRIDED, COLUMNS>(m, c),
        _ => operands.rows::<STRIDED, STRIDED>(m, c),
    }
}

/// A matrix operand's layout, for [`small_matmul`]: its rows are contiguous (column
/// stride 1), or its columns are (row stride 1: a transposed matrix), or neither.
const ROWS: u8 = 0;
/// See [`ROWS`].
const COLUMNS: u8 = 1;
/// See [`ROWS`].
const STRIDED: u8 = 2;

fn layout((row_stride, column_stride): (usize, usize)) -> u8 {
    if column_stride == 1 {
        ROWS
    } else if row_stride == 1 {
        COLUMNS
    } else {
        STRIDED
    }
}

/// The operands of [`small_matmul`].
struct Operands<'a, T> {
    a: &'a [T],
    a_strides: (usize, usize),
    b: &'a [T],
    b_strides: (usize, usize),
    k: usize,
    n: usize,
}

impl<T: Element> Operands<'_, T> {
    /// All `m` rows of the product into `c`; `A` and `B` are the operands' layouts
    /// ([`ROWS`], [`COLUMNS`] or [`STRIDED`]). Four rows at a time, in tiles up to 8
    /// columns wide; a product 1 to 3 columns wide (a classifier's logits, their
    /// gradients) in tiles of all its columns and up to 8 rows, which the compiler
    /// vectorizes over the rows instead.
    fn rows<const A: u8, const B: u8>(&self, m: usize, c: &mut [T]) {
        match self.n {
            1 => return self.narrow::<1, A, B>(m, c),
            2 => return self.narrow::<2, A, B>(m, c),
            3 => return self.narrow::<3, A, B>(m, c),
            _ => {}
        }
        let mut i = 0;
        while i + 4 <= m {
            self.row_block::<4, A, B>(i, c);
            i += 4;
        }
        while i < m {
            self.row_block::<1, A, B>(i, c);
            i += 1;
        }
    }

    /// Rows `i..i + R` of the product into `c`, in tiles 8, 4, 2 and 1 columns wide.
    fn row_block<const R: usize, const A: u8, const B: u8>(&self, i: usize, c: &mut [T]) {
        let mut j = 0;
        while j + 8 <= self.n {
            self.tile::<R, 8, A, B>(i, j, c);
            j += 8;
        }
        if j + 4 <= self.n {
            self.tile::<R, 4, A, B>(i, j, c);
            j += 4;
        }
        if j + 2 <= self.n {
            self.tile::<R, 2, A, B>(i, j, c);
            j += 2;
        }
        if j < self.n {
            self.tile::<R, 1, A, B>(i, j, c);
        }
    }

    /// All `m` rows of a product `W` (= `n`) columns wide into `c`, in tiles of 8, 4, 2
    /// and 1 rows.
    fn narrow<const W: usize, const A: u8, const B: u8>(&self, m: usize, c: &mut [T]) {
        debug_assert_eq!(self.n, W);
        let mut i = 0;
        while i + 8 <= m {
            self.column_tile::<8, W, A, B>(i, c);
            i += 8;
        }
        if i + 4 <= m {
            self.column_tile::<4, W, A, B>(i, c);
            i += 4;
        }
        if i + 2 <= m {
            self.column_tile::<2, W, A, B>(i, c);
            i += 2;
        }
        if i < m {
            self.column_tile::<1, W, A, B>(i, c);
        }
    }

    /// A's `R` rows from row `i`, sliced once if they are contiguous (empty otherwise).
    #[inline(always)]
    fn a_rows<const R: usize, const A: u8>(&self, i: usize) -> [&[T]; R] {
        if A == ROWS {
            let (a0, k) = (self.a_strides.0, self.k);
            std::array::from_fn(|r| &self.a[(i + r) * a0..][..k])
        } else {
            [&[]; R]
        }
    }

    /// B's `W` columns from column `j`, sliced once if they are contiguous (empty
    /// otherwise).
    #[inline(always)]
    fn b_columns<const W: usize, const B: u8>(&self, j: usize) -> [&[T]; W] {
        if B == COLUMNS {
            let (b1, k) = (self.b_strides.1, self.k);
            std::array::from_fn(|q| &self.b[(j + q) * b1..][..k])
        } else {
            [&[]; W]
        }
    }

    /// `a[i..i + R, p]`, from the rows [`Operands::a_rows`] sliced or from A itself.
    #[inline(always)]
    fn a_at<const R: usize, const A: u8>(&self, a_rows: &[&[T]; R], i: usize, p: usize) -> [T; R] {
        let (a0, a1) = self.a_strides;
        match A {
            ROWS => std::array::from_fn(|r| a_rows[r][p]),
            COLUMNS => {
                let run = &self.a[p * a1 + i..][..R];
                std::array::from_fn(|r| run[r])
            }
            _ => std::array::from_fn(|r| self.a[(i + r) * a0 + p * a1]),
        }
    }

    /// `b[p, j..j + W]`, from the columns [`Operands::b_columns`] sliced or from B itself.
    #[inline(always)]
    fn b_at<const W: usize, const B: u8>(
        &self,
        b_columns: &[&[T]; W],
        j: usize,
        p: usize,
    ) -> [T; W] {
        let (b0, b1) = self.b_strides;
        match B {
            ROWS => {
                let run = &self.b[p * b0 + j..][..W];
                std::array::from_fn(|q| run[q])
            }
            COLUMNS => std::array::from_fn(|q| b_columns[q][p]),
            _ => std::array::from_fn(|q| self.b[p * b0 + (j + q) * b1]),
        }
    }

    /// `c[i..i + R, j..j + W]`, summed over `p` in order. Contiguous runs are sliced once
    /// (A's `R` rows for the tile, or its `R` elements at each `p`; B's `W` elements at
    /// each `p`, or its `W` columns for the tile), so the loop indexes within slices of
    /// known length and the compiler can keep it free of bounds checks and vectorize it
    /// over the tile's columns.
    #[inline(always)]
    fn tile<const R: usize, const W: usize, const A: u8, const B: u8>(
        &self,
        i: usize,
        j: usize,
        c: &mut [T],
    ) {
        let (a_rows, b_columns) = (self.a_rows::<R, A>(i), self.b_columns::<W, B>(j));
        let mut sums = [[T::zero(); W]; R];
        for p in 0..self.k {
            let x = self.a_at::<R, A>(&a_rows, i, p);
            let y = self.b_at::<W, B>(&b_columns, j, p);
            for (row, x) in sums.iter_mut().zip(x) {
                for (sum, y) in row.iter_mut().zip(y) {
                    *sum = sum.add_wrapping(x.mul_wrapping(y));
                }
            }
        }
        for (r, row) in sums.iter().enumerate() {
            c[(i + r) * self.n + j..][..W].copy_from_slice(row);
        }
    }

    /// `c[i..i + R, ..]` of a product `W` (= `n`) columns wide: as [`Operands::tile`],
    /// with the sums held column by column so that the compiler vectorizes over the rows.
    /// Each `c[i, j]` is the same sum, in the same order.
    #[inline(always)]
    fn column_tile<const R: usize, const W: usize, const A: u8, const B: u8>(
        &self,
        i: usize,
        c: &mut [T],
    ) {
        let (a_rows, b_columns) = (self.a_rows::<R, A>(i), self.b_columns::<W, B>(0));
        let mut sums = [[T::zero(); R]; W];
        for p in 0..self.k {
            let x = self.a_at::<R, A>(&a_rows, i, p);
            let y = self.b_at::<W, B>(&b_columns, 0, p);
            for (column, y) in sums.iter_mut().zip(y) {
                for (sum, x) in column.iter_mut().zip(x) {
                    *sum = sum.add_wrapping(x.mul_wrapping(y));
                }
            }
        }
        for (r, row) in c[i * W..][..R * W].chunks_exact_mut(W).enumerate() {
            for (q, out) in row.iter_mut().enumerate() {
                *out = sums[q][r];
            }
        }
    }
}

fn two_d<T>(view: ArrayViewD<'_, T>) -> ndarray::ArrayView2<'_, T> {
    view.into_dimensionality::<Ix2>()
        .expect("checked to be 2-d")
}
