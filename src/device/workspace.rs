//! Device workspaces (semantics §2, §5): the cyclic learning of host workspaces over device
//! memory. The first cycle spills to the device pool and measures itself; at its end the
//! workspace takes one buffer of the learned size; from then on a cycle is a bump pointer
//! in that buffer and asks the driver (and the pool) for nothing.
//!
//! Invariant: a slice handed out lies in the workspace's buffer or in a spill it holds, and
//! borrows the cycle's guard, so it cannot outlive the cycle; neither the buffer nor the
//! spills are given back while a guard lives (the guard holds the workspace exclusively).
//! The bump path takes no lock and allocates nothing: two `Cell`s and arithmetic.

#![forbid(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use ndmem_alloc::{AllocError, Usage};

use super::pinned::PinnedBuffer;
use super::pool::DeviceBuffer;
use super::sim::DEVICE_ALIGN;
use super::slot::RawRange;
use super::{Device, DeviceMemory, DeviceMemoryMut};
use crate::error::{Error, Result};
use crate::workspace::sizing::{padding, spilled_bytes, Sizing};
use crate::workspace::{LearningPolicy, MirroringPolicy, SpillPolicy, WorkspaceConfig};

/// Device memory of a workspace: a device buffer (`Full`) or pinned host memory the device
/// reads in place (`HostOnly`).
enum Memory {
    Device(DeviceBuffer),
    Pinned(PinnedBuffer),
}

impl Memory {
    fn ptr(&self) -> u64 {
        match self {
            Memory::Device(b) => b.device_ptr(),
            Memory::Pinned(p) => p.device_ptr(),
        }
    }

    /// The bytes the workspace may use: all of a device buffer's size class, as a host
    /// workspace uses all of its pool block (semantics §2.3); a pinned buffer's length.
    fn len(&self) -> usize {
        match self {
            Memory::Device(b) => b.capacity(),
            Memory::Pinned(p) => p.len(),
        }
    }

    /// Where bumps start, the first address aligned to `align` (the workspace alignment),
    /// and the bytes from there: device memory is aligned to [`DEVICE_ALIGN`] only, while
    /// the learned size assumes a buffer aligned as the workspace (a host pool block of
    /// that size is), so a bump pads from the aligned start, never from the buffer's.
    fn aligned(&self, align: usize) -> (u64, usize) {
        let base = self.ptr();
        let lead = padding(base as usize, align);
        (base + lead as u64, self.len().saturating_sub(lead))
    }
}

/// A workspace in a device's memory: the first cycle spills and learns, later cycles bump
/// in one buffer with no driver call (semantics §2.3, §5).
///
/// ```
/// use ndmem::device::{self, DeviceWorkspace, SimConfig};
/// use ndmem::WorkspaceConfig;
///
/// let gpu = device::sim(SimConfig::new(0))?;
/// let mut ws = DeviceWorkspace::new(&gpu, "LOOP", &WorkspaceConfig::default())?;
/// for _ in 0..3 {
///     let cycle = ws.enter();
///     let a = cycle.allocate(4096, 256)?;
///     let b = cycle.allocate(1000, 256)?;
///     # let _ = (a, b);
/// }
/// assert_eq!(ws.stats().cycles, 3);
/// assert!(ws.stats().buffer_bytes >= 4096 + 1000);
/// # Ok::<(), ndmem::Error>(())
/// ```
pub struct DeviceWorkspace {
    device: Device,
    name: String,
    sizing: Sizing,
    learning: LearningPolicy,
    spill: SpillPolicy,
    mirroring: MirroringPolicy,
    cycles_before_initialization: u64,
    buffer: Option<Memory>,
    offset: Cell<usize>,
    /// Padding this cycle's bumps aligned beyond the workspace could have needed and did
    /// not take (as on the host, `workspace::bump`).
    slack: Cell<usize>,
    spilled: Cell<usize>,
    spills: RefCell<Vec<Memory>>,
    max_cycle: usize,
    total_spilled: usize,
    cycles: u64,
}

/// The figures of one device workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceWorkspaceStats {
    /// The workspace's name.
    pub name: String,
    /// Its buffer's bytes: a device buffer's whole size class, which it uses (0 before
    /// learning).
    pub buffer_bytes: usize,
    /// Bytes bumped in the running (or last) cycle.
    pub used: usize,
    /// Bytes spilled in the running (or last) cycle.
    pub spilled: usize,
    /// The largest cycle so far (bumped + spilled).
    pub max_cycle: usize,
    /// Bytes spilled over its life.
    pub total_spilled: usize,
    /// Cycles completed.
    pub cycles: u64,
}

