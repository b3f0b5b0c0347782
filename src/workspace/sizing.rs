//! The arithmetic of workspace sizes (semantics §2.1, §2.3, §2.4): scaling by a factor,
//! rounding to the alignment, clamping to `[min_size, max_size]`, padding, the bytes a
//! spilled request counts for, and the shape of a circular ring (its slots, where a cycle
//! starts, when a ring that spilled is rebuilt).
//!
//! Invariant: every function here is pure and total. Nothing overflows: sizes saturate at
//! the largest aligned `usize` instead, and a request whose padded size does not fit in
//! `isize` is `None`, which the arena turns into an error.

#![forbid(unsafe_code)]

/// The most slots a circular workspace's ring has (semantics §2.1, §2.4): a configuration
/// asking for more is refused when it is built, and a ring that `min_size` would cut into
/// more keeps this many (the rest of its buffer unused). The ring's per-slot bookkeeping is
/// allocated fallibly, but a bound keeps it small.
pub const MAX_RING_SLOTS: usize = 1024;

/// Margin on a circular workspace's first cycle when its slot size is learned (semantics §2.4).
pub(crate) const CIRCULAR_SLOT_MARGIN: f64 = 1.3;

/// Cycles a circular workspace keeps a spill (ND4J's "pinned" allocations), and waits
/// before rebuilding a ring that spilled (semantics §2.4).
pub(crate) const PINNED_CYCLES: u64 = 2;

/// `bytes x factor`, rounded up, tolerant of floating-point noise (1000 x 1.3 is 1300).
pub(crate) fn scaled(bytes: usize, factor: f64) -> usize {
    let exact = bytes as f64 * factor;
    let nearest = exact.round();
    let value = if (exact - nearest).abs() <= 1e-9 * nearest.max(1.0) {
        nearest
    } else {
        exact.ceil()
    };
    if value >= usize::MAX as f64 {
        usize::MAX
    } else {
        value as usize
    }
}

/// Bytes needed after `address` to reach a multiple of `align` (a power of two).
#[inline(always)]
pub(crate) fn padding(address: usize, align: usize) -> usize {
    address.wrapping_neg() & (align - 1)
}

/// What a spilled request of `size` bytes aligned to `align` counts for in a workspace
/// aligned to `workspace_align`: what the buffer's bump would take for it, its size rounded
/// to the workspace alignment, plus the most padding a bump can need before it when it is
/// more aligned than the workspace (`align - workspace_align`: a bump starts at a multiple
/// of the workspace alignment). `None` if that overflows `isize`.
pub(crate) fn spilled_bytes(size: usize, align: usize, workspace_align: usize) -> Option<usize> {
    size.checked_next_multiple_of(workspace_align)
        .and_then(|s| s.checked_add(align - align.min(workspace_align)))
        .filter(|s| *s <= isize::MAX as usize)
}

/// The size rules of one workspace configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sizing {
    /// The workspace alignment (a power of two).
    pub(crate) align: usize,
    min: usize,
    /// 0: unbounded.
    max: usize,
    /// `1 + overallocation_limit` with `Overallocate`, 1 with `Strict`.
    factor: f64,
}

impl Sizing {
    /// The rules of a configuration (see `WorkspaceConfig::sizing`): its alignment, its
    /// `min_size` and `max_size` (0: unbounded), and its overallocation factor.
    pub(crate) fn new(align: usize, min: usize, max: usize, factor: f64) -> Sizing {
        Sizing {
            align,
            min,
            max,
            factor,
        }
    }

    /// `bytes` rounded up to the alignment, saturating at the largest aligned value.
    pub(crate) fn round(&self, bytes: usize) -> usize {
        bytes
            .checked_next_multiple_of(self.align)
            .unwrap_or(usize::MAX - (self.align - 1))
    }

    /// How far a cycle may bump in a buffer of `len` bytes: `len`, or `max_size` where the
    /// buffer is larger (a pool's size class can round it past; semantics §2.1).
    pub(crate) fn bump_limit(&self, len: usize) -> usize {
        if self.max > 0 {
            len.min(self.max)
        } else {
            len
        }
    }

    /// A buffer size clamped to `[min_size, max_size]` and rounded up to the alignment, but
    /// never past `max_size` rounded down to it: a cycle bumps aligned sizes and stops at
    /// `max_size`, so bytes beyond its last aligned offset could never be used (and a
    /// ring, which bumps each slot to its end, must fit its slots under it). Where
    /// `min_size` and `max_size` leave no aligned size between them, `max_size` wins
    /// (`build` keeps `max_size` at or above the alignment, so the result is never 0).
    pub(crate) fn clamp(&self, bytes: usize) -> usize {
        let bytes = self.round(bytes.max(self.min));
        if self.max > 0 {
            bytes.min(self.max - self.max % self.align)
        } else {
            bytes
        }
    }

    /// The buffer a non-circular workspace gets from its initial size or its first
    /// learning: overallocated once, then clamped (semantics §2.3).
    pub(crate) fn learned(&self, bytes: usize) -> usize {
        self.clamp(scaled(bytes, self.factor))
    }

