//! The native pool: tensor and workspace memory outside the Rust heap, with exact limits.
//!
//! Invariant: every byte the pool holds (live blocks *and* its cache of freed blocks) is
//! reserved in the off-heap [`Budget`] before the OS is asked for it, and released only after
//! it went back to the OS, so `used = live + cached <= max_bytes` at every instant. Blocks are
//! rounded up to size classes (four per power of two, at most 25% slack) and every class
//! keeps up to [`SLOTS_PER_CLASS`] freed blocks in a lock-free [`Slots`] cache, so a loop
//! that frees and reallocates the same shapes touches neither the OS nor a lock. Classes of
//! 256 KiB and more come from `mmap` (page-aligned, zero-filled), smaller ones from
//! `posix_memalign`; blocks above 1 GiB are mapped exactly and never cached.
//!
//! Every block's bytes are initialised (zero when fresh from the OS, afterwards whatever
//! the previous owner wrote), so handing out `&[u8]` over them is sound.

#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
#[cfg(not(ndmem_loom))]
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};

use crate::counter::{Budget, UNLIMITED};
use crate::error::{AllocError, ConfigError, Holders, MemoryKind};
use crate::limits::Limits;
#[cfg(not(ndmem_loom))]
use crate::limits::{ENV_MAX_BYTES, ENV_MAX_PHYSICAL_BYTES};
use crate::physical::{page_size, physical_bytes};
use crate::slots::Slots;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// The largest alignment the pool serves (one page).
pub const MAX_ALIGN: usize = 4096;
/// Freed blocks each size class keeps for reuse.
pub const SLOTS_PER_CLASS: usize = 16;
/// Smallest block handed out.
const MIN_CLASS: usize = 64;
/// Largest size class; larger blocks are mapped exactly and never cached.
const MAX_CLASS: usize = 1 << 30;
/// Classes: 64 B, then four per power of two up to `MAX_CLASS`.
const NUM_CLASSES: usize = 1 + (MAX_CLASS.trailing_zeros() as usize - 6) * 4;
/// Blocks of at least this many bytes come from `mmap`.
const MMAP_THRESHOLD: usize = 256 << 10;
/// New OS memory after which the physical check re-reads the RSS.
const RSS_RECHECK: usize = 1 << 20;

/// The size class serving `bytes`, or `None` above the largest class.
fn class_of(bytes: usize) -> Option<usize> {
    if bytes <= MIN_CLASS {
        return Some(0);
    }
    if bytes > MAX_CLASS {
        return None;
    }
    let k = (usize::BITS - 1 - (bytes - 1).leading_zeros()) as usize; // 2^k < bytes <= 2^(k+1)
    let step = 1usize << (k - 2);
    let quarter = (bytes - (1 << k)).div_ceil(step); // 1..=4
    Some((k - 6) * 4 + quarter)
}

/// Bytes of a block of class `class`.
fn class_size(class: usize) -> usize {
    if class == 0 {
        return MIN_CLASS;
    }
    let k = 6 + (class - 1) / 4;
    let quarter = (class - 1) % 4 + 1;
    (1 << k) + quarter * (1 << (k - 2))
}

/// The alignment a block of `capacity` bytes is obtained with: its largest power-of-two
/// divisor, capped at a page. A request rounded up to a multiple of its alignment always
/// lands in a class at least that aligned (`m x align` for m < 4 is a class itself; from
/// `4 x align` on every class is a multiple of `align`).
fn natural_align(capacity: usize) -> usize {
    (1usize << capacity.trailing_zeros()).clamp(16, MAX_ALIGN)
}

/// What a block is for; the out-of-memory message breaks the used bytes down by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Usage {
    /// Tensor data outside workspaces.
    Tensor,
    /// Workspace buffers and their spills.
    Workspace,
    /// Host mirrors of device buffers.
    Mirror,
    /// Anything else.
    Other,
}

