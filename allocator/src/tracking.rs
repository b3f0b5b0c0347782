//! `Tracking<A>`: a `#[global_allocator]` wrapper that counts every heap byte and enforces
//! an exact heap limit without becoming a point of contention.
//!
//! Invariant: a byte is handed out only after it was *reserved* in the process-wide heap
//! [`Budget`], whose single-word compare-and-swap never lets reservations pass the limit. To
//! keep that CAS off the hot path each thread reserves budget in batches and spends it
//! locally (a plain thread-local subtraction). Statistics are tallied per thread the same
//! way and published to the shared counters in batches.
//!
//! The bounds this costs (stranded budget, statistics lag, peak precision) are documented
//! on [`heap`], where users read them.
//!
//! Nothing here allocates: the environment is read with `libc::getenv`, thread state is a
//! `const` thread-local without destructor, and warnings go to `write(2)`.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::counter::{Budget, Counter};
use crate::error::{AllocError, ConfigError};
use crate::limits::{parse_size_bytes, ENV_MAX_HEAP};

/// Largest batch a thread reserves at once.
const MAX_BATCH: usize = 1 << 20;
/// Unpublished net bytes at which a thread publishes its live bytes at once.
const FLUSH_NET: usize = 4 << 20;
/// Unpublished net bytes at which a thread publishes its live bytes once
/// [`FLUSH_NET_OPS`] operations have passed since it last did.
const FLUSH_NET_SOON: usize = 256 << 10;
/// See [`FLUSH_NET_SOON`]: a thread that allocates and frees large blocks in a loop
/// publishes once per this many operations instead of at every one.
const FLUSH_NET_OPS: u32 = 64;
/// Operations after which a thread publishes its tally.
const FLUSH_OPS: u32 = 4096;

static HEAP: Budget = Budget::new(None);
/// Live heap bytes, their peak, and the bytes ever allocated as the total (which the
/// tallies publish in their own batches).
static LIVE: Counter = Counter::new();
static FREED: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static DEALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static THREADS: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The OOM hook as a `fn(Layout, &HeapStats)` address; 0 when none is set.
static OOM_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Heap statistics of the process (semantics §1), as of the last flush of each thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapStats {
    /// Bytes allocated and not yet freed.
    pub live_bytes: usize,
    /// Highest `live_bytes` since start or the last [`heap::reset_peak`].
    pub peak_bytes: usize,
    /// Bytes ever allocated (a reallocation counts its new size).
    pub total_allocated_bytes: u64,
    /// Bytes ever freed (a reallocation counts its old size).
    pub total_freed_bytes: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Deallocations.
    pub deallocations: u64,
    /// Successful reallocations.
    pub reallocations: u64,
    /// Allocations refused (limit reached or the inner allocator returned null).
    pub failed_allocations: u64,
    /// The heap limit, `None` when the heap is tracked only.
    pub limit: Option<usize>,
    /// Bytes reserved against the limit: live bytes plus budget threads hold unspent.
    pub reserved_bytes: usize,
}

/// Wraps any [`GlobalAlloc`] and counts what passes through it.
///
/// ```no_run
/// #[global_allocator]
/// static GLOBAL: ndmem_alloc::Tracking<std::alloc::System> =
///     ndmem_alloc::Tracking::new(std::alloc::System);
///
/// fn main() {
///     let v = vec![0u8; 1 << 20];
///     assert!(ndmem_alloc::heap::stats().live_bytes >= v.len());
/// }
/// ```
///
/// The statistics and the limit are process-wide (see [`crate::heap`]); install one
/// `Tracking` as the global allocator. `alloc_zeroed` and `realloc` forward to the inner
/// allocator's own, so no copy or memset is added.
#[derive(Debug, Default)]
pub struct Tracking<A> {
    inner: A,
}

