//! Tensors on a device (semantics §5.8): moving a tensor to a device and back, and the ops
//! that run there. A device tensor's home is device memory ([`Home::device`]); its host
//! copy is made on demand, so every host-side op still works on it (after a counted
//! download). The f32 ops with a device kernel run on the device of their first device
//! input and return a device tensor; an operand on the host or on another device is copied
//! there first (counted). Everything else runs on the host.
//!
//! Invariant: a device op reads device ranges that are current (uploaded first when the
//! host side was written) from tensors it borrows for its whole duration, and writes only a
//! fresh output, or, in place, the device side of the only handle to the memory.

use super::storage::Placement;
use super::{contiguous_layout, contiguous_strides, DType, Dims, Tensor};
use crate::device::slot::{DeviceSlot, RawRange};
use crate::device::{BinaryOp, Device, UnaryOp};
use crate::error::{Error, Result};
use crate::memory::home::Home;
use crate::memory::owner::{Fresh, Owned};
use crate::reclaim;

/// An operand of a device op: its range, and the copy made to bring it there, if any.
struct Operand {
    range: RawRange,
    /// Keeps a copy on the op's device alive for the op.
    _copy: Option<Tensor>,
}

impl Tensor {
    /// The device this tensor's memory lives on, if any.
    pub fn device(&self) -> Option<Device> {
        self.storage.device_slot().map(|s| s.device().clone())
    }

    /// Whether this tensor's memory lives on a device.
    pub fn is_on_device(&self) -> bool {
        self.storage.device_slot().is_some()
    }

