//! Tensors whose every access is checked (semantics §3, §4, §6).
//!
//! Invariant: a [`Tensor`] reaches its bytes only through its memory's checked read, so a
//! tensor from a left, outdated or destroyed workspace, another thread's workspace, or a
//! closed scope yields an [`Error`] before any byte is touched. Views (`transpose`,
//! `reshape`, `broadcast_to`) share their base's storage and so its validity.
//!
//! Kernels are ndarray's, run over views of ndmem memory; ndmem only decides where outputs
//! live: the current workspace, else the first input's scope and memory source, else a
//! pool block owned by the handles and freed through epoch reclamation when the last
//! handle drops. This module calls down into [`crate::memory`] (homes, owners, sources),
//! [`crate::workspace`] and [`crate::reclaim`]; of scopes it sees only their ownership
//! records, never the `Scope` handle.
//!
//! Nothing here allocates on the heap for a tensor of workspace memory: shapes and strides
//! are inline up to four axes (`Dims`), the shared header comes from the thread's spares
//! (`Handle`), and ops write straight into their outputs (no temporaries; only a float
//! matmul of more than 64^3 multiply-adds packs through matrixmultiply's own buffer). A
//! pool tensor costs at most its header (none once the thread has spares), besides what
//! epoch reclamation takes to defer its free.

mod device;
mod dtype;
mod ops;
pub(crate) mod storage;

use std::sync::Arc;

use ndarray::{ArrayViewD, ArrayViewMutD, IxDyn, ShapeBuilder};

pub use dtype::{DType, Element, Float};

use crate::error::{Error, Result};
use crate::memory::home::ViewHold;
use crate::memory::owner::{Handle, Owned, Owner};
use crate::memory::MemorySource;
use crate::reclaim::{self, Pin};
use storage::{NewStorage, Placement};

/// A shape or strides: inline up to four axes (every tensor of the common ranks), on the
/// heap only above.
pub(crate) type Dims = smallvec::SmallVec<[usize; 4]>;

/// Dispatches on a [`DType`], binding the matching Rust type to `$t` inside `$body`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::tensor::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::tensor::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::tensor::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::tensor::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::tensor::DType::U8 => {
                type $t = u8;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// An n-dimensional array of one [`DType`] in ndmem memory. Cheap to clone (the storage is
/// shared), `Send + Sync`, and checked on every use.
///
/// ```
/// use ndmem::{DType, Tensor};
///
/// let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::ones(DType::F32, &[2])?;
/// let c = a.add(&b)?.matmul(&a.transpose()?)?;   // broadcasting, then 2x2 @ 2x2
/// assert_eq!(c.shape(), &[2, 2]);
/// assert_eq!(c.to_vec::<f32>()?, vec![8.0, 18.0, 14.0, 32.0]);
/// # Ok::<(), ndmem::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    /// The shared memory header and its validity check.
    storage: Handle,
    dtype: DType,
    shape: Dims,
    /// Strides in elements (never negative; 0 for broadcast axes).
    strides: Dims,
    /// Offset of the first element, in elements.
    offset: usize,
}

/// A new tensor's memory, allocated but not yet written or shared.
///
/// Ops allocate their output before they pin the reclamation epoch to read their operands:
/// an allocation at a limit runs [`reclaim::collect`], which cannot free what was deferred
/// while the allocating thread itself is pinned, so an output allocated under the op's pin
/// could be refused for bytes that are only waiting for that pin (semantics §6).
pub(crate) struct Output<T> {
    storage: NewStorage,
    /// Elements (the memory holds at least one, for an empty shape).
    n: usize,
    shape: Dims,
    strides: Dims,
    element: std::marker::PhantomData<fn() -> T>,
}

impl<T: Element> Output<T> {
    /// Lets `fill` write the elements in row-major order (nothing for an empty shape: its
    /// operands were checked already, and a shape like `[0, 2^40]` has 2^40 lanes), then
    /// shares the tensor.
    pub(crate) fn fill_flat(
        self,
        op: &str,
        fill: impl FnOnce(&mut [T]) -> Result<()>,
    ) -> Result<Tensor> {
        self.finish(op, |data, _| fill(data))
    }