impl<A> Tracking<A> {
    /// Wraps `inner`; usable in a `static`.
    pub const fn new(inner: A) -> Self {
        Tracking { inner }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged
// and returns its result unchanged (or null where the contract allows a failure), so the
// inner allocator's guarantees carry over. The accounting around the calls never allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Tracking<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !TALLY.with(|t| t.reserve(layout.size())) {
            return refuse(layout);
        }
        // SAFETY: forwarded with the caller's layout, which the caller guarantees is valid.
        let ptr = unsafe { self.inner.alloc(layout) };
        TALLY.with(|t| t.finish_alloc(ptr, layout.size()));
        if ptr.is_null() {
            return refuse(layout);
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !TALLY.with(|t| t.reserve(layout.size())) {
            return refuse(layout);
        }
        // SAFETY: forwarded with the caller's layout, which the caller guarantees is valid.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        TALLY.with(|t| t.finish_alloc(ptr, layout.size()));
        if ptr.is_null() {
            return refuse(layout);
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `ptr` came from this allocator with `layout`.
        unsafe { self.inner.dealloc(ptr, layout) };
        TALLY.with(|t| t.free(layout.size()));
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_size = layout.size();
        let growth = new_size.saturating_sub(old_size);
        if growth > 0 && !TALLY.with(|t| t.reserve(growth)) {
            // SAFETY: the caller guarantees the new layout is valid (size fits isize).
            return refuse(unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) });
        }
        // SAFETY: forwarded with the caller's arguments, which the caller guarantees valid.
        let new_ptr = unsafe { self.inner.realloc(ptr, layout, new_size) };
        TALLY.with(|t| t.finish_realloc(new_ptr, old_size, new_size));
        if new_ptr.is_null() {
            // SAFETY: as above.
            return refuse(unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) });
        }
        new_ptr
    }
}

/// Counts a refused allocation, calls the OOM hook, and returns null.
#[cold]
fn refuse(layout: Layout) -> *mut u8 {
    FAILED.fetch_add(1, Ordering::Relaxed);
    let hook = OOM_HOOK.load(Ordering::Acquire);
    if hook != 0 && !TALLY.with(|t| t.in_hook.replace(true)) {
        // SAFETY: OOM_HOOK only ever holds 0 or an address stored by `set_oom_hook` from a
        // `fn(Layout, &HeapStats)`, which lives for the whole program.
        let hook: fn(Layout, &HeapStats) = unsafe { std::mem::transmute(hook) };
        // Unwinding out of `GlobalAlloc::alloc` is undefined behaviour: a panicking hook
        // aborts the process instead. The guard costs nothing when the hook returns.
        let guard = AbortOnUnwind;
        hook(layout, &heap::stats());
        std::mem::forget(guard);
        TALLY.with(|t| t.in_hook.set(false));
    }
    std::ptr::null_mut()
}

/// Aborts the process if dropped, which only happens while a panic unwinds through the
/// frame that owns it (the normal path forgets it).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        warn(&[b"ndmem: the heap OOM hook panicked inside the global allocator; aborting\n"]);
        std::process::abort();
    }
}

const NEW: u8 = 0;
const REGISTERED: u8 = 1;
const EXITED: u8 = 2;

/// One thread's unspent budget and unflushed statistics. No destructor, so the
/// thread-local needs no lazy registration (which would allocate).
///
/// The hot paths test no `state`: a thread that is not yet registered, or has exited, is
/// sent to the cold paths by its figures alone. Its `budget` and `keep` are 0 (so `reserve`
/// refills and `give_back` releases), and its `ops` is at least `FLUSH_OPS` (so `count`
/// publishes).
struct Tally {
    budget: Cell<usize>,
    keep: Cell<usize>,
    /// Bytes allocated minus bytes freed since the live figure was last published.
    net: Cell<isize>,
    /// The highest `net` since then: the thread's own high-water mark, published to the
    /// peak with the live bytes, so that no excursion between publications is lost.
    high: Cell<isize>,
    /// `ops` when the live figure was last published.
    live_ops: Cell<u32>,
    allocated: Cell<u64>,
    freed: Cell<u64>,
    allocations: Cell<u32>,
    deallocations: Cell<u32>,
    reallocations: Cell<u32>,
    ops: Cell<u32>,
    state: Cell<u8>,
    in_hook: Cell<bool>,
}

thread_local! {
    static TALLY: Tally = const {
        Tally {
            budget: Cell::new(0),
            keep: Cell::new(0),
            net: Cell::new(0),
            high: Cell::new(0),
            live_ops: Cell::new(0),
            allocated: Cell::new(0),
            freed: Cell::new(0),
            allocations: Cell::new(0),
            deallocations: Cell::new(0),
            reallocations: Cell::new(0),
            ops: Cell::new(FLUSH_OPS),
            state: Cell::new(NEW),
            in_hook: Cell::new(false),
        }
    };
}

