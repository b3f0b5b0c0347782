//! The native pool: tensor and workspace memory outside the Rust heap, with exact limits.
//!
//! Invariant: every byte the pool holds (live blocks *and* its caches of freed blocks) is
//! reserved in the off-heap [`Budget`] before the OS is asked for it, and released only after
//! it went back to the OS, so `used = live + cached <= max_bytes` at every instant. Blocks are
//! rounded up to size classes (four per power of two, at most 25% slack; see `class`).
//!
//! Freed blocks are cached at two levels, both reserved in the budget. Each thread keeps its
//! own cache per pool (`local`): a free list per class, bounded by bytes, not by a count: up
//! to a quarter of `max_bytes` per thread (a quarter of the installed RAM when the pool is
//! unlimited), so a loop that frees and reallocates the same shapes, a thousand blocks at a
//! time, touches neither the OS, nor a lock, nor a cache line another thread writes. What
//! does not fit goes to the shared classes, [`SLOTS_PER_CLASS`] blocks each in a lock-free
//! [`Slots`], and the rest back to the OS. A thread's cache goes back to the pool when the
//! thread exits: its lists whole into the depot (`local::Depot`, up to one thread's bound),
//! where the next thread that misses in a class takes one list over whole; the rest to the
//! shared classes. Every thread's cache is recalled (to the OS) by [`Pool::trim`],
//! by a limit lowered below use, and at a limit before a request fails. The statistics are
//! summed from per-thread tallies when read, so they are exact when no request is in flight.
//!
//! A [`Pool`] is a handle on an `Arc`-ed core: a thread's cache keeps the core alive, so a
//! pool may be dropped before the threads that used it exit (dropping it empties their
//! caches to the OS; they drop their entries for it later).
//!
//! Classes of 256 KiB and more come from `mmap` (page-aligned, zero-filled), those up to 16
//! KiB from slabs of 256 KiB (`slab`: the blocks of a class side by side, nothing between
//! them), the ones between from `posix_memalign` (see `os`); blocks above 1 GiB are mapped
//! exactly and never cached.
//!
//! The parts: `class` (size arithmetic), `os` (the system calls), `slab` (the small
//! classes' memory), `stats` (the books and
//! [`PoolStats`]), `local` (the threads' caches and tallies), `block` ([`Block`] and
//! [`Reservation`], which give themselves back on drop), `reclaim` (callbacks run at a
//! limit), and the [`Pool`] here, which ties them to the budget and the limits.

#![allow(unsafe_code)]

mod block;
mod class;
mod local;
mod os;
mod reclaim;
mod slab;
mod stats;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
#[cfg(not(ndmem_loom))]
use std::sync::OnceLock;

use crate::counter::{Budget, UNLIMITED};
use crate::error::{AllocError, ConfigError, MemoryKind};
use crate::limits::Limits;
#[cfg(not(ndmem_loom))]
use crate::limits::{ENV_MAX_BYTES, ENV_MAX_PHYSICAL_BYTES};
use crate::physical::{physical_bytes, physical_ram};
use crate::slots::Slots;
use crate::sync::{AtomicUsize, Ordering};
use crate::trace::EventKind;

pub use block::{Block, FreedBlock, Reservation};
pub use class::MAX_ALIGN;
pub use stats::{PoolStats, Usage};

use class::{cached_class, class_size, fit, invalid, NO_CLASS, NUM_CLASSES};
use local::{Depot, Registry};
use os::thread_id;
use reclaim::Reclaimers;
use stats::{Books, Figures};

/// Installs the slabs' `fork` handlers (once; `crate::at_load` calls it).
#[cfg_attr(any(miri, not(target_os = "linux")), allow(dead_code))]
pub(crate) fn arm_fork_handlers() {
    slab::fork::arm();
}

/// Freed blocks each shared size class keeps for reuse (the threads' own caches are
/// bounded by bytes instead).
pub const SLOTS_PER_CLASS: usize = 16;
/// New OS memory after which the physical check re-reads the RSS.
const RSS_RECHECK: usize = 1 << 20;

/// Bytes each thread may keep in its own cache of a pool limited to `limit`: a quarter of
/// the limit, or of the installed RAM when unlimited.
/// The OS id of the calling thread, as the out-of-memory messages print it (`threadId`:
/// what `top -H` and debuggers show on Linux; the `pthread_t` value elsewhere). No
/// allocation, no system call but `gettid`.
pub fn os_thread_id() -> u64 {
    thread_id()
}

/// Whether `bytes` is more than one [`Block`] can hold (16 PiB: its length has 54 bits).
fn beyond_any_block(bytes: usize) -> bool {
    bytes >> (usize::BITS - block::LEN_SHIFT) != 0
}

fn thread_cache_bound(limit: Option<usize>) -> usize {
    limit.unwrap_or_else(physical_ram) / 4
}

/// A native memory pool with an off-heap and a physical limit.
pub struct Pool {
    core: Arc<Core>,
}

