//! The bump region of a running cycle: the buffer's base, the next free byte, and the end
//! of the bytes this cycle may use (semantics §2.2).
//!
//! Invariants: `end` is 0 unless a cycle is running; while it is not 0, `[cursor, end)`
//! lies inside the live buffer starting at `base`, so a bump that stays below `end`
//! returns a pointer into that buffer. `cursor` and `end` are multiples of the workspace
//! alignment (as `base` is): every request takes its size rounded up to the alignment, so
//! a request aligned no more than the workspace needs no padding, and the bump that
//! carries from one allocation to the next is a single addition. The bump reads and writes
//! `Cell`s only: no lock, no allocation, no system call.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::NonNull;

use super::sizing::padding;

/// Where the running cycle bumps.
#[derive(Debug)]
pub(crate) struct Region {
    /// The workspace alignment (a power of two up to 4096).
    align: usize,
    base: Cell<*mut u8>,
    /// The next free byte: `base + offset` (kept as a pointer so the bump reads one field).
    cursor: Cell<*mut u8>,
    /// Address of the end of the region this cycle may bump into; 0 when no cycle runs.
    end: Cell<usize>,
    /// Padding this cycle's bumps aligned beyond the workspace could have needed and did
    /// not take (each could need `align - workspace alignment`, as a spill counts it; what
    /// it took depends on where the buffer lies), so that a buffer sized from the cycle
    /// holds it wherever that buffer lies.
    slack: Cell<usize>,
}

impl Region {
    /// An empty region (no buffer, no cycle) of a workspace aligned to `align`.
    pub(crate) fn new(align: usize) -> Region {
        Region {
            align,
            base: Cell::new(std::ptr::null_mut()),
            cursor: Cell::new(std::ptr::null_mut()),
            end: Cell::new(0),
            slack: Cell::new(0),
        }
    }

    /// The bump itself: a pointer if the request fits the running cycle's region.
    #[inline(always)]
    pub(crate) fn bump(&self, layout: Layout) -> Option<NonNull<u8>> {
        if layout.align() > self.align {
            return self.bump_aligned(layout);
        }
        let size = layout.size();
        let cursor = self.cursor.get();
        // The cursor is aligned (module invariant): the block starts at it, and the next
        // one after its size rounded up to the alignment. The rounding cannot overflow: a
        // Layout's size is at most `isize::MAX`, the alignment at most 4096.
        let step = self.round(size);
        // `end` is 0 unless a cycle is running, so a left or destroyed workspace never
        // passes this test.
        let new_end = (cursor as usize).checked_add(step)?;
        if size == 0 || new_end > self.end.get() {
            return None;
        }
        self.cursor.set(cursor.wrapping_add(step));
        // SAFETY: `cursor < new_end <= end`, and whenever `end > 0` the region
        // `[cursor, end)` lies inside the live buffer, so `cursor` is in it and not null.
        Some(unsafe { NonNull::new_unchecked(cursor) })
    }

    /// The bump of a request aligned more than the workspace: padding first, out of line
    /// so that it keeps the common bump's chain short.
    #[cold]
    #[inline(never)]
    fn bump_aligned(&self, layout: Layout) -> Option<NonNull<u8>> {
        let size = layout.size();
        let cursor = self.cursor.get();
        // `pad` is a multiple of the workspace alignment (both alignments are powers of
        // two, the cursor a multiple of the smaller) below `layout.align()`, and a Layout's
        // size plus its alignment fits in isize: `pad + step` cannot overflow.
        let pad = padding(cursor as usize, layout.align());
        let step = pad + self.round(size);
        let new_end = (cursor as usize).checked_add(step)?;
        if size == 0 || new_end > self.end.get() {
            return None;
        }
        self.cursor.set(cursor.wrapping_add(step));
        // `pad <= layout.align() - align`: the cursor is a multiple of `align`.
        let unused = layout.align() - self.align - pad;
        self.slack.set(self.slack.get().saturating_add(unused));
        // SAFETY: `cursor + pad < new_end <= end`, and whenever `end > 0` the region
        // `[cursor, end)` lies inside the live buffer, so the result is in it and not null.
        Some(unsafe { NonNull::new_unchecked(cursor.add(pad)) })
    }

    /// `bytes` rounded up to the workspace alignment (no overflow for `bytes <= isize::MAX`).
    #[inline(always)]
    fn round(&self, bytes: usize) -> usize {
        (bytes + (self.align - 1)) & !(self.align - 1)
    }

    /// [`Region::round`] for any `bytes`, saturating at the largest aligned value.
    fn round_saturating(&self, bytes: usize) -> usize {
        bytes.saturating_add(self.align - 1) & !(self.align - 1)
    }

    /// The bytes a request of `size` aligned to `align` would take here: the padding to
    /// `align`, then `size` rounded up to the alignment (saturating).
    pub(crate) fn footprint(&self, size: usize, align: usize) -> usize {
        padding(self.cursor.get() as usize, align).saturating_add(self.round_saturating(size))
    }

    /// The padding this cycle's over-aligned bumps could have needed beyond what they
    /// took (see the field), set back to 0 for the next cycle.
    pub(crate) fn take_slack(&self) -> usize {
        self.slack.replace(0)
    }

    /// Whether the workspace has a buffer.
    pub(crate) fn has_buffer(&self) -> bool {
        !self.base.get().is_null()
    }

    /// Moves to a new buffer (null: none), with no cycle region.
    pub(crate) fn set_base(&self, base: *mut u8) {
        self.base.set(base);
        self.cursor.set(base);
        self.end.set(0);
    }

