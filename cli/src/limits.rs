//! `ndmem limits`: the effective memory limits and where each came from, the tracking
//! allocator's heap statistics, the pool's figures, and whether a CUDA driver is present.
//!
//! Invariant: it reports, it does not change: the only pool traffic is one 1 MiB block
//! allocated and freed to show the counters move, and the CUDA probe loads the driver
//! library without calling into it.

#![allow(unsafe_code)]

use std::ffi::CStr;

use ndmem::alloc::{heap, physical_ram, ByteSize, LimitSource, Limits, Pool};

use crate::Failure;

/// Where the default `NDMEM_MAX_BYTES` comes from, with this machine's RAM figure.
pub fn default_max_bytes() -> String {
    format!("1/2 of RAM {}", ByteSize(physical_ram()))
}

/// Prints the limits, heap and pool statistics and the CUDA probe.
pub fn run() -> Result<(), Failure> {
    let limits = Limits::from_env().map_err(|e| Failure::config(e.to_string()))?;
    let pool = Pool::try_global().map_err(|e| Failure::config(e.to_string()))?;
    let ram = physical_ram();
    println!("ndmem limits (physical RAM {})", ByteSize(ram));
    let row = |name: &str, value: Option<usize>, source: LimitSource, none: &str, default: &str| {
        let value = value.map_or(none.to_string(), |v| ByteSize(v).to_string());
        let source = match source {
            LimitSource::Environment => "from the environment".to_string(),
            LimitSource::Explicit => "set explicitly".to_string(),
            LimitSource::Default => format!("default: {default}"),
        };
        println!("  {name:<26} {value:>14}  ({source})");
    };
    row(
        "NDMEM_MAX_HEAP",
        limits.max_heap,
        limits.sources.max_heap,
        "tracked only",
        "no limit, every byte counted",
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
        "max_bytes + 1/4 of RAM, at most 90% of RAM",
    );
    row(
        "NDMEM_MAX_DEVICE_BYTES",
        limits.max_device_bytes,
        limits.sources.max_device_bytes,
        "per device",
        "min(max_bytes, 90% of each device)",
    );

    let block = pool
        .allocate(1 << 20, 64)
        .map_err(|e| Failure::runtime(e.to_string()))?;
    drop(block);
    let h = heap::stats();
    println!(
        "heap (ndmem_alloc::Tracking<System>{})",
        if heap::is_tracking() {
            ""
        } else {
            ", not installed"
        }
    );
    println!(
        "  live {}  peak {}  limit {}  allocations {}  deallocations {}  reallocations {}  failed {}",
        ByteSize(h.live_bytes),
        ByteSize(h.peak_bytes),
        h.limit.map_or("none".to_string(), |l| ByteSize(l).to_string()),
        h.allocations,
        h.deallocations,
        h.reallocations,
        h.failed_allocations
    );
    let p = pool.stats();
    println!("off-heap pool (after one 1 MiB block was allocated and freed)");
    println!(
        "  live {}  peak {}  cached {}  used {} of {}  allocations {}  OS allocations {}  RSS {}",
        ByteSize(p.live_bytes),
        ByteSize(p.peak_bytes),
        ByteSize(p.cached_bytes),
        ByteSize(p.used_bytes),
        p.limit_bytes
            .map_or("unlimited".into(), |l| ByteSize(l).to_string()),
        p.allocations,
        p.os_allocations,
        ByteSize(p.physical_bytes)
    );
    match cuda_driver() {
        Ok(()) => println!(
            "CUDA driver: present ({} loads)",
            CUDA_LIBRARY.to_string_lossy()
        ),
        Err(why) => println!("CUDA driver: not found ({why}); device memory is unused"),
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