impl Tally {
    /// Takes `size` bytes of budget: locally if the thread holds enough, else from the heap.
    #[inline]
    fn reserve(&self, size: usize) -> bool {
        let budget = self.budget.get();
        if budget >= size {
            self.budget.set(budget - size);
            return true;
        }
        self.refill(size)
    }

    #[cold]
    fn refill(&self, size: usize) -> bool {
        read_env_once();
        match self.state.get() {
            EXITED => return HEAP.try_reserve(size).is_ok(),
            NEW => self.register(),
            _ => {}
        }
        let budget = self.budget.get();
        if budget >= size {
            // Registering re-entered the allocator, which refilled the budget already.
            self.budget.set(budget - size);
            return true;
        }
        let need = size - budget;
        let threads = THREADS.load(Ordering::Relaxed).max(1);
        let extra = (HEAP.available() / (4 * threads)).min(MAX_BATCH);
        let granted = if extra > 0 && HEAP.try_reserve(need + extra).is_ok() {
            extra
        } else if HEAP.try_reserve(need).is_ok() {
            0
        } else {
            return false;
        };
        self.budget.set(granted);
        self.keep.set(granted);
        true
    }

    fn register(&self) {
        // State first: registering may allocate (pthread_setspecific), which re-enters here.
        self.state.set(REGISTERED);
        ACTIVE.store(true, Ordering::Relaxed);
        THREADS.fetch_add(1, Ordering::Relaxed);
        exit_hook::arm();
    }

    /// Gives back `size` bytes of budget, returning to the heap what exceeds twice `keep`.
    ///
    /// Invariant kept here: a thread's unflushed frees never exceed its unspent budget
    /// (`-net <= budget`), so the published live figure never exceeds the reserved total,
    /// and hence never the limit. Budget leaves the thread only after its net bytes are
    /// published, which is why callers count a free *before* giving its budget back.
    #[inline]
    fn give_back(&self, size: usize) {
        let keep = self.keep.get();
        let budget = self.budget.get() + size;
        self.budget.set(budget);
        if budget > 2 * keep {
            self.release_excess(keep);
        }
    }

    #[cold]
    fn release_excess(&self, keep: usize) {
        self.flush_live();
        let budget = self.budget.get();
        HEAP.release(budget - keep.min(budget));
        self.budget.set(keep.min(budget));
    }

    #[inline]
    fn finish_alloc(&self, ptr: *mut u8, size: usize) {
        if ptr.is_null() {
            self.give_back(size);
            return;
        }
        self.allocations.set(self.allocations.get() + 1);
        self.allocated.set(self.allocated.get() + size as u64);
        self.count(size as isize);
    }

    #[inline]
    fn free(&self, size: usize) {
        self.deallocations.set(self.deallocations.get() + 1);
        self.freed.set(self.freed.get() + size as u64);
        self.count(-(size as isize));
        self.give_back(size);
    }

    #[inline]
    fn finish_realloc(&self, ptr: *mut u8, old_size: usize, new_size: usize) {
        if ptr.is_null() {
            // The old block is untouched; give back only the growth reserved for it.
            self.give_back(new_size.saturating_sub(old_size));
            return;
        }
        self.reallocations.set(self.reallocations.get() + 1);
        self.allocated.set(self.allocated.get() + new_size as u64);
        self.freed.set(self.freed.get() + old_size as u64);
        self.count(new_size as isize - old_size as isize);
        self.give_back(old_size.saturating_sub(new_size));
    }

    #[inline]
    fn count(&self, delta: isize) {
        let net = self.net.get() + delta;
        self.net.set(net);
        if net > self.high.get() {
            self.high.set(net);
        }
        let ops = self.ops.get() + 1;
        self.ops.set(ops);
        if net.unsigned_abs() >= FLUSH_NET_SOON || ops >= FLUSH_OPS {
            self.publish();
        }
    }