impl Usage {
    fn index(self) -> usize {
        self as usize
    }
}

/// Pool statistics (SEMANTICS 1). Bytes are block capacities: what the pool really holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of blocks handed out and not yet freed (including [`Reservation`]s).
    pub live_bytes: usize,
    /// Highest `live_bytes` since creation or [`Pool::reset_peak`].
    pub peak_bytes: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached_bytes: usize,
    /// `live_bytes + cached_bytes`: what counts against the limit.
    pub used_bytes: usize,
    /// Highest `used_bytes` since creation or [`Pool::reset_peak`].
    pub peak_used_bytes: usize,
    /// The off-heap limit (`max_bytes`), `None` when unlimited.
    pub limit_bytes: Option<usize>,
    /// Resident set size of the process now.
    pub physical_bytes: usize,
    /// The physical limit, `None` when unlimited.
    pub physical_limit_bytes: Option<usize>,
    /// Live bytes for tensors.
    pub tensor_bytes: usize,
    /// Live bytes for workspaces.
    pub workspace_bytes: usize,
    /// Live bytes for host mirrors.
    pub mirror_bytes: usize,
    /// Live bytes for other uses.
    pub other_bytes: usize,
    /// Bytes ever handed out (block capacities and [`Reservation`]s).
    pub total_allocated_bytes: u64,
    /// Bytes ever given back; `total_allocated_bytes - total_freed_bytes` is `live_bytes`
    /// whenever no allocation or free is in flight.
    pub total_freed_bytes: u64,
    /// Blocks (and [`Reservation`]s) handed out.
    pub allocations: u64,
    /// Blocks (and [`Reservation`]s) given back.
    pub deallocations: u64,
    /// Blocks handed out from the cache.
    pub cache_hits: u64,
    /// Times memory was obtained from the OS.
    pub os_allocations: u64,
    /// Times memory was returned to the OS.
    pub os_frees: u64,
    /// Requests refused at a limit.
    pub failed_allocations: u64,
}

type Reclaimer = Arc<dyn Fn() -> usize + Send + Sync>;

/// A native memory pool with an off-heap and a physical limit.
pub struct Pool {
    budget: Budget,
    max_physical: AtomicUsize,
    classes: Box<[Slots<SLOTS_PER_CLASS>]>,
    live: AtomicUsize,
    peak_live: AtomicUsize,
    cached: AtomicUsize,
    by_usage: [AtomicUsize; 4],
    allocated_bytes: AtomicU64,
    allocations: AtomicU64,
    deallocations: AtomicU64,
    cache_hits: AtomicU64,
    os_allocations: AtomicU64,
    os_frees: AtomicU64,
    failed: AtomicU64,
    rss_hint: AtomicUsize,
    os_since_rss: AtomicUsize,
    /// Replaced (not grown) at each registration, so the out-of-memory path clones an
    /// `Arc` instead of allocating a copy of the list.
    reclaimers: Mutex<Arc<[Reclaimer]>>,
    config_error: Option<ConfigError>,
    bytes_variable: &'static str,
    physical_variable: &'static str,
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

impl Pool {
    /// The process-wide pool, with limits from `NDMEM_MAX_BYTES` and
    /// `NDMEM_MAX_PHYSICAL_BYTES` (SEMANTICS 1).
    ///
    /// If a variable holds garbage, every allocation from this pool fails with
    /// [`AllocError::Config`] naming it; [`Pool::try_global`] reports it up front.
    #[cfg(not(ndmem_loom))]
    pub fn global() -> &'static Pool {
        GLOBAL.get_or_init(|| {
            let (limits, error) = match Limits::from_env() {
                Ok(limits) => (limits, None),
                Err(e) => (Limits::builder().build(), Some(e)),
            };
            let mut pool = Pool::new(limits);
            pool.config_error = error;
            pool.bytes_variable = ENV_MAX_BYTES;
            pool.physical_variable = ENV_MAX_PHYSICAL_BYTES;
            pool
        })
    }

