//! The CUDA side of device compute: small element-wise, reduction and softmax kernels in
//! CUDA C, compiled by NVRTC once per device and cached, and cuBLAS for matrix products.
//!
//! Invariant: the kernels are compiled and loaded at most once per device (the first op
//! that needs them), and a failure to do so (no NVRTC or cuBLAS library, a compile error)
//! is remembered and returned as `Error::Device`, never a panic. Every launch goes to the
//! device's one stream, so it is ordered with the device's copies and fences.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{result, sys, CudaModule};

use super::cuda::Cuda;
use crate::error::{Error, Result};

/// The kernels, in CUDA C (f32, contiguous row-major, grid-stride loops).
pub(crate) const SOURCE: &str = r#"
typedef unsigned long long u64;

extern "C" __global__ void nd_unary(const float* x, float* y, u64 n, int op) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float v = x[i];
        float r;
        switch (op) {
            case 0: r = v > 0.0f ? v : 0.0f; break;          // relu
            case 1: r = 1.0f / (1.0f + expf(-v)); break;     // sigmoid
            case 2: r = tanhf(v); break;                     // tanh
            case 3: r = expf(v); break;                      // exp
            case 4: r = logf(v); break;                      // log
            default: r = -v; break;                          // neg
        }
        y[i] = r;
    }
}

extern "C" __global__ void nd_affine(const float* x, float* y, u64 n, float alpha, float beta) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        y[i] = alpha * x[i] + beta;
    }
}

extern "C" __global__ void nd_binary(const float* a, u64 a_len, const float* b, u64 b_len,
                                     float* y, u64 n, int op) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float p = a[i % a_len];
        float q = b[i % b_len];
        float r;
        switch (op) {
            case 0: r = p + q; break;
            case 1: r = p - q; break;
            case 2: r = p * q; break;
            case 3: r = p / q; break;
            default: r = p > 0.0f ? q : 0.0f; break;         // relu backward: x, grad
        }
        y[i] = r;
    }
}

extern "C" __global__ void nd_axpy(float alpha, const float* x, float* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        y[i] += alpha * x[i];
    }
}

// One block of 256 threads per row.
extern "C" __global__ void nd_sum_rows(const float* x, float* out, u64 rows, u64 cols) {
    __shared__ float part[256];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        float acc = 0.0f;
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) acc += x[row * cols + j];
        part[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[row] = part[0];
        __syncthreads();
    }
}

extern "C" __global__ void nd_sum_cols(const float* x, float* out, u64 rows, u64 cols) {
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < cols; j += (u64)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (u64 i = 0; i < rows; i++) acc += x[i * cols + j];
        out[j] = acc;
    }
}

// One block of 256 threads per row; log != 0 gives log-softmax.
extern "C" __global__ void nd_softmax_rows(const float* x, float* y, u64 rows, u64 cols, int log) {
    __shared__ float part[256];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        float* yr = y + row * cols;
        float m = __int_as_float(0xff800000);  // -inf, without math headers
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
        part[threadIdx.x] = m;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
            __syncthreads();
        }
        m = part[0];
        __syncthreads();
        float acc = 0.0f;
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) acc += expf(xr[j] - m);
        part[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        float total = part[0];
        __syncthreads();
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) {
            yr[j] = log ? (xr[j] - m) - logf(total) : expf(xr[j] - m) / total;
        }
        __syncthreads();
    }
}
"#;

/// The kernel names, in the order of [`Kernel`].
const NAMES: [&str; 6] = [
    "nd_unary",
    "nd_affine",
    "nd_binary",
    "nd_axpy",
    "nd_sum_rows",
    "nd_sum_cols",
];

/// One of the compiled kernels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kernel {
    Unary = 0,
    Affine = 1,
    Binary = 2,
    Axpy = 3,
    SumRows = 4,
    SumCols = 5,
    Softmax = 6,
}

/// The loaded module and its functions.
#[derive(Debug)]
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    functions: [sys::CUfunction; 7],
}

// SAFETY: `CUfunction` handles are plain driver handles, valid from any thread while their
// module (held here) is loaded; the driver serialises launches on a stream.
unsafe impl Send for Kernels {}
// SAFETY: as above; nothing here is mutated after loading.
unsafe impl Sync for Kernels {}

/// Device compute state of one CUDA device: the kernels and a cuBLAS handle, made once.
#[derive(Debug, Default)]
pub(crate) struct Compute {
    kernels: OnceLock<std::result::Result<Kernels, String>>,
    blas: Mutex<Option<std::result::Result<CudaBlas, String>>>,
}

/// An argument of a kernel launch.
pub(crate) enum Arg {
    Ptr(u64),
    U64(u64),
    I32(i32),
    F32(f32),
}

impl Cuda {
    /// Loads the kernels and makes the cuBLAS handle now, if they are not yet: before a
    /// graph capture begins, since neither can be made on a capturing thread (creating a
    /// cuBLAS handle allocates device memory, and loading a module is refused during a
    /// capture by drivers before 12.3), and a failure is kept for the device's life.
    /// Failures are left for the operation that needs them to report.
    pub(crate) fn warm_up(&self) {
        let _ = self.kernels();
        drop(self.blas());
    }

