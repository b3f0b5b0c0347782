//! The device layer: GPUs (or a simulated one) as a memory source of their own, with a
//! pool, an exact limit, pinned host staging, mirrored buffers and cyclic workspaces
//! (semantics §5).
//!
//! Invariant: one [`Device`] per device and backend (a CUDA device is opened once per
//! process and shared; each [`sim`] call makes a new simulated device), and every byte it
//! holds goes through its pool's budget, so `live + cached <= limit` at every instant. A
//! device buffer is handed back only through epoch reclamation after a fence on the
//! device's queue (semantics §6), so no copy or kernel that uses it may still run. Without
//! a driver or a GPU every call returns `Error::NoDevice` with the reason; nothing panics.
//!
//! ```
//! use ndmem::device::{self, DeviceMemory, SimConfig};
//!
//! let gpu = device::sim(SimConfig::new(0).total_memory(64 << 20))?;
//! let mut buffer = gpu.allocate(4096)?;
//! gpu.upload(&[7u8; 4096], &mut buffer)?;
//! let mut back = vec![0u8; 4096];
//! gpu.download(&buffer, &mut back)?;
//! assert_eq!(back, vec![7u8; 4096]);
//! assert_eq!(gpu.stats().transfers(), 2);
//! # Ok::<(), ndmem::Error>(())
//! ```

mod backend;
mod compute;
#[cfg(feature = "cuda")]
mod cuda;
mod graph;
#[cfg(feature = "cuda")]
mod kernels;
mod limit;
mod mirror;
mod pinned;
mod pool;
mod sim;
pub(crate) mod slot;
mod stats;
mod transfer;
mod workspace;

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ndmem_alloc::{ByteSize, Usage, ENV_MAX_BYTES, ENV_MAX_DEVICE_BYTES};

use crate::error::{Error, Result};
use crate::memory::MemorySource;
use backend::Backend;

pub use backend::BackendKind;
pub use compute::{BinaryOp, UnaryOp};
pub use graph::{Graph, GraphMemory, Region, RegionMut, RegionRef, REGION_ALIGN};
pub use limit::DeviceLimit;
pub use mirror::{Mirror, MirrorDevice, MirrorDeviceMut};
pub use pinned::PinnedBuffer;
pub use pool::DeviceBuffer;
pub use stats::DeviceStats;
pub use transfer::STAGING_BYTES;
pub use workspace::{DeviceCycle, DeviceWorkspace, DeviceWorkspaceStats, WorkspaceSlice};

/// What a device reports of its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free on the device (all processes counted).
    pub free: usize,
    /// Bytes the device has.
    pub total: usize,
}

/// A range of device memory that copies and kernels may use: a [`DeviceBuffer`], a
/// [`WorkspaceSlice`], or a mirror's device side. Sealed: only this crate's types, whose
/// ranges are live while they are borrowed, implement it.
pub trait DeviceMemory: Sealed {
    /// The ordinal of the device the range lives on.
    fn ordinal(&self) -> u32;
    /// Its device address.
    fn device_ptr(&self) -> u64;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Which device object it belongs to (devices of two backends may share an ordinal).
    #[doc(hidden)]
    fn device_id(&self) -> usize;
    /// Whether the range is pinned host memory the device reaches in place (a
    /// [`PinnedBuffer`], a `HostOnly` mirror or workspace): a copy or fill touching it
    /// waits for the device before it returns, where one between device buffers need not.
    #[doc(hidden)]
    fn is_host_memory(&self) -> bool {
        false
    }
}

/// A [`DeviceMemory`] range that may be written: copies into it and device operations on
/// it. A mirror's read-only device side is not one, so its stamps cannot be bypassed.
pub trait DeviceMemoryMut: DeviceMemory {}

#[doc(hidden)]
pub trait Sealed {}

