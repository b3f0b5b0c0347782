//! One statistics snapshot of the whole process (semantics §7): the heap, the pools, every
//! thread's workspaces, the scope tree, every open device and pending reclamation; the
//! PyTorch-style counters of each budget and their flat view under PyTorch's key names;
//! one peak reset for all; the printed summary; the out-of-memory report and its hook.
//!
//! Invariant: every figure is read from the counters the rest of the crate keeps (pool
//! books and budget, heap tallies, workspace cells as published to the registry, scope
//! lists); this module keeps none of its own but the observed peak of each scope and the
//! list of pools registered for the snapshot, and nothing here runs on an allocation
//! path.
//!
//! ```
//! use ndmem::alloc::{Limits, Pool};
//! use ndmem::{stats, MemorySource};
//!
//! let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
//! let block = source.pool().allocate(4096, 64)?;
//! let snap = stats::snapshot_of(&[source]);
//! assert_eq!(snap.pools[0].stats.live_bytes, 4096);
//! let keys: std::collections::BTreeMap<_, _> = snap.pytorch_keys().into_iter().collect();
//! assert_eq!(keys["allocated_bytes.all.current"], 4096);
//! assert_eq!(keys["allocation.all.allocated"], 1);
//! println!("{snap}"); // a few lines per budget
//! drop(block);
//! # Ok::<(), ndmem::alloc::AllocError>(())
//! ```

mod keys;
pub use keys::PYTORCH_KEYS;
mod oom;
mod summary;

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, RwLock};

use ndmem_alloc::{heap, HeapStats, Pool, PoolStats};

use crate::device::{open_devices, Device, DeviceStats};
use crate::memory::owner::{Owner, PoolShare};
use crate::memory::MemorySource;
use crate::workspace::{all_workspaces, WorkspaceStats};

pub use crate::error::{Holder, HolderKind, OomReport};
pub use ndmem_alloc::trace;
pub use oom::on_oom;

/// The PyTorch-style counters of one figure: its value now, its peak, and what was ever
/// added to and taken from it (`torch.cuda.memory_stats()`'s `current`, `peak`,
/// `allocated`, `freed`). `peak` is `None` where ndmem keeps no high-water mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value since creation or the last [`reset_peak`], if kept.
    pub peak: Option<u64>,
    /// Everything ever added.
    pub allocated: u64,
    /// Everything ever taken off (`allocated - current` where both are exact).
    pub freed: u64,
}

/// The counters of one budget, in bytes and in counts (semantics §7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BudgetCounters {
    /// Bytes live (handed out and not given back).
    pub bytes: Stat,
    /// Live allocations, counted (`None` where they are not counted: devices).
    pub count: Option<Stat>,
    /// Bytes held against the limit (for a pool: live plus cached), current and peak.
    pub reserved: Stat,
    /// Allocations retried after relieving pressure at a limit (process-wide for pools).
    pub num_alloc_retries: u64,
    /// Allocations refused.
    pub num_ooms: u64,
    /// Memory obtained from the OS (or the driver), in calls.
    pub os_allocations: u64,
    /// Memory given back to the OS (or the driver), in calls.
    pub os_frees: u64,
    /// The limit, `None` when unlimited.
    pub limit: Option<usize>,
}

impl BudgetCounters {
    /// The counters of a pool.
    pub fn of_pool(s: &PoolStats) -> BudgetCounters {
        let (bytes, count) = live_stats(
            (s.live_bytes, s.peak_bytes),
            (s.total_allocated_bytes, s.total_freed_bytes),
            (s.allocations, s.deallocations),
        );
        BudgetCounters {
            bytes,
            count,
            reserved: Stat {
                current: s.used_bytes as u64,
                peak: Some(s.peak_used_bytes as u64),
                allocated: 0,
                freed: 0,
            },
            num_alloc_retries: s.alloc_retries,
            num_ooms: s.failed_allocations,
            os_allocations: s.os_allocations,
            os_frees: s.os_frees,
            limit: s.limit_bytes,
        }
    }

