//! `ndmem limits`: the effective memory limits and where each came from, the workspace
//! debug mode, the tracking allocator's heap statistics, the pool's figures, and each CUDA
//! device with its memory and its limit (or why there is none).
//!
//! Invariant: it reports, it does not change, and it works under any limit: it allocates
//! nothing from the pool (opening a device takes no pool memory), and without a driver the
//! device probe loads nothing and fails with its reason.

use ndmem::alloc::{heap, physical_ram, ByteSize, LimitSource, Pool};
use ndmem::device;

use crate::env::{Environment, WorkspaceDebug};
use crate::out::outln;
use crate::Failure;

/// Where the default `NDMEM_MAX_BYTES` comes from, with this machine's RAM figure.
pub fn default_max_bytes() -> String {
    format!("1/2 of RAM {}", ByteSize(physical_ram()))
}

/// Prints the limits, the workspace mode, heap and pool statistics and the CUDA probe.
pub fn run(environment: &Environment) -> Result<(), Failure> {
    let limits = &environment.limits;
    let pool = Pool::try_global().map_err(|e| Failure::config(e.to_string()))?;
    let ram = physical_ram();
    outln!("ndmem limits (physical RAM {})", ByteSize(ram));
    let row = |name: &str, value: Option<usize>, source: LimitSource, none: &str, default: &str| {
        let none = match source {
            // Set, to 0 or to 4 EiB or more: no limit (semantics §1), whatever the row
            // shows when it is unset.
            LimitSource::Environment => "unlimited",
            _ => none,
        };
        let value = value.map_or(none.to_string(), |v| ByteSize(v).to_string());
        let source = match source {
            LimitSource::Environment => "from the environment".to_string(),
            LimitSource::Explicit => "set explicitly".to_string(),
            LimitSource::Default => format!("default: {default}"),
        };
        outln!("  {name:<24} {value:>12}  {source}");
    };
    row(
        "NDMEM_MAX_HEAP",
        limits.max_heap,
        limits.sources.max_heap,
        "tracked only",
        "no limit",
    );
    row(
        "NDMEM_MAX_BYTES",
        limits.max_bytes,
        limits.sources.max_bytes,
        "unlimited",
        &default_max_bytes(),
    );
    row(
        "NDMEM_MAX_PHYSICAL_BYTES",
        limits.max_physical_bytes,
        limits.sources.max_physical_bytes,
        "unlimited",
        "max_bytes + RAM/4, <= 90% RAM",
    );
    match &environment.device_percent {
        // A share of each device's memory, not of host RAM: resolved per device when the
        // device is opened (listed below).
        Some(percent) => {
            outln!(
                "  {:<24} {percent:>12}  of each device, from the environment",
                "NDMEM_MAX_DEVICE_BYTES"
            );
            outln!(
                "  {:<24} {:>12}  resolved against each device's memory",
                "",
                ""
            );
        }
        None => row(
            "NDMEM_MAX_DEVICE_BYTES",
            limits.max_device_bytes,
            limits.sources.max_device_bytes,
            "per device",
            "min(max_bytes, 90% of device)",
        ),
    }
    let (mode, meaning) = match environment.workspaces {
        WorkspaceDebug::Normal => ("normal", "unset: workspaces work normally"),
        WorkspaceDebug::SpillEverything => {
            ("spill_everything", "every workspace allocation spills")
        }
        WorkspaceDebug::Bypass => ("bypass", "workspaces off, tensors are pool blocks"),
    };
    outln!("  {:<24} {mode:>12}  {meaning}", "NDMEM_WORKSPACES");

    let h = heap::stats();
    outln!(
        "heap (ndmem_alloc::Tracking<System>{})",
        if heap::is_tracking() {
            ""
        } else {
            ", not installed"
        }
    );
    outln!(
        "  live {}  peak {}  limit {}  failed allocations {}",
        ByteSize(h.live_bytes),
        ByteSize(h.peak_bytes),
        h.limit
            .map_or("none".to_string(), |l| ByteSize(l).to_string()),
        h.failed_allocations
    );
    outln!(
        "  allocations {}  deallocations {}  reallocations {}",
        h.allocations,
        h.deallocations,
        h.reallocations
    );
    let p = pool.stats();
    outln!("off-heap pool (nothing allocated by this command)");
    outln!(
        "  live {}  cached {}  used {} of {}  RSS {}",
        ByteSize(p.live_bytes),
        ByteSize(p.cached_bytes),
        ByteSize(p.used_bytes),
        p.limit_bytes
            .map_or("unlimited".into(), |l| ByteSize(l).to_string()),
        ByteSize(p.physical_bytes)
    );
    outln!(
        "  RSS limit {}  allocations {}  OS allocations {}",
        p.physical_limit_bytes
            .map_or("unlimited".into(), |l| ByteSize(l).to_string()),
        p.allocations,
        p.os_allocations
    );
    match device::cuda_device_count() {
        Ok(0) => outln!("CUDA driver: present, no CUDA device; device memory is unused"),
        Ok(count) => {
            outln!("CUDA driver: present, {count} device(s)");
            for ordinal in 0..count {
                match device::cuda(ordinal) {
                    Ok(gpu) => outln!("  {}", gpu.describe()),
                    Err(e) => outln!("  cuda:{ordinal}: {e}"),
                }
            }
        }
        Err(e) if device::cuda_driver_present() => {
            outln!("CUDA driver: present, no usable device; device memory is unused");
            outln!("  ({e})");
        }
        Err(e) => {
            outln!("CUDA driver: not found; device memory is unused");
            outln!("  ({e})");
        }
    }
    Ok(())
}