/// What a pool is: shared with the threads that cache its blocks.
struct Core {
    budget: Budget,
    max_physical: AtomicUsize,
    classes: Box<[Slots<SLOTS_PER_CLASS>]>,
    books: Books,
    local: Registry,
    /// Whole lists exited threads left (see `local::Depot`).
    depot: Depot,
    rss_hint: AtomicUsize,
    os_since_rss: AtomicUsize,
    reclaimers: Reclaimers,
    config_error: Option<ConfigError>,
    bytes_variable: &'static str,
    physical_variable: &'static str,
    /// What set the limit, when [`Pool::set_max_bytes_by`] named it: refusals name it in
    /// place of `bytes_variable`.
    bytes_knob: std::sync::Mutex<Option<&'static str>>,
    /// Trims under way. A trim gives its blocks back to the OS one at a time, and until it
    /// has, their bytes count as used but are neither cached nor live: a request refused
    /// at the limit waits for other threads' trims before it judges.
    trimming: AtomicUsize,
}

/// Relief rounds (collect, recall, trim, retry) a request refused at the limit runs at
/// most, going on only while a round freed something or waited for another thread's
/// trim: other threads keep caching what they free while it relieves. (`ndmem`'s device
/// pools relieve in as many.)
pub const RELIEF_ROUNDS: u32 = 16;

/// The longest a request refused at the limit waits for other threads' trims, over all its
/// rounds.
const TRIM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts a trim under way on a pool while it lives.
struct Trimming<'a>(&'a AtomicUsize);

impl<'a> Trimming<'a> {
    fn begin(count: &'a AtomicUsize) -> Trimming<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Trimming(count)
    }
}

impl Drop for Trimming<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(not(ndmem_loom))]
static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// Every pool made (its core; a dropped pool's entry is pruned at the next pool's making),
/// for the recorder's start to reach their thread caches.
#[cfg(not(ndmem_loom))]
static CORES: std::sync::Mutex<Vec<std::sync::Weak<Core>>> = std::sync::Mutex::new(Vec::new());

/// The recorder switched on: every thread cache of every pool sends its owner's operations
/// to the slow paths, which record them (the hit paths test nothing of the recorder; see
/// `local`'s module invariant). Called by [`crate::trace::start`] after the switch.
pub(crate) fn recorder_started() {
    #[cfg(not(ndmem_loom))]
    {
        // Under the lock, allocating nothing (the heap may be at its limit). A pool whose
        // last handle drops meanwhile is dropped here; its drop takes no lock of this list.
        let cores = CORES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for core in cores.iter().filter_map(std::sync::Weak::upgrade) {
            core.local.force_all();
        }
    }
}

