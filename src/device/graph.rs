//! Device graphs (semantics §5.9): a sequence of device operations captured once and
//! replayed on the same addresses, CUDA graphs on `cuda` and a recorded list of the same
//! operations on `sim`. A learned device workspace hands out the same addresses every
//! cycle; a [`GraphMemory`] makes that a guarantee the type system keeps.
//!
//! Invariant: every operand of a captured operation lies inside the [`GraphMemory`] it was
//! captured on (checked when the operation is captured, on the capturing thread only), and
//! a graph replays only through the exclusive borrow of that same memory
//! ([`GraphMemory::launch`]), so a replay reads and writes live memory that nothing else
//! touches meanwhile. Nothing is allocated, copied between host and device or waited for
//! while a capture is under way on its thread: those calls fail with `Error::Device`.

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;
use std::thread::ThreadId;

use super::backend::Backend;
use super::pool::DeviceBuffer;
use super::slot::RawRange;
use super::stats::bump;
use super::{misuse, Device, Inner};
use crate::error::{Error, Result};

/// Alignment of the regions carved from a [`GraphMemory`] (as `cudaMalloc` aligns).
pub const REGION_ALIGN: usize = 256;

/// An operation of a `sim` graph: the same arithmetic, on the addresses it was captured
/// with.
pub(crate) type SimOp = Box<dyn Fn() + Send + Sync>;

/// A capture under way on a device.
pub(crate) struct Capture {
    /// The thread that captures; operations from others are refused meanwhile.
    pub(crate) thread: ThreadId,
    /// The graph memory's device range, `[start, end)`.
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The operations captured (recorded for `sim`; counted for both).
    pub(crate) ops: Vec<SimOp>,
    pub(crate) launches: usize,
}

impl Inner {
    /// Whether the calling thread is capturing a graph on this device.
    pub(crate) fn capturing_here(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
            && self
                .capture
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(|c| c.thread == std::thread::current().id())
    }

    /// `Error::Device` for `what` on the capturing thread (allocations, copies and waits
    /// cannot be part of a graph).
    pub(crate) fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing_here() {
            return Err(misuse(
                self.ordinal,
                format!("{what} cannot be part of a graph: do it before the capture or between launches"),
            ));
        }
        Ok(())
    }

    /// `Error::Device` for `what` while another thread captures on this device (a replay
    /// from another thread would run, or on `cuda` be recorded, in the middle of it). A
    /// capture that begins just after this check finds the replay queued before it.
    pub(crate) fn refuse_other_capture(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Acquire)
            && self
                .capture
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
        {
            return Err(misuse(
                self.ordinal,
                format!("{what}: the device is capturing a graph on another thread"),
            ));
        }
        Ok(())
    }

    /// While a capture is under way: an operand of `bytes` at `ptr` must be in its memory,
    /// and the operation must come from the capturing thread. `Ok(true)`: the operation
    /// is captured (not run now).
    pub(crate) fn check_captured(&self, op: &str, ptr: u64, bytes: usize) -> Result<bool> {
        if !self.capturing.load(Ordering::Acquire) {
            return Ok(false);
        }
        let capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = capture.as_ref() else {
            return Ok(false);
        };
        if c.thread != std::thread::current().id() {
            return Err(misuse(
                self.ordinal,
                format!("{op}: the device is capturing a graph on another thread"),
            ));
        }
        let end = ptr.checked_add(bytes as u64);
        if ptr < c.start || end.map_or(true, |e| e > c.end) {
            return Err(misuse(
                self.ordinal,
                format!("{op}: an operand outside the graph's memory cannot be captured (a replay could outlive it)"),
            ));
        }
        Ok(true)
    }

    /// Runs a `sim` operation now, or records it in the capture under way on this thread.
    pub(crate) fn sim_run(&self, op: impl Fn() + Send + Sync + 'static) {
        if self.capturing.load(Ordering::Acquire) {
            let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = capture
                .as_mut()
                .filter(|c| c.thread == std::thread::current().id())
            {
                c.ops.push(Box::new(op));
                return;
            }
        }
        op();
    }

    /// Counts an operation: a kernel launch now, or one more operation of the capture.
    pub(crate) fn count_launch(&self) {
        if self.capturing.load(Ordering::Acquire) {
            let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = capture
                .as_mut()
                .filter(|c| c.thread == std::thread::current().id())
            {
                c.launches += 1;
                return;
            }
        }
        bump(&self.counters.kernel_launches, 1);
    }
}

/// A region of a [`GraphMemory`]: `len` bytes at `offset`. Copy it freely; it is checked
/// against its memory on every use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    memory: u64,
    offset: usize,
    len: usize,
}

impl Region {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its length in `f32`s.
    pub fn floats(&self) -> usize {
        self.len / 4
    }

    /// Whether the two regions share bytes: in the same graph memory, at overlapping
    /// offsets (regions of two memories never overlap; using one with the other memory is
    /// refused as such).
    fn overlaps(&self, other: &Region) -> bool {
        self.memory == other.memory
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }
}

