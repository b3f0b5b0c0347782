//! What the pool hands out: a [`Block`] of its memory, or a [`Reservation`] of bytes
//! obtained elsewhere but counted against its limits. Both give themselves back on drop.
//!
//! Invariant: a `Block` owns its `capacity` bytes exclusively, like a `Box<[u8]>`, from the
//! moment the pool hands it out until its drop returns it; those bytes are always
//! initialised (zero when fresh from the OS, afterwards what the previous owner wrote), so
//! handing out `&[u8]` over them is sound.

#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;

use super::{Pool, Usage};

/// A block of pool memory; dropping it gives it back to the pool.
pub struct Block<'p> {
    ptr: NonNull<u8>,
    pool: &'p Pool,
    /// The length above [`LEN_SHIFT`], the usage's index in bits 8 and 9, and the class
    /// (kept so the free path need not work it out again) in the low byte: one word, so
    /// that moving a `Block` copies whole words (byte fields written apart and read back as
    /// a word stall the CPU's store forwarding on the allocation fast path). The capacity
    /// follows from the class and the length ([`capacity_of`]).
    packed: usize,
}

/// Where a block's length starts in [`Block`]'s packed word: lengths up to 2^54 bytes
/// (16 PiB) fit, and requests for more are refused ([`super::class::BEYOND_ANY_BLOCK`](super::class)).
pub(super) const LEN_SHIFT: u32 = 10;

/// The capacity of a block of `class` (or [`super::class::NO_CLASS`]) and length `len`:
/// the class's size, or the length rounded to the page.
#[inline(always)]
fn capacity_of(class: u8, len: usize) -> usize {
    if class != super::class::NO_CLASS {
        super::class::class_size(usize::from(class))
    } else {
        super::class::page_capacity(len)
    }
}

// SAFETY: a Block owns its memory exclusively (like a Box<[u8]>), and the pool it returns
// to is Sync.
unsafe impl Send for Block<'_> {}
// SAFETY: shared access only reads the bytes through `&self`.
unsafe impl Sync for Block<'_> {}

impl<'p> Block<'p> {
    /// Takes ownership of `capacity` bytes at `ptr` (of size class `class`), of which the
    /// first `len` were requested, for `usage`; the caller has counted them live in
    /// `pool`, and the drop gives them back to it.
    ///
    /// # Safety
    ///
    /// `ptr` must be a block of `pool` of exactly `capacity` bytes (from the OS or the
    /// cache of its class) that nothing else owns or uses any more, with every byte
    /// initialised, and `len <= capacity`.
    #[inline(always)]
    pub(super) unsafe fn new(
        ptr: NonNull<u8>,
        len: usize,
        capacity: usize,
        class: u8,
        usage: Usage,
        pool: &'p Pool,
    ) -> Block<'p> {
        debug_assert!(len <= capacity);
        debug_assert_eq!(capacity_of(class, len), capacity);
        debug_assert!(len < 1 << (usize::BITS - LEN_SHIFT));
        Block {
            ptr,
            pool,
            packed: len << LEN_SHIFT | usage.index() << 8 | usize::from(class),
        }
    }

    /// The first byte, aligned as requested.
    #[inline]
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes requested.
    #[inline]
    pub fn len(&self) -> usize {
        self.packed >> LEN_SHIFT
    }

    /// Whether the block holds no requested bytes (never true: empty blocks are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the block really occupies (its size class), all usable.
    #[inline]
    pub fn capacity(&self) -> usize {
        capacity_of(self.packed as u8, self.len())
    }

    /// What the block was allocated for.
    pub fn usage(&self) -> Usage {
        Usage::from_index(self.packed >> 8 & 3)
    }

    /// The pool the block returns to.
    pub fn pool(&self) -> &'p Pool {
        self.pool
    }

    /// The requested bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block owns `capacity >= len` initialised bytes at `ptr` for its whole
        // life, and `&self` forbids concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The requested bytes, mutably.
    #[inline]
    pub fn as_slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("ptr", &self.ptr)
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("usage", &self.usage())
            .finish()
    }
}

impl Drop for Block<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let class = self.packed as u8;
        if class != super::class::NO_CLASS {
            let capacity = super::class::class_size(usize::from(class));
            self.pool.release(self.ptr, capacity, class, self.usage());
        } else {
            // Off the inlined path: working out the capacity calls the OS for the page size.
            self.pool
                .release_page_block(self.ptr, self.len(), self.usage());
        }
    }
}

impl<'p> Block<'p> {
    /// The block reduced to what giving it back needs, in three words: a deferred free
    /// that holds a [`FreedBlock`] fits inline in crossbeam-epoch's deferred call (three
    /// words), so deferring it allocates nothing. Its bytes can no longer be read.
    #[inline]
    pub fn into_freed(self) -> FreedBlock<'p> {
        let this = std::mem::ManuallyDrop::new(self);
        // Capacities are multiples of 16 (the classes) or of the page: the low two bits
        // carry the usage.
        debug_assert_eq!(this.capacity() & 3, 0);
        FreedBlock {
            ptr: this.ptr,
            packed: this.capacity() | this.usage().index(),
            pool: this.pool,
        }
    }
}

/// A block on its way back to its pool ([`Block::into_freed`]); dropping it gives it back.
pub struct FreedBlock<'p> {
    ptr: NonNull<u8>,
    /// The capacity, with the usage's index in the low two bits.
    packed: usize,
    pool: &'p Pool,
}

// SAFETY: as for `Block`: it owns its memory exclusively (and gives no access to it), and
// the pool it returns to is Sync.
unsafe impl Send for FreedBlock<'_> {}
// SAFETY: `&FreedBlock` gives access to nothing but its capacity.
unsafe impl Sync for FreedBlock<'_> {}

impl FreedBlock<'_> {
    /// Bytes the block occupies (its size class).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.packed & !3
    }
}

impl fmt::Debug for FreedBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreedBlock")
            .field("ptr", &self.ptr)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Drop for FreedBlock<'_> {
    #[inline]
    fn drop(&mut self) {
        let usage = Usage::from_index(self.packed & 3);
        let capacity = self.capacity();
        let class =
            super::class::cached_class(capacity).map_or(super::class::NO_CLASS, |c| c as u8);
        self.pool.release(self.ptr, capacity, class, usage);
    }
}

/// Bytes obtained outside the pool but counted against its limits (see [`Pool::reserve`]).
#[derive(Debug)]
pub struct Reservation<'p> {
    bytes: usize,
    usage: Usage,
    pool: &'p Pool,
}

impl<'p> Reservation<'p> {
    /// Counts `bytes` for `usage` until the reservation drops; the caller has reserved
    /// them in `pool`'s budget and counted them live.
    pub(super) fn new(bytes: usize, usage: Usage, pool: &'p Pool) -> Reservation<'p> {
        Reservation { bytes, usage, pool }
    }

    /// Bytes counted.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.pool.release_reservation(self.bytes, self.usage);
    }
}