    /// [`Output::fill_flat`] through an ndarray view of the shape.
    pub(crate) fn fill(
        self,
        op: &str,
        fill: impl FnOnce(ArrayViewMutD<'_, T>) -> Result<()>,
    ) -> Result<Tensor> {
        self.finish(op, |data, shape| {
            let view = ArrayViewMutD::from_shape(IxDyn(shape), data).map_err(|e| Error::Shape {
                op: op.into(),
                message: format!("shape {shape:?} cannot be laid out: {e}"),
            })?;
            fill(view)
        })
    }

    fn finish(
        self,
        op: &str,
        fill: impl FnOnce(&mut [T], &[usize]) -> Result<()>,
    ) -> Result<Tensor> {
        let Output {
            mut storage,
            n,
            shape,
            strides,
            ..
        } = self;
        {
            let data: &mut [T] = bytemuck::cast_slice_mut(storage.bytes_mut(op)?);
            if n > 0 {
                fill(&mut data[..n], &shape)?;
            }
        }
        Ok(Tensor {
            storage: storage.share(op)?,
            dtype: T::DTYPE,
            shape,
            strides,
            offset: 0,
        })
    }
}

/// A read-only view of a tensor's elements, valid while this value lives.
///
/// It keeps the memory from being freed without pinning the reclamation epoch (a view held
/// for a long time delays nothing else): a scope that closes meanwhile frees the memory
/// only when the view drops, and a view of workspace memory pins the workspace: until the
/// view drops, it refuses to start a new cycle or be destroyed
/// ([`Error::WorkspaceInUse`]), so the bytes shown are never rewritten or freed.
///
/// Read it through [`TensorView::as_array`] (an ndarray view borrowed from this value, so
/// it cannot outlive it), [`TensorView::get`], indexing, [`TensorView::iter`],
/// [`TensorView::sum`], [`TensorView::as_slice`], [`TensorView::to_owned`] and their
/// kin, or compare it with an ndarray array (`==`). It is not an `ArrayViewD` itself (nor
/// derefs to one): a clone of such a view would keep the tensor's lifetime and so could
/// outlive the hold that keeps its memory from being recycled.
///
/// A view stays on the thread that made it (the tensor itself may be sent, and viewed
/// there):
///
/// ```compile_fail,E0277
/// fn send<T: Send>(_: T) {}
/// let t = ndmem::Tensor::ones(ndmem::DType::F32, &[2]).unwrap();
/// send(t.view::<f32>().unwrap());
/// ```
pub struct TensorView<'a, T> {
    view: ArrayViewD<'a, T>,
    _hold: ViewHold<'a>,
    /// Not `Send` or `Sync`: a workspace view's pin belongs to the workspace's thread.
    _thread: std::marker::PhantomData<*const ()>,
}

impl<T: Element> TensorView<'_, T> {
    /// The elements as an ndarray view, for as long as this value is borrowed.
    pub fn as_array(&self) -> ArrayViewD<'_, T> {
        self.view.view()
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.view.shape()
    }

    /// The element at `index` (one coordinate per axis), or `None` if out of bounds.
    pub fn get(&self, index: &[usize]) -> Option<&T> {
        self.view.get(index)
    }

    /// The elements in row-major order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.view.iter()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.view.ndim()
    }

    /// A copy of the elements as an owned ndarray array (heap memory, valid after the
    /// view and the tensor are gone).
    pub fn to_owned(&self) -> ndarray::ArrayD<T> {
        self.view.to_owned()
    }

    /// The sum of the elements (ndarray's `sum`; integer sums wrap).
    pub fn sum(&self) -> T {
        T::sum_of(self.view.view())
    }

    /// The mean of the elements, as [`Tensor::mean`] computes it (ndarray's `mean` for
    /// floats; for integers the `f64` mean converted back like `as`, so it neither wraps
    /// nor saturates on the way): `None` when there are none.
    pub fn mean(&self) -> Option<T> {
        T::mean_of(self.view.view())
    }

    /// The elements as a slice in row-major order, if they lie so in memory (not for a
    /// transposed or broadcast tensor: `None` then, as ndarray's `as_slice`).
    pub fn as_slice(&self) -> Option<&[T]> {
        self.view.as_slice()
    }

    /// A copy of the elements in row-major order.
    pub fn to_vec(&self) -> Vec<T> {
        self.view.iter().copied().collect()
    }

    /// The first element in row-major order, or `None` if there are none.
    pub fn first(&self) -> Option<&T> {
        self.view.first()
    }

    /// The strides, in elements, one per axis (0 along a broadcast axis).
    pub fn strides(&self) -> &[isize] {
        self.view.strides()
    }
}