    /// Offset of the next free byte from the buffer's base.
    pub(crate) fn offset(&self) -> usize {
        (self.cursor.get() as usize).wrapping_sub(self.base.get() as usize)
    }

    /// Moves the next free byte to `offset` (rounded up to the alignment).
    pub(crate) fn set_offset(&self, offset: usize) {
        let offset = self.round_saturating(offset);
        self.cursor.set(self.base.get().wrapping_add(offset));
    }

    /// Offset of the end of this cycle's region (0: no cycle runs).
    pub(crate) fn end_offset(&self) -> usize {
        self.end.get().saturating_sub(self.base.get() as usize)
    }

    /// Sets the end of this cycle's region to `offset`, rounded down to the alignment (every
    /// request takes a multiple of it, so the bytes past the last multiple serve none); 0
    /// closes it (nothing bumps).
    /// Callers keep `offset` within the buffer.
    pub(crate) fn set_end_offset(&self, offset: usize) {
        let offset = offset & !(self.align - 1);
        let end = if offset == 0 {
            0
        } else {
            (self.base.get() as usize).wrapping_add(offset)
        };
        self.end.set(end);
    }

    /// Extends the allocation at `ptr` of `old` bytes to `new` bytes in place, if it is the
    /// last one bumped and the region has room.
    pub(crate) fn grow_last(&self, ptr: NonNull<u8>, old: usize, new: usize) -> bool {
        if !self.has_buffer() {
            return false;
        }
        let at = (ptr.as_ptr() as usize).wrapping_sub(self.base.get() as usize);
        let rounded_end = at
            .checked_add(old)
            .and_then(|end| end.checked_next_multiple_of(self.align));
        if rounded_end != Some(self.offset()) {
            return false;
        }
        match at.checked_add(new) {
            Some(end) if end <= self.end_offset() => {
                self.set_offset(end);
                true
            }
            _ => false,
        }
    }
}

/// A dangling pointer aligned to `align` (a power of two), for zero-size requests.
pub(crate) fn dangling(align: usize) -> NonNull<u8> {
    // SAFETY: `align` is a power of two, so never 0; the pointer is never dereferenced
    // (zero-size allocations are only compared and passed back).
    unsafe { NonNull::new_unchecked(std::ptr::null_mut::<u8>().wrapping_add(align)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangling_pointers_are_aligned() {
        for shift in 0..13 {
            let align = 1usize << shift;
            assert_eq!(dangling(align).as_ptr() as usize % align, 0);
        }
    }

    #[test]
    fn every_request_takes_its_size_rounded_and_the_cursor_stays_aligned() {
        /// 512 bytes aligned to 128, so the padding below does not depend on the address.
        #[repr(C, align(128))]
        struct Aligned([u8; 512]);
        let mut bytes = Box::new(Aligned([0; 512]));
        let region = Region::new(16);
        region.set_base(bytes.0.as_mut_ptr());
        region.set_offset(0);
        region.set_end_offset(200); // rounded down to 192
        assert_eq!(region.end_offset(), 192);
        let byte = Layout::from_size_align(1, 1).unwrap();
        let first = region.bump(byte).unwrap();
        assert_eq!(region.offset(), 16, "1 byte takes 16");
        let second = region
            .bump(Layout::from_size_align(40, 8).unwrap())
            .unwrap();
        assert_eq!(second.as_ptr() as usize - first.as_ptr() as usize, 16);
        assert_eq!(region.offset(), 64, "40 bytes take 48, as ND4J rounds them");
        assert_eq!(region.footprint(100, 64), 112);
        // More aligned than the workspace: padded first (64 is already a multiple of 64).
        let wide = region
            .bump(Layout::from_size_align(8, 128).unwrap())
            .unwrap();
        assert_eq!(wide.as_ptr() as usize % 128, 0);
        assert_eq!(region.offset(), 128 + 16);
        assert_eq!(region.footprint(8, 128), 112 + 16);
        // 48 bytes are left (192 - 144): 33 bytes take them all, then one byte does not fit.
        assert!(region
            .bump(Layout::from_size_align(33, 1).unwrap())
            .is_some());
        assert_eq!(region.offset(), 192);
        assert!(region.bump(byte).is_none());
        // Growing the last allocation in place keeps the cursor aligned.
        region.set_offset(0);
        let last = region
            .bump(Layout::from_size_align(10, 1).unwrap())
            .unwrap();
        assert!(region.grow_last(last, 10, 20));
        assert_eq!(region.offset(), 32);
        drop(bytes);
    }

    #[test]
    fn a_region_bumps_only_while_a_cycle_runs_and_within_its_end() {
        let mut bytes = vec![0u128; 16]; // 256 bytes, 16-aligned
        let region = Region::new(16);
        let layout = Layout::from_size_align(10, 1).unwrap();
        assert!(region.bump(layout).is_none(), "no buffer");
        region.set_base(bytes.as_mut_ptr().cast());
        assert!(region.bump(layout).is_none(), "no cycle");
        region.set_offset(0);
        region.set_end_offset(32);
        let first = region.bump(layout).unwrap();
        let second = region.bump(layout).unwrap();
        assert_eq!(second.as_ptr() as usize % 16, 0);
        assert!(second.as_ptr() as usize >= first.as_ptr() as usize + 10);
        assert!(region.bump(layout).is_none(), "past the end");
        assert!(
            region.grow_last(second, 10, 12),
            "the last one grows in place"
        );
        assert!(!region.grow_last(first, 10, 12), "an earlier one does not");
        assert!(!region.grow_last(second, 12, 100), "not past the end");
        region.set_end_offset(0);
        assert!(region
            .bump(Layout::from_size_align(1, 1).unwrap())
            .is_none());
        drop(bytes);
    }
}
