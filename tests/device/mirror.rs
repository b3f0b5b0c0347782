//! Mirrored buffers: the exact minimal transfers of scripted host/device sequences, no
//! stale read ever (semantics §5).

use ndmem::device::{DeviceMemory, Mirror};
use ndmem::MirroringPolicy;

use crate::{floats, sim, write_floats};

const N: usize = 256;
const BYTES: usize = N * 4;

/// A simulated kernel: adds `delta` to every float of the device side.
fn device_add(m: &mut Mirror, delta: f32) {
    let gpu = m.device_handle().clone();
    let mut side = m.device_mut().unwrap();
    let bytes = gpu.sim_bytes_mut(&mut side).expect("sim device");
    let values: Vec<f32> = floats(bytes).iter().map(|v| v + delta).collect();
    write_floats(bytes, &values);
}

/// A simulated kernel that only reads the device side; returns its sum.
fn device_sum(m: &mut Mirror) -> f32 {
    let gpu = m.device_handle().clone();
    let side = m.device().unwrap();
    floats(gpu.sim_bytes(&side).expect("sim device"))
        .iter()
        .sum()
}

#[derive(Debug, Clone, Copy)]
enum Step {
    HostWrite(f32),
    HostAdd(f32),
    HostRead,
    DeviceAdd(f32),
    DeviceRead,
}

/// Runs `script` and checks the values after every step and the transfers at the end.
fn run(script: &[Step], htod: u64, dtoh: u64) {
    let gpu = sim(0, 1 << 30);
    let mut m = Mirror::new(&gpu, BYTES, MirroringPolicy::Full).unwrap();
    let mut expected = 0.0f32;
    for (i, step) in script.iter().enumerate() {
        match *step {
            Step::HostWrite(v) => {
                write_floats(m.host_overwrite().unwrap(), &[v; N]);
                expected = v;
            }
            Step::HostAdd(d) => {
                let bytes = m.host_mut().unwrap();
                let values: Vec<f32> = floats(bytes).iter().map(|v| v + d).collect();
                write_floats(bytes, &values);
                expected += d;
            }
            Step::HostRead => {
                assert_eq!(floats(m.host().unwrap()), vec![expected; N], "step {i}");
            }
            Step::DeviceAdd(d) => {
                device_add(&mut m, d);
                expected += d;
            }
            Step::DeviceRead => {
                assert_eq!(device_sum(&mut m), expected * N as f32, "step {i}");
            }
        }
    }
    let stats = gpu.stats();
    assert_eq!(
        (stats.htod_transfers, stats.dtoh_transfers),
        (htod, dtoh),
        "{script:?}"
    );
    assert_eq!(stats.htod_bytes, htod * BYTES as u64);
    assert_eq!(stats.dtoh_bytes, dtoh * BYTES as u64);
    assert_eq!(stats.staged_bytes, (htod + dtoh) * BYTES as u64);
}

#[test]
fn host_write_device_op_host_read_device_ops_host_read() {
    use Step::*;
    // write: host current; op: 1 upload; read: 1 download (both sides current now); two
    // ops: nothing to copy; read: 1 download.
    run(
        &[
            HostWrite(1.0),
            DeviceAdd(1.0),
            HostRead,
            DeviceAdd(2.0),
            DeviceAdd(3.0),
            HostRead,
        ],
        1,
        2,
    );
}

#[test]
fn reads_on_a_current_side_copy_nothing() {
    use Step::*;
    run(
        &[HostWrite(5.0), HostRead, HostRead, HostAdd(1.0), HostRead],
        0,
        0,
    );
    run(
        &[DeviceAdd(1.0), DeviceRead, DeviceRead, DeviceAdd(2.0)],
        0,
        0,
    );
    run(
        &[HostWrite(2.0), DeviceRead, DeviceRead, HostRead, DeviceRead],
        1,
        0,
    );
}

#[test]
fn alternating_sides_copy_once_per_switch() {
    use Step::*;
    run(
        &[
            HostWrite(1.0),
            DeviceAdd(1.0),
            HostAdd(1.0),
            DeviceAdd(1.0),
            HostAdd(1.0),
            DeviceRead,
            HostRead,
        ],
        3,
        2,
    );
}