    /// A copy on `device` (one counted upload; through the host, counted on both, from
    /// another device), or this tensor if it already lives there.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device().as_ref() == Some(device) {
            self.storage.check("to_device", "X")?;
            return Ok(self.clone());
        }
        let host = if self.is_contiguous() && self.offset == 0 {
            self.clone()
        } else {
            self.copy()?
        };
        let used = self.len() * self.dtype.size();
        host.storage.check("to_device", "X")?;
        // Allocated outside the pin, which covers the read alone (see `Output`).
        let slot = DeviceSlot::upload_with(device, used, |dest| {
            let pin = reclaim::pin();
            let bytes = host.storage.read("to_device", "X", &pin)?;
            // A contiguous host tensor from its first byte: its memory holds `used` bytes.
            let n = used.min(bytes.len());
            dest[..n].copy_from_slice(&bytes[..n]);
            Ok(())
        })?;
        Ok(Tensor {
            storage: Fresh::new(Home::device(slot)).share(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: contiguous_strides("to_device", &self.shape)?,
            offset: 0,
        })
    }

    /// A copy in host pool memory (one counted download if the host copy is stale), or
    /// this tensor if it is not on a device.
    pub fn to_host(&self) -> Result<Tensor> {
        if !self.is_on_device() {
            self.storage.check("to_host", "X")?;
            return Ok(self.clone());
        }
        self.copy_to(
            "to_host",
            Placement::Pool {
                source: self.storage.source(),
                owner: None,
            },
        )
    }

    /// The device a binary op runs on: the first operand's, else the second's.
    fn op_device(&self, other: Option<&Tensor>) -> Option<Device> {
        self.device().or_else(|| other.and_then(Tensor::device))
    }

    /// This tensor's f32 elements on `device`, contiguous (row-major, as its strides read
    /// them) from the range's start.
    fn operand(&self, device: &Device, op: &str, arg: &str) -> Result<Operand> {
        let here = self.device().as_ref() == Some(device);
        if here && self.is_contiguous() {
            self.storage.check(op, arg)?;
            if let Some(slot) = self.storage.device_slot() {
                let range = slot.device_range(false)?.offset(self.offset * 4);
                return Ok(Operand { range, _copy: None });
            }
        }
        // A view of device memory in another layout (a transpose, a broadcast, an offset
        // view that is not row-major) is not its buffer read in order: its elements are
        // gathered on the host copy (a counted download if that is stale) and uploaded as a
        // contiguous tensor (counted). Elsewhere, `to_device` makes the same copy.
        let copy = if here {
            let placement = Placement::Pool {
                source: self.storage.source(),
                owner: None,
            };
            self.copy_to(op, placement)?.to_device(device)?
        } else {
            self.to_device(device)?
        };
        let range = match copy.storage.device_slot() {
            Some(slot) => slot.device_range(false)?,
            None => {
                return Err(Error::Device {
                    device: device.ordinal(),
                    message: format!("Op [{op}]: {arg} argument could not be copied to the device"),
                })
            }
        };
        Ok(Operand {
            range,
            _copy: Some(copy),
        })
    }

    /// A fresh f32 device tensor of `shape`, written by `write` on `device`.
    fn device_output(
        device: &Device,
        op: &str,
        shape: &[usize],
        write: impl FnOnce(&mut RawRange) -> Result<()>,
    ) -> Result<Tensor> {
        let (n, strides) = contiguous_layout(op, shape, 4)?;
        let slot = DeviceSlot::for_output(device, (n * 4).max(4))?;
        let mut range = slot.device_range(true)?;
        write(&mut range)?;
        Ok(Tensor {
            storage: Fresh::new(Home::device(slot)).share(),
            dtype: DType::F32,
            shape: Dims::from_slice(shape),
            strides,
            offset: 0,
        })
    }

    /// Whether an op on these f32 operands runs on a device (and which).
    fn device_for(&self, other: Option<&Tensor>) -> Option<Device> {
        let device = self.op_device(other)?;
        let f32s = self.dtype == DType::F32 && other.map_or(true, |o| o.dtype == DType::F32);
        f32s.then_some(device)
    }

    /// `op(self, other)` on the device, if one applies and the shapes are the same, a row
    /// broadcast (`other` is the last axis) or a scalar; `None`: run it on the host.
    pub(crate) fn device_binary(
        &self,
        name: &str,
        op: BinaryOp,
        other: &Tensor,
    ) -> Option<Result<Tensor>> {
        let device = self.device_for(Some(other))?;
        let n = self.len();
        let b_len = other.len();
        let row = self.ndim() >= 1 && other.shape() == &self.shape()[self.ndim() - 1..];
        let row2 = other.ndim() == 2
            && other.shape()[0] == 1
            && self.ndim() == 2
            && other.shape()[1] == self.shape()[1];
        // A second operand of higher rank broadcasts the first (the output takes its
        // rank): that runs on the host (semantics §5.8).
        if !(other.shape() == self.shape() || row || row2 || b_len == 1)
            || other.ndim() > self.ndim()
            || n == 0
        {
            return None;
        }
        let shape = self.shape.clone();
        Some((|| {
            let a = self.operand(&device, name, "X")?;
            let b = other.operand(&device, name, "Y")?;
            Tensor::device_output(&device, name, &shape, |out| {
                device.binary_f32(op, &a.range, n, &b.range, b_len, out, n)
            })
        })())
    }

    /// `op(self)` on the device, if this is a device f32 tensor.
    pub(crate) fn device_unary(&self, name: &str, op: UnaryOp) -> Option<Result<Tensor>> {
        let device = self.device_for(None)?;
        Some((|| {
            let x = self.operand(&device, name, "X")?;
            let n = self.len();
            Tensor::device_output(&device, name, &self.shape.clone(), |out| {
                device.unary_f32(op, &x.range, out, n)
            })
        })())
    }

    /// `alpha * self + beta` on the device, if this is a device f32 tensor.
    pub(crate) fn device_affine(
        &self,
        name: &str,
        alpha: f32,
        beta: f32,
    ) -> Option<Result<Tensor>> {
        let device = self.device_for(None)?;
        Some((|| {
            let x = self.operand(&device, name, "X")?;
            let n = self.len();
            Tensor::device_output(&device, name, &self.shape.clone(), |out| {
                device.affine_f32(&x.range, out, n, alpha, beta)
            })
        })())
    }

    /// Sum or mean over `axis` of a 1-d or 2-d device f32 tensor; `None`: on the host.
    pub(crate) fn device_reduce(
        &self,
        name: &str,
        axis: Option<usize>,
        mean: bool,
    ) -> Option<Result<Tensor>> {
        let device = self.device_for(None)?;
        let (rows, cols, sum_axis, shape): (usize, usize, usize, Vec<usize>) =
            match (self.ndim(), axis) {
                (1, None | Some(0)) => (1, self.shape[0], 1, vec![]),
                (2, None) => (1, self.len(), 1, vec![]),
                (2, Some(0)) => (self.shape[0], self.shape[1], 0, vec![self.shape[1]]),
                (2, Some(1)) => (self.shape[0], self.shape[1], 1, vec![self.shape[0]]),
                _ => return None,
            };
        let lanes = if sum_axis == 1 { cols } else { rows };
        if lanes == 0 || rows * cols == 0 {
            return None;
        }
        Some((|| {
            let x = self.operand(&device, name, "X")?;
            let sums = Tensor::device_output(&device, name, &shape, |out| {
                device.sum_f32(&x.range, out, rows, cols, sum_axis)
            })?;
            if !mean {
                return Ok(sums);
            }
            sums.device_affine(name, 1.0 / lanes as f32, 0.0)
                .unwrap_or_else(|| {
                    Err(Error::Device {
                        device: device.ordinal(),
                        message: format!("Op [{name}]: the sums left the device"),
                    })
                })
        })())
    }

    /// Softmax (or log-softmax) over the last axis of a device f32 tensor.
    pub(crate) fn device_softmax(
        &self,
        name: &str,
        axis: usize,
        log: bool,
    ) -> Option<Result<Tensor>> {
        let device = self.device_for(None)?;
        if self.ndim() == 0 || axis + 1 != self.ndim() || self.is_empty() {
            return None;
        }
        let cols = self.shape[axis];
        let rows = self.len() / cols;
        Some((|| {
            let x = self.operand(&device, name, "X")?;
            Tensor::device_output(&device, name, &self.shape.clone(), |out| {
                device.softmax_f32(&x.range, out, rows, cols, log)
            })
        })())
    }

    /// Matrix product on the device (cuBLAS on CUDA); a transposed view is passed as a
    /// transposed operand, not copied.
    pub(crate) fn device_matmul(&self, other: &Tensor) -> Option<Result<Tensor>> {
        let device = self.device_for(Some(other))?;
        let (m, k, n) = (self.shape[0], self.shape[1], other.shape[1]);
        // Each is a dimension of a tensor; their product may overflow, their test cannot.
        if m == 0 || k == 0 || n == 0 {
            return None;
        }
        Some((|| {
            let (a, ta) = self.matrix_operand(&device, "X")?;
            let (b, tb) = other.matrix_operand(&device, "Y")?;
            Tensor::device_output(&device, "matmul", &[m, n], |out| {
                device.matmul_f32(&a.range, &b.range, out, m, k, n, ta, tb)
            })
        })())
    }

    /// A 2-d operand for a matrix product: contiguous, or the transpose of a contiguous
    /// matrix (then `true`).
    fn matrix_operand(&self, device: &Device, arg: &str) -> Result<(Operand, bool)> {
        let transposed = self.ndim() == 2
            && self.strides[0] == 1
            && self.strides[1] == self.shape[0]
            && self.shape[0] > 1
            && self.device().as_ref() == Some(device);
        if transposed {
            self.storage.check("matmul", arg)?;
            if let Some(slot) = self.storage.device_slot() {
                let range = slot.device_range(false)?.offset(self.offset * 4);
                return Ok((Operand { range, _copy: None }, true));
            }
        }
        Ok((self.operand(device, "matmul", arg)?, false))
    }

    /// `self += alpha * x` (or `self = x`, for `assign`) on the device, for the only handle
    /// of a contiguous device f32 tensor and an `x` of its shape.
    pub(crate) fn device_update(
        &mut self,
        name: &str,
        alpha: Option<f32>,
        x: &Tensor,
    ) -> Option<Result<()>> {
        let device = self.device()?;
        if self.dtype != DType::F32 || x.dtype != DType::F32 || x.shape() != self.shape() {
            return None;
        }
        if !self.is_contiguous() || self.offset != 0 {
            return None;
        }
        let n = self.len();
        Some((|| {
            let src = x.operand(&device, name, "Y")?;
            let slot = Owned::device_exclusive(&mut self.storage, name)?;
            let mut dst = slot.device_range(true)?;
            match alpha {
                Some(alpha) => device.axpy_f32(alpha, &src.range, &mut dst, n),
                None => device.copy(&src.range.prefix(n * 4), &mut dst),
            }
        })())
    }
}