/// Implements [`DeviceMemory`] (and `Sealed`) for a type by its `RawRange` field `$field`.
macro_rules! device_memory_by {
    ($t:ty, $field:ident) => {
        impl $crate::device::Sealed for $t {}
        impl $crate::device::DeviceMemory for $t {
            fn ordinal(&self) -> u32 {
                $crate::device::DeviceMemory::ordinal(&self.$field)
            }
            fn device_ptr(&self) -> u64 {
                $crate::device::DeviceMemory::device_ptr(&self.$field)
            }
            fn len(&self) -> usize {
                $crate::device::DeviceMemory::len(&self.$field)
            }
            fn device_id(&self) -> usize {
                $crate::device::DeviceMemory::device_id(&self.$field)
            }
            fn is_host_memory(&self) -> bool {
                $crate::device::DeviceMemory::is_host_memory(&self.$field)
            }
        }
    };
}
pub(crate) use device_memory_by;

/// The shared state of one device.
pub(crate) struct Inner {
    pub(crate) ordinal: u32,
    pub(crate) backend: Backend,
    pub(crate) counters: stats::Counters,
    pub(crate) pool: pool::DevicePool,
    pub(crate) staging: Mutex<Option<pinned::Staging>>,
    pub(crate) host: MemorySource,
    /// Fence tickets issued (one per buffer dropped) and passed: a ticket is passed once an
    /// event recorded after it was issued has completed.
    fence_issued: AtomicU64,
    fence_passed: AtomicU64,
    fence_lock: Mutex<()>,
    total_memory: usize,
    limit_given: DeviceLimit,
    /// Where the limit was given in code (`SimConfig::limit`); `None`: from the
    /// environment (`NDMEM_MAX_DEVICE_BYTES`, or its default when unset).
    limit_setting: Option<&'static str>,
    /// The graph capture under way, if any ([`graph`]); `capturing` says so without the
    /// lock.
    capture: Mutex<Option<graph::Capture>>,
    capturing: std::sync::atomic::AtomicBool,
    /// Deferred frees of this device's memory that came due on the thread capturing a
    /// graph on it, which may make no driver call that waits or frees (it would end the
    /// capture, and the memory would leak): run when the capture ends.
    held_frees: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal)
            .field("backend", &self.backend.kind())
            .field("total_memory", &self.total_memory)
            .field("limit", &self.pool.budget.limit())
            .finish()
    }
}

/// A device (a CUDA GPU, or one simulated in host memory): cheap to clone, compared by
/// identity. See the [module documentation](self).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Device {}

/// How to make a simulated device ([`sim`]).
#[derive(Debug, Clone)]
pub struct SimConfig {
    ordinal: u32,
    total_memory: usize,
    limit: Option<DeviceLimit>,
    host: Option<MemorySource>,
}

impl SimConfig {
    /// A simulated device with ordinal `ordinal`, 16 GiB of memory, the limit from
    /// `NDMEM_MAX_DEVICE_BYTES`, staging and mirrors drawn from the global pool.
    pub fn new(ordinal: u32) -> SimConfig {
        SimConfig {
            ordinal,
            total_memory: 16 << 30,
            limit: None,
            host: None,
        }
    }

    /// The memory the simulated device has (what `memory_info` reports and the simulated
    /// driver refuses to exceed); 0 is refused by [`sim`] (a device with no memory).
    pub fn total_memory(mut self, bytes: usize) -> Self {
        self.total_memory = bytes;
        self
    }

