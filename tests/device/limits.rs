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
fn a_device_refusal_calls_mirror_bytes_the_mirrors_device_sides() {
    let gpu = device::sim(
        SimConfig::new(13)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(1 << 20)),
    )
    .unwrap();
    let _mirror = gpu.allocate_for(256 << 10, Usage::Mirror).unwrap();
    let msg = gpu.allocate(900 << 10).unwrap_err().to_string();
    assert!(msg.contains("mirror device sides 256.0 KiB"), "{msg}");
    assert!(!msg.contains("host mirrors"), "{msg}");
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
    // The limit was given in code: the advice names that setting (semantics §7).
    assert!(
        msg.contains("raise SimConfig::limit (now 1.00 MiB)"),
        "{msg}"
    );
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
    // Semantics §5.2: the driver's refusal for want of memory is an out-of-memory error of
    // the device, with its report (the device's memory in use and in all, what to do), a
    // failure counted and the hooks called, as a refusal at the budget is.
    static HOOKED: AtomicUsize = AtomicUsize::new(0);
    ndmem::stats::on_oom(|report| {
        if report
            .to_string()
            .contains("the driver had no device memory left")
        {
            HOOKED.fetch_add(1, Ordering::Relaxed);
        }
    });
    let failed = gpu.stats().failed_allocations;
    let err = gpu.allocate(800 << 10).unwrap_err();
    assert_eq!(HOOKED.load(Ordering::Relaxed), 1, "the hooks saw it");
    assert!(err.is_out_of_memory(), "{err:?}");
    let Error::Alloc(AllocError::OutOfMemory {
        kind: MemoryKind::Device(0),
        requested,
        used,
        limit,
        ..
    }) = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((*requested, *limit), (800 << 10, 1 << 20));
    assert!(
        (800 << 10..1 << 20).contains(used),
        "the first buffer's class: {used}"
    );
    let text = err.to_string();
    assert!(text.contains("[DEVICE 0]"), "{text}");
    assert!(
        text.contains("the driver had no device memory left"),
        "{text}"
    );
    assert!(
        !text.contains("NDMEM_MAX_DEVICE_BYTES"),
        "no limit to raise: {text}"
    );
    assert_eq!(gpu.stats().failed_allocations, failed + 1);
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

/// A simulated device of 1 GiB with `limit`.
fn limited(ordinal: u32, limit: DeviceLimit) -> ndmem::Result<device::Device> {
    device::sim(SimConfig::new(ordinal).total_memory(1 << 30).limit(limit))
}

#[test]
fn a_percentage_over_a_zero_denominator_is_a_config_error_not_a_panic() {
    let bad = DeviceLimit::Percent {
        scaled: 1,
        denominator: 0,
    };
    let err = limited(0, bad).expect_err("a zero denominator");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("denominator: 0"), "names the value: {msg}");
    assert!(msg.contains("SimConfig::limit"), "names the setting: {msg}");
    // Neither printing nor resolving it panics.
    assert!(!bad.to_string().is_empty());
    assert!(bad.resolve(1 << 30, None).is_err());
}

#[test]
fn zero_given_in_code_is_no_limit_as_in_the_variable() {
    for zero in [
        DeviceLimit::Bytes(0),
        DeviceLimit::Percent {
            scaled: 0,
            denominator: 1,
        },
    ] {
        let gpu = limited(0, zero).unwrap();
        assert_eq!(gpu.limit(), None, "{zero:?}");
        let _buffer = gpu.allocate(1 << 20).expect("no limit of ndmem's own");
    }
}

#[test]
fn a_percentage_above_100_given_in_code_is_refused() {
    for (scaled, denominator) in [(101, 1), (1001, 10), (u64::MAX, 1)] {
        let err = limited(
            0,
            DeviceLimit::Percent {
                scaled,
                denominator,
            },
        )
        .expect_err("more than the device");
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(err.to_string().contains("cannot exceed 100%"), "{err}");
    }
}