    #[cold]
    fn publish(&self) {
        if self.state.get() == NEW {
            // A thread that frees before it ever needs budget must still be flushed at exit.
            self.register();
        }
        let ops = self.ops.get();
        if ops >= FLUSH_OPS || self.state.get() != REGISTERED {
            self.flush();
        } else if self.net.get().unsigned_abs() >= FLUSH_NET
            || ops.wrapping_sub(self.live_ops.get()) >= FLUSH_NET_OPS
        {
            // Only the net bytes passed their bound: publish the live figure alone (one
            // shared read-modify-write instead of seven). Between FLUSH_NET_SOON and
            // FLUSH_NET it waits FLUSH_NET_OPS operations, so that a thread allocating and
            // freeing 1 MiB blocks in a loop does not write the shared line at every one.
            self.flush_live();
        }
    }

    /// Publishes this thread's net bytes to the live figure, and its high-water mark since
    /// the last publication to the peak.
    ///
    /// The peak becomes the live figure when this thread's net bytes were highest, the
    /// other threads' published figures taken as they are now (exact when no other thread
    /// publishes); see [`Counter::publish`], which writes the peak only when it rises.
    #[inline]
    fn flush_live(&self) {
        let net = self.net.replace(0);
        let high = self.high.replace(0);
        self.live_ops.set(self.ops.get());
        LIVE.publish(net, high);
    }

    /// Publishes this thread's whole tally to the process-wide counters.
    fn flush(&self) {
        self.flush_live();
        LIVE.add_total(self.allocated.replace(0));
        FREED.fetch_add(self.freed.replace(0), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(u64::from(self.allocations.replace(0)), Ordering::Relaxed);
        DEALLOCATIONS.fetch_add(u64::from(self.deallocations.replace(0)), Ordering::Relaxed);
        REALLOCATIONS.fetch_add(u64::from(self.reallocations.replace(0)), Ordering::Relaxed);
        // Unregistered and exited threads publish at every operation.
        let registered = self.state.get() == REGISTERED;
        self.ops.set(if registered { 0 } else { FLUSH_OPS });
        self.live_ops.set(self.ops.get());
    }

    /// Returns all unspent budget to the heap (after publishing the tally it covers).
    fn return_budget(&self) {
        self.flush();
        HEAP.release(self.budget.replace(0));
    }

    /// The thread is exiting: publish everything and stop batching.
    fn retire(&self) {
        self.return_budget();
        self.keep.set(0);
        if self.state.replace(EXITED) == REGISTERED {
            THREADS.fetch_sub(1, Ordering::Relaxed);
        }
        self.ops.set(FLUSH_OPS);
    }
}

/// A pthread key whose destructor hands a thread's budget back when the thread exits.
mod exit_hook {
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

    const UNSET: u8 = 0;
    const CREATING: u8 = 1;
    const READY: u8 = 2;
    const FAILED: u8 = 3;

    static STATE: AtomicU8 = AtomicU8::new(UNSET);
    static KEY: AtomicUsize = AtomicUsize::new(0);

    /// Makes the calling thread run [`on_exit`] when it ends.
    pub(super) fn arm() {
        if let Some(key) = key() {
            // SAFETY: `key` was created by pthread_key_create; the value is a non-null
            // marker, never dereferenced.
            unsafe {
                libc::pthread_setspecific(key, std::ptr::NonNull::<u8>::dangling().as_ptr().cast())
            };
        }
    }

    fn key() -> Option<libc::pthread_key_t> {
        loop {
            match STATE.load(Ordering::Acquire) {
                READY => return Some(KEY.load(Ordering::Relaxed) as libc::pthread_key_t),
                FAILED => return None,
                UNSET => {
                    if STATE
                        .compare_exchange(UNSET, CREATING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        let mut key: libc::pthread_key_t = 0;
                        // SAFETY: `key` is a valid out-pointer; `on_exit` has the C ABI and
                        // signature pthread expects.
                        let rc = unsafe { libc::pthread_key_create(&mut key, Some(on_exit)) };
                        KEY.store(key as usize, Ordering::Relaxed);
                        STATE.store(if rc == 0 { READY } else { FAILED }, Ordering::Release);
                    }
                }
                _ => std::hint::spin_loop(),
            }
        }
    }