    /// The counters of the heap.
    pub fn of_heap(s: &HeapStats) -> BudgetCounters {
        let (bytes, count) = live_stats(
            (s.live_bytes, s.peak_bytes),
            (s.total_allocated_bytes, s.total_freed_bytes),
            (s.allocations, s.deallocations),
        );
        BudgetCounters {
            bytes,
            count,
            reserved: Stat {
                current: s.reserved_bytes as u64,
                peak: None,
                allocated: 0,
                freed: 0,
            },
            num_alloc_retries: 0,
            num_ooms: s.failed_allocations,
            os_allocations: 0,
            os_frees: 0,
            limit: s.limit,
        }
    }
}

/// The byte and count rows of a budget from its `(live, peak)` bytes, `(allocated,
/// freed)` byte totals and `(allocations, frees)`.
fn live_stats(
    (live, peak): (usize, usize),
    (allocated, freed): (u64, u64),
    (allocations, frees): (u64, u64),
) -> (Stat, Option<Stat>) {
    (
        Stat {
            current: live as u64,
            peak: Some(peak as u64),
            allocated,
            freed,
        },
        Some(Stat {
            current: allocations.saturating_sub(frees),
            peak: None,
            allocated: allocations,
            freed: frees,
        }),
    )
}

/// One pool in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolSnapshot {
    /// `global` for [`Pool::global`], the registered name otherwise.
    pub name: String,
    /// The pool's figures.
    pub stats: PoolStats,
    /// Its PyTorch-style counters.
    pub counters: BudgetCounters,
    /// Why the pool refuses every allocation, if its configuration is invalid
    /// ([`Pool::config_error`]: garbage in `NDMEM_MAX_BYTES` for the global pool).
    pub config_error: Option<String>,
}

/// One workspace in a [`Snapshot`], with the thread that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WorkspaceEntry {
    /// The owning thread, `name (ThreadId(n))`.
    pub thread: String,
    /// Its figures (for another thread's workspace, as published at its last enter or
    /// leave).
    pub stats: WorkspaceStats,
}

/// One scope in a [`Snapshot`] (the tree in depth-first order, the root first).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ScopeSnapshot {
    /// The scope's name (`root` for the root).
    pub name: String,
    /// Depth in the tree: 0 for the root.
    pub depth: usize,
    /// Live tensors (memories) it owns.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: usize,
    /// The highest `bytes` any snapshot, summary or OOM report has seen since the scope was
    /// made or [`reset_peak`] (an observed peak: ndmem does not count per scope on the
    /// allocation path).
    pub peak_bytes: usize,
    /// Live tensors it borrowed, and their bytes.
    pub borrowed: usize,
    /// Bytes of the borrowed tensors.
    pub borrowed_bytes: usize,
    /// What its tensors, owned and borrowed, hold of their pools: the blocks' capacities
    /// (the size classes), as the pools count them; what closing it would release, less
    /// the borrowed tensors, which go back to their owners.
    pub held_bytes: usize,
    /// Whether it is capped.
    pub capped: bool,
    /// Whether it is closed.
    pub closed: bool,
}

/// One device in a [`Snapshot`] (semantics §5): every device opened and still alive,
/// simulated or CUDA.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceSnapshot {
    /// `sim:n` or `cuda:n`.
    pub id: String,
    /// The device's name (the GPU's, or `simulated device`).
    pub name: String,
    /// Device ordinal.
    pub ordinal: u32,
    /// Its figures.
    pub stats: DeviceStats,
    /// Its counters: bytes live (capacities), held against its limit (live + cached),
    /// driver allocations and frees; allocations are not counted (`count` is `None`).
    pub counters: BudgetCounters,
}

impl DeviceSnapshot {
    fn of(device: &Device) -> DeviceSnapshot {
        let stats = device.stats();
        let live = device.inner.counters.live.read();
        DeviceSnapshot {
            id: format!("{}:{}", device.kind(), device.ordinal()),
            name: device.name(),
            ordinal: device.ordinal(),
            counters: BudgetCounters {
                bytes: Stat {
                    current: live.value as u64,
                    peak: Some(live.peak as u64),
                    allocated: live.total,
                    freed: live.total.saturating_sub(live.value as u64),
                },
                count: None,
                reserved: Stat {
                    current: stats.used_bytes as u64,
                    peak: Some(device.inner.pool.budget.peak() as u64),
                    allocated: 0,
                    freed: 0,
                },
                num_alloc_retries: stats.alloc_retries,
                num_ooms: stats.failed_allocations,
                os_allocations: stats.driver_allocations,
                os_frees: stats.driver_frees,
                limit: stats.limit,
            },
            stats,
        }
    }
}