#[test]
fn a_percentage_of_less_than_one_byte_given_in_code_is_refused() {
    let tiny = DeviceLimit::Percent {
        scaled: 1,
        denominator: 1_000_000,
    };
    let err = device::sim(SimConfig::new(0).total_memory(1000).limit(tiny))
        .expect_err("less than one byte");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("less than one byte"), "{msg}");
    // Given in code, not in the variable: the message names the setting.
    assert!(
        msg.contains("SimConfig::limit") && !msg.contains("NDMEM_MAX_DEVICE_BYTES"),
        "{msg}"
    );
}

#[test]
fn a_byte_limit_beyond_isize_max_given_in_code_is_refused() {
    let err = limited(0, DeviceLimit::Bytes(usize::MAX)).expect_err("overflows isize");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("isize::MAX"), "{err}");
    // isize::MAX itself is no limit, as in the variable, and so is everything from 4 EiB
    // (semantics §1); just below is a limit.
    for bytes in [isize::MAX as usize, 1 << 62] {
        assert_eq!(
            limited(0, DeviceLimit::Bytes(bytes)).unwrap().limit(),
            None,
            "{bytes}"
        );
    }
    assert_eq!(
        limited(0, DeviceLimit::Bytes((1 << 62) - 1))
            .unwrap()
            .limit(),
        Some((1 << 62) - 1)
    );
}

#[test]
fn a_percentage_over_any_denominator_displays_with_decimals() {
    let third = DeviceLimit::Percent {
        scaled: 1,
        denominator: 3,
    };
    assert_eq!(third.to_string(), "0.333%");
    let gpu = limited(0, third).unwrap();
    assert_eq!(gpu.limit(), Some((1usize << 30) / 300));
    assert!(gpu.describe().ends_with("(0.333%)"), "{}", gpu.describe());
    for (scaled, denominator, text) in [
        (2, 3, "0.667%"),
        (100, 3, "33.3%"),
        (125, 10, "12.5%"),
        (50, 1, "50%"),
        (1, 7_000, "0.000143%"),
    ] {
        let limit = DeviceLimit::Percent {
            scaled,
            denominator,
        };
        assert_eq!(limit.to_string(), text, "{limit:?}");
    }
}

#[test]
fn a_simulated_device_without_memory_is_refused() {
    for limit in [DeviceLimit::Unlimited, DeviceLimit::Default] {
        let err = device::sim(SimConfig::new(0).total_memory(0).limit(limit))
            .expect_err("a device with no memory");
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("SimConfig::total_memory") && msg.contains("no memory"),
            "{msg}"
        );
    }
}

#[test]
fn refusals_and_retries_are_counted_in_the_stats_and_the_snapshot() {
    const ORDINAL: u32 = 41;
    let gpu = limited(ORDINAL, DeviceLimit::Bytes(1 << 20)).unwrap();
    let start = gpu.stats();
    assert_eq!((start.failed_allocations, start.alloc_retries), (0, 0));
    // A retry after relief that succeeds: a freed 768 KiB buffer is flushed and trimmed
    // to make room for a 1 MiB one.
    drop(gpu.allocate(768 << 10).unwrap());
    let big = gpu.allocate(900 << 10).unwrap();
    let after_retry = gpu.stats();
    assert_eq!(after_retry.alloc_retries, 1);
    assert_eq!(after_retry.failed_allocations, 0);
    // Two refusals, each after one retry.
    assert!(gpu.allocate(4096).is_err());
    assert!(gpu.allocate(4096).is_err());
    let stats = gpu.stats();
    assert_eq!(stats.failed_allocations, 2);
    assert_eq!(stats.alloc_retries, 3);
    let interval = stats.since(&after_retry);
    assert_eq!(
        (interval.failed_allocations, interval.alloc_retries),
        (2, 2)
    );
    let snap = ndmem::stats::snapshot();
    let d = snap
        .devices
        .iter()
        .find(|d| d.id == format!("sim:{ORDINAL}"))
        .expect("the device is in the snapshot");
    assert_eq!(d.counters.num_ooms, 2);
    assert_eq!(d.counters.num_alloc_retries, 3);
    let summary = snap.to_string();
    assert!(summary.contains("retries 3, OOMs 2, "), "{summary}");
    drop(big);
}

