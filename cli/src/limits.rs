//! `ndmem limits`: the effective memory limits and where each came from, the workspace
//! debug mode, the tracking allocator's heap statistics, the pool's figures, and whether a
//! CUDA driver is present.
//!
//! Invariant: it reports, it does not change, and it works under any limit: it allocates
//! nothing from the pool, and the CUDA probe loads the driver library without calling
//! into it.

#![allow(unsafe_code)]

use std::ffi::CStr;

use ndmem::alloc::{heap, physical_ram, ByteSize, LimitSource, Pool};

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
        // A share of each device's memory: only the device layer knows that memory, so
        // the figure is not a share of host RAM, and nothing applies it yet.
        Some(percent) => {
            outln!(
                "  {:<24} {percent:>12}  of each device, from the environment",
                "NDMEM_MAX_DEVICE_BYTES"
            );
            outln!("  {:<24} {:>12}  unresolved: no device layer yet", "", "");
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
    match cuda_driver() {
        Ok(()) => outln!(
            "CUDA driver: present ({} loads)",
            CUDA_LIBRARY.to_string_lossy()
        ),
        Err(why) => {
            outln!("CUDA driver: not found; device memory is unused");
            outln!("  ({why})");
        }
    }
    Ok(())
}

/// The CUDA driver library's name.
const CUDA_LIBRARY: &CStr = c"libcuda.so.1";

/// Whether the CUDA driver library can be loaded, without linking against it.
fn cuda_driver() -> Result<(), String> {
    let name = CUDA_LIBRARY;
    // SAFETY: `name` is a NUL-terminated string; dlopen with RTLD_LAZY only maps the
    // library (running its initialisers, as any CUDA program does); the handle is closed
    // at once and no symbol of it is used.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string valid until the next
        // dl* call on this thread; it is copied before any such call.
        let reason = unsafe {
            let message = libc::dlerror();
            if message.is_null() {
                "dlopen failed".to_string()
            } else {
                std::ffi::CStr::from_ptr(message)
                    .to_string_lossy()
                    .into_owned()
            }
        };
        return Err(reason);
    }
    // SAFETY: `handle` came from a successful dlopen and is closed exactly once.
    unsafe { libc::dlclose(handle) };
    Ok(())
}