#[test]
fn a_fresh_mirror_is_zero_on_both_sides_without_transfers() {
    use Step::*;
    run(&[HostRead, DeviceRead, HostRead], 0, 0);
}

#[test]
fn overwriting_a_stale_side_copies_nothing_first() {
    use Step::*;
    // The device wrote, then the host overwrites everything: no download first.
    run(
        &[DeviceAdd(4.0), HostWrite(7.0), HostRead, DeviceRead],
        1,
        0,
    );
}

#[test]
fn stamps_tick_on_writes_and_follow_copies() {
    let gpu = sim(0, 1 << 30);
    let mut m = Mirror::from_host(&gpu, &[1u8; 64], MirroringPolicy::Full).unwrap();
    assert_eq!(m.stamps(), (1, 1, 0));
    assert!(m.is_host_current() && !m.is_device_current());
    let _ = m.device().unwrap();
    assert_eq!(m.stamps(), (1, 1, 1));
    let _ = m.device_mut().unwrap();
    assert_eq!(m.stamps(), (2, 1, 2));
    assert_eq!(m.host().unwrap(), &[1u8; 64][..]);
    assert_eq!(m.stamps(), (2, 2, 2));
}

#[test]
fn host_only_allocates_no_device_memory_and_never_copies() {
    let gpu = sim(0, 1 << 30);
    let mut m = Mirror::new(&gpu, BYTES, MirroringPolicy::HostOnly).unwrap();
    write_floats(m.host_overwrite().unwrap(), &[3.0; N]);
    device_add(&mut m, 1.0);
    assert_eq!(floats(m.host().unwrap()), vec![4.0; N]);
    assert_eq!(device_sum(&mut m), 4.0 * N as f32);
    let stats = gpu.stats();
    assert_eq!(stats.driver_allocations, 0);
    assert_eq!(stats.live_bytes, 0);
    assert_eq!(stats.transfers(), 0);
    assert_eq!(stats.pinned_allocations, 1);
    assert!(stats.pinned_bytes >= BYTES);
}

#[test]
fn pinned_host_memory_is_marked_so_copies_into_it_wait_for_the_device() {
    // Semantics §5.4: a copy or fill that reads or writes pinned host memory is done when
    // it returns (on CUDA it then waits for the device; between device buffers it need not).
    let gpu = sim(0, 1 << 30);
    let mut pinned = gpu.allocate_pinned(BYTES).unwrap();
    let buffer = gpu.allocate(BYTES).unwrap();
    assert!(pinned.is_host_memory());
    assert!(!buffer.is_host_memory());
    let mut host_only = Mirror::new(&gpu, BYTES, MirroringPolicy::HostOnly).unwrap();
    assert!(host_only.device().unwrap().is_host_memory());
    let mut full = Mirror::new(&gpu, BYTES, MirroringPolicy::Full).unwrap();
    assert!(!full.device().unwrap().is_host_memory());
    gpu.fill(&mut pinned, 7).unwrap();
    assert!(
        pinned.as_slice().iter().all(|&b| b == 7),
        "filled when fill returns"
    );
}

#[test]
fn a_read_only_device_side_cannot_be_written_through() {
    // `device()` gives a range for reading; copies into it need `device_mut` (the trait
    // bound says so at compile time). Here: a device-to-device copy into the writable side
    // makes the host stale, and the next host read sees it.
    let gpu = sim(0, 1 << 30);
    let mut a = Mirror::from_host(&gpu, &[9u8; 128], MirroringPolicy::Full).unwrap();
    let mut b = Mirror::new(&gpu, 128, MirroringPolicy::Full).unwrap();
    {
        let src = a.device().unwrap();
        let mut dst = b.device_mut().unwrap();
        gpu.copy(&src, &mut dst).unwrap();
        assert_eq!(dst.len(), 128);
    }
    assert_eq!(b.host().unwrap(), &[9u8; 128][..]);
    let stats = gpu.stats();
    assert_eq!(
        (
            stats.htod_transfers,
            stats.dtoh_transfers,
            stats.dtod_transfers
        ),
        (1, 1, 1)
    );
}

