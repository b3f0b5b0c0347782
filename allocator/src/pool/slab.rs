//! Slabs: the memory of the small classes (up to [`SLAB_MAX`] bytes), carved from aligned
//! runs of [`SLAB`] bytes mapped from the OS, so that the blocks of a class lie side by
//! side and take their capacity in the process, and a slab one page more for its header
//! (a class of 16 KiB fits 15 blocks in a slab, 6% of it unused). (One block at a time
//! from the C allocator, at its class's natural alignment, a block of up to 4 KiB took
//! about twice its capacity with glibc, three times at 64 bytes, and a thousand 64-byte
//! blocks spread over 187 KiB.)
//!
//! Invariant: a slab holds blocks of one class only, in the bytes before its header, which
//! sits at its end. The header counts the blocks handed out of the slab and not given back
//! (`live`), links the blocks given back (`free`, through their first words), and says how
//! many of its bytes were ever carved. A slab with room (a block given back, or bytes never
//! carved) is on its list: each class has [`SHARDS`] lists, each under its own lock, and a
//! slab belongs to one for life (its header names it); a thread carves from its own
//! shard's. A slab whose `live` falls to 0 goes back to the OS at
//! once, so [`Slabs::give_back`] of a class's last block unmaps its memory as `free` would.
//! Every field is touched under its shard's lock alone (but the shard, written before the
//! slab is first listed and never again), held for pointer work and at most
//! one `mmap` or `munmap`. The locks are spin locks, so that `fork` can take them all
//! beforehand (`pthread_atfork` handlers installed at load time): a child never inherits
//! one held. (The pool's own locks, its list of threads among them, are not held across a
//! fork: semantics §1.)
//!
//! A block handed out is zero-filled: carved bytes are fresh from the OS, and a block given
//! back is zeroed when it is handed out again.
//!
//! A slab is found from any of its blocks by masking the address: slabs are aligned to
//! their size. Under Miri, which maps no memory, a slab comes from `posix_memalign`
//! instead, zeroed.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::class::{class_of, class_size};

/// Classes up to this capacity come from slabs; larger ones one block at a time (whose
/// alignment padding and headers are then at most a quarter of the block).
pub(super) const SLAB_MAX: usize = 16 << 10;

/// Bytes of a slab, and its alignment.
pub(super) const SLAB: usize = 256 << 10;

/// Bytes at the end of a slab that hold its header (a cache line).
const HEADER: usize = 64;

/// Bytes of a slab that blocks may take.
const BLOCK_BYTES: usize = SLAB - HEADER;

/// Classes served from slabs: those up to [`SLAB_MAX`], from the first.
const CLASSES: usize = match class_of(SLAB_MAX) {
    Some(class) => class + 1,
    None => 0,
};

/// The bookkeeping of one slab, in its last [`HEADER`] bytes.
#[repr(C)]
struct Header {
    /// Blocks given back, linked through their first words (null: none).
    free: *mut u8,
    /// Bytes carved from the slab's start: the blocks beyond were never handed out.
    carved: usize,
    /// Blocks handed out and not given back.
    live: usize,
    /// The class's list of slabs with room.
    prev: *mut Header,
    next: *mut Header,
    /// Whether the slab is on that list.
    listed: bool,
}

/// Where in a slab's header bytes, past the [`Header`] (so that no `&mut Header` the shard's
/// lock allows covers it), the slab's shard is kept: written once, before the slab is
/// listed, and read without the lock by [`Slabs::give_back`] to find that lock.
const SHARD_OFFSET: usize = HEADER - std::mem::size_of::<usize>();

const _: () = assert!(std::mem::size_of::<Header>() <= SHARD_OFFSET);

/// The word holding the shard of the slab whose header is `header`.
fn shard_word(header: *mut Header) -> *mut usize {
    header.cast::<u8>().wrapping_add(SHARD_OFFSET).cast()
}

/// A class shard's lock and its list of slabs with room, alone on its pair of cache lines:
/// the shards' locks must not share a line (nor the adjacent line a core fetches with it),
/// or threads of neighbouring shards would pass it between them at every carve.
#[repr(align(128))]
struct Class {
    locked: AtomicBool,
    /// The first slab with room (null: none); touched under `locked` only.
    room: UnsafeCell<*mut Header>,
}

