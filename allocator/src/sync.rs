//! The atomics every lock-free piece of this crate uses, from one place.
//!
//! Under `--cfg ndmem_loom` they are loom's, so the models in `loom-tests/` explore every
//! interleaving of the same code that ships; otherwise they are `std`'s.

#[cfg(not(ndmem_loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicIsize, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
};

#[cfg(ndmem_loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicIsize, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
};

pub(crate) use std::sync::atomic::Ordering;

/// Tells the processor (or loom's scheduler) that this thread is waiting on another.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(not(ndmem_loom))]
    std::hint::spin_loop();
    #[cfg(ndmem_loom)]
    loom::hint::spin_loop();
}