/// A region of a [`GraphMemory`], readable by device operations while the memory is
/// borrowed.
#[derive(Debug, Clone, Copy)]
pub struct RegionRef<'a> {
    range: RawRange,
    _memory: std::marker::PhantomData<&'a GraphMemory>,
}

/// A region of a [`GraphMemory`], writable by device operations while the memory is
/// borrowed exclusively.
#[derive(Debug)]
pub struct RegionMut<'a> {
    range: RawRange,
    _memory: std::marker::PhantomData<&'a mut GraphMemory>,
}

super::device_memory_by!(RegionRef<'_>, range);
super::device_memory_by!(RegionMut<'_>, range);
impl super::DeviceMemoryMut for RegionMut<'_> {}

static NEXT_MEMORY: AtomicU64 = AtomicU64::new(1);

/// Device memory that graphs are captured on ([`GraphMemory::capture`]) and replayed
/// against ([`GraphMemory::launch`]): one buffer of the device's pool, carved into
/// [`Region`]s (semantics §5.9).
pub struct GraphMemory {
    device: Device,
    buffer: DeviceBuffer,
    used: usize,
    id: u64,
}

impl fmt::Debug for GraphMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphMemory")
            .field("device", &self.device.ordinal())
            .field("bytes", &self.buffer.len())
            .field("used", &self.used)
            .finish()
    }
}

/// Operations captured once, replayed by [`GraphMemory::launch`].
pub struct Graph {
    memory: u64,
    ops: usize,
    inner: GraphInner,
}

enum GraphInner {
    Sim(Vec<SimOp>),
    #[cfg(feature = "cuda")]
    Cuda(Option<super::cuda::CudaGraphExec>),
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").field("ops", &self.ops).finish()
    }
}

impl Graph {
    /// The device operations it replays.
    pub fn ops(&self) -> usize {
        self.ops
    }
}

impl Device {
    /// `bytes` of device memory (from the device's pool, counted as tensor memory) for
    /// graphs to be captured on.
    pub fn graph_memory(&self, bytes: usize) -> Result<GraphMemory> {
        let buffer = self.allocate(bytes)?;
        Ok(GraphMemory {
            device: self.clone(),
            buffer,
            used: 0,
            id: NEXT_MEMORY.fetch_add(1, Ordering::Relaxed),
        })
    }
}

impl GraphMemory {
    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Its size in bytes.
    pub fn capacity(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes carved into regions so far.
    pub fn used(&self) -> usize {
        self.used
    }

    /// The next `bytes` (aligned to [`REGION_ALIGN`]); `Error::Device` when they do not
    /// fit.
    pub fn region(&mut self, bytes: usize) -> Result<Region> {
        let offset = self.used.next_multiple_of(REGION_ALIGN);
        let end = offset
            .checked_add(bytes)
            .filter(|e| *e <= self.buffer.len());
        let Some(end) = end else {
            return Err(misuse(
                self.device.ordinal(),
                format!(
                    "a region of {bytes} bytes does not fit in the graph memory ({} of {} bytes used)",
                    self.used,
                    self.buffer.len()
                ),
            ));
        };
        self.used = end;
        Ok(Region {
            memory: self.id,
            offset,
            len: bytes,
        })
    }

    /// A region of `n` `f32`s.
    pub fn floats(&mut self, n: usize) -> Result<Region> {
        let bytes = n.checked_mul(4).ok_or_else(|| Error::Shape {
            op: "graph region".into(),
            message: format!("{n} floats overflow"),
        })?;
        self.region(bytes)
    }

    fn range(&self, region: Region) -> Result<RawRange> {
        if region.memory != self.id {
            return Err(misuse(
                self.device.ordinal(),
                "a region of another graph memory".into(),
            ));
        }
        Ok(RawRange::of(&self.buffer)
            .offset(region.offset)
            .prefix(region.len))
    }

    /// `region`, readable.
    pub fn get(&self, region: Region) -> Result<RegionRef<'_>> {
        Ok(RegionRef {
            range: self.range(region)?,
            _memory: std::marker::PhantomData,
        })
    }