    /// The device's limit, instead of `NDMEM_MAX_DEVICE_BYTES`, checked as the variable's
    /// value is: `Bytes(0)` and 0% are no limit; a percentage over a denominator of 0,
    /// above 100% or of less than one byte of the device, and more than `isize::MAX`
    /// bytes, make [`sim`] return `Error::Config` naming `SimConfig::limit` and the value.
    pub fn limit(mut self, limit: DeviceLimit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The host pool that pinned buffers and host mirrors are counted in.
    pub fn host(mut self, source: MemorySource) -> Self {
        self.host = Some(source);
        self
    }
}

/// A new simulated device (semantics §5): host memory behind the device API, counting
/// every allocation, transfer and byte.
///
/// `Error::Config`, before anything is made, for a device with no memory
/// (`total_memory(0)`) or a limit that `NDMEM_MAX_DEVICE_BYTES` would refuse
/// ([`SimConfig::limit`]).
pub fn sim(config: SimConfig) -> Result<Device> {
    if config.total_memory == 0 {
        return Err(ndmem_alloc::ConfigError::Invalid {
            variable: "SimConfig::total_memory".into(),
            message: "0 bytes is a device with no memory, which could hold no buffer; give \
                      it some (16 GiB unless set)"
                .into(),
        }
        .into());
    }
    let (limit, setting) = match config.limit {
        Some(limit) => (limit, Some("SimConfig::limit")),
        None => (DeviceLimit::from_env()?, None),
    };
    limit.check(config.total_memory, setting)?;
    let host = config.host.unwrap_or_else(MemorySource::global);
    Device::open(
        config.ordinal,
        Backend::Sim(sim::Sim::new(config.total_memory)),
        config.total_memory,
        (limit, setting),
        host,
    )
}

/// CUDA device `ordinal`, opened once per process (later calls return the same device).
/// Its limit is `NDMEM_MAX_DEVICE_BYTES` resolved against its memory (semantics §1).
/// Without a driver, or without that device: `Error::NoDevice` with the reason.
pub fn cuda(ordinal: u32) -> Result<Device> {
    #[cfg(feature = "cuda")]
    {
        static OPENED: Mutex<Vec<Device>> = Mutex::new(Vec::new());
        let mut opened = OPENED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(device) = opened.iter().find(|d| d.ordinal() == ordinal) {
            return Ok(device.clone());
        }
        let limit = DeviceLimit::from_env()?;
        let backend = cuda::Cuda::open(ordinal)?;
        let (_, total) = backend.memory_info()?;
        let device = Device::open(
            ordinal,
            Backend::Cuda(backend),
            total,
            (limit, None),
            MemorySource::global(),
        )?;
        opened.push(device.clone());
        Ok(device)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(Error::NoDevice {
            reason: "ndmem was built without its `cuda` feature".into(),
        })
    }
}

/// The number of CUDA devices; `Error::NoDevice` (with the reason) without a driver.
pub fn cuda_device_count() -> Result<u32> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(Error::NoDevice {
            reason: "ndmem was built without its `cuda` feature".into(),
        })
    }
}