impl Pool {
    /// The process-wide pool, with limits from `NDMEM_MAX_BYTES` and
    /// `NDMEM_MAX_PHYSICAL_BYTES` (semantics §1).
    ///
    /// If a variable holds garbage, every allocation from this pool fails with
    /// [`AllocError::Config`] naming it; [`Pool::try_global`] reports it up front.
    #[cfg(not(ndmem_loom))]
    pub fn global() -> &'static Pool {
        GLOBAL.get_or_init(|| {
            let _ = crate::trace::init_from_env();
            // Only the pool's own variables: garbage in the heap's or the devices' is
            // theirs to report, and must not make the host pool unusable.
            let (limits, error) = match Limits::pool_from_env() {
                Ok(limits) => (limits, None),
                Err(e) => (Limits::builder().build(), Some(e)),
            };
            let mut core = Core::new(limits);
            core.config_error = error;
            core.bytes_variable = ENV_MAX_BYTES;
            core.physical_variable = ENV_MAX_PHYSICAL_BYTES;
            Pool::listed(core)
        })
    }

    /// The process-wide pool, or the configuration error that makes it unusable.
    #[cfg(not(ndmem_loom))]
    pub fn try_global() -> Result<&'static Pool, ConfigError> {
        let pool = Pool::global();
        match &pool.core.config_error {
            Some(e) => Err(e.clone()),
            None => Ok(pool),
        }
    }

    /// The configuration error that makes this pool refuse every allocation (garbage in
    /// `NDMEM_MAX_BYTES` or `NDMEM_MAX_PHYSICAL_BYTES` for [`Pool::global`]); `None` for a
    /// usable pool.
    pub fn config_error(&self) -> Option<&ConfigError> {
        self.core.config_error.as_ref()
    }

    /// An independent pool with its own limits and cache (tests, embedding).
    pub fn new(limits: Limits) -> Pool {
        Pool::listed(Core::new(limits))
    }

    /// A pool of `core`, listed among the pools the recorder's start reaches
    /// ([`recorder_started`]).
    fn listed(core: Core) -> Pool {
        let core = Arc::new(core);
        #[cfg(not(ndmem_loom))]
        {
            let mut cores = CORES
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The entries of dropped pools go first, so the list holds the live ones only
            // (and what the recorder walks stays short).
            cores.retain(|c| c.strong_count() > 0);
            cores.push(Arc::downgrade(&core));
        }
        Pool { core }
    }

    /// A block of at least `size` bytes aligned to `align` (a power of two up to 4096).
    /// Its bytes are initialised but their values are unspecified.
    #[inline]
    pub fn allocate(&self, size: usize, align: usize) -> Result<Block<'_>, AllocError> {
        self.allocate_for(size, align, Usage::Other)
    }

    /// [`Pool::allocate`] with every byte zero.
    #[inline]
    pub fn allocate_zeroed(&self, size: usize, align: usize) -> Result<Block<'_>, AllocError> {
        self.allocate_zeroed_for(size, align, Usage::Other)
    }

    /// [`Pool::allocate`] recording what the block is for.
    #[inline]
    pub fn allocate_for(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
    ) -> Result<Block<'_>, AllocError> {
        self.allocate_inner(size, align, usage, false)
    }

    /// [`Pool::allocate_zeroed`] recording what the block is for.
    #[inline]
    pub fn allocate_zeroed_for(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
    ) -> Result<Block<'_>, AllocError> {
        self.allocate_inner(size, align, usage, true)
    }

    /// Counts `bytes` of memory obtained elsewhere (a memory-mapped file) against this
    /// pool's limits, as if they were a block, until the reservation drops: it counts as
    /// one allocation of `bytes` now and one deallocation when it drops.
    pub fn reserve(&self, bytes: usize, usage: Usage) -> Result<Reservation<'_>, AllocError> {
        if bytes == 0 {
            return Err(invalid(0, 1, "a reservation of zero bytes counts nothing"));
        }
        if bytes > crate::counter::UNLIMITED {
            return Err(invalid(bytes, 1, class::BEYOND_ANY_POOL));
        }
        let core = &*self.core;
        core.check_config()?;
        if beyond_any_block(bytes) && core.limit_bytes().is_none() {
            // No limit to refuse it first: a count this large could only drain the budget
            // an unlimited pool counts against (4 EiB), after which it would refuse
            // everything at a limit it does not have.
            return Err(invalid(bytes, 1, class::BEYOND_ANY_BLOCK));
        }
        core.take_budget(bytes, bytes, None)?;
        core.budget.note_peak();
        core.count_live(bytes, usage, false);
        Ok(Reservation::new(bytes, usage, self))
    }

    /// The fast path, inlined into callers: this thread's own cache, one thread-local
    /// lookup; everything else is [`Pool::allocate_slow`]. A pool whose configuration is
    /// unusable never gets to the fast path: the slow path refuses before any thread's
    /// cache of it is made.
    #[inline(always)]
    fn allocate_inner(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
        zeroed: bool,
    ) -> Result<Block<'_>, AllocError> {
        let fit = fit(size, align)?;
        let core = &*self.core;
        // The fast path: no call, so the caller's frame stays as small as the work. Both
        // paths end in the block's address alone, and the block is built once, after they
        // meet: so the fast path's block lives in registers and is never copied through the
        // slow path's result in memory.
        let mut cached = None;
        if fit.class != NO_CLASS {
            if let Some(slot) = local::cached_slot(core) {
                // SAFETY: `cached_slot` names this thread's live slot for `core`, which
                // only this thread removes, and not during this call.
                let slot = unsafe { slot.as_ref() };
                cached = slot.try_take(usize::from(fit.class), fit.capacity, usage);
            }
        }
        let ptr = match cached {
            Some(ptr) => {
                // No recording here: a hit never happens while the recorder is on (the
                // slot's thresholds send every allocation to the slow path then).
                if zeroed {
                    // SAFETY: `ptr` is a block of `fit.capacity` writable bytes that this
                    // allocation owns alone (taken off this thread's list above).
                    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, fit.capacity) };
                }
                ptr
            }
            None => self.allocate_slow(size, align, fit.capacity, fit.class, usage, zeroed)?,
        };
        // SAFETY: `ptr` is a block of exactly `fit.capacity` bytes of this pool (its class's
        // size, from a cache of that class, or from the shared classes, the budget or the
        // OS), owned by this call alone (a cached pointer leaves a thread's list inside the
        // slot's handshake, and a shared slot through one `swap`), with every byte
        // initialised (zeroed by the OS path, written by previous owners since), counted
        // live for `usage`; `size <= fit.capacity`.
        Ok(unsafe { Block::new(ptr, size, fit.capacity, fit.class, usage, self) })
    }

    /// [`Pool::allocate_inner`] off its fast path: the thread's slot looked up in full (its
    /// list's cap raised on a miss, the figures published past their batch), then a block
    /// from the shared classes or the OS (registering this thread's cache first if it has
    /// none).
    #[cold]
    #[inline(never)]
    fn allocate_slow(
        &self,
        size: usize,
        align: usize,
        capacity: usize,
        class_id: u8,
        usage: Usage,
        zeroed: bool,
    ) -> Result<NonNull<u8>, AllocError> {
        let core = &*self.core;
        if class_id != NO_CLASS && crate::trace::is_on() {
            // The recorder forced the hit path here: the same hit, recorded.
            if let Some(slot) = local::cached_slot(core) {
                // SAFETY: as in `allocate_inner`.
                let slot = unsafe { slot.as_ref() };
                let class = usize::from(class_id);
                if let Some(ptr) = slot.try_take_recorded(class, capacity, usage, &core.local) {
                    self.prepare(ptr, capacity, zeroed, false);
                    return Ok(ptr);
                }
            }
        }
        if class_id != NO_CLASS {
            let class = usize::from(class_id);
            let hit = local::with_slot(core, |slot| {
                let ptr = slot.take(class, capacity, &core.local)?;
                slot.live(&core.local, &core.books, capacity, usage, true);
                Some(ptr)
            });
            if let Some(Some(ptr)) = hit {
                self.prepare(ptr, capacity, zeroed, false);
                return Ok(ptr);
            }
        }
        core.check_config()?;
        let class = (class_id != NO_CLASS).then_some(usize::from(class_id));
        if let Some(c) = class {
            if local::with_slot(core, |_| ()).is_none() {
                local::register(&self.core);
                // This request found no block of its class in the new cache: a miss, which
                // lets the cache keep one when it comes back.
                local::with_slot(core, |slot| slot.take(c, capacity, &core.local));
            }
        }
        if beyond_any_block(capacity) && core.limit_bytes().is_none() {
            // No limit to refuse it first: refused before the budget, whose refusal would
            // run the relief (reclaimers, trims) for a request nothing can serve.
            return Err(class::invalid(size, align, class::BEYOND_ANY_BLOCK));
        }
        if let Some(ptr) = class.and_then(|c| core.take_depot(c, capacity)) {
            core.count_live(capacity, usage, true);
            self.prepare(ptr, capacity, zeroed, false);
            return Ok(ptr);
        }
        let (ptr, fresh) = match class.and_then(|c| core.take_shared(c, capacity)) {
            Some(ptr) => (ptr, false),
            None => match core.take_budget(capacity, size, class)? {
                Some(ptr) => (ptr, false),
                None if beyond_any_block(capacity) => {
                    // Past the limits (a limited pool refuses at its limit first, as for any
                    // request too large for it): a `Block` keeps its length in 54 bits.
                    core.budget.release(capacity);
                    return Err(class::invalid(size, align, class::BEYOND_ANY_BLOCK));
                }
                None => (core.os_alloc(capacity, size)?, true),
            },
        };
        core.count_live(capacity, usage, !fresh);
        self.prepare(ptr, capacity, zeroed, fresh);
        Ok(ptr)
    }

    /// Readies a block of `capacity` bytes at `ptr` for its new owner: zeroed if asked
    /// (unless `fresh` from the OS, which zeroed it), and traced if the recorder is on.
    #[inline(always)]
    fn prepare(&self, ptr: NonNull<u8>, capacity: usize, zeroed: bool, fresh: bool) {
        if zeroed && !fresh {
            // SAFETY: `ptr` is a block of `capacity` writable bytes that this allocation
            // owns alone (the callers' invariant; nothing else refers to it yet).
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, capacity) };
        }
        if crate::trace::is_on() {
            self.core.traced(EventKind::Alloc, capacity);
        }
    }

    /// An identity for this pool, stable for its life and unique among live pools (the
    /// address of its shared state): the key trace events and refusals name it by.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.core) as usize
    }

    /// Registers a callback run when an allocation reaches a limit, before the caches are
    /// released and the allocation retried. It returns the bytes it freed: the relief goes
    /// on in rounds (at most 16) while a round freed something, and the reclaimers run
    /// again in the next round only if they freed something in this one.
    ///
    /// A reclaimer may allocate from the pool; if that allocation reaches a limit too, the
    /// reclaimers are not run again for it (no recursion). A reclaimer that panics fails
    /// the request it ran for with [`AllocError::ReclaimerPanicked`]; the panic does not
    /// unwind out of the pool.
    pub fn register_reclaimer(&self, reclaim: impl Fn() -> usize + Send + Sync + 'static) {
        self.core.reclaimers.register(reclaim);
    }

    /// Takes a block back: into this thread's cache while it is within its bound, else
    /// into its class's shared slots if one is free, else to the OS. A cached block stays
    /// reserved, so the caches can never push the pool past its limit; at the limit they
    /// are released before anything fails.
    /// `class` is the block's class ([`NO_CLASS`] for blocks never cached).
    #[inline(always)]
    fn release(&self, ptr: NonNull<u8>, capacity: usize, class: u8, usage: Usage) {
        let core = &*self.core;
        // The fast path: no call, so the caller's frame stays as small as the work. No test
        // of the recorder: while it is on, the slot's gate sends every free to the slow
        // path.
        if class != NO_CLASS {
            if let Some(slot) = local::cached_slot(core) {
                // SAFETY: `cached_slot` names this thread's live slot for `core`, which
                // only this thread removes, and not during this call.
                let slot = unsafe { slot.as_ref() };
                if slot.try_keep(usize::from(class), ptr, capacity, usage) {
                    return;
                }
            }
        }
        self.release_slow(ptr, capacity, class, usage);
    }

    /// [`Pool::release`] of a block of no class, of `len` requested bytes.
    #[cold]
    #[inline(never)]
    fn release_page_block(&self, ptr: NonNull<u8>, len: usize, usage: Usage) {
        self.release_slow(ptr, class::page_capacity(len), NO_CLASS, usage);
    }

    /// [`Pool::release`] off its fast path: the thread's slot looked up in full, the
    /// statistics published if they passed their batch, and a block the thread cannot
    /// keep given to the shared classes.
    #[cold]
    #[inline(never)]
    fn release_slow(&self, ptr: NonNull<u8>, capacity: usize, class: u8, usage: Usage) {
        let core = &*self.core;
        if class != NO_CLASS && crate::trace::is_on() {
            // The recorder forced the hit path here: the same hit, recorded.
            if let Some(slot) = local::cached_slot(core) {
                // SAFETY: as in `release`.
                let slot = unsafe { slot.as_ref() };
                if slot.try_keep_recorded(usize::from(class), ptr, capacity, usage) {
                    core.traced(EventKind::Free, capacity);
                    return;
                }
            }
        }
        let kept = local::with_slot(core, |slot| {
            slot.freed(&core.books, capacity, usage);
            class != NO_CLASS && slot.keep(usize::from(class), ptr)
        });
        match kept {
            Some(true) => {}
            Some(false) => core.release_shared(ptr, capacity),
            None => {
                core.books.freed(capacity, usage);
                core.release_shared(ptr, capacity);
            }
        }
        // After the block went where it goes: the event carries the pool's bytes after the
        // free (less, when the block went back to the OS).
        if crate::trace::is_on() {
            core.traced(EventKind::Free, capacity);
        }
    }

    /// Takes a [`Reservation`] of `bytes` back.
    fn release_reservation(&self, bytes: usize, usage: Usage) {
        let core = &*self.core;
        if local::with_slot(core, |slot| slot.freed(&core.books, bytes, usage)).is_none() {
            core.books.freed(bytes, usage);
        }
        core.budget.release(bytes);
    }

    /// Returns every cached block, the threads' caches included, to the OS; returns the
    /// bytes released.
    pub fn trim(&self) -> usize {
        self.core.trim()
    }

    /// Changes the off-heap limit; `None` or `Some(0)` means unlimited (as `0` does in
    /// `NDMEM_MAX_BYTES`, and as in [`crate::heap::set_limit`]).
    ///
    /// A limit below the bytes held outside the caches (live blocks and reservations) is
    /// refused before anything is touched, so a refused limit changes nothing: not the
    /// limit, not the caches. A limit that fits once the caches are released releases them
    /// first, every thread's included. (If other threads allocate meanwhile, the limit can
    /// still be refused after the caches were released; it is never applied below what is
    /// reserved.)
    pub fn set_max_bytes(&self, limit: Option<usize>) -> Result<(), AllocError> {
        self.set_max_bytes_named(limit, None)
    }

    /// [`Pool::set_max_bytes`], naming `knob` as what set the limit (a command-line option,
    /// a configuration key, ...): a refusal at this limit then says to raise `knob`, in
    /// place of the environment variable or the call. A later `set_max_bytes` forgets it.
    ///
    /// ```
    /// use ndmem_alloc::{AllocError, Limits, Pool};
    ///
    /// let pool = Pool::new(Limits::unlimited());
    /// pool.set_max_bytes_by(Some(4096), "--max-bytes")?;
    /// let refused = pool.allocate(8192, 16).unwrap_err();
    /// assert!(refused.to_string().contains("raise --max-bytes"), "{refused}");
    /// assert_eq!(pool.max_bytes_knob(), Some("--max-bytes"));
    /// pool.set_max_bytes(Some(4096))?;
    /// assert_eq!(pool.max_bytes_knob(), None);
    /// # Ok::<(), AllocError>(())
    /// ```
    pub fn set_max_bytes_by(
        &self,
        limit: Option<usize>,
        knob: &'static str,
    ) -> Result<(), AllocError> {
        self.set_max_bytes_named(limit, Some(knob))
    }

    /// What set the limit, as [`Pool::set_max_bytes_by`] named it; `None` when the limit
    /// came from the environment, the defaults, [`Limits`] or [`Pool::set_max_bytes`].
    pub fn max_bytes_knob(&self) -> Option<&'static str> {
        self.core.knob()
    }

    fn set_max_bytes_named(
        &self,
        limit: Option<usize>,
        knob: Option<&'static str>,
    ) -> Result<(), AllocError> {
        let core = &*self.core;
        let limit = limit.filter(|l| *l > 0);
        let below_use = |limit: usize, used: usize| AllocError::LimitBelowUse {
            what: "the pool's max_bytes",
            limit,
            used,
        };
        if let Some(l) = limit {
            let (used, cached) = core.local.summed(&core.books, |f| {
                (core.budget.used(), f.cached + f.thread_cached)
            });
            let held = used.saturating_sub(cached);
            if l < held {
                return Err(below_use(l, held));
            }
            if l < used {
                core.trim();
            }
        }
        core.budget
            .set_limit(limit)
            .map_err(|e| below_use(e.limit, e.used))?;
        let bound = thread_cache_bound(limit);
        let lowered = bound < core.local.bound();
        core.local.set_bound(bound);
        if lowered {
            // The threads' caps were learned under the higher bound: they start again.
            core.local
                .recall(|block, class| core.release_shared(block, class_size(class)));
            // And what waits in the depot, which the old bound bounded.
            core.drain_depot(|block, capacity| core.release_shared(block, capacity));
        }
        *core
            .bytes_knob
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = knob;
        Ok(())
    }

    /// Changes the physical limit; `None` or `Some(0)` means unlimited. Refused below the
    /// current RSS.
    pub fn set_max_physical_bytes(&self, limit: Option<usize>) -> Result<(), AllocError> {
        let limit = limit.filter(|l| *l > 0);
        let rss = physical_bytes();
        if let Some(l) = limit.filter(|l| *l < rss) {
            return Err(AllocError::LimitBelowUse {
                what: "the pool's max_physical_bytes",
                limit: l,
                used: rss,
            });
        }
        self.core
            .max_physical
            .store(limit.unwrap_or(UNLIMITED), Ordering::Relaxed);
        Ok(())
    }

    /// The limits this pool enforces now (the byte limit is `Some(0)` for the global
    /// pool while its variables hold garbage: it serves nothing).
    pub fn limits(&self) -> (Option<usize>, Option<usize>) {
        let physical = self.core.max_physical.load(Ordering::Relaxed);
        (
            self.core.limit_bytes(),
            (physical < UNLIMITED).then_some(physical),
        )
    }

    /// A snapshot of the pool's counters: the threads' tallies are summed when read, so
    /// the figures are exact whenever no allocation or free is in flight, whichever thread
    /// reads them. The peak of live bytes is exact when one thread allocates, and within
    /// 4 MiB per other thread allocating at the same time.
    pub fn stats(&self) -> PoolStats {
        let core = &*self.core;
        let physical = core.max_physical.load(Ordering::Relaxed);
        // The used bytes are read once, for the bound and the figure both: a `trim` (or
        // any block given back to the OS) between two reads would report less used than
        // the live and cached bytes were bounded by.
        let (stats, used) = core.local.summed(
            &core.books,
            core.bounded(|f, used| (core.books.stats(&f), used)),
        );
        // The budget raises its peak once the OS gave the bytes, and `used` counts them
        // from their reservation just before: a reading between the two raises the peak
        // itself, so no later reading shows less.
        let peak_used = core.budget.raise_peak(used);
        PoolStats {
            // Live bytes are part of the used bytes, whose peak the budget keeps exactly: a
            // live peak above it can only be the other threads' unpublished drift.
            peak_bytes: stats.peak_bytes.min(peak_used).max(stats.live_bytes),
            used_bytes: used,
            peak_used_bytes: peak_used,
            limit_bytes: core.limit_bytes(),
            physical_bytes: physical_bytes(),
            physical_limit_bytes: (physical < UNLIMITED).then_some(physical),
            ..stats
        }
    }

    /// Restarts both peaks from the current figures.
    pub fn reset_peak(&self) {
        let core = &*self.core;
        core.local.reset_peak(
            &core.books,
            core.bounded(|f, _| core.books.reset_peak(f.live())),
        );
        core.budget.reset_peak();
    }
}