    /// The process-wide pool, or the configuration error that makes it unusable.
    #[cfg(not(ndmem_loom))]
    pub fn try_global() -> Result<&'static Pool, ConfigError> {
        let pool = Pool::global();
        match &pool.config_error {
            Some(e) => Err(e.clone()),
            None => Ok(pool),
        }
    }

    /// An independent pool with its own limits and cache (tests, embedding).
    pub fn new(limits: Limits) -> Pool {
        Pool {
            budget: Budget::new(limits.max_bytes),
            max_physical: AtomicUsize::new(limits.max_physical_bytes.unwrap_or(UNLIMITED)),
            classes: (0..NUM_CLASSES).map(|_| Slots::default()).collect(),
            live: AtomicUsize::new(0),
            peak_live: AtomicUsize::new(0),
            cached: AtomicUsize::new(0),
            by_usage: Default::default(),
            allocated_bytes: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            deallocations: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            os_allocations: AtomicU64::new(0),
            os_frees: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rss_hint: AtomicUsize::new(physical_bytes()),
            os_since_rss: AtomicUsize::new(0),
            reclaimers: Mutex::new(Arc::new([])),
            config_error: None,
            bytes_variable: "Limits::max_bytes of this pool",
            physical_variable: "Limits::max_physical_bytes of this pool",
        }
    }

    /// A block of at least `size` bytes aligned to `align` (a power of two up to 4096).
    /// Its bytes are initialised but their values are unspecified.
    pub fn allocate(&self, size: usize, align: usize) -> Result<Block<'_>, AllocError> {
        self.allocate_for(size, align, Usage::Other)
    }

    /// [`Pool::allocate`] with every byte zero.
    pub fn allocate_zeroed(&self, size: usize, align: usize) -> Result<Block<'_>, AllocError> {
        self.allocate_zeroed_for(size, align, Usage::Other)
    }

    /// [`Pool::allocate`] recording what the block is for.
    pub fn allocate_for(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
    ) -> Result<Block<'_>, AllocError> {
        self.allocate_inner(size, align, usage, false)
    }

    /// [`Pool::allocate_zeroed`] recording what the block is for.
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
        if bytes > isize::MAX as usize {
            return Err(invalid(bytes, 1, "the size does not fit in isize"));
        }
        self.check_config()?;
        self.take_budget(bytes, bytes, None)?;
        self.mark_live(bytes, usage);
        Ok(Reservation {
            bytes,
            usage,
            pool: self,
        })
    }

    fn allocate_inner(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
        zeroed: bool,
    ) -> Result<Block<'_>, AllocError> {
        let capacity = capacity_for(size, align)?;
        self.check_config()?;
        let class = class_of(capacity).filter(|_| capacity <= MAX_CLASS);
        let (ptr, fresh) = match class.and_then(|c| self.take_cached(c, capacity)) {
            Some(ptr) => (ptr, false),
            None => match self.take_budget(capacity, size, class)? {
                Some(ptr) => (ptr, false),
                None => (self.os_alloc(capacity, size)?, true),
            },
        };
        if zeroed && !fresh {
            // SAFETY: `ptr` is a block of `capacity` writable bytes owned by this call.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, capacity) };
        }
        self.mark_live(capacity, usage);
        Ok(Block {
            ptr,
            len: size,
            capacity,
            usage,
            pool: self,
        })
    }

    fn check_config(&self) -> Result<(), AllocError> {
        match &self.config_error {
            Some(e) => Err(AllocError::Config(e.clone())),
            None => Ok(()),
        }
    }

    fn take_cached(&self, class: usize, capacity: usize) -> Option<NonNull<u8>> {
        let ptr = NonNull::new(self.classes[class].pop()?)?;
        self.cached.fetch_sub(capacity, Ordering::Relaxed);
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(ptr)
    }

    /// Reserves `capacity` bytes of budget for new OS memory, relieving pressure once at a
    /// limit. If relief put a block of `class` into the cache, returns that block instead
    /// (its budget is already counted).
    fn take_budget(
        &self,
        capacity: usize,
        requested: usize,
        class: Option<usize>,
    ) -> Result<Option<NonNull<u8>>, AllocError> {
        let mut relieved = false;
        loop {
            let refusal = match self.budget.try_reserve(capacity) {
                Ok(_) => match self.check_physical(capacity) {
                    Ok(()) => return Ok(None),
                    Err(rss) => {
                        self.budget.release(capacity);
                        self.physical_error(requested, rss)
                    }
                },
                Err(e) => self.out_of_memory(requested, e.used, e.limit),
            };
            if relieved {
                self.failed.fetch_add(1, Ordering::Relaxed);
                return Err(refusal);
            }
            relieved = true;
            self.run_reclaimers();
            if let Some(ptr) = class.and_then(|c| self.take_cached(c, capacity)) {
                return Ok(Some(ptr));
            }
            self.trim();
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

    /// Runs the registered reclaimers, without allocating: the list is an `Arc<[_]>`
    /// cloned under the lock. A reclaimer that allocates from this pool and reaches the
    /// limit again does not run the reclaimers once more (its request fails or is served
    /// from the cache); the guard is per thread and per pool.
    fn run_reclaimers(&self) {
        let me = self as *const Pool as usize;
        let outer = RECLAIMING.with(|r| r.get());
        if outer == me {
            return;
        }
        let reclaimers: Arc<[Reclaimer]> = match self.reclaimers.lock() {
            Ok(list) => Arc::clone(&list),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        if reclaimers.is_empty() {
            return;
        }
        RECLAIMING.with(|r| r.set(me));
        // Restores the outer pool's mark even if a reclaimer panics.
        let _restore = RestoreReclaiming(outer);
        for reclaim in reclaimers.iter() {
            reclaim();
        }
    }

    /// Registers a callback run when an allocation reaches a limit, before the cache is
    /// released and the allocation retried once. It returns the bytes it freed.
    ///
    /// A reclaimer may allocate from the pool; if that allocation reaches a limit too, the
    /// reclaimers are not run again for it (no recursion).
    pub fn register_reclaimer(&self, reclaim: impl Fn() -> usize + Send + Sync + 'static) {
        let mut list = match self.reclaimers.lock() {
            Ok(list) => list,
            Err(poisoned) => poisoned.into_inner(),
        };
        let grown: Arc<[Reclaimer]> = list
            .iter()
            .cloned()
            .chain(std::iter::once(Arc::new(reclaim) as Reclaimer))
            .collect();
        *list = grown;
    }

    fn mark_live(&self, bytes: usize, usage: Usage) {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // A new peak is rare: read first, so the usual case is no second write.
        if live > self.peak_live.load(Ordering::Relaxed) {
            self.peak_live.fetch_max(live, Ordering::Relaxed);
        }
        self.by_usage[usage.index()].fetch_add(bytes, Ordering::Relaxed);
        self.allocated_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    fn mark_freed(&self, bytes: usize, usage: Usage) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
        self.by_usage[usage.index()].fetch_sub(bytes, Ordering::Relaxed);
        self.deallocations.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a block back: into its class's cache if a slot is free, else to the OS. A
    /// cached block stays reserved, so the cache can never push the pool past its limit;
    /// at the limit it is released before anything fails.
    fn release(&self, ptr: NonNull<u8>, capacity: usize, usage: Usage) {
        self.mark_freed(capacity, usage);
        if let Some(class) = class_of(capacity).filter(|_| capacity <= MAX_CLASS) {
            // Counted before the push so a racing pop can never take the count below zero.
            self.cached.fetch_add(capacity, Ordering::Relaxed);
            if self.classes[class].push(ptr.as_ptr()).is_ok() {
                return;
            }
            self.cached.fetch_sub(capacity, Ordering::Relaxed);
        }
        self.os_free(ptr, capacity);
    }

    /// Returns every cached block to the OS; returns the bytes released.
    pub fn trim(&self) -> usize {
        let mut released = 0;
        for (class, slots) in self.classes.iter().enumerate() {
            let capacity = class_size(class);
            while let Some(ptr) = slots.pop() {
                self.cached.fetch_sub(capacity, Ordering::Relaxed);
                if let Some(ptr) = NonNull::new(ptr) {
                    self.os_free(ptr, capacity);
                    released += capacity;
                }
            }
        }
        released
    }

    /// Changes the off-heap limit; `None` or `Some(0)` means unlimited (as `0` does in
    /// `NDMEM_MAX_BYTES`, and as in [`crate::heap::set_limit`]).
    ///
    /// A limit below the bytes held outside the cache (live blocks and reservations) is
    /// refused before anything is touched, so a refused limit changes nothing: not the
    /// limit, not the cache. A limit that fits once the cache is released releases the
    /// cache first. (If other threads allocate meanwhile, the limit can still be refused
    /// after the cache was released; it is never applied below what is reserved.)
    pub fn set_max_bytes(&self, limit: Option<usize>) -> Result<(), AllocError> {
        let limit = limit.filter(|l| *l > 0);
        let below_use = |limit: usize, used: usize| AllocError::LimitBelowUse {
            what: "the pool's max_bytes",
            limit,
            used,
        };
        if let Some(l) = limit {
            let used = self.budget.used();
            let held = used.saturating_sub(self.cached.load(Ordering::Relaxed));
            if l < held {
                return Err(below_use(l, held));
            }
            if l < used {
                self.trim();
            }
        }
        self.budget
            .set_limit(limit)
            .map_err(|e| below_use(e.limit, e.used))
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
        self.max_physical
            .store(limit.unwrap_or(UNLIMITED), Ordering::Relaxed);
        Ok(())
    }

    /// The limits this pool enforces now.
    pub fn limits(&self) -> (Option<usize>, Option<usize>) {
        let physical = self.max_physical.load(Ordering::Relaxed);
        (
            self.budget.limit(),
            (physical < UNLIMITED).then_some(physical),
        )
    }

    /// A snapshot of the pool's counters.
    pub fn stats(&self) -> PoolStats {
        let live = self.live.load(Ordering::Relaxed);
        // After `live`: a figure read later only grows, so freed never goes negative.
        let allocated = self.allocated_bytes.load(Ordering::Relaxed);
        let cached = self.cached.load(Ordering::Relaxed);
        let physical = self.max_physical.load(Ordering::Relaxed);
        let usage = |u: Usage| self.by_usage[u.index()].load(Ordering::Relaxed);
        PoolStats {
            live_bytes: live,
            peak_bytes: self.peak_live.load(Ordering::Relaxed),
            cached_bytes: cached,
            used_bytes: self.budget.used(),
            peak_used_bytes: self.budget.peak(),
            limit_bytes: self.budget.limit(),
            physical_bytes: physical_bytes(),
            physical_limit_bytes: (physical < UNLIMITED).then_some(physical),
            tensor_bytes: usage(Usage::Tensor),
            workspace_bytes: usage(Usage::Workspace),
            mirror_bytes: usage(Usage::Mirror),
            other_bytes: usage(Usage::Other),
            total_allocated_bytes: allocated,
            // Derived, not counted: one shared write less per free.
            total_freed_bytes: allocated.saturating_sub(live as u64),
            allocations: self.allocations.load(Ordering::Relaxed),
            deallocations: self.deallocations.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            os_allocations: self.os_allocations.load(Ordering::Relaxed),
            os_frees: self.os_frees.load(Ordering::Relaxed),
            failed_allocations: self.failed.load(Ordering::Relaxed),
        }
    }

    /// Restarts both peaks from the current figures.
    pub fn reset_peak(&self) {
        self.peak_live
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
        self.budget.reset_peak();
    }

    fn holders(&self) -> Holders {
        let usage = |u: Usage| self.by_usage[u.index()].load(Ordering::Relaxed);
        Holders {
            workspaces: usage(Usage::Workspace),
            tensors: usage(Usage::Tensor),
            mirrors: usage(Usage::Mirror),
            other: usage(Usage::Other),
            cached: self.cached.load(Ordering::Relaxed),
        }
    }

    fn out_of_memory(&self, requested: usize, used: usize, limit: usize) -> AllocError {
        AllocError::OutOfMemory {
            kind: MemoryKind::Host,
            requested,
            thread: thread_id(),
            used,
            limit,
            holders: self.holders(),
            variable: self.bytes_variable,
        }
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
        let result = if capacity >= MMAP_THRESHOLD {
            // SAFETY: an anonymous private mapping with no address hint has no preconditions.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    capacity,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            } else {
                Ok(ptr.cast::<u8>())
            }
        } else {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: `ptr` is a valid out-pointer and the alignment is a power of two that
            // is a multiple of `size_of::<*mut c_void>()` (at least 16).
            let rc = unsafe { libc::posix_memalign(&mut ptr, natural_align(capacity), capacity) };
            if rc == 0 {
                // SAFETY: `ptr` points to `capacity` fresh writable bytes; zeroing them keeps
                // the pool's promise that block bytes are initialised.
                unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, capacity) };
                Ok(ptr.cast::<u8>())
            } else {
                Err(rc)
            }
        };
        match result.map(NonNull::new) {
            Ok(Some(ptr)) => {
                self.os_allocations.fetch_add(1, Ordering::Relaxed);
                Ok(ptr)
            }
            Ok(None) | Err(_) => {
                self.budget.release(capacity);
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(AllocError::Os {
                    kind: MemoryKind::Host,
                    requested,
                    errno: result.err().unwrap_or(libc::ENOMEM),
                })
            }
        }
    }

    /// Gives a block back to the OS and its bytes back to the budget.
    fn os_free(&self, ptr: NonNull<u8>, capacity: usize) {
        if capacity >= MMAP_THRESHOLD {
            // SAFETY: blocks of this capacity were mapped by `os_alloc` with exactly this
            // length, and the caller owns the block (it is neither live nor cached now).
            unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
        } else {
            // SAFETY: blocks of this capacity came from posix_memalign in `os_alloc`, and
            // the caller owns the block.
            unsafe { libc::free(ptr.as_ptr().cast()) };
        }
        self.budget.release(capacity);
        self.os_frees.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Live blocks borrow the pool, so only the cache can remain.
        self.trim();
    }
}