/// Whether a CUDA driver library can be loaded (no driver call is made).
pub fn cuda_driver_present() -> bool {
    #[cfg(feature = "cuda")]
    {
        cuda::driver_present().is_ok()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// Makes `device` this thread's current device; returns the previous one.
pub fn set_current(device: &Device) -> Option<Device> {
    CURRENT.with(|c| c.borrow_mut().replace(device.clone()))
}

/// This thread's current device: the one set by [`set_current`], else CUDA device 0.
pub fn current() -> Result<Device> {
    match CURRENT.with(|c| c.borrow().clone()) {
        Some(device) => Ok(device),
        None => cuda(0),
    }
}

/// Clears this thread's current device; returns it.
pub fn clear_current() -> Option<Device> {
    CURRENT.with(|c| c.borrow_mut().take())
}

impl Device {
    /// Opens a device whose limit is `limit_given`, set by `setting` (`None`: the
    /// variable), which its errors name.
    fn open(
        ordinal: u32,
        backend: Backend,
        total_memory: usize,
        (limit_given, setting): (DeviceLimit, Option<&'static str>),
        host: MemorySource,
    ) -> Result<Device> {
        let max_bytes = host.pool().limits().0;
        let limit = limit_given.resolve_as(total_memory, max_bytes, setting)?;
        Ok(opened(Device {
            inner: Arc::new(Inner {
                ordinal,
                backend,
                counters: stats::Counters::default(),
                pool: pool::DevicePool::new(limit),
                staging: Mutex::new(None),
                host,
                fence_issued: AtomicU64::new(0),
                fence_passed: AtomicU64::new(0),
                fence_lock: Mutex::new(()),
                total_memory,
                limit_given,
                limit_setting: setting,
                capture: Mutex::new(None),
                capturing: std::sync::atomic::AtomicBool::new(false),
                held_frees: Mutex::new(Vec::new()),
            }),
        }))
    }

    /// The device's ordinal (`n` of `[DEVICE n]`, `cuda:n`).
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// Which backend it runs on.
    pub fn kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// The device's name (the GPU's, or "simulated device").
    pub fn name(&self) -> String {
        self.inner.backend.name()
    }

    /// The device's memory as the driver reports it now.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self.inner.backend.memory_info()?;
        Ok(MemoryInfo { free, total })
    }

    /// The device's memory in bytes, as read when it was opened.
    pub fn total_memory(&self) -> usize {
        self.inner.total_memory
    }

    /// Its limit in bytes (`None`: none of ndmem's own), resolved against its memory.
    pub fn limit(&self) -> Option<usize> {
        self.inner.pool.budget.limit()
    }

    /// The limit as it was given (a size, a percentage, the default).
    pub fn limit_given(&self) -> DeviceLimit {
        self.inner.limit_given
    }

    /// What to raise when this device refuses at its limit of `limit` bytes (semantics §1,
    /// §7): the setting that gave the limit, or, where the default applies, the side of
    /// min(host `max_bytes`, 90% of the device) that set it.
    pub(crate) fn limit_advice(&self, limit: usize) -> String {
        let now = ByteSize(limit);
        let setting = self.inner.limit_setting;
        if self.inner.limit_given != DeviceLimit::Default {
            return format!(
                "raise {} (now {now})",
                setting.unwrap_or(ENV_MAX_DEVICE_BYTES)
            );
        }
        let unset = match setting {
            Some(setting) => format!("{setting} DeviceLimit::Default"),
            None => format!("{ENV_MAX_DEVICE_BYTES} unset"),
        };
        if let Some(knob) = self.host_knob(limit) {
            format!(
                "raise {knob} (now {now}): with {unset}, the device's limit is min({knob}, 90% \
                 of the device)"
            )
        } else {
            format!(
                "the device's limit is 90% of its {} (now {now}), below the host pool's \
                 max_bytes: with {unset} that is the most it gets; set {} to a larger share \
                 (up to 100%) or free device memory",
                ByteSize(self.inner.total_memory),
                setting.unwrap_or(ENV_MAX_DEVICE_BYTES)
            )
        }
    }

    /// The setting that names the host pool's limit, if that limit is `limit` (the side
    /// of the default min(host `max_bytes`, 90% of the device) that set it).
    fn host_knob(&self, limit: usize) -> Option<&'static str> {
        let host = self.inner.host.pool();
        if host.limits().0 != Some(limit) {
            return None;
        }
        let global = ndmem_alloc::Pool::try_global().is_ok_and(|g| std::ptr::eq(host, g));
        Some(host.max_bytes_knob().unwrap_or(if global {
            ENV_MAX_BYTES
        } else {
            "the host pool's max_bytes"
        }))
    }

    /// The host pool that its pinned buffers and host mirrors are counted in.
    pub fn host_source(&self) -> MemorySource {
        self.inner.host
    }

    /// A buffer of `bytes` from the device's pool (counted as tensor memory).
    pub fn allocate(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.inner.allocate(bytes, Usage::Tensor)
    }

    /// A buffer of `bytes` from the device's pool, counted as `usage` (what the
    /// out-of-memory message says holds the memory).
    pub fn allocate_for(&self, bytes: usize, usage: Usage) -> Result<DeviceBuffer> {
        self.inner.allocate(bytes, usage)
    }

    /// Gives the pool's cached buffers back to the driver (after flushing deferred frees,
    /// except those a thread still pinned holds back, as [`crate::reclaim::collect`]
    /// says); returns the bytes released.
    pub fn trim(&self) -> usize {
        crate::reclaim::collect();
        self.inner.trim()
    }

    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .refuse_while_capturing("waiting for the device")?;
        stats::bump(&self.inner.counters.synchronizations, 1);
        self.inner.backend.synchronize()
    }

    /// An event recorded after all work queued so far.
    pub fn record_event(&self) -> Result<Event> {
        self.inner.refuse_while_capturing("recording an event")?;
        Ok(Event {
            device: Arc::clone(&self.inner),
            fence: self.inner.backend.fence()?,
        })
    }

    /// The device's figures now.
    pub fn stats(&self) -> DeviceStats {
        let mut stats = self.inner.counters.snapshot();
        stats.used_bytes = self.inner.pool.budget.used();
        stats.limit = self.limit();
        stats
    }

    /// One line: `cuda:0 NVIDIA H100 80GB HBM3, 79.1 GiB, limit 71.2 GiB (default: 90% of
    /// the device)`; where the default's host side set the limit, the setting that named
    /// the host pool's limit instead (`(default: --max-bytes)`).
    pub fn describe(&self) -> String {
        use ndmem_alloc::ByteSize;
        let (limit, given) = match self.limit() {
            Some(l) => {
                let given = match (self.limit_given(), self.host_knob(l)) {
                    // The default's host side set it: name the knob that did (not a
                    // variable that is unset: the host pool's own default set it then).
                    (DeviceLimit::Default, Some(ENV_MAX_BYTES)) if !set_in_environment(l) => {
                        "default: the host pool's max_bytes".into()
                    }
                    (DeviceLimit::Default, Some(knob)) => format!("default: {knob}"),
                    (DeviceLimit::Default, None) => "default: 90% of the device".into(),
                    (given, _) => given.to_string(),
                };
                (ByteSize(l).to_string(), given)
            }
            None => ("none".into(), self.limit_given().to_string()),
        };
        format!(
            "{}:{} {}, {}, limit {} ({})",
            self.kind(),
            self.ordinal(),
            self.name(),
            ByteSize(self.total_memory()),
            limit,
            given
        )
    }
}