impl DeviceWorkspace {
    /// A workspace named `name` on `device`, following `config`'s sizes and policies
    /// (learning, spills, over-allocation, alignment, mirroring). With `initial_size` its
    /// buffer is taken now. Circular workspaces (`ResetPolicy::EndOfBuffer`) are host-only:
    /// `Error::Config`.
    pub fn new(device: &Device, name: &str, config: &WorkspaceConfig) -> Result<DeviceWorkspace> {
        if config.is_circular() {
            return Err(Error::Config(ndmem_alloc::ConfigError::Invalid {
                variable: format!("device workspace [{name}]"),
                message: "device workspaces are linear; use ResetPolicy::BlockLeft".into(),
            }));
        }
        let mut ws = DeviceWorkspace {
            device: device.clone(),
            name: name.into(),
            sizing: config.sizing(),
            learning: config.policy_learning(),
            spill: config.policy_spill(),
            mirroring: config.policy_mirroring(),
            cycles_before_initialization: config.cycles_before_initialization(),
            buffer: None,
            offset: Cell::new(0),
            slack: Cell::new(0),
            spilled: Cell::new(0),
            spills: RefCell::new(Vec::new()),
            max_cycle: 0,
            total_spilled: 0,
            cycles: 0,
        };
        if config.initial_size() > 0 {
            let bytes = ws.sizing.learned(config.initial_size());
            ws.buffer = Some(ws.take_buffer(bytes)?);
            // An initial size is not learned from (semantics §2.3).
            ws.learning = LearningPolicy::None;
        }
        Ok(ws)
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A buffer of `bytes` from an address aligned as the workspace: the memory asked for
    /// holds the padding to it too, when the workspace is aligned more than device memory.
    fn take_buffer(&self, bytes: usize) -> Result<Memory> {
        self.take(bytes.saturating_add(self.sizing.align.saturating_sub(DEVICE_ALIGN)))
    }

    /// `bytes` of the workspace's memory (a spill pads its own start).
    fn take(&self, bytes: usize) -> Result<Memory> {
        match self.mirroring {
            MirroringPolicy::HostOnly => Ok(Memory::Pinned(self.device.allocate_pinned(bytes)?)),
            _ => Ok(Memory::Device(
                self.device.allocate_for(bytes, Usage::Workspace)?,
            )),
        }
    }

    /// Starts a cycle; the guard hands out memory until it drops, which ends the cycle.
    pub fn enter(&mut self) -> DeviceCycle<'_> {
        self.offset.set(0);
        self.slack.set(0);
        self.spilled.set(0);
        DeviceCycle { workspace: self }
    }

    /// Its figures now.
    pub fn stats(&self) -> DeviceWorkspaceStats {
        DeviceWorkspaceStats {
            name: self.name.clone(),
            buffer_bytes: self.buffer.as_ref().map_or(0, Memory::len),
            used: self.offset.get(),
            spilled: self.spilled.get(),
            max_cycle: self.max_cycle,
            total_spilled: self.total_spilled,
            cycles: self.cycles,
        }
    }

    /// As a host workspace bumps (semantics §2.2): the start padded to `align` (at least
    /// the workspace's alignment), the size rounded up to the workspace's alignment, no
    /// further than `max_size`. Not for a zero-size request, which takes no bytes (see
    /// [`DeviceCycle::allocate`]).
    #[inline]
    fn bump(&self, bytes: usize, align: usize) -> Option<u64> {
        let (base, len) = self.buffer.as_ref()?.aligned(self.sizing.align);
        let offset = self.offset.get();
        let pad = padding((base as usize).wrapping_add(offset), align);
        let start = offset.checked_add(pad)?;
        let end = start.checked_add(self.sizing.round(bytes))?;
        if end > self.sizing.bump_limit(len) {
            return None;
        }
        self.offset.set(end);
        // As on the host: a bump aligned beyond the workspace counts, for learning, the
        // most padding it could need (`pad` is at most that: `offset` is a multiple of the
        // workspace alignment from an aligned base).
        let unused = align.saturating_sub(self.sizing.align).saturating_sub(pad);
        self.slack.set(self.slack.get().saturating_add(unused));
        Some(base + start as u64)
    }