/// The capacity serving `size` bytes at `align`, or why the request is invalid.
fn capacity_for(size: usize, align: usize) -> Result<usize, AllocError> {
    if size == 0 {
        return Err(invalid(size, align, "zero-size allocations are not served"));
    }
    if align == 0 || !align.is_power_of_two() {
        return Err(invalid(size, align, "the alignment must be a power of two"));
    }
    if align > MAX_ALIGN {
        return Err(invalid(
            size,
            align,
            "alignments above 4096 bytes (a page) are not supported",
        ));
    }
    let rounded = size
        .checked_next_multiple_of(align)
        .filter(|r| *r <= isize::MAX as usize - MAX_ALIGN)
        .ok_or_else(|| {
            invalid(
                size,
                align,
                "the size overflows when rounded to the alignment",
            )
        })?;
    match class_of(rounded) {
        Some(class) => Ok(class_size(class)),
        None => Ok(rounded.next_multiple_of(page_size())),
    }
}

fn invalid(size: usize, align: usize, reason: &'static str) -> AllocError {
    AllocError::InvalidLayout {
        size,
        align,
        reason,
    }
}

/// The OS id of the calling thread (what `top -H` and debuggers show).
#[cfg(target_os = "linux")]
fn thread_id() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// An id of the calling thread: elsewhere than Linux, the `pthread_t` value (what
/// debuggers print there), obtained without allocating.
#[cfg(not(target_os = "linux"))]
fn thread_id() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize as u64 }
}