/// Deferred frees waiting for the epoch (semantics §6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Reclamation {
    /// Bytes waiting ([`crate::reclaim::pending_bytes`]).
    pub pending_bytes: usize,
}

/// The timeline recorder's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TraceState {
    /// Whether it records.
    pub on: bool,
    /// Events its ring holds at most.
    pub capacity: usize,
    /// Events recorded that the ring no longer holds.
    pub dropped: u64,
}

/// Every figure of the process at one moment (semantics §7). Each part is read on its
/// own, so figures of different parts may be a few operations apart under concurrency.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Snapshot {
    /// The tracking allocator's figures (all zero unless it is the global allocator).
    pub heap: HeapStats,
    /// Whether an [`ndmem_alloc::Tracking`] allocator is the global allocator
    /// ([`heap::is_tracking`]); when not, every heap figure is 0 and the summary says why.
    pub heap_tracked: bool,
    /// The heap's PyTorch-style counters.
    pub heap_counters: BudgetCounters,
    /// The pools: the global one and those registered, or those asked for.
    pub pools: Vec<PoolSnapshot>,
    /// Every live workspace of every thread.
    pub workspaces: Vec<WorkspaceEntry>,
    /// The scope tree, depth first from the root.
    pub scopes: Vec<ScopeSnapshot>,
    /// Every device opened and still alive (semantics §5).
    pub devices: Vec<DeviceSnapshot>,
    /// Pending deferred frees.
    pub reclaim: Reclamation,
    /// The timeline recorder.
    pub trace: TraceState,
}

/// Pools registered for [`snapshot`] beside the global one.
static REGISTERED: RwLock<Vec<(String, MemorySource)>> = RwLock::new(Vec::new());
/// The observed peak bytes of each scope, by owner id.
static SCOPE_PEAKS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

/// Adds `source`'s pool to what [`snapshot`], [`reset_peak`] and [`memory_summary`] read,
/// under `name`, which the timeline's events of that pool carry too (semantics §7).
/// Registering the same pool again renames it.
pub fn register(name: &str, source: MemorySource) {
    ndmem_alloc::trace::name_pool(source.pool().id(), name);
    let mut list = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    match list.iter_mut().find(|(_, s)| *s == source) {
        Some(entry) => entry.0 = name.to_string(),
        None => list.push((name.to_string(), source)),
    }
}

/// The pools [`snapshot`] reads: the global pool first, then the registered ones.
fn default_pools() -> Vec<(String, &'static Pool)> {
    let global = Pool::global();
    let mut pools = vec![("global".to_string(), global)];
    for (name, source) in REGISTERED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        if !std::ptr::eq(source.pool(), global) {
            pools.push((name.clone(), source.pool()));
        }
    }
    pools
}

/// The snapshot of the heap, the global pool and the registered ones ([`register`]),
/// every workspace, the scopes, devices and reclamation (semantics §7).
///
/// PyTorch: `torch.cuda.memory_stats()`.
pub fn snapshot() -> Snapshot {
    take(default_pools())
}

/// [`snapshot`] with the pools of `sources` (in that order) instead of the global and
/// registered ones.
pub fn snapshot_of(sources: &[MemorySource]) -> Snapshot {
    let pools = sources
        .iter()
        .enumerate()
        .map(|(i, s)| (pool_name(*s, i), s.pool()))
        .collect();
    take(pools)
}

fn pool_name(source: MemorySource, index: usize) -> String {
    if std::ptr::eq(source.pool(), Pool::global()) {
        return "global".into();
    }
    REGISTERED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(_, s)| *s == source)
        .map_or_else(|| format!("pool #{}", index + 1), |(n, _)| n.clone())
}