    /// The cuBLAS handle, made on first use (or why there is none), under its lock.
    fn blas(&self) -> std::sync::MutexGuard<'_, Option<std::result::Result<CudaBlas, String>>> {
        let mut guard = self
            .compute()
            .blas
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            // SAFETY: only tries to open the cuBLAS library by its usual names.
            let present = unsafe { cudarc::cublas::sys::is_culib_present() };
            *guard = Some(if present {
                std::panic::catch_unwind(|| CudaBlas::new(self.stream().clone()))
                    .map_err(|_| "the cuBLAS library lacks a required function".to_string())
                    .and_then(|r| r.map_err(|e| format!("creating a cuBLAS handle: {e:?}")))
            } else {
                Err("no cuBLAS library found (libcublas.so could not be loaded)".into())
            });
        }
        guard
    }

    fn kernels(&self) -> Result<&Kernels> {
        self.compute()
            .kernels
            .get_or_init(|| self.load_kernels())
            .as_ref()
            .map_err(|message| Error::Device {
                device: self.ordinal(),
                message: message.clone(),
            })
    }

    fn load_kernels(&self) -> std::result::Result<Kernels, String> {
        // SAFETY: only tries to open the NVRTC library by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("no NVRTC library found (libnvrtc.so could not be loaded)".into());
        }
        // No fused multiply-adds: `y += alpha * x` rounds twice, as on the host and the
        // simulated device (NVRTC fuses by default, one rounding: a last-bit difference).
        let options = cudarc::nvrtc::CompileOptions {
            fmad: Some(false),
            ..Default::default()
        };
        let ptx =
            std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options))
                .map_err(|_| "the NVRTC library lacks a required function".to_string())?
                .map_err(|e| format!("compiling the device kernels: {e}"))?;
        let module = self
            .context()
            .load_module(ptx)
            .map_err(|e| format!("loading the device kernels: {e}"))?;
        let mut functions = [std::ptr::null_mut(); 7];
        let names = NAMES.iter().chain(std::iter::once(&"nd_softmax_rows"));
        for (slot, name) in functions.iter_mut().zip(names) {
            let f = module
                .load_function(name)
                .map_err(|e| format!("loading kernel {name}: {e}"))?;
            *slot = f.cu_function();
        }
        Ok(Kernels {
            _module: module,
            functions,
        })
    }

    /// Launches `kernel` on the device's stream with `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters, and every pointer argument is a live
    /// device range of this device as long as the kernel reads or writes through it.
    pub(crate) unsafe fn launch(
        &self,
        kernel: Kernel,
        grid: u32,
        block: u32,
        args: &mut [Arg],
    ) -> Result<()> {
        let f = self.kernels()?.functions[kernel as usize];
        self.bind_context()?;
        let stream = self.launch_stream();
        let mut params: Vec<*mut c_void> = args
            .iter_mut()
            .map(|a| match a {
                Arg::Ptr(p) | Arg::U64(p) => p as *mut u64 as *mut c_void,
                Arg::I32(v) => v as *mut i32 as *mut c_void,
                Arg::F32(v) => v as *mut f32 as *mut c_void,
            })
            .collect();
        // SAFETY: `f` is a function of the module `self` keeps loaded; `params` points at
        // one value per kernel parameter, alive until the call returns (the driver copies
        // them); the ranges are live by the caller's contract.
        unsafe {
            result::launch_kernel(
                f,
                (grid.max(1), 1, 1),
                (block, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| Error::Device {
            device: self.ordinal(),
            message: format!("launching {kernel:?}: {e}"),
        })
    }

    /// Row-major `c[m, n] = op(a) op(b)` in f32 through cuBLAS (`op` transposes when asked).
    ///
    /// # Safety
    /// `a`, `b` and `c` are live device ranges of this device holding at least `m*k`,
    /// `k*n` and `m*n` floats.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn sgemm(
        &self,
        a: u64,
        b: u64,
        c: u64,
        m: usize,
        k: usize,
        n: usize,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<()> {
        let err = |message: String| Error::Device {
            device: self.ordinal(),
            message,
        };
        let to_i32 =
            |d: usize| i32::try_from(d).map_err(|_| err(format!("matmul: {d} exceeds i32")));
        let (m, k, n) = (to_i32(m)?, to_i32(k)?, to_i32(n)?);
        let guard = self.blas();
        let blas = match guard.as_ref() {
            Some(Ok(blas)) => blas,
            Some(Err(message)) => return Err(err(message.clone())),
            None => return Err(err("no cuBLAS handle".into())),
        };
        self.bind_context()?;
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // The handle follows the stream kernels go to (a capture's, while one is under way).
        let stream = self.launch_stream();
        // SAFETY: the handle is this device's and the stream a live stream of its context.
        unsafe { cudarc::cublas::result::set_stream(*blas.handle(), stream.cu_stream() as _) }
            .map_err(|e| err(format!("cublasSetStream: {e:?}")))?;
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
        let lda = if trans_a { m } else { k };
        let ldb = if trans_b { k } else { n };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the handle is bound to this device's stream; the ranges hold the floats
        // the dimensions say (the caller's contract); alpha and beta live across the call.
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                op(trans_b),
                op(trans_a),
                n,
                m,
                k,
                &alpha,
                b as *const f32,
                ldb,
                a as *const f32,
                lda,
                &beta,
                c as *mut f32,
                n,
            )
        }
        .map_err(|e| err(format!("cublasSgemm: {e:?}")))
    }
}