impl<'v, T> IntoIterator for &'v TensorView<'_, T> {
    type Item = &'v T;
    type IntoIter = ndarray::iter::Iter<'v, T, IxDyn>;

    /// The elements in row-major order, as [`TensorView::iter`].
    fn into_iter(self) -> Self::IntoIter {
        self.view.iter()
    }
}

/// Equal to an ndarray array of any dimension type with the same shape and elements, so
/// `assert_eq!(t.view::<f32>()?, ndarray::array![[1.0, 2.0], [3.0, 4.0]])` reads as it
/// would of an `ArrayViewD`.
impl<T, S, D> PartialEq<ndarray::ArrayBase<S, D>> for TensorView<'_, T>
where
    T: PartialEq,
    S: ndarray::Data<Elem = T>,
    D: ndarray::Dimension,
{
    fn eq(&self, other: &ndarray::ArrayBase<S, D>) -> bool {
        self.view.shape() == other.shape() && self.view.iter().eq(other.iter())
    }
}

/// Equal when both views have the same shape and elements (wherever their bytes live).
impl<'b, T: PartialEq> PartialEq<TensorView<'b, T>> for TensorView<'_, T> {
    fn eq(&self, other: &TensorView<'b, T>) -> bool {
        self.view == other.view
    }
}

impl<T: Element, const N: usize> std::ops::Index<[usize; N]> for TensorView<'_, T> {
    type Output = T;
    /// The element at `index`. Panics if it is out of bounds, like slice indexing; use
    /// [`TensorView::get`] to check instead.
    fn index(&self, index: [usize; N]) -> &T {
        &self.view[&index[..]]
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for TensorView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.view.fmt(f)
    }
}

/// Elements of `shape` holding `elem_size`-byte values, or a shape error if the shape
/// cannot describe memory: the product of its non-zero axes times `elem_size` must fit in
/// `isize` (ndarray's rule, applied to zero-size shapes too, so their strides and views
/// never overflow).
fn element_count(op: &str, shape: &[usize], elem_size: usize) -> Result<usize> {
    let nonzero = shape
        .iter()
        .filter(|d| **d != 0)
        .try_fold(1usize, |n, d| n.checked_mul(*d));
    match nonzero.and_then(|n| n.checked_mul(elem_size.max(1))) {
        Some(bytes) if bytes <= isize::MAX as usize => {}
        _ => return Err(too_large(op, shape, elem_size)),
    }
    Ok(if shape.contains(&0) {
        0
    } else {
        nonzero.unwrap_or(0)
    })
}

/// [`element_count`] and [`contiguous_strides`] of a new tensor's `shape` in one pass (the
/// strides' partial products are the element count's, so they overflow only where it
/// does), with [`element_count`]'s error.
#[inline]
fn contiguous_layout(op: &str, shape: &[usize], elem_size: usize) -> Result<(usize, Dims)> {
    const INLINE: usize = 4;
    // Up to `INLINE` axes the strides are written into an array and moved in whole, with
    // no test of where the vector keeps them.
    let mut inline = [0usize; INLINE];
    let mut spilled = Dims::new();
    let strides: &mut [usize] = if shape.len() <= INLINE {
        &mut inline[..shape.len()]
    } else {
        spilled = Dims::from_elem(0, shape.len());
        &mut spilled
    };
    let mut step = 1usize;
    let mut empty = false;
    for (stride, &dim) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        empty |= dim == 0;
        step = match step.checked_mul(dim.max(1)) {
            Some(next) => next,
            None => return Err(too_large(op, shape, elem_size)),
        };
    }
    match step.checked_mul(elem_size.max(1)) {
        Some(bytes) if bytes <= isize::MAX as usize => {}
        _ => return Err(too_large(op, shape, elem_size)),
    }
    let strides = if shape.len() <= INLINE {
        Dims::from_buf_and_len(inline, shape.len())
    } else {
        spilled
    };
    Ok((if empty { 0 } else { step }, strides))
}