#[test]
fn another_device_gets_a_counted_copy_and_refuses_foreign_memory() {
    let gpu0 = sim(0, 1 << 30);
    let gpu1 = sim(1, 1 << 30);
    let mut m = Mirror::from_host(&gpu0, &[5u8; 256], MirroringPolicy::Full).unwrap();
    device_add_bytes(&mut m, 1);
    let mut copy = m.copy_to(&gpu1).unwrap();
    assert_eq!(copy.device_handle(), &gpu1);
    assert!(copy.is_device_current());
    assert_eq!(copy.host().unwrap(), &[6u8; 256][..]);
    assert_eq!(gpu0.stats().dtoh_transfers, 1);
    assert_eq!(gpu1.stats().htod_transfers, 1);
    // Memory of device 0 is refused by device 1's operations.
    let side = m.device().unwrap();
    let mut out = vec![0u8; 256];
    let err = gpu1.download(&side, &mut out).unwrap_err().to_string();
    assert!(err.contains("another device"), "{err}");
}

fn device_add_bytes(m: &mut Mirror, delta: u8) {
    let gpu = m.device_handle().clone();
    let mut side = m.device_mut().unwrap();
    for b in gpu.sim_bytes_mut(&mut side).unwrap() {
        *b = b.wrapping_add(delta);
    }
}

#[test]
fn random_scripts_never_read_stale_data_and_copy_minimally() {
    // A small deterministic generator; every step checked against a model.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..50 {
        let gpu = sim(0, 1 << 30);
        let mut m = Mirror::new(&gpu, 64, MirroringPolicy::Full).unwrap();
        let mut value = 0u8;
        // Model: which sides are current.
        let (mut host_ok, mut dev_ok) = (true, true);
        let (mut up, mut down) = (0u64, 0u64);
        for _ in 0..40 {
            match next() % 5 {
                0 => {
                    value = value.wrapping_add(3);
                    m.host_overwrite().unwrap().fill(value);
                    (host_ok, dev_ok) = (true, false);
                }
                1 => {
                    if !host_ok {
                        down += 1;
                    }
                    let bytes = m.host_mut().unwrap();
                    assert!(bytes.iter().all(|b| *b == value));
                    value = value.wrapping_add(1);
                    bytes.fill(value);
                    (host_ok, dev_ok) = (true, false);
                }
                2 => {
                    if !host_ok {
                        down += 1;
                    }
                    assert!(m.host().unwrap().iter().all(|b| *b == value));
                    host_ok = true;
                }
                3 => {
                    if !dev_ok {
                        up += 1;
                    }
                    device_add_bytes(&mut m, 2);
                    value = value.wrapping_add(2);
                    (host_ok, dev_ok) = (false, true);
                }
                _ => {
                    if !dev_ok {
                        up += 1;
                    }
                    let side = m.device().unwrap();
                    assert!(gpu.sim_bytes(&side).unwrap().iter().all(|b| *b == value));
                    dev_ok = true;
                }
            }
            let s = gpu.stats();
            assert_eq!((s.htod_transfers, s.dtoh_transfers), (up, down));
        }
    }
}

#[test]
fn a_refused_host_overwrite_keeps_the_device_data() {
    // semantics §5.5 (stale bytes are never read) and §1 (a failure changes nothing): a
    // host overwrite whose host copy the pool refuses leaves the device side the newest,
    // so the next host read downloads it.
    use ndmem::alloc::{Limits, Pool};
    use ndmem::device::{self, DeviceLimit, SimConfig};
    use ndmem::MemorySource;
    let host = MemorySource::new(Pool::new(Limits::builder().max_bytes(2 << 20).build()));
    let gpu = device::sim(
        SimConfig::new(0)
            .total_memory(1 << 30)
            .limit(DeviceLimit::Unlimited)
            .host(host),
    )
    .unwrap();
    let mut m = Mirror::new(&gpu, 600 << 10, MirroringPolicy::Full).unwrap();
    {
        let mut side = m.device_mut().unwrap();
        gpu.fill(&mut side, 7).unwrap();
    }
    // 1.5 MiB of a 2 MiB pool: no room for a 600 KiB host copy (the fill's cached
    // staging block is given back to make room for the hog).
    let hog = host.pool().allocate(3 << 19, 64).unwrap();
    let stamps = m.stamps();
    match m.host_overwrite() {
        Err(e) => assert!(e.is_out_of_memory(), "{e}"),
        Ok(_) => panic!("the host copy fit: {:?}", host.pool().stats()),
    }
    assert_eq!(m.stamps(), stamps, "a refusal changes no stamp");
    drop(hog);
    assert!(m.host().unwrap().iter().all(|b| *b == 7));
    assert_eq!(gpu.stats().dtoh_transfers, 1);
}

