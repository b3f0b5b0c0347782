//! The `ndmem` command. For now it prints the effective memory limits, where each came
//! from, and the current heap and pool statistics.

use std::process::ExitCode;

use ndmem::alloc::{heap, ByteSize, LimitSource, Limits, Pool, Tracking};

#[global_allocator]
static GLOBAL: Tracking<std::alloc::System> = Tracking::new(std::alloc::System);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ndmem: {message}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    if let Some(err) = heap::env_error() {
        return Err(err.to_string());
    }
    let limits = Limits::from_env().map_err(|e| e.to_string())?;
    let pool = Pool::try_global().map_err(|e| e.to_string())?;
    println!(
        "ndmem limits (physical RAM {})",
        ByteSize(ndmem::alloc::physical_ram())
    );
    let row = |name: &str, value: Option<usize>, source: LimitSource, none: &str| {
        let value = value.map_or(none.to_string(), |v| ByteSize(v).to_string());
        let source = match source {
            LimitSource::Environment => "environment",
            LimitSource::Explicit => "set explicitly",
            LimitSource::Default => "default",
        };
        println!("  {name:<26} {value:>12}  ({source})");
    };
    row(
        "NDMEM_MAX_HEAP",
        limits.max_heap,
        limits.sources.max_heap,
        "tracked only",
    );
    row(
        "NDMEM_MAX_BYTES",
        limits.max_bytes,
        limits.sources.max_bytes,
        "unlimited",
    );
    row(
        "NDMEM_MAX_PHYSICAL_BYTES",
        limits.max_physical_bytes,
        limits.sources.max_physical_bytes,
        "unlimited",
    );
    row(
        "NDMEM_MAX_DEVICE_BYTES",
        limits.max_device_bytes,
        limits.sources.max_device_bytes,
        "per device",
    );

    let block = pool.allocate(1 << 20, 64).map_err(|e| e.to_string())?;
    drop(block);
    let h = heap::stats();
    println!("heap (tracking allocator)");
    println!(
        "  live {}  peak {}  allocations {}  deallocations {}  failed {}",
        ByteSize(h.live_bytes),
        ByteSize(h.peak_bytes),
        h.allocations,
        h.deallocations,
        h.failed_allocations
    );
    let p = pool.stats();
    println!("off-heap pool (after one 1 MiB block was allocated and freed)");
    println!(
        "  live {}  peak {}  cached {}  used {} of {}  os allocations {}  RSS {}",
        ByteSize(p.live_bytes),
        ByteSize(p.peak_bytes),
        ByteSize(p.cached_bytes),
        ByteSize(p.used_bytes),
        p.limit_bytes
            .map_or("unlimited".into(), |l| ByteSize(l).to_string()),
        p.os_allocations,
        ByteSize(p.physical_bytes)
    );
    Ok(())
}
