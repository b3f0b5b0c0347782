//! Epoch-based deferred frees: the garbage collector ND4J relied on, made explicit.
//!
//! Invariant (crossbeam-epoch's): memory handed to `defer_free` is released only after
//! every thread that was pinned when it was deferred has unpinned, so a reader that pinned,
//! checked a tensor's validity and is still reading it never sees its memory freed. Ops
//! pin through [`pin`] around the check and the access, for the op's duration only, and
//! allocate their output before they pin (a pin held while the pool collects at its limit
//! would hold back everything deferred since it was taken); a
//! [`crate::TensorView`], which may live long, holds its memory by a view count instead,
//! so it never holds back the epoch (and with it every other free in the process).
//!
//! The bytes waiting are counted ([`pending_bytes`]) and bounded: past
//! [`AUTO_COLLECT_BYTES`] the deferring thread collects, and every pool a
//! [`crate::MemorySource`] was made for runs [`collect`] before it refuses an allocation
//! at its limit (semantics §1, §6). A deferred block is freed to its own pool.
//!
//! Freeing never aborts for want of heap: deferring allocates (crossbeam queues a bag per
//! flush; a deferred block, three words, is kept inline in it, unboxed), so `defer_free` first asks the heap's budget whether it has room for
//! it ([`HEAP_ROOM`], a few atomic loads, no allocation); if not, the block waits in a fixed reserve set aside in static
//! memory ([`PARKED_CAPACITY`] blocks, no heap), to be deferred by a later free or
//! [`collect`] that finds room. Deferring a block later than it was freed is always
//! sound: a reader pinned when it was freed and still pinned later holds it back then too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crossbeam_epoch as epoch;
use ndmem_alloc::{Block, FreedBlock, Pool};

/// Pending bytes past which the thread that defers a free also collects.
pub const AUTO_COLLECT_BYTES: usize = 64 << 20;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Heap bytes a deferral may need at most: a sealed bag of 64 deferred calls with its queue
/// node (about 2 KiB; a deferred block is three words, kept inline), and the thread's
/// registration with the epoch (about 2 KiB) on its first pin. A free goes to the epoch
/// only when this much can be allocated.
pub const HEAP_ROOM: usize = 8 << 10;

/// Blocks the reserve of frees waiting for heap room holds at most. Past it (that many
/// frees at a heap full to the last byte), a free is deferred as usual and may fail to
/// allocate.
pub const PARKED_CAPACITY: usize = 1024;

/// Frees that found no heap room for their deferral, in static memory (no heap).
struct Parked {
    blocks: [Option<Block<'static>>; PARKED_CAPACITY],
    len: usize,
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    blocks: [const { None }; PARKED_CAPACITY],
    len: 0,
});

/// Blocks parked now (read without the lock, to skip it when there are none).
static PARKED_LEN: AtomicUsize = AtomicUsize::new(0);

fn parked() -> MutexGuard<'static, Parked> {
    PARKED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the heap can hold what one deferral allocates ([`HEAP_ROOM`] bytes): asked of
/// the tracking allocator's budget, without allocating (always true without a heap limit).
fn heap_has_room() -> bool {
    ndmem_alloc::heap::has_room(HEAP_ROOM)
}

/// Hands `block` (whose bytes are already counted in `PENDING`) to the epoch.
fn defer(block: Block<'static>) {
    // Three words: crossbeam-epoch keeps the call inline in the thread's bag, unboxed.
    let freed: FreedBlock<'static> = block.into_freed();
    let guard = epoch::pin();
    guard.defer(move || {
        let bytes = freed.capacity();
        drop(freed);
        PENDING.fetch_sub(bytes, Ordering::Relaxed);
    });
    // Hand the garbage to the global queue now, so that a loop reusing one shape gets its
    // blocks back in the pool's cache within a couple of epochs, not after 64 deferrals.
    guard.flush();
}

/// Defers parked blocks while the heap has room for each.
fn drain_parked() {
    if PARKED_LEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    loop {
        if !heap_has_room() {
            return;
        }
        let block = {
            let mut parked = parked();
            if parked.len == 0 {
                return;
            }
            parked.len -= 1;
            let i = parked.len;
            PARKED_LEN.store(parked.len, Ordering::Relaxed);
            parked.blocks[i].take()
        };
        if let Some(block) = block {
            defer(block);
        }
    }
}