#[test]
fn zero_byte_mirrors_and_pinned_buffers_are_refused_as_device_buffers_are() {
    // Semantics §5.3-§5.5: a zero-byte request is AllocError::InvalidLayout; a mirror and a
    // pinned buffer took one byte and then reported a length of 1.
    let gpu = sim(0, 1 << 30);
    let before = gpu.stats();
    let refused = |r: Result<(), ndmem::Error>, what: &str| match r {
        Err(ndmem::Error::Alloc(ndmem::alloc::AllocError::InvalidLayout { size: 0, .. })) => {}
        other => panic!("{what}: {other:?}"),
    };
    refused(gpu.allocate(0).map(drop), "allocate(0)");
    refused(gpu.allocate_pinned(0).map(drop), "allocate_pinned(0)");
    for policy in [MirroringPolicy::Full, MirroringPolicy::HostOnly] {
        refused(Mirror::new(&gpu, 0, policy).map(drop), "Mirror::new(0)");
        refused(
            Mirror::from_host(&gpu, &[], policy).map(drop),
            "Mirror::from_host(&[])",
        );
    }
    let after = gpu.stats();
    assert_eq!(
        (after.driver_allocations, after.pinned_allocations),
        (before.driver_allocations, before.pinned_allocations)
    );
    // One byte is a buffer like any other.
    assert_eq!(gpu.allocate_pinned(1).unwrap().len(), 1);
    assert_eq!(
        Mirror::new(&gpu, 1, MirroringPolicy::Full).unwrap().len(),
        1
    );
}

#[test]
fn a_host_only_mirror_waits_for_the_device_before_the_host_touches_it() {
    // Semantics §5.5: stale bytes are never read. A HostOnly mirror's memory is the same
    // for both sides, and device work is asynchronous: after the device was handed it,
    // the host waits for the device once before reading or writing; the host's own reads
    // and writes wait for nothing, and a Full mirror's copies wait by themselves.
    let gpu = sim(0, 1 << 30);
    let mut m = Mirror::new(&gpu, 64, MirroringPolicy::HostOnly).unwrap();
    let syncs = |gpu: &ndmem::Device| gpu.stats().synchronizations;
    let start = syncs(&gpu);
    m.host_mut().unwrap().fill(1);
    assert_eq!(m.host().unwrap()[0], 1);
    assert_eq!(syncs(&gpu), start, "no device work: no wait");
    {
        let mut d = m.device_mut().unwrap();
        gpu.fill(&mut d, 2).unwrap();
    }
    assert_eq!(m.host().unwrap()[0], 2);
    assert_eq!(syncs(&gpu), start + 1, "one wait after the device wrote");
    assert_eq!(m.host().unwrap()[0], 2);
    assert_eq!(syncs(&gpu), start + 1, "and only one");
    let _ = m.device().unwrap();
    m.host_overwrite().unwrap().fill(3);
    assert_eq!(
        syncs(&gpu),
        start + 2,
        "a host write waits for a device read"
    );
    let mut full = Mirror::new(&gpu, 64, MirroringPolicy::Full).unwrap();
    let _ = full.device_mut().unwrap();
    let _ = full.host().unwrap();
    assert_eq!(
        syncs(&gpu),
        start + 2,
        "a Full mirror's download waits by itself"
    );
}