/// A point in a device's queue of work ([`Device::record_event`]).
pub struct Event {
    device: Arc<Inner>,
    fence: backend::Fence,
}

impl Event {
    /// Waits until the work recorded before the event is done.
    pub fn synchronize(&self) -> Result<()> {
        stats::bump(&self.device.counters.synchronizations, 1);
        self.device.backend.wait(&self.fence)
    }

    /// Whether the work recorded before the event is done, without waiting.
    pub fn is_complete(&self) -> Result<bool> {
        self.device.backend.is_passed(&self.fence)
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device.ordinal)
            .finish_non_exhaustive()
    }
}

/// `AllocError::InvalidLayout` (saying `reason`) for a request of zero bytes.
fn refuse_zero_bytes(bytes: usize, reason: &'static str) -> Result<()> {
    if bytes == 0 {
        return Err(Error::Alloc(ndmem_alloc::AllocError::InvalidLayout {
            size: 0,
            align: 1,
            reason,
        }));
    }
    Ok(())
}

impl Inner {
    /// Frees `bytes` of this device's memory once no thread pinned now can still be
    /// using them and the work queued so far has passed (a fence ticket taken now):
    /// `free(device, passed)` runs then, counted as deferred until it has run, and on the
    /// thread capturing a graph on this device not before the capture ends.
    pub(crate) fn defer_free(
        self: &Arc<Self>,
        bytes: usize,
        free: impl FnOnce(&Inner, bool) + Send + 'static,
    ) {
        let device = Arc::clone(self);
        let ticket = device.fence_ticket();
        device.counters.deferred.fetch_add(bytes, Ordering::Relaxed);
        crate::reclaim::defer_with(bytes, move || {
            let holder = Arc::clone(&device);
            holder.free_or_hold(move || {
                let passed = device.wait_ticket(ticket);
                free(&device, passed);
                device.counters.deferred.fetch_sub(bytes, Ordering::Relaxed);
            });
        });
    }

