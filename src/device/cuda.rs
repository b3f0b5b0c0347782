//! The `cuda` backend: one CUDA context per device through cudarc, loaded at run time, so
//! the crate builds and runs where no CUDA toolkit or driver is installed (semantics §5).
//!
//! Invariant: nothing here panics on a missing or failing driver. The driver library's
//! presence is checked before any driver call (cudarc panics on a missing library), the
//! context is created under `catch_unwind` (a driver too old for a symbol panics in
//! cudarc), and every driver error becomes `Error::NoDevice` (no usable device) or
//! `Error::Device` (a device that failed) with the driver's message, but `cuMemAlloc`'s
//! refusal for want of memory, which the device pool reports as its out-of-memory error.
//! All work goes to the context's default (null) stream, so copies, kernels and events are
//! ordered with each other; copies to and from the host are synchronous with respect to
//! it, and a device-to-device copy or a memset is waited for by its caller when it touches
//! pinned host memory (`Device::copy`, `Device::fill`). A graph capture is the one
//! exception: kernels launched while one is under way go to a stream of its own (the
//! legacy stream cannot be captured), which waits for the default stream's work before a
//! replay and makes the default stream wait for the replay after it, so the order holds.

#![allow(unsafe_code)]

use std::sync::Arc;

use std::sync::{Mutex, PoisonError};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaGraph, CudaStream, DriverError};

use super::backend::DriverRefusal;
use crate::error::{Error, Result};

/// A CUDA device: its context and the stream all of its work goes to.
#[derive(Debug)]
pub(crate) struct Cuda {
    ordinal: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compute: super::kernels::Compute,
    /// The thread capturing a graph and the stream it records on (`None`: no capture).
    capturing: Mutex<Option<(std::thread::ThreadId, Arc<CudaStream>)>>,
    /// Whether `capturing` holds a stream, so a launch outside a capture takes no lock.
    capture_on: std::sync::atomic::AtomicBool,
}

/// A captured, instantiated CUDA graph and the stream it replays on.
pub(crate) struct CudaGraphExec {
    graph: CudaGraph,
    stream: Arc<CudaStream>,
}

// SAFETY: CUDA graph objects must not be used from two threads at once; a replay needs the
// exclusive borrow of the graph's memory (`GraphMemory::launch(&mut self, ..)`), and the
// graph is destroyed only by its owner, so its uses are serialised.
unsafe impl Send for CudaGraphExec {}
// SAFETY: as for `Send`: shared references only reach the graph through that exclusive
// borrow.
unsafe impl Sync for CudaGraphExec {}

impl std::fmt::Debug for CudaGraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraphExec").finish_non_exhaustive()
    }
}

/// Says whether the CUDA driver library can be loaded, with the reason when it cannot.
pub(crate) fn driver_present() -> Result<()> {
    // SAFETY: `is_culib_present` only tries to open the driver library by its usual names
    // (and closes it again); it calls nothing in it.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::NoDevice {
            reason: "no CUDA driver found (libcuda.so could not be loaded)".into(),
        })
    }
}

/// The number of CUDA devices, `Error::NoDevice` without a driver.
pub(crate) fn device_count() -> Result<u32> {
    driver_present()?;
    let count = std::panic::catch_unwind(|| -> Result<i32, DriverError> {
        result::init()?;
        result::device::get_count()
    })
    .map_err(|_| no_device("the CUDA driver library lacks a required function"))?
    .map_err(|e| no_device(&format!("the CUDA driver failed to initialise: {e}")))?;
    Ok(count.max(0) as u32)
}

fn no_device(reason: &str) -> Error {
    Error::NoDevice {
        reason: reason.into(),
    }
}

