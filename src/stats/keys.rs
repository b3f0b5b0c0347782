//! The flat view of a [`Snapshot`] under PyTorch's `torch.cuda.memory_stats()` key names,
//! so that dashboards written for PyTorch read ndmem (semantics §7).
//!
//! Invariant: every key names one ndmem figure of the first pool of the snapshot (the
//! global pool for [`super::snapshot`]) or of the process; a PyTorch key whose figure
//! ndmem does not keep is left out rather than filled with a guess. The mapping:
//!
//! | key | ndmem figure |
//! |---|---|
//! | `allocated_bytes.all.current` / `.peak` | `PoolStats::live_bytes` / `peak_bytes` |
//! | `allocated_bytes.all.allocated` / `.freed` | `total_allocated_bytes` / `total_freed_bytes` |
//! | `active_bytes.all.*` | the same as `allocated_bytes` (a live block is active) |
//! | `reserved_bytes.all.current` / `.peak` | `used_bytes` / `peak_used_bytes` (live + cached, what counts against the limit) |
//! | `inactive_split_bytes.all.current` | `cached_bytes` (freed blocks kept for reuse) |
//! | `allocation.all.current` | `allocations - deallocations` |
//! | `allocation.all.allocated` / `.freed` | `allocations` / `deallocations` |
//! | `active.all.*` | the same as `allocation` |
//! | `segment.all.current` | `os_allocations - os_frees` |
//! | `segment.all.allocated` / `.freed` | `os_allocations` / `os_frees` |
//! | `num_device_alloc` / `num_device_free` | `os_allocations` / `os_frees` |
//! | `num_alloc_retries` | the pool's retries after relieving pressure at a limit |
//! | `num_ooms` | `failed_allocations` |
//! | `ndmem.heap.*` | the heap's `current`, `peak`, `allocated`, `freed` bytes (left out without `Tracking`) |
//! | `ndmem.workspaces.buffer_bytes` / `.spilled_bytes` | sums over every workspace |
//! | `ndmem.scopes.bytes` | bytes every scope's tensors hold of their pools, owned or borrowed (block capacities) |
//! | `ndmem.reclaim.pending_bytes` | deferred frees waiting |
//! | `ndmem.device.<sim\|cuda>:<n>.allocated_bytes.*` | a device's live bytes, peak, bytes ever handed out and given back |
//! | `ndmem.device.<id>.reserved_bytes.{current,peak}` | its bytes held against its limit (live + cached) |
//! | `ndmem.device.<id>.{num_device_alloc,num_device_free,transfers}` | its driver allocations and frees, host-device copies |
//!
//! Left out: `allocation.all.peak` and `segment.all.peak` (ndmem keeps no peak count),
//! `reserved_bytes.all.allocated`/`.freed` (the pool counts OS calls, not their bytes),
//! `requested_bytes.*` (ndmem counts block capacities), and the `large_pool`/`small_pool`
//! splits.

use super::{Snapshot, Stat};

/// Every key [`Snapshot::pytorch_keys`] gives, in its order (pool keys are present only
/// when the snapshot has a pool, `ndmem.heap.*` only when the heap is tracked), before the
/// per-device `ndmem.device.*` keys.
pub const PYTORCH_KEYS: &[&str] = &[
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "active_bytes.all.allocated",
    "active_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "allocation.all.current",
    "allocation.all.allocated",
    "allocation.all.freed",
    "active.all.current",
    "active.all.allocated",
    "active.all.freed",
    "segment.all.current",
    "segment.all.allocated",
    "segment.all.freed",
    "num_device_alloc",
    "num_device_free",
    "num_alloc_retries",
    "num_ooms",
    "ndmem.heap.current",
    "ndmem.heap.peak",
    "ndmem.heap.allocated",
    "ndmem.heap.freed",
    "ndmem.workspaces.buffer_bytes",
    "ndmem.workspaces.spilled_bytes",
    "ndmem.scopes.bytes",
    "ndmem.reclaim.pending_bytes",
];

fn stat(out: &mut Vec<(String, u64)>, prefix: &str, s: &Stat) {
    out.push((format!("{prefix}.current"), s.current));
    if let Some(peak) = s.peak {
        out.push((format!("{prefix}.peak"), peak));
    }
    out.push((format!("{prefix}.allocated"), s.allocated));
    out.push((format!("{prefix}.freed"), s.freed));
}

impl Snapshot {
    /// The snapshot under PyTorch's `memory_stats()` key names (see the table in this
    /// module's documentation), in the order of [`PYTORCH_KEYS`]. Collect it into a
    /// `BTreeMap` for lookups.
    pub fn pytorch_keys(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(PYTORCH_KEYS.len());
        if let Some(pool) = self.pools.first() {
            let c = &pool.counters;
            stat(&mut out, "allocated_bytes.all", &c.bytes);
            stat(&mut out, "active_bytes.all", &c.bytes);
            out.push(("reserved_bytes.all.current".into(), c.reserved.current));
            out.push((
                "reserved_bytes.all.peak".into(),
                c.reserved.peak.unwrap_or(c.reserved.current),
            ));
            out.push((
                "inactive_split_bytes.all.current".into(),
                pool.stats.cached_bytes as u64,
            ));
            if let Some(count) = &c.count {
                stat(&mut out, "allocation.all", count);
                stat(&mut out, "active.all", count);
            }
            let segment = Stat {
                current: c.os_allocations.saturating_sub(c.os_frees),
                peak: None,
                allocated: c.os_allocations,
                freed: c.os_frees,
            };
            stat(&mut out, "segment.all", &segment);
            out.push(("num_device_alloc".into(), c.os_allocations));
            out.push(("num_device_free".into(), c.os_frees));
            out.push(("num_alloc_retries".into(), c.num_alloc_retries));
            out.push(("num_ooms".into(), c.num_ooms));
        }
        // Without `Tracking` as the global allocator nothing counts the heap: its keys
        // are left out rather than given as zeros.
        if self.heap_tracked {
            stat(&mut out, "ndmem.heap", &self.heap_counters.bytes);
        }
        let sum = |f: fn(&crate::WorkspaceStats) -> usize| {
            self.workspaces.iter().map(|w| f(&w.stats) as u64).sum()
        };
        out.push(("ndmem.workspaces.buffer_bytes".into(), sum(|w| w.size)));
        out.push((
            "ndmem.workspaces.spilled_bytes".into(),
            sum(|w| w.spilled_bytes + w.pinned_bytes),
        ));
        out.push((
            "ndmem.scopes.bytes".into(),
            self.scopes.iter().map(|s| s.held_bytes as u64).sum(),
        ));
        out.push((
            "ndmem.reclaim.pending_bytes".into(),
            self.reclaim.pending_bytes as u64,
        ));
        for d in &self.devices {
            let prefix = format!("ndmem.device.{}", d.id);
            stat(
                &mut out,
                &format!("{prefix}.allocated_bytes"),
                &d.counters.bytes,
            );
            out.push((
                format!("{prefix}.reserved_bytes.current"),
                d.counters.reserved.current,
            ));
            if let Some(peak) = d.counters.reserved.peak {
                out.push((format!("{prefix}.reserved_bytes.peak"), peak));
            }
            out.push((
                format!("{prefix}.num_device_alloc"),
                d.counters.os_allocations,
            ));
            out.push((format!("{prefix}.num_device_free"), d.counters.os_frees));
            out.push((format!("{prefix}.transfers"), d.stats.transfers()));
        }
        out
    }
}
