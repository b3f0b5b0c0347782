//! The device pool: caching by size class, transfers through staging, deferred frees after
//! a fence (semantics §5, §6).

use ndmem::device::{self, BackendKind, DeviceMemory, STAGING_BYTES};

use crate::sim;

#[test]
fn a_freed_buffer_is_reused_without_the_driver() {
    let gpu = sim(0, 1 << 30);
    assert_eq!(gpu.kind(), BackendKind::Sim);
    let first = gpu.allocate(10_000).unwrap();
    assert_eq!(first.len(), 10_000);
    assert!(first.capacity() >= 10_000);
    assert_eq!(first.device_ptr() % 256, 0);
    drop(first);
    crate::settle(&gpu);
    let before = gpu.stats();
    assert_eq!(before.driver_allocations, 1);
    assert_eq!(before.live_bytes, 0);
    assert!(before.cached_bytes >= 10_000);
    assert!(before.fences_before_free >= 1, "a fence before reuse");
    for _ in 0..100 {
        let b = gpu.allocate(9_000).unwrap(); // the same size class
        drop(b);
        crate::settle(&gpu);
    }
    let after = gpu.stats().since(&before);
    assert_eq!(after.driver_allocations, 0);
    assert_eq!(after.pool_hits, 100);
}

#[test]
fn trim_gives_the_cache_back_to_the_driver() {
    let gpu = sim(0, 1 << 30);
    drop(gpu.allocate(1 << 20).unwrap());
    // The free waits for the epoch, which another test's op may hold pinned for a moment
    // (trim's own collect cannot pass a pin): let it reach the cache first.
    crate::settle(&gpu);
    assert!(gpu.trim() >= 1 << 20);
    let stats = gpu.stats();
    assert_eq!(
        (stats.cached_bytes, stats.used_bytes, stats.driver_frees),
        (0, 0, 1)
    );
    let info = gpu.memory_info().unwrap();
    assert_eq!(info.free, info.total);
}

#[test]
fn large_copies_go_through_staging_in_chunks_and_count_once() {
    let gpu = sim(0, 1 << 30);
    let n = STAGING_BYTES * 2 + 12345;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let mut buffer = gpu.allocate(n).unwrap();
    gpu.upload(&data, &mut buffer).unwrap();
    let mut back = vec![0u8; n];
    gpu.download(&buffer, &mut back).unwrap();
    assert!(back == data);
    let stats = gpu.stats();
    assert_eq!((stats.htod_transfers, stats.dtoh_transfers), (1, 1));
    assert_eq!(stats.htod_bytes, n as u64);
    assert_eq!(stats.staged_bytes, 2 * n as u64);
    // One staging buffer, reused for both directions.
    assert_eq!(stats.pinned_allocations, 1);
    assert_eq!(stats.pinned_bytes, STAGING_BYTES);
}

#[test]
fn pinned_copies_go_directly() {
    let gpu = sim(0, 1 << 30);
    let mut pinned = gpu.allocate_pinned(4096).unwrap();
    pinned.as_mut_slice().fill(0xab);
    let mut buffer = gpu.allocate(4096).unwrap();
    gpu.upload_pinned(&pinned, &mut buffer).unwrap();
    gpu.fill(&mut buffer, 0x11).unwrap();
    gpu.download_pinned(&buffer, &mut pinned).unwrap();
    assert!(pinned.as_slice().iter().all(|b| *b == 0x11));
    let stats = gpu.stats();
    assert_eq!(stats.staged_bytes, 0);
    assert_eq!(stats.transfers(), 2);
}

#[test]
fn sizes_that_do_not_fit_are_errors_not_panics() {
    let gpu = sim(0, 1 << 30);
    let mut small = gpu.allocate(16).unwrap();
    let err = gpu.upload(&[0u8; 32], &mut small).unwrap_err().to_string();
    assert!(err.contains("32 bytes do not fit in 16"), "{err}");
    assert!(gpu.allocate(0).is_err());
}

#[test]
fn pinned_buffers_are_counted_in_the_host_pool_and_freed_through_reclamation() {
    use ndmem::alloc::{Limits, Pool};
    use ndmem::MemorySource;
    let host = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
    let gpu = device::sim(
        device::SimConfig::new(0)
            .limit(device::DeviceLimit::Unlimited)
            .host(host),
    )
    .unwrap();
    let pinned = gpu.allocate_pinned(600 << 10).unwrap();
    assert_eq!(host.pool().stats().mirror_bytes, 600 << 10);
    let err = gpu.allocate_pinned(600 << 10).unwrap_err().to_string();
    assert!(
        err.contains("[HOST]") && err.contains("host mirrors 600.0 KiB"),
        "{err}"
    );
    drop(pinned);
    crate::settle(&gpu);
    assert_eq!(gpu.stats().pinned_bytes, 0);
    assert!(gpu.allocate_pinned(600 << 10).is_ok());
}