/// Holds a class's lock until dropped.
struct Locked<'a>(&'a Class);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

impl Class {
    const fn new() -> Class {
        Class {
            locked: AtomicBool::new(false),
            room: UnsafeCell::new(ptr::null_mut()),
        }
    }

    /// Takes the lock: a few spins, then yielding the processor, since the holder may be in
    /// a system call.
    fn lock(&self) -> Locked<'_> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Locked(self)
    }

    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// Shards of each class: a thread carves from its own shard's slabs (threads take shards
/// in turn), so that threads of different shards carving at once do not interleave their
/// blocks (threads `i` and `i + SHARDS` share one). Interleaved,
/// two threads' 64-byte blocks shared 128-byte line pairs and pages, which each thread's
/// writes then took from the other's cache, for as long as the blocks were reused: a
/// 1,000-block cycle at two threads ran at 18 ns a block instead of 11 whenever its first
/// blocks were carved at once.
const SHARDS: usize = 8;

/// The slabs of every small class: [`Slabs::obtain`] and [`Slabs::give_back`] in place of
/// a C allocator's `posix_memalign` and `free`.
pub(super) struct Slabs {
    classes: [[Class; SHARDS]; CLASSES],
    /// Slabs mapped now.
    mapped: AtomicUsize,
}

// SAFETY: a class's list and the headers it links are touched only under that class's lock
// (see the module's invariant), which makes those accesses exclusive across threads; the
// raw pointers are to memory this value alone manages.
unsafe impl Sync for Slabs {}

/// The process's slabs, which the pools' `os::obtain` carves from.
pub(super) static SLABS: Slabs = Slabs::new();

impl Slabs {
    pub(super) const fn new() -> Slabs {
        Slabs {
            classes: [const { [const { Class::new() }; SHARDS] }; CLASSES],
            mapped: AtomicUsize::new(0),
        }
    }

    /// Whether blocks of `capacity` bytes come from slabs.
    #[inline]
    pub(super) fn serves(capacity: usize) -> bool {
        capacity <= SLAB_MAX
    }