    /// The buffer a cycle that spilled with `Reallocate` leads to: the largest cycle,
    /// clamped, not overallocated again (semantics §2.3).
    pub(crate) fn reallocated(&self, max_cycle: usize) -> usize {
        self.clamp(max_cycle)
    }

    /// The ring of a circular workspace created with `initial_size` bytes per slot.
    pub(crate) fn initial_ring(&self, initial_size: usize) -> Option<RingShape> {
        let slot_bytes = self.round(initial_size);
        RingShape::new(slot_bytes, self.clamp(scaled(slot_bytes, self.factor)))
    }

    /// The ring a circular workspace learns from its first cycles: slots of the largest
    /// cycle x 1.3, the buffer overallocated (semantics §2.4).
    pub(crate) fn learned_ring(&self, max_cycle: usize) -> Option<RingShape> {
        let slot_bytes = self.round(scaled(max_cycle, CIRCULAR_SLOT_MARGIN));
        RingShape::new(slot_bytes, self.clamp(scaled(slot_bytes, self.factor)))
    }

    /// The ring that replaces `current` after spills with `Reallocate` (semantics §2.4):
    /// slots of `max_cycle` bytes, as many as before, clamped; `None` when it would not be
    /// larger than `current` in both its slots and the bytes they cover.
    ///
    /// The comparison is with the bytes `current`'s slots cover, never with the capacity
    /// of the block under it: a pool size class may round that block past the
    /// new ring, and a ring that keeps its slots would spill every cycle forever.
    pub(crate) fn rebuilt_ring(&self, max_cycle: usize, current: RingShape) -> Option<RingShape> {
        let slot_bytes = self.round(max_cycle);
        let bytes = self.clamp(slot_bytes.saturating_mul(current.slots));
        if slot_bytes > current.slot_bytes && bytes > current.bytes() {
            RingShape::new(slot_bytes, bytes)
        } else {
            None
        }
    }
}

/// The geometry of a circular workspace's ring: a buffer of `buffer` bytes whose first
/// `slots x slot_bytes` bytes are the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingShape {
    /// Bytes per slot: the most one cycle may bump.
    pub(crate) slot_bytes: usize,
    /// Slots in the ring (at least 1).
    pub(crate) slots: usize,
    /// Bytes to allocate for the ring (at least `slots x slot_bytes`).
    pub(crate) buffer: usize,
}

impl RingShape {
    /// A ring of `buffer` bytes cut in slots of `slot_bytes` (at most `buffer`), at most
    /// [`MAX_RING_SLOTS`] of them; `None` when that is empty.
    pub(crate) fn new(slot_bytes: usize, buffer: usize) -> Option<RingShape> {
        let slot_bytes = slot_bytes.min(buffer);
        (slot_bytes > 0).then(|| RingShape {
            slot_bytes,
            slots: (buffer / slot_bytes).min(MAX_RING_SLOTS),
            buffer,
        })
    }

    /// Bytes the slots cover: what the ring uses of its buffer.
    pub(crate) fn bytes(&self) -> usize {
        self.slot_bytes.saturating_mul(self.slots)
    }

    /// The offset where slot `slot` starts.
    pub(crate) fn start(&self, slot: usize) -> usize {
        slot * self.slot_bytes
    }

    /// The slot after `slot`, wrapping to 0 after the last one.
    pub(crate) fn next(&self, slot: usize) -> usize {
        (slot + 1) % self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocationPolicy, WorkspaceConfig};

    fn sizing(limit: f64) -> Sizing {
        WorkspaceConfig::builder()
            .overallocation_limit(limit)
            .build()
            .unwrap()
            .sizing()
    }

    #[test]
    fn scaling_ignores_floating_point_noise_and_saturates() {
        assert_eq!(scaled(1000, 1.3), 1300);
        assert_eq!(scaled(65536, 1.3), 85197);
        assert_eq!(scaled(7, 1.0), 7);
        assert_eq!(scaled(10, 1.01), 11, "a real fraction rounds up");
        assert_eq!(scaled(usize::MAX, 2.0), usize::MAX);
    }

    #[test]
    fn padding_reaches_the_next_multiple() {
        assert_eq!(padding(0, 16), 0);
        assert_eq!(padding(1, 16), 15);
        assert_eq!(padding(4096, 4096), 0);
        assert_eq!(padding(usize::MAX, 2), 1);
    }

    #[test]
    fn spilled_requests_count_their_rounded_size_and_worst_padding() {
        assert_eq!(spilled_bytes(1000, 16, 16), Some(1008));
        // Rounded to the workspace alignment (as a bump rounds it), not to the request's.
        assert_eq!(spilled_bytes(1000, 64, 16), Some(1008 + 48));
        assert_eq!(spilled_bytes(5, 64, 16), Some(16 + 48));
        assert_eq!(spilled_bytes(1, 16, 16), Some(16), "as aligned: no padding");
        assert_eq!(
            spilled_bytes(1, 1, 16),
            Some(16),
            "less aligned: no padding"
        );
        assert_eq!(spilled_bytes(usize::MAX - 3, 16, 16), None);
        // Rounded to 16, the largest request passes isize.
        assert_eq!(spilled_bytes(isize::MAX as usize, 1, 16), None);
        assert_eq!(
            spilled_bytes(isize::MAX as usize - 15, 1, 16),
            Some(isize::MAX as usize - 15)
        );
        assert_eq!(spilled_bytes(isize::MAX as usize, 2, 16), None);
    }