    /// Bytes a cycle may still bump (before padding).
    fn available(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| {
            self.sizing
                .bump_limit(b.aligned(self.sizing.align).1)
                .saturating_sub(self.offset.get())
        })
    }

    /// A request of `bytes > 0` the buffer cannot hold, by spill policy.
    fn spill_allocate(&self, bytes: usize, align: usize) -> Result<u64> {
        let counted = spilled_bytes(bytes, align, self.sizing.align).ok_or(Error::Alloc(
            AllocError::InvalidLayout {
                size: bytes,
                align,
                reason: "the padded size overflows isize",
            },
        ))?;
        if self.spill == SpillPolicy::Fail {
            let available = self.available();
            return Err(Error::WorkspaceFull {
                workspace: self.name.clone(),
                requested: counted,
                available,
            });
        }
        // Device buffers are 256-byte aligned; over-aligned spills take the padding.
        let extra = align.saturating_sub(DEVICE_ALIGN);
        let memory = self.take(bytes + extra)?;
        let ptr = memory.ptr();
        let aligned = ptr + padding(ptr as usize, align) as u64;
        self.spills.borrow_mut().push(memory);
        self.spilled.set(self.spilled.get() + counted);
        Ok(aligned)
    }

    fn end_cycle(&mut self) {
        let cycle = self.offset.get() + self.slack.get() + self.spilled.get();
        self.max_cycle = self.max_cycle.max(cycle);
        self.total_spilled += self.spilled.get();
        self.cycles += 1;
        let spilled = self.spilled.get() > 0;
        // Spills go back to the pool (deferred, after a fence).
        self.spills.get_mut().clear();
        let learn = match (&self.buffer, self.learning) {
            (None, LearningPolicy::FirstLoop) => true,
            (None, LearningPolicy::OverTime) => {
                self.cycles >= self.cycles_before_initialization.max(1)
            }
            _ => false,
        };
        let bytes = if learn && self.max_cycle > 0 {
            Some(self.sizing.learned(self.max_cycle))
        } else if spilled && self.buffer.is_some() && self.spill == SpillPolicy::Reallocate {
            let bytes = self.sizing.reallocated(self.max_cycle);
            let usable = self
                .buffer
                .as_ref()
                .map_or(0, |b| b.aligned(self.sizing.align).1);
            (bytes > usable).then_some(bytes)
        } else {
            None
        };
        if let Some(bytes) = bytes {
            // A refusal keeps the old buffer (or keeps spilling): semantics §2.3.
            if let Ok(memory) = self.take_buffer(bytes) {
                self.buffer = Some(memory);
            }
        }
    }
}

impl fmt::Debug for DeviceWorkspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceWorkspace")
            .field("device", &self.device.ordinal())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The address of a zero-size request aligned to `align` (a power of two): `align` itself,
/// as the host's dangling pointer; it is never dereferenced, since its range is empty.
fn dangling(align: usize) -> u64 {
    align as u64
}

/// A running cycle of a [`DeviceWorkspace`]; dropping it ends the cycle.
pub struct DeviceCycle<'w> {
    workspace: &'w mut DeviceWorkspace,
}

impl DeviceCycle<'_> {
    /// `bytes` of device memory aligned to `align` (a power of two), valid until the cycle
    /// ends: bumped in the buffer, or spilled to the device pool by the spill policy. A
    /// zero-size request takes no bytes and never spills: an empty slice at a dangling,
    /// aligned address.
    #[inline]
    pub fn allocate(&self, bytes: usize, align: usize) -> Result<WorkspaceSlice<'_>> {
        if !align.is_power_of_two() {
            return Err(Error::Alloc(AllocError::InvalidLayout {
                size: bytes,
                align,
                reason: "the alignment must be a power of two",
            }));
        }
        let ws = &*self.workspace;
        // Every allocation is aligned to at least the workspace's alignment (§2.1).
        let align = align.max(ws.sizing.align);
        let ptr = if bytes == 0 {
            // As on the host (§2.2): a dangling, aligned address that takes no bytes and is
            // never read or written (an empty range: copies and kernels touch nothing).
            dangling(align)
        } else {
            match ws.bump(bytes, align) {
                Some(ptr) => ptr,
                None => ws.spill_allocate(bytes, align)?,
            }
        };
        Ok(WorkspaceSlice {
            range: RawRange::new(
                ws.device.ordinal(),
                Arc::as_ptr(&ws.device.inner) as usize,
                ptr,
                bytes,
            )
            .in_host_memory(ws.mirroring == MirroringPolicy::HostOnly),
            _cycle: PhantomData,
        })
    }

    /// The workspace's figures now.
    pub fn stats(&self) -> DeviceWorkspaceStats {
        self.workspace.stats()
    }
}

impl Drop for DeviceCycle<'_> {
    fn drop(&mut self) {
        self.workspace.end_cycle();
    }
}

impl fmt::Debug for DeviceCycle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceCycle")
            .field("workspace", &self.workspace.name)
            .finish()
    }
}

/// Device memory of a workspace cycle; it borrows the cycle, so it cannot outlive it.
#[derive(Debug)]
pub struct WorkspaceSlice<'c> {
    range: RawRange,
    _cycle: PhantomData<&'c ()>,
}

impl DeviceMemoryMut for WorkspaceSlice<'_> {}
super::device_memory_by!(WorkspaceSlice<'_>, range);
