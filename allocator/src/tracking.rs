//! `Tracking<A>`: a `#[global_allocator]` wrapper that counts every heap byte and enforces
//! an exact heap limit without becoming a point of contention.
//!
//! Invariant: a byte is handed out only after it was *reserved* in the process-wide heap
//! [`Budget`](crate::counter::Budget), whose single-word compare-and-swap never lets
//! reservations pass the limit. To keep that CAS off the hot path each thread reserves
//! budget in batches: a small *cell* it spends with plain thread-local arithmetic, and a
//! *reserve* in a fixed registry that a refused allocation recalls before it fails.
//! Statistics are tallied per thread and published to the shared counters in batches. The
//! per-thread protocol is [`crate::counter::Tally`] (modelled under loom); this module is
//! its `GlobalAlloc` glue.
//!
//! The bounds this costs (budget out of a refused thread's reach, statistics lag, peak
//! precision) are documented on [`heap`], where users read them.
//!
//! Nothing here allocates: the environment is read with `libc::getenv`, thread state is a
//! `const` thread-local without destructor, the reserves are a `static` array, and
//! warnings go to `write(2)`.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::counter::{Ledger, Tally};
use crate::error::{AllocError, ConfigError};
use crate::limits::{parse_size_bytes, ENV_MAX_HEAP, NOT_UTF8};

/// Threads that keep a reserve at once (the others reserve from the budget directly).
const RESERVE_SLOTS: usize = 256;

/// The heap budget, the live counter, the reserves and the published counts.
static LEDGER: Ledger<RESERVE_SLOTS> = Ledger::new(None);
static FAILED: AtomicU64 = AtomicU64::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The OOM hook as a `fn(Layout, &HeapStats)` address; 0 when none is set.
static OOM_HOOK: AtomicUsize = AtomicUsize::new(0);
/// Whether the heap limit in force was set by `heap::set_limit` (not by `NDMEM_MAX_HEAP`),
/// for the advice of [`heap::exit_on_oom`].
static LIMIT_IN_CODE: AtomicBool = AtomicBool::new(false);

/// Whether the heap limit in force was set by [`heap::set_limit`].
pub(crate) fn limit_set_in_code() -> bool {
    LIMIT_IN_CODE.load(Ordering::Relaxed)
}

thread_local! {
    /// This thread's cell, reserve slot and unpublished statistics. No destructor, so the
    /// thread-local needs no lazy registration (which would allocate); a pthread key
    /// destructor retires it instead (see `exit_hook`).
    static TALLY: Tally = const { Tally::new() };
    /// Whether this thread is inside the OOM hook.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// Whether the refusal this thread last reported came from the inner allocator
    /// (`true`) or from the heap limit (`false`): [`heap::system_refused`].
    static BY_SYSTEM: Cell<bool> = const { Cell::new(false) };
}

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
    // Counts the allocation first, so that only a test for null follows the inner `alloc`
    // (no register has to survive the call); the cold cases go to `alloc_cold`.
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !TALLY.with(|t| t.try_alloc(layout.size(), layout.align())) {
            // SAFETY: the caller's guarantee, passed on.
            return unsafe { alloc_cold::<A, false>(&self.inner, layout) };
        }
        // SAFETY: forwarded with the caller's layout, which the caller guarantees is valid.
        let ptr = unsafe { self.inner.alloc(layout) };
        if ptr.is_null() {
            return unalloc();
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !TALLY.with(|t| t.try_alloc(layout.size(), layout.align())) {
            // SAFETY: the caller's guarantee, passed on.
            return unsafe { alloc_cold::<A, true>(&self.inner, layout) };
        }
        // SAFETY: forwarded with the caller's layout, which the caller guarantees is valid.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if ptr.is_null() {
            return unalloc();
        }
        ptr
    }

    /// Counts the free first, so that the inner `dealloc` is the last call (a tail call):
    /// the bytes go back to this thread's cell, which only this thread spends, and leave
    /// it (in `settle`) only after the inner allocator has the memory back.
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if TALLY.with(|t| t.freed(&LEDGER, layout.size())) {
            // SAFETY: the caller guarantees `ptr` came from this allocator with `layout`.
            unsafe { self.inner.dealloc(ptr, layout) };
        } else {
            // SAFETY: as above.
            unsafe { dealloc_then_settle(&self.inner, ptr, layout) };
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_size = layout.size();
        let growth = new_size.saturating_sub(old_size);
        if growth > 0 && !TALLY.with(|t| t.try_take(growth)) && !take_slow(growth) {
            // SAFETY: the caller guarantees the new layout is valid (size fits isize).
            let asked = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            return refuse(asked, false);
        }
        // SAFETY: forwarded with the caller's arguments, which the caller guarantees valid.
        let new_ptr = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if new_ptr.is_null() {
            // The old block is untouched; give back only the growth taken for it.
            alloc_failed(growth);
            // SAFETY: as above.
            let asked = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            return refuse(asked, true);
        }
        if !TALLY.with(|t| t.reallocated(&LEDGER, old_size, new_size)) {
            settle();
        }
        new_ptr
    }
}