    /// `region`, writable.
    pub fn get_mut(&mut self, region: Region) -> Result<RegionMut<'_>> {
        Ok(RegionMut {
            range: self.range(region)?,
            _memory: std::marker::PhantomData,
        })
    }

    /// The operands of one operation: `inputs` readable, `output` writable; the output
    /// must not overlap an input (an operation never reads what it writes).
    pub fn operands<const N: usize>(
        &mut self,
        inputs: [Region; N],
        output: Region,
    ) -> Result<([RegionRef<'_>; N], RegionMut<'_>)> {
        // Each region is checked to be of this memory first, so a foreign one is refused
        // as such, whatever its offsets.
        let out = self.range(output)?;
        let mut ranges = [out; N];
        for (range, region) in ranges.iter_mut().zip(inputs) {
            *range = self.range(region)?;
        }
        if let Some(i) = inputs.iter().position(|r| r.overlaps(&output)) {
            return Err(misuse(
                self.device.ordinal(),
                format!("the output region overlaps input {i}"),
            ));
        }
        let refs = ranges.map(|range| RegionRef {
            range,
            _memory: std::marker::PhantomData,
        });
        Ok((
            refs,
            RegionMut {
                range: out,
                _memory: std::marker::PhantomData,
            },
        ))
    }

    /// Copies `data` into `region` (which must be exactly as long).
    pub fn upload(&mut self, region: Region, data: &[u8]) -> Result<()> {
        if data.len() != region.len {
            return Err(Error::Shape {
                op: "graph upload".into(),
                message: format!("{} bytes into a region of {}", data.len(), region.len),
            });
        }
        let mut range = self.range(region)?;
        self.device.upload(data, &mut range)
    }

    /// [`GraphMemory::upload`] of `f32`s.
    pub fn upload_f32(&mut self, region: Region, data: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.upload(region, &bytes)
    }

    /// Copies `region` into `out` (which must be exactly as long).
    pub fn download(&self, region: Region, out: &mut [u8]) -> Result<()> {
        if out.len() != region.len {
            return Err(Error::Shape {
                op: "graph download".into(),
                message: format!("a region of {} bytes into {}", region.len, out.len()),
            });
        }
        let range = self.range(region)?;
        self.device.download(&range, out)
    }

    /// [`GraphMemory::download`] as `f32`s.
    pub fn download_f32(&self, region: Region) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; region.len];
        self.download(region, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Captures the device operations `f` issues into a graph instead of running them.
    /// Their operands must lie in this memory; allocations, copies between host and device
    /// and waits fail inside `f` (semantics §5.9). An error from `f` ends the capture and
    /// is returned; nothing is kept.
    ///
    /// `f` borrows this memory exclusively, and must leave it behind the reference: if it
    /// swaps or replaces it, the capture still ends on this memory's device, and the result
    /// is `Error::Device` (the operations were captured on memory the graph would not
    /// replay on).
    pub fn capture<R>(
        &mut self,
        f: impl FnOnce(&mut GraphMemory) -> Result<R>,
    ) -> Result<(Graph, R)> {
        // `f` can put other memory behind `self`: the capture ends on this device, and the
        // graph is stamped with this memory only if it is still the one behind `self`.
        let device = self.device.clone();
        let id = self.id;
        let inner = &device.inner;
        {
            let mut capture = inner.capture.lock().unwrap_or_else(PoisonError::into_inner);
            if capture.is_some() {
                return Err(misuse(
                    inner.ordinal,
                    "a graph capture is already under way on this device".into(),
                ));
            }
            let start = self.buffer.device_ptr();
            *capture = Some(Capture {
                thread: std::thread::current().id(),
                start,
                end: start + self.buffer.len() as u64,
                ops: Vec::new(),
                launches: 0,
            });
            inner.capturing.store(true, Ordering::Release);
        }
        let begun: Result<()> = match &inner.backend {
            Backend::Sim(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.begin_capture(),
        };
        // A panic in `f` ends the capture too (then goes on unwinding), so the device is
        // not left refusing other threads' work.
        let outcome =
            begun.map(|()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))));
        let capture = {
            let mut capture = inner.capture.lock().unwrap_or_else(PoisonError::into_inner);
            inner.capturing.store(false, Ordering::Release);
            capture.take()
        };
        let (ops, launches) = capture.map_or((Vec::new(), 0), |c| (c.ops, c.launches));
        // The backend's capture ends whatever `f` returned.
        let ended: Result<GraphInner> = match &inner.backend {
            Backend::Sim(_) => Ok(GraphInner::Sim(ops)),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.end_capture().map(GraphInner::Cuda),
        };
        // Frees that came due on this thread during the capture run now.
        inner.release_held_frees();
        let value = match outcome {
            Err(e) => return Err(e),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Ok(Ok(result)) => result?,
        };
        let graph_inner = ended?;
        if self.id != id {
            return Err(misuse(
                inner.ordinal,
                "the capture's closure replaced the graph memory it was given: the graph is \
                 discarded (capture on the memory its operands lie in)"
                    .into(),
            ));
        }
        Ok((
            Graph {
                memory: id,
                ops: launches,
                inner: graph_inner,
            },
            value,
        ))
    }

    /// Replays `graph`, which must have been captured on this memory, after the work
    /// queued so far; later work waits for it.
    pub fn launch(&mut self, graph: &Graph) -> Result<()> {
        if graph.memory != self.id {
            return Err(misuse(
                self.device.ordinal(),
                "the graph was captured on another graph memory".into(),
            ));
        }
        let inner = &self.device.inner;
        inner.refuse_while_capturing("launching a graph")?;
        inner.refuse_other_capture("launching a graph")?;
        match (&inner.backend, &graph.inner) {
            (Backend::Sim(_), GraphInner::Sim(ops)) => {
                for op in ops {
                    op();
                }
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), GraphInner::Cuda(exec)) => {
                if let Some(exec) = exec {
                    c.launch_graph(exec)?;
                }
            }
            #[cfg(feature = "cuda")]
            _ => {
                return Err(misuse(
                    inner.ordinal,
                    "the graph belongs to another backend".into(),
                ))
            }
        }
        bump(&inner.counters.graph_launches, 1);
        bump(&inner.counters.kernel_launches, graph.ops as u64);
        Ok(())
    }
}