fn take(pools: Vec<(String, &'static Pool)>) -> Snapshot {
    let heap = heap::stats();
    let pools = pools
        .into_iter()
        .map(|(name, pool)| {
            let stats = pool.stats();
            PoolSnapshot {
                name,
                counters: BudgetCounters::of_pool(&stats),
                stats,
                config_error: pool.config_error().map(ToString::to_string),
            }
        })
        .collect();
    Snapshot {
        heap_counters: BudgetCounters::of_heap(&heap),
        heap,
        heap_tracked: heap::is_tracking(),
        pools,
        workspaces: all_workspaces()
            .into_iter()
            .map(|(thread, stats)| WorkspaceEntry { thread, stats })
            .collect(),
        scopes: scopes(),
        devices: open_devices().iter().map(DeviceSnapshot::of).collect(),
        reclaim: Reclamation {
            pending_bytes: crate::reclaim::pending_bytes(),
        },
        trace: TraceState {
            on: trace::is_on(),
            capacity: trace::capacity(),
            dropped: trace::dropped(),
        },
    }
}

/// The scope tree from the root, with observed peaks updated.
fn scopes() -> Vec<ScopeSnapshot> {
    scopes_with_source().into_iter().map(|e| e.scope).collect()
}

/// A scope of [`scopes_with_source`].
pub(crate) struct ScopeEntry {
    pub(crate) scope: ScopeSnapshot,
    /// Where its new memory comes from.
    pub(crate) source: MemorySource,
    /// What it holds of each host pool (its tensors may come from several).
    pub(crate) held_by_pool: Vec<PoolShare>,
}

/// [`scopes`] with each scope's memory source and what it holds of each pool.
pub(crate) fn scopes_with_source() -> Vec<ScopeEntry> {
    // The walk is taken under the lock, so that figures read before a reset are never
    // folded into the peaks after it (a peak is never raised after the fact).
    let mut peaks = SCOPE_PEAKS.lock().unwrap_or_else(PoisonError::into_inner);
    let figures = Owner::root().walk();
    let peaks = peaks.get_or_insert_with(HashMap::new);
    // Closed scopes leave the tree; their peaks go with them.
    peaks.retain(|id, _| figures.iter().any(|f| f.id == *id));
    let out = figures
        .into_iter()
        .map(|f| {
            let peak = peaks.entry(f.id).or_insert(0);
            *peak = (*peak).max(f.bytes);
            let scope = ScopeSnapshot {
                name: f.name,
                depth: f.depth,
                tensors: f.tensors,
                bytes: f.bytes,
                peak_bytes: *peak,
                borrowed: f.borrowed,
                borrowed_bytes: f.borrowed_bytes,
                held_bytes: f.held_bytes,
                capped: f.capped,
                closed: f.closed,
            };
            ScopeEntry {
                scope,
                source: f.source,
                held_by_pool: f.held_by_pool,
            }
        })
        .collect();
    out
}

/// Restarts every peak from its current figure at once: the heap's, the global and
/// registered pools' (live and used), every open device's (live and used), and the
/// scopes' observed peaks. Pools of their own
/// that are not registered: call [`Pool::reset_peak`] on them, or use [`reset_peak_of`].
///
/// PyTorch: `torch.cuda.reset_peak_memory_stats()`.
pub fn reset_peak() {
    heap::reset_peak();
    for (_, pool) in default_pools() {
        pool.reset_peak();
    }
    for device in open_devices() {
        device.inner.counters.live.reset_peak();
        device.inner.pool.budget.reset_peak();
    }
    reset_scope_peaks(|_| true);
}

/// [`reset_peak`] for the pools of `sources` and the scopes drawing from them, instead
/// of the global and registered pools and every scope; the heap's peak is restarted too
/// (every snapshot, [`snapshot_of`]'s included, shows it), the devices' are not.
pub fn reset_peak_of(sources: &[MemorySource]) {
    heap::reset_peak();
    for source in sources {
        source.pool().reset_peak();
    }
    reset_scope_peaks(|s| sources.contains(&s));
}

/// Restarts the observed peak of every scope whose source passes `which`.
fn reset_scope_peaks(which: impl Fn(MemorySource) -> bool) {
    // Under the lock, as in `scopes_with_source`.
    let mut peaks = SCOPE_PEAKS.lock().unwrap_or_else(PoisonError::into_inner);
    let figures = Owner::root().walk();
    let peaks = peaks.get_or_insert_with(HashMap::new);
    for f in figures.into_iter().filter(|f| which(f.source)) {
        peaks.insert(f.id, f.bytes);
    }
}

/// The whole snapshot as one table (see [`Snapshot`]'s `Display`).
///
/// PyTorch: `torch.cuda.memory_summary()`.
pub fn memory_summary() -> String {
    snapshot().to_string()
}