#[test]
fn a_refusal_names_the_bytes_asked_for_then_the_size_class() {
    // The bytes asked for open the message; the class block that did not fit follows.
    let gpu = limited(0, DeviceLimit::Bytes(400_000)).unwrap();
    let err = gpu.allocate(400_000).unwrap_err();
    let msg = err.to_string();
    let needed = match err.alloc_error() {
        Some(&AllocError::OutOfMemory {
            requested, needed, ..
        }) => {
            assert_eq!(requested, 400_000);
            needed
        }
        other => panic!("{other:?}"),
    };
    assert!(needed > 400_000, "a larger class: {needed}");
    let opening = format!(
        "Can't allocate [DEVICE 0] memory: 400000 bytes (a block of {});",
        ndmem::alloc::ByteSize(needed)
    );
    assert!(msg.starts_with(&opening), "{msg}");
}

/// The `threadId` of a refusal of `gpu` and of a host pool's, on the calling thread.
fn refusal_threads(gpu: &device::Device) -> (u64, u64) {
    use ndmem::alloc::{Limits, Pool};
    let device = match gpu.allocate(2 << 20).unwrap_err().alloc_error() {
        Some(&AllocError::OutOfMemory { thread, .. }) => thread,
        other => panic!("{other:?}"),
    };
    let pool = Pool::new(Limits::builder().max_bytes(64 << 10).build());
    let host = match pool.allocate(1 << 20, 8) {
        Err(AllocError::OutOfMemory { thread, .. }) => thread,
        other => panic!("{other:?}"),
    };
    (device, host)
}

#[test]
fn a_refusal_names_the_os_thread_as_the_host_pool_does() {
    let gpu = limited(0, DeviceLimit::Bytes(1 << 20)).unwrap();
    let (device, host) = refusal_threads(&gpu);
    assert_eq!(device, host, "the main test thread");
    let other = gpu.clone();
    let (device2, host2) = std::thread::spawn(move || refusal_threads(&other))
        .join()
        .unwrap();
    assert_eq!(device2, host2, "a spawned thread");
    assert_ne!(device, device2, "two threads, two ids");
}

#[test]
fn the_advice_names_the_setting_that_gave_the_refusing_limit() {
    // semantics §1 and §7: the out-of-memory advice names the knob that applies: the
    // host pool's max_bytes when the default limit follows it, the device's share when
    // 90% of the device is the smaller, and the setting that gave any other limit.
    use ndmem::alloc::{Limits, Pool};
    use ndmem::MemorySource;
    // The error's `variable` field names the same setting as its advice.
    let variable = |gpu: &ndmem::device::Device, bytes: usize| match gpu.allocate(bytes) {
        Err(Error::Alloc(AllocError::OutOfMemory { variable, .. })) => variable,
        other => panic!("{other:?}"),
    };
    let refusal = |gpu: &ndmem::device::Device, bytes: usize| match gpu.allocate(bytes) {
        Err(e @ Error::Alloc(AllocError::OutOfMemory { .. })) => e.to_string(),
        other => panic!("{other:?}"),
    };
    let small_host = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
    let follows_host = device::sim(
        SimConfig::new(5)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Default)
            .host(small_host),
    )
    .unwrap();
    assert_eq!(
        variable(&follows_host, 2 << 20),
        "the host pool's max_bytes"
    );
    let text = refusal(&follows_host, 2 << 20);
    assert!(
        text.contains(
            "raise the host pool's max_bytes (now 1.00 MiB): with SimConfig::limit \
             DeviceLimit::Default, the device's limit is min(the host pool's max_bytes, 90% of \
             the device)"
        ),
        "{text}"
    );
    let large_host = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 30).build()));
    let share = device::sim(
        SimConfig::new(5)
            .total_memory(10 << 20)
            .limit(DeviceLimit::Default)
            .host(large_host),
    )
    .unwrap();
    assert_eq!(share.limit(), Some(9 << 20));
    assert_eq!(variable(&share, 10 << 20), "SimConfig::limit");
    let text = refusal(&share, 10 << 20);
    assert!(
        text.contains("the device's limit is 90% of its 10.0 MiB (now 9.00 MiB)")
            && text.contains("set SimConfig::limit to a larger share (up to 100%)")
            && !text.contains("raise the host pool"),
        "{text}"
    );
    let given = device::sim(
        SimConfig::new(5)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(1 << 20)),
    )
    .unwrap();
    assert_eq!(variable(&given, 2 << 20), "SimConfig::limit");
    let text = refusal(&given, 2 << 20);
    assert!(
        text.contains("raise SimConfig::limit (now 1.00 MiB)"),
        "{text}"
    );
}