    /// Runs `free` (a deferred free of this device's memory: a fence wait and a driver
    /// free or a return to the cache) now, or, on the thread capturing a graph on this
    /// device, when the capture ends.
    fn free_or_hold(&self, free: impl FnOnce() + Send + 'static) {
        if self.capturing_here() {
            self.held_frees
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Box::new(free));
        } else {
            free();
        }
    }

    /// Runs the frees held during a capture (see `held_frees`); the capture has ended.
    pub(crate) fn release_held_frees(&self) {
        let held = std::mem::take(
            &mut *self
                .held_frees
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for free in held {
            free();
        }
    }

    /// The setting an out-of-memory error of this device names (its `variable`): the one
    /// [`Device::limit_advice`] tells the user to raise for a limit of `limit` bytes.
    pub(crate) fn limit_variable(&self, limit: usize) -> &'static str {
        let setting = self.limit_setting.unwrap_or(ENV_MAX_DEVICE_BYTES);
        if self.limit_given != DeviceLimit::Default {
            return setting;
        }
        let host = self.host.pool();
        if host.limits().0 != Some(limit) {
            return setting; // the 90% side: a larger share is the setting's to give
        }
        let global = ndmem_alloc::Pool::try_global().is_ok_and(|g| std::ptr::eq(host, g));
        host.max_bytes_knob().unwrap_or(if global {
            ENV_MAX_BYTES
        } else {
            "the host pool's max_bytes"
        })
    }

    /// A ticket for the work queued so far (no driver call): [`Inner::wait_ticket`] waits
    /// for it.
    pub(crate) fn fence_ticket(&self) -> u64 {
        self.fence_issued.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Waits until the work queued before `ticket` was issued has completed; `false` if
    /// the device failed to say. One event covers every ticket issued before it was
    /// recorded, so a batch of deferred frees waits once.
    pub(crate) fn wait_ticket(&self, ticket: u64) -> bool {
        stats::bump(&self.counters.fences_before_free, 1);
        if self.fence_passed.load(Ordering::Acquire) >= ticket {
            return true;
        }
        let _one = self
            .fence_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.fence_passed.load(Ordering::Acquire) >= ticket {
            return true;
        }
        // Every ticket issued by now is covered by an event recorded after this load.
        let covered = self.fence_issued.load(Ordering::Acquire);
        let passed = match self.backend.fence() {
            Ok(fence) => self.backend.wait(&fence).is_ok(),
            Err(_) => self.backend.synchronize().is_ok(),
        };
        if passed {
            self.fence_passed.fetch_max(covered, Ordering::AcqRel);
        }
        passed
    }
}

impl Drop for Inner {
    /// The last handle is gone, and with it every buffer (each deferred free holds one):
    /// the staging buffer and the cached buffers go back to the driver, so nothing a
    /// dropped device took stays allocated.
    fn drop(&mut self) {
        let _ = self.backend.synchronize();
        let staging = self
            .staging
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(staging) = staging {
            staging.free(self);
        }
        self.trim();
    }
}

/// `Error::Device` for a misuse caught before the driver is asked.
pub(crate) fn misuse(ordinal: u32, message: String) -> Error {
    Error::Device {
        device: ordinal,
        message,
    }
}

/// Every device opened and still alive, for the statistics snapshot (semantics §7).
static OPEN_DEVICES: Mutex<Vec<std::sync::Weak<Inner>>> = Mutex::new(Vec::new());

/// Records `device` among the open devices.
fn opened(device: Device) -> Device {
    let mut open = OPEN_DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|d| d.strong_count() > 0);
    open.push(Arc::downgrade(&device.inner));
    device
}

thread_local! {
    /// The device that refused an allocation on this thread last (its `Inner`'s address).
    static LAST_REFUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Notes `inner` as the device that refused on this thread last.
pub(crate) fn note_refusal(inner: &Inner) {
    LAST_REFUSED.with(|last| last.set(inner as *const Inner as usize));
}

/// The open device that refused an allocation of `[DEVICE ordinal]` at `limit` bytes: the
/// one this thread saw refuse last if it matches, else the first open one that does.
pub(crate) fn refusing_device(ordinal: u32, limit: usize) -> Option<Device> {
    let last = LAST_REFUSED.with(std::cell::Cell::get);
    let matching: Vec<Device> = open_devices()
        .into_iter()
        .filter(|d| d.ordinal() == ordinal && d.limit() == Some(limit))
        .collect();
    let noted = matching
        .iter()
        .position(|d| Arc::as_ptr(&d.inner) as usize == last)
        .unwrap_or(0);
    matching.into_iter().nth(noted)
}

/// The devices opened and still alive, in the order they were opened.
pub(crate) fn open_devices() -> Vec<Device> {
    OPEN_DEVICES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(|d| d.upgrade().map(|inner| Device { inner }))
        .collect()
}

/// Whether the global pool's limit `limit` is the one `NDMEM_MAX_BYTES` sets (not its
/// default, nor a limit set in code).
fn set_in_environment(limit: usize) -> bool {
    ndmem_alloc::Limits::from_env().is_ok_and(|env| {
        env.sources.max_bytes == ndmem_alloc::LimitSource::Environment
            && env.max_bytes == Some(limit)
    })
}