/// The error of [`element_count`] (out of line: the hot path only tests).
#[cold]
#[inline(never)]
fn too_large(op: &str, shape: &[usize], elem_size: usize) -> Error {
    Error::Shape {
        op: op.into(),
        message: format!(
            "shape {shape:?} cannot describe memory: the product of its non-zero axis lengths \
             times the element size ({elem_size} bytes) overflows isize"
        ),
    }
}

/// The error of [`Tensor::check_dtype`] (out of line: the hot path only compares).
#[cold]
#[inline(never)]
fn dtype_mismatch(op: &str, arg: &str, got: DType, wanted: DType) -> Error {
    Error::DType {
        op: op.into(),
        message: format!("{arg} argument is {got}, not {wanted}"),
    }
}

/// Row-major strides of `shape` ([`contiguous_layout`]'s), or a shape error if they
/// overflow (they cannot for a shape [`element_count`] accepted).
fn contiguous_strides(op: &str, shape: &[usize]) -> Result<Dims> {
    contiguous_layout(op, shape, 1).map(|(_, strides)| strides)
}

impl Tensor {
    // ---- creation ------------------------------------------------------------------

    /// A tensor of zeros, placed by the allocation flow (current workspace, else the pool).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Self::full_placed("zeros", dtype, shape, 0.0, Placement::Auto(None))
    }

    /// A tensor of ones.
    pub fn ones(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Self::full_placed("ones", dtype, shape, 1.0, Placement::Auto(None))
    }

    /// A tensor filled with `value` (converted to `dtype` like `as`).
    pub fn full(dtype: DType, shape: &[usize], value: f64) -> Result<Tensor> {
        Self::full_placed("full", dtype, shape, value, Placement::Auto(None))
    }

    /// Uniform random values in `[0, 1)` (floats) or `0..100` (integers), reproducible for
    /// a `seed` whatever the memory placement.
    pub fn rand(dtype: DType, shape: &[usize], seed: u64) -> Result<Tensor> {
        with_dtype!(dtype, T => Self::build::<T>("rand", shape, Placement::Auto(None), |mut out| {
            let mut state = seed;
            for x in out.iter_mut() {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
                *x = T::from_f64(if dtype.is_float() { unit } else { (unit * 100.0).floor() });
            }
            Ok(())
        }))
    }

    /// A tensor copied from `data` with `shape` (row-major).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Self::from_slice_placed("from_slice", data, shape, Placement::Auto(None))
    }

    /// A tensor copied from `data` (the vector is freed; tensor memory is ndmem's).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Self::from_slice_placed("from_vec", &data, shape, Placement::Auto(None))
    }

    /// A tensor of zeros in pool memory from `source`, owned by its handles, whatever
    /// workspace is current (like [`Tensor::detach`]).
    ///
    /// ```
    /// use ndmem::alloc::{Limits, Pool};
    /// use ndmem::{DType, MemorySource, Tensor};
    ///
    /// let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
    /// let t = Tensor::zeros_in(&source, DType::F32, &[256])?;
    /// assert_eq!(source.pool().stats().live_bytes, 1024);
    /// let u = t.add_scalar(1.0)?;                  // outputs follow their first input
    /// assert_eq!(u.source(), source);
    /// assert!(Tensor::zeros_in(&source, DType::F32, &[1 << 20]).is_err()); // its limit
    /// # Ok::<(), ndmem::Error>(())
    /// ```
    pub fn zeros_in(source: &MemorySource, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Self::full_in_named("zeros_in", source, dtype, shape, 0.0)
    }

    /// A tensor of `value`s in pool memory from `source` (see [`Tensor::zeros_in`]).
    pub fn full_in(
        source: &MemorySource,
        dtype: DType,
        shape: &[usize],
        value: f64,
    ) -> Result<Tensor> {
        Self::full_in_named("full_in", source, dtype, shape, value)
    }

    /// [`Tensor::full_in`] as operation `op` (the name its errors give).
    fn full_in_named(
        op: &str,
        source: &MemorySource,
        dtype: DType,
        shape: &[usize],
        value: f64,
    ) -> Result<Tensor> {
        let placement = Placement::Pool {
            source: *source,
            owner: None,
        };
        Self::full_placed(op, dtype, shape, value, placement)
    }

    /// A tensor copied from `data`, in pool memory from `source` (see
    /// [`Tensor::zeros_in`]).
    pub fn from_slice_in<T: Element>(
        source: &MemorySource,
        data: &[T],
        shape: &[usize],
    ) -> Result<Tensor> {
        let placement = Placement::Pool {
            source: *source,
            owner: None,
        };
        Self::from_slice_placed("from_slice_in", data, shape, placement)
    }

    /// A tensor of `value`s owned by `owner`, in its source's pool memory.
    pub(crate) fn full_owned(
        op: &str,
        dtype: DType,
        shape: &[usize],
        value: f64,
        owner: &Arc<Owner>,
    ) -> Result<Tensor> {
        let placement = Placement::Pool {
            source: owner.source(),
            owner: Some(owner),
        };
        Self::full_placed(op, dtype, shape, value, placement)
    }

    /// A tensor copied from `data`, owned by `owner`, in its source's pool memory.
    pub(crate) fn from_slice_owned<T: Element>(
        data: &[T],
        shape: &[usize],
        owner: &Arc<Owner>,
    ) -> Result<Tensor> {
        let placement = Placement::Pool {
            source: owner.source(),
            owner: Some(owner),
        };
        Self::from_slice_placed("from_slice", data, shape, placement)
    }

    fn full_placed(
        op: &str,
        dtype: DType,
        shape: &[usize],
        value: f64,
        placement: Placement<'_>,
    ) -> Result<Tensor> {
        with_dtype!(dtype, T => Self::build::<T>(op, shape, placement, |mut out| {
            out.fill(T::from_f64(value));
            Ok(())
        }))
    }

    fn from_slice_placed<T: Element>(
        op: &str,
        data: &[T],
        shape: &[usize],
        placement: Placement<'_>,
    ) -> Result<Tensor> {
        let n = element_count(op, shape, size_of::<T>())?;
        if n != data.len() {
            return Err(Error::Shape {
                op: op.into(),
                message: format!(
                    "{} values cannot fill shape {shape:?} ({n} elements)",
                    data.len()
                ),
            });
        }
        Self::build::<T>(op, shape, placement, |mut out| {
            out.as_slice_mut()
                .expect("fresh outputs are contiguous")
                .copy_from_slice(data);
            Ok(())
        })
    }

    /// Allocates a contiguous `shape` of `T` where `placement` says, lets `fill` write it,
    /// then shares it.
    pub(crate) fn build<T: Element>(
        op: &str,
        shape: &[usize],
        placement: Placement<'_>,
        fill: impl FnOnce(ArrayViewMutD<'_, T>) -> Result<()>,
    ) -> Result<Tensor> {
        Self::output::<T>(op, shape, placement)?.fill(op, fill)
    }

    /// The memory of a new contiguous `shape` of `T`, where `placement` says, to be filled
    /// by [`Output::fill`] or [`Output::fill_flat`]. An op that reads its operands under a
    /// pin allocates its output first, before it pins (see [`Output`]).
    pub(crate) fn output<T: Element>(
        op: &str,
        shape: &[usize],
        placement: Placement<'_>,
    ) -> Result<Output<T>> {
        let (n, strides) = contiguous_layout(op, shape, size_of::<T>())?;
        // Cannot overflow: contiguous_layout bounds it by isize::MAX.
        let bytes = n * size_of::<T>();
        let storage =
            NewStorage::allocate(op, bytes.max(size_of::<T>()), align_of::<T>(), placement)?;
        Ok(Output {
            storage,
            n,
            shape: Dims::from_slice(shape),
            strides,
            element: std::marker::PhantomData,
        })
    }

    // ---- metadata ------------------------------------------------------------------

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the tensor lives in a workspace (and which), for diagnostics.
    pub fn workspace(&self) -> Option<&str> {
        self.storage.stamp().map(|s| s.workspace_id())
    }

    /// The memory source the tensor's bytes were drawn from: its pool block's, or for
    /// workspace memory its workspace's (where [`Tensor::detach`] copies go).
    pub fn source(&self) -> MemorySource {
        self.storage.source()
    }

    /// Whether the tensor may be used now from this thread (semantics §3, §4). This is the
    /// check every op runs on each argument: one load of the probe the handle keeps and
    /// one of the word it names (a pool block's freed flag, or for workspace memory this
    /// thread's entry of its table of open cycles, which holds the memory's cycle word only
    /// on the owner thread while that cycle runs).
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.storage.is_live()
    }

    /// The memory and its ownership record (for scopes).
    pub(crate) fn storage(&self) -> &Arc<Owned> {
        self.storage.arc()
    }

    /// Whether two tensors share memory (one is a view of the other, or both of a base).
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(self.storage.arc(), other.storage.arc())
    }

    // ---- read-out ------------------------------------------------------------------

    /// The elements in row-major order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let pin = reclaim::pin();
        let view = self.array::<T>("to_vec", "X", &pin)?;
        // Fallibly: under a heap limit a large copy is an error, not an abort.
        let mut out = Vec::new();
        out.try_reserve_exact(view.len())
            .map_err(|_| Error::HeapRefused {
                op: "to_vec".into(),
                requested: view.len().saturating_mul(std::mem::size_of::<T>()),
            })?;
        out.extend(view.iter().copied());
        Ok(out)
    }

    /// A read-only view of the elements (no copy), checked like an op's argument.
    pub fn view<T: Element>(&self) -> Result<TensorView<'_, T>> {
        self.check_dtype::<T>("view", "X")?;
        let (hold, bytes) = self.storage.hold_for_view("view", "X")?;
        Ok(TensorView {
            view: self.view_of(bytes, "view", "X")?,
            _hold: hold,
            _thread: std::marker::PhantomData,
        })
    }

    /// The single value of a one-element tensor, as `f64`.
    pub fn scalar(&self) -> Result<f64> {
        if self.len() != 1 {
            return Err(Error::Shape {
                op: "scalar".into(),
                message: format!("shape {:?} is not a single value", self.shape),
            });
        }
        let pin = reclaim::pin();
        with_dtype!(self.dtype, T => Ok(self.array::<T>("scalar", "X", &pin)?.iter().next().map_or(0.0, |v| v.to_f64())))
    }

    /// The checked ndarray view of this tensor's elements, for as long as `pin` lives.
    pub(crate) fn array<'a, T: Element>(
        &'a self,
        op: &str,
        arg: &str,
        pin: &'a Pin,
    ) -> Result<ArrayViewD<'a, T>> {
        self.check_dtype::<T>(op, arg)?;
        let bytes = self.storage.read(op, arg, pin)?;
        self.view_of(bytes, op, arg)
    }

    /// Whether the elements are laid out row-major without gaps from `offset` on (the
    /// strides a fresh tensor of this shape has; axes of length 1 may have any stride).
    pub(crate) fn is_contiguous(&self) -> bool {
        let mut step = 1usize;
        for (&dim, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if dim != 1 && stride != step {
                return false;
            }
            step = step.saturating_mul(dim.max(1));
        }
        true
    }

    /// The checked elements in row-major order, when they are contiguous
    /// ([`Tensor::is_contiguous`]); `None` otherwise (the caller takes the ndarray path).
    pub(crate) fn flat<'a, T: Element>(
        &'a self,
        op: &str,
        arg: &str,
        pin: &'a Pin,
    ) -> Result<Option<&'a [T]>> {
        if !self.is_contiguous() {
            return Ok(None);
        }
        let data = self.elements::<T>(op, arg, pin)?;
        Ok(data.get(..self.len()))
    }

    /// The checked elements of this tensor's memory from its first one on (index them with
    /// its strides), for as long as `pin` lives; empty for an empty tensor.
    pub(crate) fn elements<'a, T: Element>(
        &'a self,
        op: &str,
        arg: &str,
        pin: &'a Pin,
    ) -> Result<&'a [T]> {
        self.check_dtype::<T>(op, arg)?;
        let data: &[T] = bytemuck::cast_slice(self.storage.read(op, arg, pin)?);
        Ok(if self.is_empty() {
            &[]
        } else {
            data.get(self.offset..).unwrap_or(&[])
        })
    }

    #[inline]
    fn check_dtype<T: Element>(&self, op: &str, arg: &str) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(dtype_mismatch(op, arg, self.dtype, T::DTYPE));
        }
        Ok(())
    }

    /// This tensor's elements in `bytes` (its storage's), as an ndarray view.
    fn view_of<'a, T: Element>(
        &self,
        bytes: &'a [u8],
        op: &str,
        arg: &str,
    ) -> Result<ArrayViewD<'a, T>> {
        let data: &[T] = bytemuck::cast_slice(bytes);
        let view = if self.is_empty() {
            ArrayViewD::from_shape(IxDyn(&self.shape), &data[..0])
        } else {
            let shape = IxDyn(&self.shape).strides(IxDyn(&self.strides));
            ArrayViewD::from_shape(shape, &data[self.offset..])
        };
        view.map_err(|e| Error::Shape {
            op: op.into(),
            message: format!(
                "{arg} argument's shape {:?} does not fit its memory: {e}",
                self.shape
            ),
        })
    }

    // ---- moving data out (semantics §3) ------------------------------------------

    /// A copy in pool memory owned by the returned handle: valid forever (ND4J `detach`).
    pub fn detach(&self) -> Result<Tensor> {
        let placement = Placement::Pool {
            source: self.pool_source(),
            owner: None,
        };
        self.copy_to("detach", placement)
    }

    /// A copy in the parent of the current workspace, or detached if there is none;
    /// unchanged if it already lives there (ND4J `leverage`).
    pub fn leverage(&self) -> Result<Tensor> {
        if let Some(stamp) = self.storage.stamp() {
            let id = stamp.workspace_id();
            if crate::workspace::parent_of_current_is(id) && stamp.is_in(id) {
                self.storage.check("leverage", "X")?;
                return Ok(self.clone());
            }
        }
        self.copy_to("leverage", Placement::ParentWorkspace(self.pool_source()))
    }

    /// A copy in the open workspace `id` of this thread (ND4J `leverageTo`); unchanged if
    /// it already lives there; an error if no such workspace exists.
    pub fn leverage_to(&self, id: &str) -> Result<Tensor> {
        if self.storage.stamp().is_some_and(|s| s.is_in(id)) {
            self.storage.check("leverage_to", "X")?;
            return Ok(self.clone());
        }
        self.copy_to("leverage_to", Placement::Workspace(id))
    }

    /// A copy in the current workspace, or detached if none is current (ND4J `migrate`).
    pub fn migrate(&self) -> Result<Tensor> {
        self.copy_to("migrate", Placement::CurrentWorkspace(self.pool_source()))
    }

    /// A contiguous copy placed by the allocation flow (ND4J `dup`).
    pub fn copy(&self) -> Result<Tensor> {
        self.copy_to("copy", Placement::Auto(Some(&*self.storage)))
    }

    /// Where pool copies of this tensor go: the source its bytes came from.
    fn pool_source(&self) -> MemorySource {
        self.storage.source()
    }

    /// A contiguous copy where `placement` says; the read checks the tensor (once).
    fn copy_to(&self, op: &str, placement: Placement<'_>) -> Result<Tensor> {
        with_dtype!(self.dtype, T => {
            // The copy's memory first, then the pin (see `Output`).
            self.storage.check(op, "X")?;
            let out = Self::output::<T>(op, &self.shape, placement)?;
            let pin = reclaim::pin();
            if let Some(source) = self.flat::<T>(op, "X", &pin)? {
                return out.fill_flat(op, |out| {
                    out.copy_from_slice(source);
                    Ok(())
                });
            }
            let source = self.array::<T>(op, "X", &pin)?;
            out.fill(op, |mut out| {
                out.assign(&source);
                Ok(())
            })
        })
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Tensor");
        s.field("dtype", &self.dtype).field("shape", &self.shape);
        if let Some(ws) = self.workspace() {
            s.field("workspace", &ws);
        }
        s.field("valid", &self.is_valid()).finish()
    }
}