std::thread_local! {
    /// The pool (by address) whose reclaimers this thread is running; 0 when none.
    static RECLAIMING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Puts back the outer `RECLAIMING` mark when reclaimers finish (or panic).
struct RestoreReclaiming(usize);

impl Drop for RestoreReclaiming {
    fn drop(&mut self) {
        RECLAIMING.with(|r| r.set(self.0));
    }
}

/// A block of pool memory; dropping it gives it back to the pool.
pub struct Block<'p> {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    usage: Usage,
    pool: &'p Pool,
}

// SAFETY: a Block owns its memory exclusively (like a Box<[u8]>), and the pool it returns
// to is Sync.
unsafe impl Send for Block<'_> {}
// SAFETY: shared access only reads the bytes through `&self`.
unsafe impl Sync for Block<'_> {}

impl<'p> Block<'p> {
    /// The first byte, aligned as requested.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block holds no requested bytes (never true: empty blocks are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block really occupies (its size class), all usable.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// What the block was allocated for.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The pool the block returns to.
    pub fn pool(&self) -> &'p Pool {
        self.pool
    }

    /// The requested bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block owns `capacity >= len` initialised bytes at `ptr` for its whole
        // life, and `&self` forbids concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The requested bytes, mutably.
    pub fn as_slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("usage", &self.usage)
            .finish()
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        self.pool.release(self.ptr, self.capacity, self.usage);
    }
}

