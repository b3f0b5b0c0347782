//! The atomics of ndmem's lock-free pieces, from one place.
//!
//! Under `--cfg ndmem_loom` they are loom's, so the models in `loom-tests/` explore every
//! interleaving of the same code that ships; otherwise they are `std`'s. Only the small
//! modules that loom models (and the types they need) are compiled under that cfg.

#[cfg(not(ndmem_loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize};

#[cfg(ndmem_loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize};

#[allow(unused_imports)]
pub(crate) use std::sync::atomic::Ordering;

#[cfg(not(ndmem_loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::Arc;

#[cfg(ndmem_loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::Arc;