/// Parks `block` in the reserve; gives it back if the reserve is full.
fn park(block: Block<'static>) -> Result<(), Block<'static>> {
    let mut parked = parked();
    if parked.len == PARKED_CAPACITY {
        return Err(block);
    }
    let i = parked.len;
    parked.blocks[i] = Some(block);
    parked.len += 1;
    PARKED_LEN.store(parked.len, Ordering::Relaxed);
    Ok(())
}

/// A pinned epoch: memory deferred after this point is not freed while it lives.
pub type Pin = epoch::Guard;

/// Pins the current thread for the duration of a check-then-read. Keep pins short: while
/// any thread is pinned, nothing deferred after it pinned is freed, anywhere.
pub fn pin() -> Pin {
    epoch::pin()
}

/// Frees `block` (to its own pool) once no thread pinned now can still be reading it.
/// Needs no heap: with none to spare, the block waits in the reserve (see the module).
pub(crate) fn defer_free(block: Block<'static>) {
    let bytes = block.capacity();
    let pending = PENDING.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if heap_has_room() {
        defer(block);
        drain_parked();
    } else if let Err(block) = park(block) {
        // The reserve is full too: the last resort is the ordinary deferral.
        defer(block);
    }
    if pending > AUTO_COLLECT_BYTES {
        collect();
    }
}

/// [`defer_free`] for several blocks at once: one deferred call (the list, three words,
/// is kept inline by the epoch) and one flush for all of them. Without heap room for the
/// deferral, each block goes to the reserve as [`defer_free`] would send it.
pub(crate) fn defer_free_all(blocks: Vec<Block<'static>>) {
    if blocks.is_empty() {
        return;
    }
    let bytes: usize = blocks.iter().map(Block::capacity).sum();
    let pending = PENDING.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if heap_has_room() {
        let guard = epoch::pin();
        guard.defer(move || {
            let bytes: usize = blocks.iter().map(Block::capacity).sum();
            drop(blocks);
            PENDING.fetch_sub(bytes, Ordering::Relaxed);
        });
        guard.flush();
        drop(guard);
        drain_parked();
    } else {
        for block in blocks {
            if let Err(block) = park(block) {
                defer(block);
            }
        }
    }
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

/// Rounds without progress after which [`collect`] stops: two epoch advances release what
/// was deferred, so a few rounds that free nothing mean a thread still pinned holds it back.
const IDLE_ROUNDS: u32 = 4;

/// The most rounds one [`collect`] makes (each frees a few batches of deferred frees; this
/// many drain millions of them).
const MAX_ROUNDS: u32 = 1 << 20;

/// How long the pools' reclaimer ([`collect_at_limit`]) and a device pool at its limit
/// ([`collect_until_freed`]) keep collecting while frees are pending and none came back,
/// before the pool refuses a request at its limit. A pin is held for one
/// operation, but a thread descheduled while pinned holds the epoch that long: with eight
/// threads busy on two loaded cores, 100 ms was not always enough.
const LIMIT_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// Forces pending frees: advances the epoch until everything deferred is released or a
/// thread still pinned holds it back (the `invokeGc` of this runtime). Returns the bytes
/// freed by this call.
///
/// Each advance frees a few batches of what is queued (every free is its own batch, so
/// that a loop gets its blocks back soon), so it goes on as long as a round frees
/// something, and stops after a few rounds that free nothing.
pub fn collect() -> usize {
    let before = PENDING.load(Ordering::Relaxed);
    drain_parked();
    let mut last = PENDING.load(Ordering::Relaxed);
    let mut idle = 0;
    let mut rounds = 0;
    while last > 0 && idle < IDLE_ROUNDS && rounds < MAX_ROUNDS {
        let guard = epoch::pin();
        guard.flush();
        drop(guard);
        let now = PENDING.load(Ordering::Relaxed);
        idle = if now < last { 0 } else { idle + 1 };
        last = now;
        rounds += 1;
    }
    before.saturating_sub(last)
}

/// The pools' reclaimer: [`collect`], again and again while frees are pending and none
/// was freed yet, for at most [`LIMIT_WAIT`] (a second). A thread pinned for the length of
/// one operation (every op pins, and so does every free) holds the epoch back for a moment
/// only; one `collect` that met such a pin freed nothing, and the pool refused a request
/// whose bytes were only waiting. It returns once something was freed: the pool retries,
/// and runs it again in its next relief round if the request still does not fit, so a
/// busy process (other threads deferring frees all the while) is not held here a second
/// per round waiting for a queue that never empties.
fn collect_at_limit() -> usize {
    collect_until_freed(pending_bytes)
}

/// [`collect`], again and again until `pending()` falls below where it stood (something
/// came back) or to 0, for at most [`LIMIT_WAIT`]; returns how far it fell. `pending` is
/// the figure the caller waits on: every pending free ([`pending_bytes`]) for the host
/// pools' reclaimer, a device's own deferred frees for its pool.
pub(crate) fn collect_until_freed(pending: impl Fn() -> usize) -> usize {
    let before = pending();
    let deadline = std::time::Instant::now() + LIMIT_WAIT;
    loop {
        collect();
        let now = pending();
        if now < before || now == 0 || std::time::Instant::now() >= deadline {
            return before.saturating_sub(now);
        }
        std::thread::yield_now();
    }
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
        pool.register_reclaimer(collect_at_limit);
    }
}