/// Bytes obtained outside the pool but counted against its limits (see [`Pool::reserve`]).
#[derive(Debug)]
pub struct Reservation<'p> {
    bytes: usize,
    usage: Usage,
    pool: &'p Pool,
}

impl Reservation<'_> {
    /// Bytes counted.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.pool.mark_freed(self.bytes, self.usage);
        self.pool.budget.release(self.bytes);
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter() {
        assert_eq!(class_size(class_of(1).unwrap()), 64);
        assert_eq!(class_size(class_of(65).unwrap()), 80);
        assert_eq!(class_size(class_of(128).unwrap()), 128);
        assert_eq!(class_size(class_of(129).unwrap()), 160);
        assert_eq!(class_size(class_of(MAX_CLASS).unwrap()), MAX_CLASS);
        assert_eq!(class_of(MAX_CLASS).unwrap(), NUM_CLASSES - 1);
        assert_eq!(class_of(MAX_CLASS + 1), None);
        for n in (1..100_000).chain([(4 << 20) + 1, (256 << 20) - 3]) {
            let c = class_size(class_of(n).unwrap());
            assert!(c >= n && (n <= 64 || c <= n + n / 4), "{n} -> {c}");
            assert!(
                class_of(c) == class_of(n),
                "class of a class size is itself"
            );
        }
    }

    #[test]
    fn rounded_requests_land_in_classes_aligned_enough() {
        let mut align = 1;
        while align <= MAX_ALIGN {
            for size in 1..20_000 {
                let capacity = capacity_for(size, align).unwrap();
                assert!(capacity >= size);
                assert_eq!(
                    natural_align(capacity) % align.max(16),
                    0,
                    "{size} @ {align}"
                );
            }
            align *= 2;
        }
    }

    #[test]
    fn usage_indices_match_their_position() {
        let all = [Usage::Tensor, Usage::Workspace, Usage::Mirror, Usage::Other];
        for (i, usage) in all.iter().enumerate() {
            assert_eq!(usage.index(), i);
        }
    }
}