#[test]
fn a_request_no_budget_can_hold_is_an_invalid_layout_not_an_oom() {
    // semantics §1 (as for the host pool): a request of 4 EiB or more is `InvalidLayout`
    // ("more than any pool can hold"), even on a device with no limit: no advice to raise
    // a limit, no failure counted, no hook called.
    let gpu = device::sim(
        SimConfig::new(6)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Unlimited),
    )
    .unwrap();
    assert_eq!(gpu.limit(), None);
    for bytes in [1usize << 62, isize::MAX as usize] {
        match gpu.allocate(bytes) {
            Err(Error::Alloc(AllocError::InvalidLayout { size, reason, .. })) => {
                assert_eq!(size, bytes);
                assert!(reason.contains("more than any pool can hold"), "{reason}");
            }
            other => panic!("{bytes}: {other:?}"),
        }
    }
    assert_eq!(gpu.stats().failed_allocations, 0);
    // The largest request below it is the driver's to refuse (the device has 1 GiB).
    let err = gpu.allocate((1usize << 62) - 1).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
}

#[test]
fn at_the_limit_the_device_waits_out_a_pin_that_holds_its_frees_for_300_ms() {
    // Semantics §5.2: at the limit the pool flushes its deferred frees while none come
    // back, for up to a second (a thread descheduled while pinned on a loaded machine
    // holds them that long; the wait was 100 ms, and such a pin got the request refused
    // with the bytes only pending).
    const LIMIT: usize = 4 << 20;
    let gpu = device::sim(
        SimConfig::new(7)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Bytes(LIMIT)),
    )
    .unwrap();
    let host = ndmem::Tensor::zeros(ndmem::DType::U8, &[3 << 20]).unwrap();
    let first = host.to_device(&gpu).unwrap();
    let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
    let pinner = std::thread::spawn(move || {
        let _pin = ndmem::reclaim::pin();
        pinned_tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
    });
    pinned_rx.recv().unwrap();
    drop(first); // deferred: the pinner may still be reading
    assert!(gpu.stats().deferred_bytes >= 3 << 20);
    let started = std::time::Instant::now();
    let second = host
        .to_device(&gpu)
        .expect("the pool waited for the pinned thread's frees");
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(gpu.stats().failed_allocations, 0);
    drop(second);
    pinner.join().unwrap();
}

#[test]
fn a_host_pool_refusing_a_device_tensors_host_copy_is_an_out_of_memory_error() {
    // Semantics §5.8: host operations on a device tensor work after one download into its
    // host pool; a host pool at its limit refuses that copy, and the error says so (an
    // OOM with its report), not that the tensor's scope is closed: the tensor is live and
    // readable once the host has room.
    use ndmem::alloc::{Limits, Pool};
    use ndmem::{DType, MemorySource, Tensor};
    let host = MemorySource::new(Pool::new(Limits::builder().max_bytes(64 << 10).build()));
    let gpu = device::sim(SimConfig::new(0).limit(DeviceLimit::Unlimited).host(host)).unwrap();
    let column = Tensor::ones(DType::F32, &[256, 1])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    let row = Tensor::ones(DType::F32, &[1, 256])
        .unwrap()
        .to_device(&gpu)
        .unwrap();
    let big = column.matmul(&row).unwrap(); // 256 KiB, on the device only
    assert!(big.is_valid());
    for err in [
        big.to_vec::<f32>().unwrap_err(),
        big.view::<f32>().unwrap_err(),
    ] {
        assert!(err.is_out_of_memory(), "{err}");
        assert!(err.oom_report().is_some(), "{err}");
        assert!(!matches!(err, Error::ScopeClosed { .. }), "{err}");
    }
    host.pool().set_max_bytes(None).unwrap();
    let values = big.to_vec::<f32>().unwrap();
    assert_eq!(values.len(), 256 * 256);
    assert!(values.iter().all(|&v| v == 1.0), "an outer product of ones");
}