/// An allocation the fast path declined: a new thread, a dry cell, or a publication due;
/// through the inner allocator's `alloc_zeroed` if `ZEROED`, its `alloc` otherwise (a
/// direct call each, which the compiler can inline).
///
/// # Safety
///
/// As [`GlobalAlloc::alloc`] on `inner`.
#[cold]
#[inline(never)]
unsafe fn alloc_cold<A: GlobalAlloc, const ZEROED: bool>(inner: &A, layout: Layout) -> *mut u8 {
    let size = layout.size();
    if !TALLY.with(|t| t.try_take(size)) && !take_slow(size) {
        return refuse(layout, false);
    }
    // SAFETY: the caller's guarantee, passed on.
    let ptr = unsafe {
        if ZEROED {
            inner.alloc_zeroed(layout)
        } else {
            inner.alloc(layout)
        }
    };
    if ptr.is_null() {
        alloc_failed(size);
        return refuse(layout, true);
    }
    if !TALLY.with(|t| t.allocated(size)) {
        settle();
    }
    ptr
}

/// The inner allocator refused an allocation the fast path had counted: takes it back and
/// refuses it.
#[cold]
#[inline(never)]
fn unalloc() -> *mut u8 {
    let (size, align) = TALLY.with(|t| t.unalloc());
    settle();
    // SAFETY: `size` and `align` are those of the caller's `Layout`, as `try_alloc` kept them.
    refuse(
        unsafe { Layout::from_size_align_unchecked(size, align) },
        true,
    )
}

/// The cold half of a reservation: applies `NDMEM_MAX_HEAP` the first time, registers a new
/// thread, and refills its cell (recalling the other threads' reserves if the budget
/// refuses).
#[cold]
#[inline(never)]
fn take_slow(size: usize) -> bool {
    read_env_once();
    TALLY.with(|t| t.take_slow(&LEDGER, size, register))
}

/// Installs the heap limit's `fork` handlers (once; `crate::at_load` calls it).
#[cfg_attr(any(miri, not(target_os = "linux")), allow(dead_code))]
pub(crate) fn arm_fork_handlers() {
    fork_hook::arm();
}

/// Registers the calling thread (its tally is already marked registered, so the
/// allocation `pthread_setspecific` may make re-enters the allocator safely).
fn register() {
    ACTIVE.store(true, Ordering::Relaxed);
    exit_hook::arm();
    fork_hook::arm();
}

/// `pthread_atfork` handlers that hold off heap limit changes across a `fork()`: a limit
/// change is a short lock (see [`crate::counter::Budget::set_limit`]), and a child forked
/// while another thread held it would inherit it held, with no thread left to release it,
/// so its first refill, `heap::stats` or `heap::set_limit` would wait forever.
///
/// They are installed when the program is loaded (`crate::at_load`).
mod fork_hook {
    use std::sync::atomic::{AtomicBool, Ordering};

    static ARMED: AtomicBool = AtomicBool::new(false);

    /// Installs the handlers once per process: at load time, or (where there are no
    /// initialisers) when the first thread registers.
    pub(super) fn arm() {
        crate::at_load::keep();
        if !ARMED.swap(true, Ordering::AcqRel) {
            // SAFETY: the handlers have the C ABI and signature pthread expects, and stay
            // valid for the whole program. A failure (ENOMEM) leaves forks unprotected, as
            // before; nothing else depends on it.
            unsafe { libc::pthread_atfork(Some(prepare), Some(resume), Some(resume)) };
        }
    }

    /// Before the fork, on the forking thread: waits out a limit change under way and holds
    /// off the next (no allocation: a compare-and-swap loop).
    extern "C" fn prepare() {
        super::LEDGER.budget().hold_limit_changes();
    }

    /// After the fork, in the parent and in the child.
    extern "C" fn resume() {
        super::LEDGER.budget().allow_limit_changes();
    }
}

/// The cold end of a free: the memory goes back first, then the cell's excess (a separate
/// function, so that the hot path's inner `dealloc` stays a tail call).
///
/// # Safety
///
/// As [`GlobalAlloc::dealloc`] on `inner`.
#[cold]
#[inline(never)]
unsafe fn dealloc_then_settle<A: GlobalAlloc>(inner: &A, ptr: *mut u8, layout: Layout) {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { inner.dealloc(ptr, layout) };
    settle();
}