    /// Slabs mapped now (each [`SLAB`] bytes of address space; only the pages blocks were
    /// carved from, or written, are resident).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn mapped(&self) -> usize {
        self.mapped.load(Ordering::Relaxed)
    }

    /// A zero-filled block of `capacity` bytes (a class size up to [`SLAB_MAX`]), aligned to
    /// its class's natural alignment; the OS error number if a new slab was needed and the
    /// OS refused it.
    pub(super) fn obtain(&self, capacity: usize) -> Result<NonNull<u8>, i32> {
        let shard = this_threads_shard();
        let class = &self.class(capacity)[shard];
        let locked = class.lock();
        // SAFETY: the class's lock is held.
        let room = unsafe { &mut *class.room.get() };
        let header = match NonNull::new(*room) {
            Some(header) => header.as_ptr(),
            None => {
                let header = self.new_slab(shard)?;
                // SAFETY: a new slab's header, not yet listed; the lock is held.
                unsafe { link(room, header) };
                header
            }
        };
        // SAFETY: a listed header is in a mapped slab of this class; the lock is held.
        let h = unsafe { &mut *header };
        let block = match NonNull::new(h.free) {
            Some(block) => {
                // SAFETY: a block given back is one of this slab's, `capacity` bytes, no
                // longer used by anyone; its first word links the next.
                unsafe {
                    h.free = block.as_ptr().cast::<*mut u8>().read();
                    ptr::write_bytes(block.as_ptr(), 0, capacity);
                }
                block
            }
            None => {
                // SAFETY: a listed slab without blocks given back has `capacity` bytes left
                // to carve (it is unlisted once it has not), inside the slab.
                let block = unsafe { base_of(header).add(h.carved) };
                h.carved += capacity;
                // SAFETY: inside a mapped slab: not null.
                unsafe { NonNull::new_unchecked(block) }
            }
        };
        h.live += 1;
        if h.free.is_null() && h.carved + capacity > BLOCK_BYTES {
            // SAFETY: listed, and the lock is held.
            unsafe { unlink(room, header) };
        }
        drop(locked);
        Ok(block)
    }

    /// Gives back a block [`Slabs::obtain`] handed out with this `capacity`; its slab goes
    /// back to the OS if it was the slab's last.
    ///
    /// # Safety
    ///
    /// `block` must come from `self.obtain(capacity)` and be owned by the caller (nothing
    /// uses it afterwards).
    pub(super) unsafe fn give_back(&self, block: NonNull<u8>, capacity: usize) {
        let offset = block.as_ptr() as usize & (SLAB - 1);
        let base = block.as_ptr().wrapping_sub(offset);
        // SAFETY: slabs are aligned to their size, so the mask finds the block's slab,
        // whose header is at its end.
        let header = unsafe { base.add(BLOCK_BYTES).cast::<Header>() };
        // SAFETY: the slab is mapped (this block is live in it); its shard word is written
        // once, before the slab is listed, under the lock whose release published it to
        // the thread that obtained this block (which handed it here), and no reference
        // covers it (it lies past the `Header` that `obtain` and `give_back` borrow).
        let shard = unsafe { shard_word(header).read() };
        let class = &self.class(capacity)[shard];
        let locked = class.lock();
        // SAFETY: the class's lock is held, and the slab is mapped (this block is live in it).
        let h = unsafe { &mut *header };
        // SAFETY: the caller owns the block: its first word is ours to link through.
        unsafe { block.as_ptr().cast::<*mut u8>().write(h.free) };
        h.free = block.as_ptr();
        h.live -= 1;
        // SAFETY: the lock is held.
        let room = unsafe { &mut *class.room.get() };
        if h.live == 0 {
            if h.listed {
                // SAFETY: listed, and the lock is held.
                unsafe { unlink(room, header) };
            }
            // SAFETY: no block of the slab is live, and it is on no list.
            if unsafe { unmap(base) } {
                self.mapped.fetch_sub(1, Ordering::Relaxed);
            } else {
                // The OS kept it (`munmap` splitting a mapping past the process's map
                // count): it stays, every block of it free, for the class's next requests.
                // SAFETY: still mapped and unlisted; the lock is held.
                unsafe { link(room, header) };
            }
        } else if !h.listed {
            // SAFETY: a slab with a block given back has room; the lock is held.
            unsafe { link(room, header) };
        }
        drop(locked);
    }

    fn class(&self, capacity: usize) -> &[Class; SHARDS] {
        let class = class_of(capacity).filter(|&c| c < CLASSES);
        debug_assert!(class.is_some_and(|c| class_size(c) == capacity));
        &self.classes[class.unwrap_or(CLASSES - 1)]
    }

    /// Maps a slab of `shard` and writes its header (unlisted); returns the header.
    fn new_slab(&self, shard: usize) -> Result<*mut Header, i32> {
        fork::arm();
        let base = map()?;
        self.mapped.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the header's bytes are the slab's last, aligned to 64, and ours.
        unsafe {
            let header = base.add(BLOCK_BYTES).cast::<Header>();
            header.write(Header {
                free: ptr::null_mut(),
                carved: 0,
                live: 0,
                prev: ptr::null_mut(),
                next: ptr::null_mut(),
                listed: false,
            });
            shard_word(header).write(shard);
            Ok(header)
        }
    }

    /// Takes every class's lock (before a `fork`).
    fn lock_all(&self) {
        for class in self.classes.iter().flatten() {
            std::mem::forget(class.lock());
        }
    }

    /// Releases every class's lock (after a `fork`, in the parent and in the child).
    fn unlock_all(&self) {
        for class in self.classes.iter().flatten() {
            class.unlock();
        }
    }
}

/// The shard this thread carves from: threads take the shards in turn, at their first
/// carve (a thread-local without a destructor: nothing to register, nothing allocated).
fn this_threads_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    }
    SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0)
}

/// The first byte of the slab whose header is `header`.
///
/// # Safety
///
/// `header` must be a slab's header.
unsafe fn base_of(header: *mut Header) -> *mut u8 {
    // SAFETY: the header is the slab's last `HEADER` bytes.
    unsafe { header.cast::<u8>().sub(BLOCK_BYTES) }
}