    extern "C" fn on_exit(_: *mut libc::c_void) {
        // The tally is a const thread-local without destructor: still usable here.
        super::TALLY.with(|t| t.retire());
    }
}

static ENV_STATE: AtomicU8 = AtomicU8::new(0);

const ENV_UNREAD: u8 = 0;
const ENV_READING: u8 = 1;
const ENV_DONE: u8 = 2;

/// Applies `NDMEM_MAX_HEAP` the first time any thread needs budget (inside the allocator:
/// read with getenv, which allocates nothing).
fn read_env_once() {
    once(|| {
        // SAFETY: the name is NUL-terminated; getenv returns null or a NUL-terminated
        // string that stays valid while nobody calls setenv, which the program has not yet
        // had a chance to do concurrently with its first allocation.
        let value = unsafe {
            let ptr = libc::getenv(c"NDMEM_MAX_HEAP".as_ptr());
            (!ptr.is_null()).then(|| std::ffi::CStr::from_ptr(ptr).to_bytes())
        };
        apply_env_limit(value);
    });
}

/// [`read_env_once`] for callers outside the allocator (`heap::stats` before anything was
/// allocated, `heap::set_limit`), which may run late, beside a `std::env::set_var`: the
/// variable is read through `std::env`, under its lock, and before the once is claimed,
/// because reading allocates and so may run the allocator's own `read_env_once`.
fn read_env_once_outside_allocator() {
    if ENV_STATE.load(Ordering::Acquire) == ENV_DONE {
        return;
    }
    let value = std::env::var_os(ENV_MAX_HEAP);
    once(|| apply_env_limit(value.as_ref().map(|v| v.as_encoded_bytes())));
}

/// Runs `apply` if no thread has applied the variable yet; waits for one that is applying it.
fn once(apply: impl FnOnce()) {
    loop {
        match ENV_STATE.load(Ordering::Acquire) {
            ENV_DONE => return,
            ENV_UNREAD => {
                if ENV_STATE
                    .compare_exchange(
                        ENV_UNREAD,
                        ENV_READING,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    apply();
                    ENV_STATE.store(ENV_DONE, Ordering::Release);
                    return;
                }
            }
            _ => std::hint::spin_loop(),
        }
    }
}

/// Applies the variable's value (`None`: not set), warning on stderr if it is unusable.
fn apply_env_limit(value: Option<&[u8]>) {
    let Some(value) = value else {
        return;
    };
    match parse_size_bytes(value) {
        Ok(0) => {}
        Ok(limit) => {
            if HEAP.set_limit(Some(limit)).is_err() {
                warn(&[
                    b"ndmem: NDMEM_MAX_HEAP=",
                    value,
                    b" is below the heap already in use; the heap limit is not applied\n",
                ]);
            }
        }
        Err(reason) => warn(&[
            b"ndmem: NDMEM_MAX_HEAP=\"",
            value,
            b"\" is not a valid size: ",
            reason.as_bytes(),
            b"; the heap limit is not applied\n",
        ]),
    }
}

/// Writes to stderr without allocating.
fn warn(parts: &[&[u8]]) {
    for part in parts {
        // SAFETY: `part` is a live byte slice; write(2) only reads it.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
}

/// Process-wide heap statistics and limit of the tracking allocator.
///
/// # Bounds
///
/// Per thread, the price of speed:
/// - *stranded budget*: a thread keeps at most `2 x keep` unspent bytes, where `keep` is
///   chosen at each refill as `min(1 MiB, remaining / (4 x threads))`; as the remaining budget
///   falls, batches shrink to exact reservations and frees return budget at once. A thread's
///   budget is returned when it exits (a pthread key destructor). An allocation can fail
///   while other threads strand budget, never succeed past the limit.
/// - *statistics lag*: a thread publishes its live bytes at once when its unpublished net
///   bytes reach 4 MiB, within 64 of its own operations once they reach 256 KiB, and all
///   its figures after 4096 operations and whenever it returns budget. So the live figure
///   can lag by less than 4 MiB per other thread (less than 256 KiB per thread that has
///   done 64 operations since its net bytes passed that), and the counts (allocations,
///   bytes allocated and freed) by 4096 operations per other thread. Each thread also
///   keeps the high-water mark of its unpublished net bytes and publishes it to the peak
///   with its live bytes, so no excursion between publications is lost: the peak is the
///   highest live figure, each thread's own excursions added to the others' figures as
///   published at that moment (so it can miss by the same lag as the live figure when
///   several threads peak together, never by a single thread's own excursion).
///   [`stats`](crate::heap::stats) publishes the calling thread first, so a single thread
///   sees exact figures, peak included.
/// - *moving reallocations*: a `realloc` reserves only its growth. When the inner allocator
///   moves the block, it holds the old and the new block while it copies, so for that
///   moment its own footprint can pass the limit by up to the old size; the bytes counted,
///   and the bytes the program can reach, never pass it.
pub mod heap {
    pub use super::HeapStats;
    use super::*;
    pub use crate::oom::exit_on_oom;

    /// The heap statistics, after publishing the calling thread's tally: exact for a single
    /// thread, within the bounds documented on this module for the others.
    ///
    /// All zero unless a [`Tracking`] allocator is installed as `#[global_allocator]`.
    /// The limit of `NDMEM_MAX_HEAP` is reported even before the first allocation.
    pub fn stats() -> HeapStats {
        read_env_once_outside_allocator();
        TALLY.with(|t| t.flush());
        let live = LIVE.read();
        HeapStats {
            live_bytes: live.value,
            peak_bytes: live.peak,
            total_allocated_bytes: live.total,
            total_freed_bytes: FREED.load(Ordering::Relaxed),
            allocations: ALLOCATIONS.load(Ordering::Relaxed),
            deallocations: DEALLOCATIONS.load(Ordering::Relaxed),
            reallocations: REALLOCATIONS.load(Ordering::Relaxed),
            failed_allocations: FAILED.load(Ordering::Relaxed),
            limit: HEAP.limit(),
            reserved_bytes: HEAP.used(),
        }
    }

    /// Whether a [`Tracking`] allocator is installed and has counted anything.
    pub fn is_tracking() -> bool {
        ACTIVE.load(Ordering::Relaxed)
    }

    /// Restarts the peak from the current live bytes.
    pub fn reset_peak() {
        TALLY.with(|t| t.flush());
        LIVE.reset_peak();
    }

    /// Sets (`Some`) or removes (`None`) the heap limit at run time; `NDMEM_MAX_HEAP` sets
    /// it at start-up. `Some(0)` means no limit, as `0` does in the variable and in
    /// [`crate::Pool::set_max_bytes`]. A limit below the bytes already reserved is refused
    /// and changes nothing.
    pub fn set_limit(limit: Option<usize>) -> Result<(), AllocError> {
        read_env_once_outside_allocator();
        TALLY.with(|t| t.return_budget());
        HEAP.set_limit(limit.filter(|l| *l > 0))
            .map_err(|e| AllocError::LimitBelowUse {
                what: "the heap limit",
                limit: e.limit,
                used: e.used,
            })
    }

    /// Calls `hook` with the failed layout and the statistics just before the allocator
    /// returns null (after which Rust's allocation-error handler usually aborts). The hook
    /// may allocate; a failure inside it does not call it again.
    ///
    /// **The hook must not panic**: it runs inside `GlobalAlloc::alloc`/`realloc`, which
    /// must not unwind, so a panic in the hook aborts the process (after the panic message
    /// and a line on stderr). Record what you need (in atomics, say) and act after the
    /// failed allocation returns. (With `RUST_BACKTRACE` set, a panic there may not even
    /// reach the abort: capturing the backtrace allocates at a heap already at its limit,
    /// and std's allocation-error handler then waits on the backtrace lock it holds.)
    pub fn set_oom_hook(hook: fn(Layout, &HeapStats)) {
        OOM_HOOK.store(hook as usize, Ordering::Release);
    }

    /// Removes the OOM hook.
    pub fn clear_oom_hook() {
        OOM_HOOK.store(0, Ordering::Release);
    }

    /// The error in `NDMEM_MAX_HEAP`, if its value is not a size (the allocator itself can
    /// only warn on stderr and leave the heap unlimited).
    pub fn env_error() -> Option<ConfigError> {
        let value = std::env::var(ENV_MAX_HEAP).ok()?;
        crate::limits::parse_size_named(ENV_MAX_HEAP, &value).err()
    }
}
