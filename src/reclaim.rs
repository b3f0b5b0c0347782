//! Epoch-based deferred frees: the garbage collector ND4J relied on, made explicit.
//!
//! Invariant (crossbeam-epoch's): memory handed to `defer_free` is released only after
//! every thread that was pinned when it was deferred has unpinned, so a reader that pinned,
//! checked a tensor's validity and is still reading it never sees its memory freed. Ops
//! pin through [`pin`] around the check and the access, for the op's duration only; a
//! [`crate::TensorView`], which may live long, holds its memory by a view count instead,
//! so it never holds back the epoch (and with it every other free in the process).
//!
//! The bytes waiting are counted ([`pending_bytes`]) and bounded: past
//! [`AUTO_COLLECT_BYTES`] the deferring thread collects, and every pool a
//! [`crate::MemorySource`] was made for runs [`collect`] before it refuses an allocation
//! at its limit (semantics §1, §6). A deferred block is freed to its own pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crossbeam_epoch as epoch;
use ndmem_alloc::{Block, Pool};

/// Pending bytes past which the thread that defers a free also collects.
pub const AUTO_COLLECT_BYTES: usize = 64 << 20;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// A pinned epoch: memory deferred after this point is not freed while it lives.
pub type Pin = epoch::Guard;

/// Pins the current thread for the duration of a check-then-read. Keep pins short: while
/// any thread is pinned, nothing deferred after it pinned is freed, anywhere.
pub fn pin() -> Pin {
    epoch::pin()
}

/// Frees `block` (to its own pool) once no thread pinned now can still be reading it.
pub(crate) fn defer_free(block: Block<'static>) {
    let bytes = block.capacity();
    let pending = PENDING.fetch_add(bytes, Ordering::Relaxed) + bytes;
    let guard = epoch::pin();
    guard.defer(move || {
        drop(block);
        PENDING.fetch_sub(bytes, Ordering::Relaxed);
    });
    // Hand the garbage to the global queue now, so that a loop reusing one shape gets its
    // blocks back in the pool's cache within a couple of epochs, not after 64 deferrals.
    guard.flush();
    drop(guard);
    if pending > AUTO_COLLECT_BYTES {
        collect();
    }
}

/// Runs `free` once no thread pinned now can still be reading the `bytes` it releases; the
/// device layer frees device and pinned host buffers this way (semantics §5, §6).
pub(crate) fn defer_with(bytes: usize, free: impl FnOnce() + Send + 'static) {
    let pending = PENDING.fetch_add(bytes, Ordering::Relaxed) + bytes;
    let guard = epoch::pin();
    guard.defer(move || {
        free();
        PENDING.fetch_sub(bytes, Ordering::Relaxed);
    });
    guard.flush();
    drop(guard);
    if pending > AUTO_COLLECT_BYTES {
        collect();
    }
}

/// Forces pending frees: advances the epoch until everything deferred is released or a
/// thread still pinned holds it back (the `invokeGc` of this runtime). Returns the bytes
/// freed by this call.
pub fn collect() -> usize {
    let before = PENDING.load(Ordering::Relaxed);
    // Two epoch advances release what was deferred; a few more rounds drain the queues.
    for _ in 0..16 {
        if PENDING.load(Ordering::Relaxed) == 0 {
            break;
        }
        let guard = epoch::pin();
        guard.flush();
        drop(guard);
    }
    before.saturating_sub(PENDING.load(Ordering::Relaxed))
}

/// Bytes of tensor memory waiting to be freed.
pub fn pending_bytes() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// Registers [`collect`] as a reclaimer of `pool`, once per pool, so the pool flushes
/// deferred frees before it refuses an allocation at its limit.
pub(crate) fn register_with(pool: &'static Pool) {
    static REGISTERED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let key = pool as *const Pool as usize;
    if !registered.contains(&key) {
        registered.push(key);
        pool.register_reclaimer(collect);
    }
}