/// Puts an unlisted slab first on its class's list.
///
/// # Safety
///
/// `header` is an unlisted slab's; the class's lock is held, and `room` is its list.
unsafe fn link(room: &mut *mut Header, header: *mut Header) {
    // SAFETY: the caller's contract: the headers are mapped and ours under the lock.
    unsafe {
        (*header).prev = ptr::null_mut();
        (*header).next = *room;
        if let Some(next) = NonNull::new(*room) {
            (*next.as_ptr()).prev = header;
        }
        (*header).listed = true;
    }
    *room = header;
}

/// Takes a listed slab off its class's list.
///
/// # Safety
///
/// `header` is a listed slab's; the class's lock is held, and `room` is its list.
unsafe fn unlink(room: &mut *mut Header, header: *mut Header) {
    // SAFETY: the caller's contract: the headers are mapped and ours under the lock.
    unsafe {
        let (prev, next) = ((*header).prev, (*header).next);
        match NonNull::new(prev) {
            Some(prev) => (*prev.as_ptr()).next = next,
            None => *room = next,
        }
        if let Some(next) = NonNull::new(next) {
            (*next.as_ptr()).prev = prev;
        }
        (*header).listed = false;
    }
}

/// A fresh, zero-filled slab aligned to its size: twice its size mapped, the rest unmapped.
#[cfg(not(miri))]
fn map() -> Result<*mut u8, i32> {
    let len = 2 * SLAB;
    let raw = super::os::map_anonymous(len)?;
    let lead = (SLAB - (raw as usize & (SLAB - 1))) & (SLAB - 1);
    let trail = len - lead - SLAB;
    // SAFETY: both ranges lie inside the mapping just made and outside the slab kept. Were
    // the OS to refuse (splitting a mapping past the process's map count), the range would
    // stay mapped and untouched: address space, never resident.
    unsafe {
        if lead > 0 {
            libc::munmap(raw.cast(), lead);
        }
        if trail > 0 {
            libc::munmap(raw.add(lead + SLAB).cast(), trail);
        }
        Ok(raw.add(lead))
    }
}

/// A fresh, zero-filled slab aligned to its size (Miri maps no memory).
#[cfg(miri)]
fn map() -> Result<*mut u8, i32> {
    let mut raw = ptr::null_mut();
    // SAFETY: a valid out-pointer and a power-of-two alignment that is a multiple of the
    // pointer size.
    let rc = unsafe { libc::posix_memalign(&mut raw, SLAB, SLAB) };
    if rc != 0 {
        return Err(rc);
    }
    let raw = raw.cast::<u8>();
    // SAFETY: `SLAB` fresh writable bytes.
    unsafe { ptr::write_bytes(raw, 0, SLAB) };
    Ok(raw)
}

/// Returns a slab [`map`] made; `false` if the OS refused (the slab is then still mapped).
///
/// # Safety
///
/// `base` must come from [`map`], with no block of it in use.
unsafe fn unmap(base: *mut u8) -> bool {
    // SAFETY: the caller's contract.
    #[cfg(not(miri))]
    unsafe {
        libc::munmap(base.cast(), SLAB) == 0
    }
    // SAFETY: the caller's contract.
    #[cfg(miri)]
    unsafe {
        libc::free(base.cast());
        true
    }
}

/// `pthread_atfork` handlers that hold every class's lock across a `fork()`, so that a
/// child never inherits a lock another thread held (with no thread left to release it).
///
/// They are installed when the program is loaded (`crate::at_load`).
pub(super) mod fork {
    use std::sync::atomic::{AtomicBool, Ordering};

    static ARMED: AtomicBool = AtomicBool::new(false);

    /// Installs the handlers once per process: at load time, or (where there are no
    /// initialisers) when the first slab is mapped.
    pub(crate) fn arm() {
        crate::at_load::keep();
        if !ARMED.swap(true, Ordering::AcqRel) {
            // SAFETY: the handlers have the C ABI and signature pthread expects and live for
            // the whole program. A failure (ENOMEM) leaves forks unprotected, as before.
            #[cfg(not(miri))]
            unsafe {
                libc::pthread_atfork(Some(prepare), Some(resume), Some(resume));
            }
        }
    }

