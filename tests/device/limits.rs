//! The device limit (semantics §1, §5): a size or a percentage of the device's memory,
//! exact from several threads, and an out-of-memory error naming `[DEVICE n]` and what
//! holds the memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use ndmem::alloc::{AllocError, MemoryKind, Usage};
use ndmem::device::{self, DeviceLimit, SimConfig};
use ndmem::Error;

#[test]
fn a_percentage_is_of_the_device_memory_not_of_ram() {
    for (total, text, expected) in [
        (8usize << 30, "50%", 4usize << 30),
        (80 << 30, "12.5%", 10 << 30),
        (1000, "100%", 1000),
    ] {
        let gpu = device::sim(
            SimConfig::new(0)
                .total_memory(total)
                .limit(DeviceLimit::parse(text).unwrap()),
        )
        .unwrap();
        assert_eq!(gpu.limit(), Some(expected), "{text} of {total}");
    }
}

#[test]
fn the_default_is_min_of_max_bytes_and_ninety_percent_of_the_device() {
    use ndmem::alloc::{Limits, Pool};
    use ndmem::MemorySource;
    let host = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 30).build()));
    let small = device::sim(
        SimConfig::new(0)
            .total_memory(1000 << 20)
            .limit(DeviceLimit::Default)
            .host(host),
    )
    .unwrap();
    assert_eq!(small.limit(), Some((1000 << 20) / 10 * 9));
    let large = device::sim(
        SimConfig::new(0)
            .total_memory(80 << 30)
            .limit(DeviceLimit::Default)
            .host(host),
    )
    .unwrap();
    assert_eq!(large.limit(), Some(1 << 30));
}

#[test]
fn the_limit_is_exact_from_four_threads() {
    const LIMIT: usize = 1 << 20;
    const SIZE: usize = 24 << 10; // a size class of its own (24 KiB)
    let gpu = device::sim(
        SimConfig::new(1)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(LIMIT)),
    )
    .unwrap();
    let tally = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (gpu, tally, peak, refused, barrier) = (
                gpu.clone(),
                tally.clone(),
                peak.clone(),
                refused.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let mut held = Vec::new();
                for i in 0..2000 {
                    match gpu.allocate(SIZE - (t * 64 + i % 7)) {
                        Ok(b) => {
                            let now =
                                tally.fetch_add(b.capacity(), Ordering::SeqCst) + b.capacity();
                            peak.fetch_max(now, Ordering::SeqCst);
                            assert!(gpu.stats().used_bytes <= LIMIT);
                            held.push(b);
                        }
                        Err(Error::Alloc(AllocError::OutOfMemory { kind, limit, .. })) => {
                            assert_eq!(kind, MemoryKind::Device(1));
                            assert_eq!(limit, LIMIT);
                            refused.fetch_add(1, Ordering::SeqCst);
                            // Give back half of what this thread holds.
                            let give_back = held.len().div_ceil(2);
                            for b in held.drain(..give_back) {
                                tally.fetch_sub(b.capacity(), Ordering::SeqCst);
                            }
                        }
                        Err(other) => panic!("{other}"),
                    }
                    if i % 3 == 0 {
                        if let Some(b) = held.pop() {
                            tally.fetch_sub(b.capacity(), Ordering::SeqCst);
                        }
                    }
                }
                for b in held {
                    tally.fetch_sub(b.capacity(), Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    crate::settle(&gpu);
    let stats = gpu.stats();
    // Never above the limit: neither the independent tally of live capacities nor the
    // pool's own figures, and the limit was reached (some requests were refused).
    assert!(peak.load(Ordering::SeqCst) <= LIMIT);
    assert!(stats.peak_live_bytes <= LIMIT);
    assert!(refused.load(Ordering::SeqCst) > 0);
    assert_eq!(tally.load(Ordering::SeqCst), 0);
    assert_eq!(stats.live_bytes, 0);
    assert!(stats.used_bytes <= LIMIT);
    let info = gpu.memory_info().unwrap();
    assert_eq!(
        info.total - info.free,
        stats.used_bytes,
        "driver and pool agree"
    );
}

#[test]
fn out_of_memory_names_the_device_and_what_holds_its_memory() {
    let gpu = device::sim(
        SimConfig::new(3)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(1 << 20)),
    )
    .unwrap();
    let _tensor = gpu.allocate(512 << 10).unwrap();
    let _ws = gpu.allocate_for(256 << 10, Usage::Workspace).unwrap();
    let err = gpu.allocate(512 << 10).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("[DEVICE 3]"), "{msg}");
    assert!(msg.contains("NDMEM_MAX_DEVICE_BYTES"), "{msg}");
    assert!(msg.contains("workspaces 256.0 KiB"), "{msg}");
    assert!(msg.contains("tensors 512.0 KiB"), "{msg}");
    // The device budget is named as such, not as the host's off-heap one.
    assert!(
        msg.contains("device 768.0 KiB of 1.00 MiB limit in use"),
        "{msg}"
    );
    assert!(!msg.contains("off-heap"), "{msg}");
    match err.alloc_error() {
        Some(&AllocError::OutOfMemory {
            kind,
            used,
            limit,
            requested,
            ..
        }) if err.oom_report().is_some() => {
            assert_eq!(kind, MemoryKind::Device(3));
            assert_eq!((used, limit, requested), (768 << 10, 1 << 20, 512 << 10));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn at_the_limit_deferred_frees_and_the_cache_are_released_first() {
    let gpu = device::sim(
        SimConfig::new(0)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(1 << 20)),
    )
    .unwrap();
    // Fill the cache with small buffers, then ask for one large one.
    let small: Vec<_> = (0..16).map(|_| gpu.allocate(60 << 10).unwrap()).collect();
    drop(small); // deferred: still counted until collected
    let big = gpu.allocate(900 << 10).unwrap();
    assert_eq!(big.len(), 900 << 10);
    assert!(gpu.stats().driver_frees >= 1);
}

#[test]
fn the_simulated_driver_refuses_what_the_device_does_not_hold() {
    let gpu = device::sim(
        SimConfig::new(0)
            .total_memory(1 << 20)
            .limit(DeviceLimit::Unlimited),
    )
    .unwrap();
    let _a = gpu.allocate(800 << 10).unwrap();
    let err = gpu.allocate(800 << 10).unwrap_err();
    assert!(matches!(err, Error::Device { device: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("out of memory"), "{err}");
}

#[test]
fn garbage_in_the_variable_names_it() {
    let err = DeviceLimit::parse("lots").unwrap_err().to_string();
    assert!(
        err.contains("NDMEM_MAX_DEVICE_BYTES") && err.contains("\"lots\""),
        "{err}"
    );
    let err = DeviceLimit::parse("150%").unwrap_err().to_string();
    assert!(err.contains("cannot exceed 100%"), "{err}");
}