impl Cuda {
    /// Opens device `ordinal` (its primary context).
    pub(crate) fn open(ordinal: u32) -> Result<Cuda> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(no_device(&format!(
                "CUDA device {ordinal} does not exist ({count} device(s) found)"
            )));
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal as usize))
            .map_err(|_| no_device("the CUDA driver library lacks a required function"))?
            .map_err(|e| no_device(&format!("CUDA device {ordinal} cannot be opened: {e}")))?;
        let stream = ctx.default_stream();
        Ok(Cuda {
            ordinal,
            ctx,
            stream,
            compute: Default::default(),
            capturing: Mutex::new(None),
            capture_on: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn err(&self, what: &str, e: DriverError) -> Error {
        Error::Device {
            device: self.ordinal,
            message: format!("{what}: {e}"),
        }
    }

    /// The device's ordinal.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The kernels and cuBLAS handle of this device.
    pub(crate) fn compute(&self) -> &super::kernels::Compute {
        &self.compute
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind_context(&self) -> Result<()> {
        self.bind()
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("binding the context", e))
    }

    /// The device's name, as the driver reports it.
    pub(crate) fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {}", self.ordinal))
    }

    /// `(free, total)` bytes of device memory.
    pub(crate) fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| self.err("reading memory info", e))
    }

    /// `cuMemAlloc` of `bytes` (aligned to at least 256 bytes by the driver).
    pub(crate) fn malloc(&self, bytes: usize) -> Result<u64, DriverRefusal> {
        let refusal = |error, out_of_memory| DriverRefusal {
            error: Box::new(error),
            out_of_memory,
        };
        self.bind().map_err(|e| refusal(e, false))?;
        // SAFETY: the memory is returned uninitialised; it is handed out as bytes that a
        // copy or a kernel writes before anything reads them.
        unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            let out_of_memory = e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            refusal(self.err("cuMemAlloc", e), out_of_memory)
        })
    }

    /// `cuMemFree`.
    ///
    /// # Safety
    /// `ptr` came from [`Cuda::malloc`] and no queued work uses it any more.
    pub(crate) unsafe fn free(&self, ptr: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract.
        unsafe { result::free_sync(ptr) }.map_err(|e| self.err("cuMemFree", e))
    }

    /// Copies `bytes` from host memory to device memory; returns when the source may be
    /// reused.
    ///
    /// # Safety
    /// `src` is readable for `bytes` bytes and `dst` is device memory of this context
    /// writable for `bytes` bytes.
    pub(crate) unsafe fn copy_htod(&self, src: *const u8, dst: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract, `src` is readable for `bytes`.
        let src = unsafe { std::slice::from_raw_parts(src, bytes) };
        // SAFETY: by the caller's contract, `dst` is writable for `bytes`.
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(|e| self.err("cuMemcpyHtoD", e))
    }

    /// Copies `bytes` from device memory to host memory; returns when they have arrived.
    ///
    /// # Safety
    /// `src` is device memory of this context readable for `bytes` bytes and `dst` is
    /// writable for `bytes` bytes and not otherwise accessed meanwhile.
    pub(crate) unsafe fn copy_dtoh(&self, src: u64, dst: *mut u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract, `dst` is writable and exclusively ours.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        // SAFETY: by the caller's contract, `src` is readable for `bytes`.
        // `cuMemcpyDtoH` returns once the bytes have arrived, pinned destination or not.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(|e| self.err("cuMemcpyDtoH", e))
    }

    /// Copies `bytes` between two device ranges of this context.
    ///
    /// # Safety
    /// Both ranges are device memory of this context, valid for `bytes` bytes.
    pub(crate) unsafe fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }
            .map_err(|e| self.err("cuMemcpyDtoD", e))
    }

    /// Sets `bytes` of device memory to `value`.
    ///
    /// # Safety
    /// `dst` is device memory of this context writable for `bytes` bytes.
    pub(crate) unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract.
        unsafe { result::memset_d8_sync(dst, value, bytes) }.map_err(|e| self.err("cuMemsetD8", e))
    }

    /// Sets `bytes` of device memory to `value` on the stream kernels go to (a capture's,
    /// on the capturing thread): ordered with the kernels, and capturable.
    ///
    /// # Safety
    /// `dst` is device memory of this context writable for `bytes` bytes until the memset
    /// has run.
    pub(crate) unsafe fn memset_launched(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream = self.launch_stream();
        // SAFETY: by the caller's contract; the stream is a live stream of this context.
        unsafe { result::memset_d8_async(dst, value, bytes, stream.cu_stream()) }
            .map_err(|e| self.err("cuMemsetD8Async", e))
    }

    /// Waits for all work queued on the device.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronizing", e))
    }

    /// Page-locked host memory mapped into the device's address space.
    pub(crate) fn malloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        // SAFETY: the memory is returned uninitialised and handed out as bytes (`u8` is
        // valid for any bit pattern once written; the callers zero or copy into it first).
        let ptr = unsafe {
            result::malloc_host(
                bytes,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        }
        .map_err(|e| self.err("cuMemHostAlloc", e))?;
        Ok(ptr.cast())
    }

    /// The device address of pinned host memory from [`Cuda::malloc_pinned`].
    pub(crate) fn pinned_device_ptr(&self, ptr: *mut u8) -> Result<u64> {
        self.bind()?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` was allocated with `CU_MEMHOSTALLOC_DEVICEMAP` in this context and
        // `dptr` is a valid place for the result; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr.cast(), 0) }
            .result()
            .map_err(|e| self.err("cuMemHostGetDevicePointer", e))?;
        Ok(dptr)
    }

    /// Frees pinned memory.
    ///
    /// # Safety
    /// `ptr` came from [`Cuda::malloc_pinned`] and no queued work uses it any more.
    pub(crate) unsafe fn free_pinned(&self, ptr: *mut u8) -> Result<()> {
        self.bind()?;
        // SAFETY: by the caller's contract.
        unsafe { result::free_host(ptr.cast()) }.map_err(|e| self.err("cuMemFreeHost", e))
    }

    /// An event recorded after all work queued so far.
    pub(crate) fn record_event(&self) -> Result<CudaEvent> {
        let event = self
            .ctx
            .new_event(None)
            .map_err(|e| self.err("cuEventCreate", e))?;
        event
            .record(&self.stream)
            .map_err(|e| self.err("cuEventRecord", e))?;
        Ok(event)
    }

    /// Waits for `event`.
    pub(crate) fn wait(&self, event: &CudaEvent) -> Result<()> {
        event
            .synchronize()
            .map_err(|e| self.err("cuEventSynchronize", e))
    }

    /// Whether the work before `event` has finished.
    pub(crate) fn is_complete(&self, event: &CudaEvent) -> Result<bool> {
        event
            .try_is_complete()
            .map_err(|e| self.err("cuEventQuery", e))
    }

    /// The context, for the kernels and cuBLAS.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all work goes to.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream kernels and cuBLAS go to now: the capture's on the capturing thread while
    /// one is under way, the device's otherwise. (Another thread's operation is refused
    /// during a capture when it checks its operands; one that passed that check just before
    /// the capture began runs on the device's stream, never into the graph.)
    pub(crate) fn launch_stream(&self) -> Arc<CudaStream> {
        if !self.capture_on.load(std::sync::atomic::Ordering::Acquire) {
            return Arc::clone(&self.stream);
        }
        let me = std::thread::current().id();
        self.capturing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|(thread, _)| *thread == me)
            .map(|(_, stream)| Arc::clone(stream))
            .unwrap_or_else(|| Arc::clone(&self.stream))
    }

    /// Starts recording the kernels launched from now on (from this thread) into a graph,
    /// on a stream of its own that first waits for the work queued so far.
    pub(crate) fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        self.warm_up();
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| self.err("creating the capture stream", e))?;
        stream
            .join(&self.stream)
            .map_err(|e| self.err("ordering the capture stream", e))?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| self.err("cuStreamBeginCapture", e))?;
        *self
            .capturing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((std::thread::current().id(), stream));
        self.capture_on
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Ends the capture begun by [`Cuda::begin_capture`] and instantiates its graph
    /// (`None` when nothing was captured).
    pub(crate) fn end_capture(&self) -> Result<Option<CudaGraphExec>> {
        let stream = self
            .capturing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.capture_on
            .store(false, std::sync::atomic::Ordering::Release);
        let Some((_, stream)) = stream else {
            return Ok(None);
        };
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.err("cuStreamEndCapture", e))?;
        Ok(graph.map(|graph| CudaGraphExec { graph, stream }))
    }

    /// Replays `exec` after the work queued so far; the default stream's later work waits
    /// for it.
    pub(crate) fn launch_graph(&self, exec: &CudaGraphExec) -> Result<()> {
        self.bind()?;
        exec.stream
            .join(&self.stream)
            .map_err(|e| self.err("ordering the graph launch", e))?;
        exec.graph
            .launch()
            .map_err(|e| self.err("cuGraphLaunch", e))?;
        self.stream
            .join(&exec.stream)
            .map_err(|e| self.err("ordering after the graph launch", e))
    }
}