    #[cfg_attr(miri, allow(dead_code))]
    extern "C" fn prepare() {
        super::SLABS.lock_all();
    }

    #[cfg_attr(miri, allow(dead_code))]
    extern "C" fn resume() {
        super::SLABS.unlock_all();
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;
    use crate::pool::class::natural_align;

    #[test]
    fn blocks_of_a_class_lie_side_by_side_at_their_natural_alignment() {
        let slabs = Slabs::new();
        let capacities: &[usize] = if cfg!(miri) {
            &[3072, 16384]
        } else {
            &[64, 80, 96, 192, 1024, 3072, 4096, 16384]
        };
        for &capacity in capacities {
            let n = 2 * BLOCK_BYTES / capacity + 3; // three slabs' worth
            let blocks: Vec<_> = (0..n).map(|_| slabs.obtain(capacity).unwrap()).collect();
            let mut addresses: Vec<usize> = blocks.iter().map(|b| b.as_ptr() as usize).collect();
            addresses.sort_unstable();
            addresses.dedup();
            assert_eq!(addresses.len(), n, "{capacity}: every block distinct");
            for &a in &addresses {
                assert_eq!(a % natural_align(capacity), 0, "{capacity}: aligned");
                assert!(
                    a % SLAB + capacity <= BLOCK_BYTES,
                    "{capacity}: clear of the header"
                );
            }
            let per_slab = BLOCK_BYTES / capacity;
            assert_eq!(
                slabs.mapped(),
                n.div_ceil(per_slab),
                "{capacity}: slabs full"
            );
            let spans = addresses
                .windows(2)
                .filter(|w| w[1] - w[0] != capacity)
                .count();
            assert!(
                spans < slabs.mapped(),
                "{capacity}: side by side within a slab"
            );
            for block in blocks {
                // SAFETY: obtained above with this capacity, and used no more.
                unsafe { slabs.give_back(block, capacity) };
            }
            assert_eq!(
                slabs.mapped(),
                0,
                "{capacity}: every slab went back with its last block"
            );
        }
    }

    #[test]
    fn a_block_given_back_comes_out_again_zeroed_and_first() {
        let slabs = Slabs::new();
        let keep = slabs.obtain(64).unwrap();
        let block = slabs.obtain(64).unwrap();
        // SAFETY: 64 writable bytes of ours.
        unsafe { ptr::write_bytes(block.as_ptr(), 0xab, 64) };
        // SAFETY: obtained above with this capacity, and used no more.
        unsafe { slabs.give_back(block, 64) };
        let again = slabs.obtain(64).unwrap();
        assert_eq!(
            again, block,
            "a block given back is reused before bytes are carved"
        );
        // SAFETY: 64 readable bytes of ours.
        let bytes = unsafe { std::slice::from_raw_parts(again.as_ptr(), 64) };
        assert!(bytes.iter().all(|&b| b == 0), "zero-filled again");
        assert_eq!(slabs.mapped(), 1);
        // SAFETY: as above.
        unsafe {
            slabs.give_back(again, 64);
            slabs.give_back(keep, 64);
        }
        assert_eq!(slabs.mapped(), 0);
    }

    #[test]
    fn a_full_slab_with_a_block_given_back_serves_it_before_a_new_slab() {
        let slabs = Slabs::new();
        let capacity = 16384;
        let per_slab = BLOCK_BYTES / capacity;
        let mut blocks: Vec<_> = (0..per_slab)
            .map(|_| slabs.obtain(capacity).unwrap())
            .collect();
        assert_eq!(slabs.mapped(), 1);
        let returned = blocks.pop().unwrap();
        // SAFETY: obtained above with this capacity, and used no more.
        unsafe { slabs.give_back(returned, capacity) };
        blocks.push(slabs.obtain(capacity).unwrap());
        assert_eq!(
            slabs.mapped(),
            1,
            "the full slab's returned block served the request"
        );
        blocks.push(slabs.obtain(capacity).unwrap());
        assert_eq!(slabs.mapped(), 2, "a full slab makes room with a new one");
        for block in blocks {
            // SAFETY: as above.
            unsafe { slabs.give_back(block, capacity) };
        }
        assert_eq!(slabs.mapped(), 0);
    }

    #[test]
    fn threads_obtaining_and_giving_back_at_once_share_no_block() {
        let slabs = Slabs::new();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let slabs = &slabs;
                s.spawn(move || {
                    for round in 0..if cfg!(miri) { 2 } else { 50 } {
                        let blocks: Vec<_> = (0..300).map(|_| slabs.obtain(128).unwrap()).collect();
                        for b in &blocks {
                            // SAFETY: 128 writable bytes of this thread's.
                            unsafe { ptr::write_bytes(b.as_ptr(), t ^ round, 128) };
                        }
                        for b in blocks {
                            // SAFETY: 128 readable bytes of this thread's.
                            let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), 128) };
                            assert!(bytes.iter().all(|&x| x == t ^ round), "no other writer");
                            // SAFETY: obtained above with this capacity, and used no more.
                            unsafe { slabs.give_back(b, 128) };
                        }
                    }
                });
            }
        });
        assert_eq!(slabs.mapped(), 0);
    }

    #[test]
    fn threads_carving_at_once_carve_from_their_own_shards_slabs() {
        // Two threads' blocks never interleave: each carves from slabs of its own shard,
        // so threads of different shards share no slab (and so no page, no line pair).
        // Threads take shards in turn; a pair that drew one shard (other tests' threads
        // took shards in between) is drawn again.
        let slabs = Slabs::new();
        for _ in 0..16 {
            let barrier = std::sync::Barrier::new(2);
            let carved: Vec<(usize, Vec<usize>)> = std::thread::scope(|s| {
                let workers: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            let shard = this_threads_shard();
                            barrier.wait();
                            let blocks: Vec<_> = (0..if cfg!(miri) { 20 } else { 500 })
                                .map(|_| slabs.obtain(64).unwrap())
                                .collect();
                            let bases = blocks
                                .iter()
                                .map(|b| b.as_ptr() as usize & !(SLAB - 1))
                                .collect();
                            // Both threads' blocks are live together: a slab given back
                            // whole is unmapped, and a later slab may be mapped where it was.
                            barrier.wait();
                            for block in blocks {
                                // SAFETY: obtained above with this capacity, and used no more.
                                unsafe { slabs.give_back(block, 64) };
                            }
                            (shard, bases)
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            let (a, b) = (&carved[0], &carved[1]);
            if a.0 == b.0 {
                continue;
            }
            assert!(
                a.1.iter().all(|base| !b.1.contains(base)),
                "threads of shards {} and {} shared a slab",
                a.0,
                b.0
            );
            assert_eq!(slabs.mapped(), 0);
            return;
        }
        panic!("16 pairs of threads drew one shard each time");
    }

    #[test]
    fn a_block_given_back_by_another_thread_races_nothing_of_its_slabs_owner() {
        // A thread gives back blocks of another thread's shard while that thread gives
        // back and obtains in the same slab: the giver reads the slab's shard without the
        // lock, which no reference the lock allows may cover (Miri's race detector checks).
        let slabs = Slabs::new();
        let n = if cfg!(miri) { 12 } else { 2000 };
        let blocks: Vec<usize> = (0..n)
            .map(|_| slabs.obtain(64).unwrap().as_ptr() as usize)
            .collect();
        let (mine, theirs) = blocks.split_at(n / 2);
        let give_back = |address: usize| {
            let block = NonNull::new(address as *mut u8).unwrap();
            // SAFETY: obtained above with this capacity, given back once, used no more.
            unsafe { slabs.give_back(block, 64) };
        };
        std::thread::scope(|s| {
            s.spawn(|| theirs.iter().copied().for_each(give_back));
            for &block in mine {
                give_back(block);
                let again = slabs.obtain(64).unwrap();
                give_back(again.as_ptr() as usize);
            }
        });
        assert_eq!(slabs.mapped(), 0);
    }
}