    #[test]
    fn rounding_and_clamping_follow_the_configuration() {
        let config = WorkspaceConfig::builder()
            .min_size(100)
            .max_size(1000)
            .policy_allocation(AllocationPolicy::Strict)
            .build()
            .unwrap();
        let s = config.sizing();
        assert_eq!(s.round(1), 16);
        assert_eq!(s.round(usize::MAX), usize::MAX - 15, "saturates, aligned");
        assert_eq!(s.clamp(1), 112, "min_size, rounded");
        assert_eq!(
            s.clamp(5000),
            992,
            "max_size, rounded down: bumps stop at it"
        );
        assert_eq!(s.learned(500), 512, "Strict: no overallocation");
        assert_eq!(sizing(0.3).learned(1000), 1312);
        assert_eq!(
            sizing(0.3).reallocated(1000),
            1008,
            "not overallocated again"
        );
    }

    #[test]
    fn a_ring_covers_no_more_than_max_size_rounded_down_to_the_alignment() {
        let s = |align, max, limit| {
            WorkspaceConfig::builder()
                .alignment(align)
                .max_size(max)
                .overallocation_limit(limit)
                .build()
                .unwrap()
                .sizing()
        };
        // 5000 bytes at alignment 4096: one 4096-byte slot, not an 8192-byte buffer.
        let ring = s(4096, 5000, 0.3).initial_ring(5000).unwrap();
        assert_eq!((ring.slot_bytes, ring.slots, ring.buffer), (4096, 1, 4096));
        // Learned from a 3000-byte cycle under max_size 1000 at alignment 16: 992, not 1008.
        let ring = s(16, 1000, 0.3).learned_ring(3000).unwrap();
        assert_eq!(ring.bytes(), 992);
        assert!(ring.buffer <= 1000);
        // Rebuilt after spills: still under max_size.
        let current = s(16, 1000, 0.3).learned_ring(100).unwrap();
        let rebuilt = s(16, 1000, 0.3).rebuilt_ring(900, current).unwrap();
        assert!(rebuilt.bytes() <= 1000, "{rebuilt:?}");
        // A max_size on the alignment is used whole; no max_size, no cap.
        assert_eq!(s(16, 1024, 0.0).learned_ring(3000).unwrap().bytes(), 1024);
        assert_eq!(s(16, 0, 0.0).learned_ring(1000).unwrap().slot_bytes, 1312);
    }

    #[test]
    fn rings_are_cut_in_whole_slots() {
        let s = sizing(2.5);
        let learned = s.learned_ring(1008).unwrap();
        assert_eq!(
            learned,
            RingShape {
                slot_bytes: 1312,
                slots: 3,
                buffer: 4592
            },
            "1008 x 1.3 rounded to 16, x 3.5"
        );
        assert_eq!(learned.bytes(), 3936);
        assert_eq!(s.initial_ring(1024).unwrap().slots, 3);
        assert_eq!(learned.start(2), 2624);
        assert_eq!((learned.next(1), learned.next(2)), (2, 0));
        assert_eq!(RingShape::new(0, 100), None);
        assert_eq!(
            RingShape::new(300, 100),
            Some(RingShape {
                slot_bytes: 100,
                slots: 1,
                buffer: 100
            }),
            "a slot never exceeds its buffer"
        );
        assert_eq!(
            RingShape::new(1, 16 << 20).map(|r| r.slots),
            Some(MAX_RING_SLOTS),
            "the slot count is bounded"
        );
    }

    #[test]
    fn a_ring_that_spilled_is_rebuilt_whatever_the_capacity_under_it() {
        // Two 4,000-byte allocations learn slots of 10,400 bytes (x4 = 41,600 bytes, which
        // a size class may round past 48,000); cycles of 12,000 bytes need a rebuild.
        let s = sizing(3.0);
        let current = s.learned_ring(8000).unwrap();
        assert_eq!(current.bytes(), 41_600);
        assert_eq!(current.slots, 4);
        assert_eq!(
            s.rebuilt_ring(12_000, current),
            Some(RingShape {
                slot_bytes: 12_000,
                slots: 4,
                buffer: 48_000
            })
        );
        assert_eq!(s.rebuilt_ring(10_000, current), None, "not larger: kept");
        let capped = WorkspaceConfig::builder()
            .overallocation_limit(3.0)
            .max_size(41_600)
            .build()
            .unwrap()
            .sizing();
        assert_eq!(
            capped.rebuilt_ring(12_000, current),
            None,
            "max_size leaves no larger ring"
        );
    }
}
