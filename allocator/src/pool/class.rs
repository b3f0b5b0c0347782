//! Size classes: which block capacity serves a request of `size` bytes at `align`.
//!
//! Invariant: a class size is never more than 25% above the request it serves (four
//! classes per power of two, from 64 bytes to 1 GiB), the class of a class size is itself,
//! and a request rounded up to a multiple of its alignment lands in a class whose natural
//! alignment ([`natural_align`]) is at least that alignment. Pure arithmetic: no state, no
//! unsafe.

use crate::error::AllocError;
use crate::physical::page_size;

/// The largest alignment the pool serves (one page).
pub const MAX_ALIGN: usize = 4096;
/// Smallest block handed out.
const MIN_CLASS: usize = 64;
/// Largest size class; larger blocks are mapped exactly and never cached.
pub(super) const MAX_CLASS: usize = 1 << 30;
/// Classes: 64 B, then four per power of two up to `MAX_CLASS`.
pub(super) const NUM_CLASSES: usize = 1 + (MAX_CLASS.trailing_zeros() as usize - 6) * 4;

/// The size class serving `bytes`, or `None` above the largest class.
#[inline]
pub(super) fn class_of(bytes: usize) -> Option<usize> {
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
#[inline]
pub(super) fn class_size(class: usize) -> usize {
    if class == 0 {
        return MIN_CLASS;
    }
    let k = 6 + (class - 1) / 4;
    let quarter = (class - 1) % 4 + 1;
    (1 << k) + quarter * (1 << (k - 2))
}

/// The cache class of a block of `capacity` bytes: `None` for blocks mapped exactly (above
/// the largest class), which are never cached.
#[inline]
pub(super) fn cached_class(capacity: usize) -> Option<usize> {
    class_of(capacity)
}

/// The alignment a block of `capacity` bytes is obtained with: its largest power-of-two
/// divisor, capped at a page. A request rounded up to a multiple of its alignment always
/// lands in a class at least that aligned (`m x align` for m < 4 is a class itself; from
/// `4 x align` on every class is a multiple of `align`).
pub(super) fn natural_align(capacity: usize) -> usize {
    (1usize << capacity.trailing_zeros()).clamp(16, MAX_ALIGN)
}

/// The capacity serving `size` bytes at `align`, or why the request is invalid.
#[inline]
pub(super) fn capacity_for(size: usize, align: usize) -> Result<usize, AllocError> {
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

/// An invalid request of `size` bytes at `align`, and why.
pub(super) fn invalid(size: usize, align: usize, reason: &'static str) -> AllocError {
    AllocError::InvalidLayout {
        size,
        align,
        reason,
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
    fn blocks_above_the_largest_class_are_page_multiples_and_never_cached() {
        let page = page_size();
        let capacity = capacity_for(MAX_CLASS + 1, 64).unwrap();
        assert_eq!(capacity % page, 0);
        assert!(capacity > MAX_CLASS && capacity <= MAX_CLASS + page);
        assert_eq!(cached_class(capacity), None);
        assert_eq!(cached_class(MAX_CLASS), Some(NUM_CLASSES - 1));
    }

    #[test]
    fn invalid_requests_are_errors_naming_the_reason() {
        for (size, align, reason) in [
            (0, 8, "zero-size"),
            (8, 3, "power of two"),
            (8, 8192, "above 4096"),
            (usize::MAX - 2, 8, "overflows"),
        ] {
            match capacity_for(size, align) {
                Err(AllocError::InvalidLayout { reason: r, .. }) => {
                    assert!(r.contains(reason), "{size} @ {align}: {r}")
                }
                other => panic!("{size} @ {align}: {other:?}"),
            }
        }
    }
}
