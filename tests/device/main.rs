//! The device layer on the simulated device (semantics §1, §5, §6), and on CUDA when a
//! driver is present (skipped with a printed reason otherwise).

#[path = "../common/mod.rs"]
mod common;
mod compute;
mod cuda;
mod graph;
mod limits;
mod mirror;
mod pool;
mod tensors;
mod workspace;

use ndmem::device::{self, Device, DeviceLimit, SimConfig};

/// A simulated device with `total` bytes and no limit of ndmem's own.
pub fn sim(ordinal: u32, total: usize) -> Device {
    device::sim(
        SimConfig::new(ordinal)
            .total_memory(total)
            .limit(DeviceLimit::Unlimited),
    )
    .expect("a simulated device always opens")
}

/// Reads `f32`s from bytes.
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Writes `f32`s into bytes.
pub fn write_floats(bytes: &mut [u8], values: &[f32]) {
    for (chunk, v) in bytes.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Flushes epoch reclamation until nothing of `gpu` waits (other tests may hold pins).
pub fn settle(gpu: &Device) {
    for _ in 0..10_000 {
        ndmem::reclaim::collect();
        if gpu.stats().deferred_bytes == 0 {
            return;
        }
        std::thread::yield_now();
    }
    panic!("deferred frees of {gpu:?} never ran");
}