#[test]
fn events_and_synchronize_are_counted() {
    let gpu = sim(0, 1 << 30);
    let event = gpu.record_event().unwrap();
    assert!(event.is_complete().unwrap());
    event.synchronize().unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(gpu.stats().synchronizations, 2);
}

#[test]
fn the_current_device_is_per_thread() {
    let gpu = sim(3, 1 << 20);
    assert!(device::set_current(&gpu).is_none());
    assert_eq!(device::current().unwrap().ordinal(), 3);
    std::thread::spawn(|| {
        // Another thread has no current device: CUDA device 0, or NoDevice here.
        match device::current() {
            Ok(d) => assert_eq!(d.kind(), BackendKind::Cuda),
            Err(e) => assert!(e.to_string().starts_with("no device"), "{e}"),
        }
    })
    .join()
    .unwrap();
    assert_eq!(device::clear_current(), Some(gpu));
}

#[test]
fn describe_names_kind_ordinal_memory_and_limit() {
    let gpu = device::sim(
        device::SimConfig::new(2)
            .total_memory(8 << 30)
            .limit(device::DeviceLimit::parse("25%").unwrap()),
    )
    .unwrap();
    assert_eq!(
        gpu.describe(),
        "sim:2 simulated device, 8.00 GiB, limit 2.00 GiB (25%)"
    );
    let _ = gpu.stats().limit.unwrap();
    let buffer = gpu.allocate(100).unwrap();
    assert_eq!(buffer.ordinal(), 2);
    assert_eq!(DeviceMemory::len(&buffer), 100);
}

#[test]
fn a_dropped_device_gives_back_its_staging_buffer() {
    use ndmem::alloc::{Limits, Pool};
    use ndmem::MemorySource;
    let host = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 24).build()));
    let gpu = device::sim(
        device::SimConfig::new(0)
            .limit(device::DeviceLimit::Unlimited)
            .host(host),
    )
    .unwrap();
    // A pageable upload goes through the device's staging buffer (pinned, counted in the
    // host pool as mirror memory); a dropped buffer lands in the device's cache.
    let mut buffer = gpu.allocate(4096).unwrap();
    gpu.upload(&[7u8; 4096], &mut buffer).unwrap();
    drop(buffer);
    crate::settle(&gpu);
    assert!(host.pool().stats().mirror_bytes > 0);
    assert_eq!(gpu.stats().cached_bytes, 4096);
    // The staging buffer must not keep its own device alive: once the last handle goes,
    // its reservation is back in the host pool. (The cached buffer goes back to the
    // simulated driver with it; scripts/valgrind.sh runs this suite with leak checking.)
    drop(gpu);
    assert_eq!(host.pool().stats().mirror_bytes, 0);
}

#[test]
fn describe_names_the_side_of_the_default_limit_that_set_it() {
    // The default is min(host max_bytes, 90% of the device): "(default)" alone left a
    // user who passed --max-bytes wondering where the figure came from.
    let pool = ndmem::alloc::Pool::new(ndmem::alloc::Limits::unlimited());
    pool.set_max_bytes_by(Some(64 << 20), "--max-bytes")
        .unwrap();
    let host = ndmem::MemorySource::new(pool);
    let gpu = device::sim(device::SimConfig::new(3).total_memory(8 << 30).host(host)).unwrap();
    assert_eq!(
        gpu.describe(),
        "sim:3 simulated device, 8.00 GiB, limit 64.0 MiB (default: --max-bytes)"
    );
    let small = device::sim(device::SimConfig::new(4).total_memory(1 << 30).host(
        ndmem::MemorySource::new(ndmem::alloc::Pool::new(ndmem::alloc::Limits::unlimited())),
    ))
    .unwrap();
    assert_eq!(
        small.describe(),
        "sim:4 simulated device, 1.00 GiB, limit 921.6 MiB (default: 90% of the device)"
    );
    // The global pool's limit, with NDMEM_MAX_BYTES unset, is its own default (1/2 of RAM):
    // the line does not name a variable nobody set.
    let global = ndmem::MemorySource::global();
    let big = device::sim(device::SimConfig::new(6).total_memory(1 << 50).host(global)).unwrap();
    let from_env = ndmem::alloc::Limits::from_env().unwrap();
    let expected = match global.pool().limits().0 {
        None => "(default: 90% of the device)",
        Some(l)
            if from_env.max_bytes == Some(l)
                && from_env.sources.max_bytes == ndmem::alloc::LimitSource::Environment =>
        {
            "(default: NDMEM_MAX_BYTES)"
        }
        Some(_) => "(default: the host pool's max_bytes)",
    };
    assert!(big.describe().ends_with(expected), "{}", big.describe());
}