#[cold]
#[inline(never)]
fn alloc_failed(size: usize) {
    TALLY.with(|t| t.alloc_failed(&LEDGER, size));
}

#[cold]
#[inline(never)]
fn settle() {
    TALLY.with(|t| {
        // A thread that frees before it ever allocates registers here, so that its frees
        // are batched too and published when it exits.
        t.register(&LEDGER, register);
        t.settle(&LEDGER);
    });
}

/// Counts a refused allocation, calls the OOM hook, and returns null.
#[cold]
fn refuse(layout: Layout, by_system: bool) -> *mut u8 {
    FAILED.fetch_add(1, Ordering::Relaxed);
    BY_SYSTEM.with(|b| b.set(by_system));
    let hook = OOM_HOOK.load(Ordering::Acquire);
    if hook != 0 && !IN_HOOK.with(|h| h.replace(true)) {
        // SAFETY: OOM_HOOK only ever holds 0 or an address stored by `set_oom_hook` from a
        // `fn(Layout, &HeapStats)`, which lives for the whole program.
        let hook: fn(Layout, &HeapStats) = unsafe { std::mem::transmute(hook) };
        // Unwinding out of `GlobalAlloc::alloc` is undefined behaviour: a panicking hook
        // aborts the process instead. The panic is caught right here, not by a guard's
        // drop further up: the frames above (the allocator shim, compiled not to unwind)
        // can lack unwind tables, and a panic that has to search them for a handler is
        // refused by the runtime before any guard runs, so the reason would never be told.
        let stats = heap::stats();
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hook(layout, &stats);
        }));
        if called.is_err() {
            warn(&[b"ndmem: the heap OOM hook panicked inside the global allocator; aborting\n"]);
            std::process::abort();
        }
        IN_HOOK.with(|h| h.set(false));
    }
    std::ptr::null_mut()
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
        super::TALLY.with(|t| t.retire(&super::LEDGER));
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
    if std::str::from_utf8(value).is_err() {
        // The reason `heap::env_error` gives, the value shown the same way (invalid bytes
        // as U+FFFD), written piece by piece: nothing here may allocate.
        warn(&[b"ndmem: NDMEM_MAX_HEAP=\""]);
        for chunk in value.utf8_chunks() {
            warn(&[chunk.valid().as_bytes()]);
            if !chunk.invalid().is_empty() {
                warn(&["\u{fffd}".as_bytes()]);
            }
        }
        warn(&[
            b"\" is not a valid size: ",
            NOT_UTF8.as_bytes(),
            b"; the heap limit is not applied\n",
        ]);
        return;
    }
    match parse_size_bytes(value) {
        Ok(0) => {}
        Ok(limit) => {
            if LEDGER.budget().set_limit(Some(limit)).is_err() {
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
/// - *budget held by threads*: each thread holds a *cell* it spends without atomics and a
///   *reserve* it refills the cell from. The cell is refilled to a target of
///   `min(64 KiB, headroom / (256 x threads))` and gives back what passes twice that, so it
///   holds at most `2 x target` as of the thread's last refill: at most 128 KiB a thread,
///   and together at most 1/128 of the headroom when the threads last refilled at the
///   same headroom. The reserve holds up to twice a batch of
///   `min(1 MiB, headroom / (4 x threads))`; the first 256 threads alive at once have one.
///   An allocation the budget refuses first *recalls* every thread's reserve, so it fails
///   only if the bytes are live or in other threads' cells. A thread's cell and reserve go
///   back when it exits (a pthread key destructor). No allocation is ever served past the
///   limit.
/// - *statistics lag*: a thread checks its unpublished net bytes whenever its cell runs
///   dry or overflows (so before they move by more than its cell, 128 KiB at most) and
///   publishes its live bytes when they reach 4 MiB, or 256 KiB once 64 of its own
///   operations passed since it last did; it publishes all its figures after 4096
///   allocations, 4096 frees or 4096 reallocations, and whenever it returns budget. So the
///   live figure can lag by less than 4 MiB + 128 KiB per other thread, and the counts
///   (allocations, bytes allocated and freed) by 4096 operations of each kind per other
///   thread. Each thread also
///   keeps the high-water mark of its unpublished net bytes and publishes it to the peak
///   with its live bytes, so no excursion between publications is lost: the peak is the
///   highest live figure, each thread's own excursions added to the others' figures as
///   published at that moment (so it can miss by the same lag as the live figure when
///   several threads peak together, never by a single thread's own excursion; and it can
///   read above the true peak by the bytes the others have freed and not yet published,
///   but never above the limit, which live bytes never pass).
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
        TALLY.with(|t| t.flush(&LEDGER));
        let live = LEDGER.live().read();
        let counts = LEDGER.counts();
        HeapStats {
            live_bytes: live.value,
            peak_bytes: live.peak,
            total_allocated_bytes: live.total,
            total_freed_bytes: counts.freed_bytes,
            allocations: counts.allocations,
            deallocations: counts.deallocations,
            reallocations: counts.reallocations,
            failed_allocations: FAILED.load(Ordering::Relaxed),
            limit: LEDGER.budget().limit(),
            reserved_bytes: LEDGER.budget().used(),
        }
    }

    /// Whether `bytes` more heap can be allocated now without passing the limit: always
    /// with no limit; under one, when the headroom, the threads' reserves (which a refused
    /// allocation recalls) and the calling thread's own cell cover it. A few atomic loads,
    /// no allocation, so a free path can ask before it does anything that allocates. Another
    /// thread may take the room right after: the answer is a moment's.
    pub fn has_room(bytes: usize) -> bool {
        let budget = LEDGER.budget();
        if budget.limit().is_none() {
            return true;
        }
        let own = TALLY.try_with(|t| t.cell()).unwrap_or(0);
        budget
            .available()
            .saturating_add(LEDGER.reserves().total())
            .saturating_add(own)
            >= bytes
    }

    /// Why the last allocation this thread saw refused was refused: `true` when the
    /// allocator `Tracking` wraps returned null (the system is out of memory, or an
    /// address-space or container cap was hit) with the heap limit not reached, `false`
    /// when the heap limit refused it. For an OOM hook, which runs on the refusing thread,
    /// to tell the two apart ([`exit_on_oom`] does); `false` before any refusal.
    pub fn system_refused() -> bool {
        BY_SYSTEM.try_with(Cell::get).unwrap_or(false)
    }

    /// Whether a [`Tracking`] allocator is installed and has counted anything.
    pub fn is_tracking() -> bool {
        ACTIVE.load(Ordering::Relaxed)
    }

    /// Restarts the peak from the current live bytes.
    pub fn reset_peak() {
        TALLY.with(|t| {
            t.flush(&LEDGER);
            LEDGER.live().reset_peak();
            t.restart_peak(&LEDGER);
        });
    }

    /// Sets (`Some`) or removes (`None`) the heap limit at run time; `NDMEM_MAX_HEAP` sets
    /// it at start-up. `Some(0)` means no limit, as `0` does in the variable and in
    /// [`crate::Pool::set_max_bytes`]. A limit below the bytes already reserved is refused
    /// and changes nothing: the threads' reserves are recalled first, but each thread's
    /// cell (at most 128 KiB, spent by that thread before it takes more) stays reserved,
    /// so a limit within 128 KiB a thread of the live bytes can be refused while idle
    /// threads keep their cells.
    pub fn set_limit(limit: Option<usize>) -> Result<(), AllocError> {
        read_env_once_outside_allocator();
        // Budget that threads hold in reserve would make a lower limit look taken.
        TALLY.with(|t| t.return_budget(&LEDGER));
        LEDGER.reserves().recall(LEDGER.budget());
        LEDGER
            .budget()
            .set_limit(limit.filter(|l| *l > 0))
            .map_err(|e| AllocError::LimitBelowUse {
                what: crate::error::HEAP_LIMIT,
                limit: e.limit,
                used: e.used,
            })?;
        LIMIT_IN_CODE.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Calls `hook` with the failed layout and the statistics just before the allocator
    /// returns null (after which Rust's allocation-error handler usually aborts). It runs
    /// on every refusal, a fallible request's (`Vec::try_reserve`) too: the allocator
    /// cannot tell them apart.
    ///
    /// The hook may allocate, but at a heap with no room left its allocations are refused
    /// as well (without calling the hook again), and an infallible one (`format!`, say)
    /// then aborts the process: write from the stack, as [`exit_on_oom`] does.
    ///
    /// **The hook must not panic**: it runs inside `GlobalAlloc::alloc`/`realloc`, which
    /// must not unwind, so a panic in the hook aborts the process (after the panic message
    /// and, when the heap has room for the panic's message, a line on stderr). Record what
    /// you need (in atomics, say) and act after the failed allocation returns. (With
    /// `RUST_BACKTRACE` set, a panic there may not even reach the abort: capturing the
    /// backtrace allocates at a heap already at its limit, and std's allocation-error
    /// handler then waits on the backtrace lock it holds. The same wait can follow any
    /// panic whose unwinding allocates at a heap at its limit, hook or not.)
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
        match crate::limits::env_value(ENV_MAX_HEAP) {
            Ok(value) => crate::limits::parse_size_named(ENV_MAX_HEAP, &value?).err(),
            Err(not_unicode) => Some(not_unicode),
        }
    }
}