impl Core {
    /// This pool's identity ([`Pool::id`]).
    fn id(&self) -> usize {
        self as *const Core as usize
    }

    /// Records a pool event of `bytes` in the trace, with the bytes the pool holds after it.
    #[cold]
    fn traced(&self, kind: EventKind, bytes: usize) {
        crate::trace::record_pool(kind, self.id(), bytes, self.budget.used());
    }

    fn new(limits: Limits) -> Core {
        Core {
            budget: Budget::new(limits.max_bytes),
            max_physical: AtomicUsize::new(limits.max_physical_bytes.unwrap_or(UNLIMITED)),
            classes: (0..NUM_CLASSES).map(|_| Slots::default()).collect(),
            books: Books::new(),
            local: Registry::new(thread_cache_bound(limits.max_bytes)),
            depot: Depot::new(),
            rss_hint: AtomicUsize::new(physical_bytes()),
            os_since_rss: AtomicUsize::new(0),
            reclaimers: Reclaimers::new(),
            config_error: None,
            bytes_variable: "Limits::max_bytes of this pool",
            physical_variable: "Limits::max_physical_bytes of this pool",
            bytes_knob: std::sync::Mutex::new(None),
            trimming: AtomicUsize::new(0),
        }
    }

    /// `f` of the summed figures bounded by the used bytes (`Figures::bound`: exact at
    /// rest, no phantom live bytes while threads run), with the used bytes read once for
    /// both: what every reader of the sum takes.
    fn bounded<'a, R>(
        &'a self,
        f: impl FnOnce(Figures, usize) -> R + 'a,
    ) -> impl FnOnce(Figures) -> R + 'a {
        move |mut figures| {
            let used = self.budget.used();
            figures.bound(used);
            f(figures, used)
        }
    }

    /// The byte limit as reported: the budget's, or `Some(0)` while the configuration is
    /// unusable (nothing can be allocated).
    fn limit_bytes(&self) -> Option<usize> {
        match self.config_error {
            None => self.budget.limit(),
            Some(_) => Some(0),
        }
    }

    #[inline(always)]
    fn check_config(&self) -> Result<(), AllocError> {
        match &self.config_error {
            None => Ok(()),
            Some(e) => Err(config_failure(e)),
        }
    }

    /// Counts a block or reservation of `bytes` live, in this thread's tally if it has one.
    fn count_live(&self, bytes: usize, usage: Usage, hit: bool) {
        if local::with_slot(self, |slot| {
            slot.live(&self.local, &self.books, bytes, usage, hit)
        })
        .is_none()
        {
            self.books.live(bytes, usage, hit);
        }
    }

    /// A block of `class` from the shared slots.
    fn take_shared(&self, class: usize, capacity: usize) -> Option<NonNull<u8>> {
        let ptr = NonNull::new(self.classes[class].pop()?)?;
        self.books.uncached(capacity);
        Some(ptr)
    }

    /// A block of `class` from this thread's cache or the shared slots.
    fn take_cached(&self, class: usize, capacity: usize) -> Option<NonNull<u8>> {
        local::with_slot(self, |slot| slot.take(class, capacity, &self.local))
            .flatten()
            .or_else(|| self.take_shared(class, capacity))
    }

    /// Reserves `capacity` bytes of budget for new OS memory, relieving pressure at a
    /// limit: the reclaimers (pending frees), then every cache, in rounds while a round
    /// frees something or waits out another thread's trim (at most [`RELIEF_ROUNDS`]),
    /// so that a refusal means the bytes are held by live blocks. If relief put a block of
    /// `class` into a cache, returns that block instead (its budget is already counted).
    fn take_budget(
        &self,
        capacity: usize,
        requested: usize,
        class: Option<usize>,
    ) -> Result<Option<NonNull<u8>>, AllocError> {
        let mut rounds = 0;
        let mut progress = true;
        let mut reclaiming = true;
        let mut deadline = None;
        loop {
            // The peak is raised once the bytes are held: after the OS gave them
            // (`os_alloc`), or now for a reservation (`Pool::reserve`).
            let refusal = match self.budget.try_reserve_unmarked(capacity) {
                Ok(_) => match self.check_physical(capacity) {
                    Ok(()) => return Ok(None),
                    Err(rss) => {
                        self.budget.release(capacity);
                        self.physical_error(requested, rss)
                    }
                },
                // No byte limit: the budget refused at the 4 EiB it counts against, which
                // only reservations adding up to that much can reach. No limit to relieve,
                // and none to name: nothing could ever serve it.
                Err(e) if e.limit >= UNLIMITED => {
                    return Err(class::invalid(requested, 1, class::BEYOND_ANY_POOL))
                }
                Err(e) => self.out_of_memory(requested, capacity, e.used, e.limit),
            };
            if rounds == RELIEF_ROUNDS || !progress {
                self.books.failure();
                crate::trace::refused(self.id(), self.budget.used(), &refusal);
                return Err(refusal);
            }
            if rounds == 0 {
                // One retry counted per request, however many rounds it takes.
                self.books.retry();
                crate::trace::count_retry();
            }
            // The reclaimers again in every round after one that freed something, not in
            // the first alone: while this request relieves, other threads go on deferring
            // frees (a scope closed is a free pending), and a request refused with them
            // pending would be refused for bytes that are only waiting. Not after a round
            // whose reclaimers freed nothing: those may have waited (ndmem's waits up to a
            // second for a pinned thread), and the caches' churn must not make every round
            // wait again (16 rounds, 16 seconds).
            let reclaimed = if reclaiming {
                match self.reclaimers.run(self as *const Core as usize) {
                    Ok(bytes) => bytes,
                    Err(message) => {
                        self.books.failure();
                        return Err(AllocError::ReclaimerPanicked {
                            kind: MemoryKind::Host,
                            requested,
                            message,
                        });
                    }
                }
            } else {
                0
            };
            reclaiming = reclaimed > 0;
            rounds += 1;
            if let Some(ptr) = class.and_then(|c| self.take_cached(c, capacity)) {
                return Ok(Some(ptr));
            }
            let waited = self.wait_for_trims(&mut deadline);
            progress = self.trim() > 0 || waited || reclaimed > 0;
        }
    }

    /// Waits while other threads trim this pool (the bytes they are giving back to the OS
    /// are used until they are done), until `deadline`, which the first wait of a request
    /// sets [`TRIM_WAIT`] ahead. Whether it saw trims under way and they all finished.
    #[cold]
    fn wait_for_trims(&self, deadline: &mut Option<std::time::Instant>) -> bool {
        if self.trimming.load(Ordering::Acquire) == 0 {
            return false;
        }
        let end = *deadline.get_or_insert_with(|| std::time::Instant::now() + TRIM_WAIT);
        loop {
            if self.trimming.load(Ordering::Acquire) == 0 {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            crate::sync::spin_loop();
            #[cfg(not(ndmem_loom))]
            std::thread::yield_now();
        }
    }

    /// Checks the physical limit for `bytes` of new OS memory; `Err(rss)` if it would pass.
    fn check_physical(&self, bytes: usize) -> Result<(), usize> {
        let limit = self.max_physical.load(Ordering::Relaxed);
        if limit >= UNLIMITED {
            return Ok(());
        }
        let since = self.os_since_rss.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let estimate = self.rss_hint.load(Ordering::Relaxed) + since;
        if since < RSS_RECHECK && estimate.saturating_add(bytes) <= limit {
            return Ok(());
        }
        let rss = physical_bytes();
        self.rss_hint.store(rss, Ordering::Relaxed);
        self.os_since_rss.store(0, Ordering::Relaxed);
        if rss.saturating_add(bytes) <= limit {
            Ok(())
        } else {
            Err(rss)
        }
    }

    /// A block the caller owns (counted freed already) goes into its class's shared slots
    /// if one is free, else to the OS.
    fn release_shared(&self, ptr: NonNull<u8>, capacity: usize) {
        if let Some(class) = cached_class(capacity) {
            // Counted before the push so a racing pop can never take the count below zero.
            self.books.caching(capacity);
            if self.classes[class].push(ptr.as_ptr()).is_ok() {
                return;
            }
            self.books.uncached(capacity);
        }
        self.os_free(ptr, capacity);
    }

    /// Returns every cached block, the threads' caches first, to the OS.
    fn trim(&self) -> usize {
        let _under_way = Trimming::begin(&self.trimming);
        let recalled = self
            .local
            .recall(|block, class| self.os_free(block, class_size(class)));
        recalled + self.trim_shared()
    }

    /// Returns the blocks of the shared slots to the OS.
    fn trim_shared(&self) -> usize {
        let mut released = self.drain_depot(|block, capacity| self.os_free(block, capacity));
        for (class, slots) in self.classes.iter().enumerate() {
            let capacity = class_size(class);
            while let Some(ptr) = slots.pop() {
                self.books.uncached(capacity);
                if let Some(ptr) = NonNull::new(ptr) {
                    self.os_free(ptr, capacity);
                    released += capacity;
                }
            }
        }
        released
    }

    fn out_of_memory(
        &self,
        requested: usize,
        needed: usize,
        used: usize,
        limit: usize,
    ) -> AllocError {
        AllocError::OutOfMemory {
            kind: MemoryKind::Host,
            requested,
            needed,
            thread: thread_id(),
            used,
            limit,
            holders: self
                .local
                .summed(&self.books, self.bounded(|f, _| f.holders())),
            variable: self.knob().unwrap_or(self.bytes_variable),
            report: None,
        }
    }

    /// What named the limit ([`Pool::set_max_bytes_by`]), if anything did.
    fn knob(&self) -> Option<&'static str> {
        *self
            .bytes_knob
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn physical_error(&self, requested: usize, rss: usize) -> AllocError {
        AllocError::PhysicalLimit {
            kind: MemoryKind::Host,
            requested,
            thread: thread_id(),
            rss,
            limit: self.max_physical.load(Ordering::Relaxed),
            variable: self.physical_variable,
        }
    }

    /// New memory from the OS; the budget for it is already reserved (and is released here
    /// if the OS refuses).
    fn os_alloc(&self, capacity: usize, requested: usize) -> Result<NonNull<u8>, AllocError> {
        match os::obtain(capacity) {
            Ok(ptr) => {
                self.books.os_allocation();
                self.budget.note_peak();
                Ok(ptr)
            }
            Err(errno) => {
                self.budget.release(capacity);
                self.books.failure();
                Err(AllocError::Os {
                    kind: MemoryKind::Host,
                    requested,
                    errno,
                })
            }
        }
    }

    /// Gives a block the caller owns (neither live nor cached now) back to the OS and its
    /// bytes back to the budget.
    fn os_free(&self, ptr: NonNull<u8>, capacity: usize) {
        // SAFETY: every block of this pool of `capacity` bytes came from `os::obtain` with
        // that capacity (`os_alloc`), and the callers own it: `release` takes it from a
        // dropped `Block`, `trim` from a slot through one `swap` or a thread's list under
        // its handshake.
        unsafe { os::give_back(ptr, capacity) };
        self.budget.release(capacity);
        self.books.os_free();
    }
}

/// The error of a pool whose configuration is unusable (kept off the allocation path).
#[cold]
fn config_failure(e: &ConfigError) -> AllocError {
    AllocError::Config(e.clone())
}

impl Drop for Core {
    fn drop(&mut self) {
        // The address that named this pool in the timeline may name another pool next.
        crate::trace::forget_pool(self as *const Core as usize);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Live blocks borrow the pool, so only the caches can remain, and no thread is
        // inside one of its caches now.
        let core = &*self.core;
        core.local
            .close(|block, class| core.os_free(block, class_size(class)));
        core.trim_shared();
    }
}
