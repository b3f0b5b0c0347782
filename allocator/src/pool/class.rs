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
pub(super) const fn class_of(bytes: usize) -> Option<usize> {
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

/// Bytes of a block of class `class` (computed: see [`CLASS_SIZES`] for the table).
const fn compute_class_size(class: usize) -> usize {
    if class == 0 {
        return MIN_CLASS;
    }
    let k = 6 + (class - 1) / 4;
    let quarter = (class - 1) % 4 + 1;
    (1 << k) + quarter * (1 << (k - 2))
}

/// Every class's size, so the allocation path reads it instead of computing it (256
/// entries, so that a `u8` class indexes it with no bounds check; those past the last
/// class are 0 and never read).
const CLASS_SIZES: [usize; 256] = {
    let mut sizes = [0; 256];
    let mut class = 0;
    while class < NUM_CLASSES {
        sizes[class] = compute_class_size(class);
        class += 1;
    }
    sizes
};

/// Bytes of a block of class `class`.
#[inline(always)]
pub(super) fn class_size(class: usize) -> usize {
    debug_assert!(class < NUM_CLASSES);
    CLASS_SIZES[class]
}

/// Requests up to this many bytes, rounded to their alignment, find their class in
/// [`SMALL_FITS`].
const SMALL_BYTES: usize = 64 << 10;
/// The largest alignment the table path serves (every class is a multiple of 16, and a
/// request rounded to its alignment lands in a class at least that aligned: see
/// [`natural_align`]).
const SMALL_ALIGN: usize = 64;

/// The class and capacity of every multiple of 16 bytes up to [`SMALL_BYTES`], by
/// `bytes / 16`, as `capacity << 8 | class`: one load instead of the arithmetic of
/// [`class_of`] and the class's size after it.
static SMALL_FITS: [u32; SMALL_BYTES / 16 + 1] = {
    let mut table = [0; SMALL_BYTES / 16 + 1];
    let mut i = 1;
    while i < table.len() {
        let bytes = i * 16;
        // `class_of` for `bytes <= SMALL_BYTES`, in const form.
        let class = if bytes <= MIN_CLASS {
            0
        } else {
            let k = (usize::BITS - 1 - (bytes - 1).leading_zeros()) as usize;
            let step = 1usize << (k - 2);
            (k - 6) * 4 + (bytes - (1 << k)).div_ceil(step)
        };
        table[i] = (CLASS_SIZES[class] << 8 | class) as u32;
        i += 1;
    }
    table
};

/// No class: the block is mapped exactly and never cached (see [`Fit::class`]).
pub(super) const NO_CLASS: u8 = u8::MAX;

/// How a valid request is served: the block's capacity and its cache class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fit {
    pub(super) capacity: usize,
    /// The class of `capacity`, or [`NO_CLASS`] above the largest class.
    pub(super) class: u8,
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

/// The capacity and class serving `size` bytes at `align`, or why the request is invalid.
/// A request of up to 64 KiB at an alignment of up to 64 is a table lookup; the rest is
/// [`fit_any`].
#[inline(always)]
pub(super) fn fit(size: usize, align: usize) -> Result<Fit, AllocError> {
    if align.is_power_of_two() && align <= SMALL_ALIGN && size.wrapping_sub(1) < SMALL_BYTES {
        let unit = align.max(16);
        // At most SMALL_BYTES: a multiple of every alignment served here.
        let rounded = (size + unit - 1) & !(unit - 1);
        let fit = SMALL_FITS[rounded / 16];
        return Ok(Fit {
            capacity: (fit >> 8) as usize,
            class: fit as u8,
        });
    }
    fit_any(size, align)
}

/// [`fit`] for any request: every check, and the class worked out.
#[inline(never)]
fn fit_any(size: usize, align: usize) -> Result<Fit, AllocError> {
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
    let rounded = size.checked_next_multiple_of(align).ok_or_else(|| {
        invalid(
            size,
            align,
            "the size overflows when rounded to the alignment",
        )
    })?;
    if rounded > crate::counter::UNLIMITED {
        return Err(invalid(size, align, BEYOND_ANY_POOL));
    }
    match class_of(rounded) {
        Some(class) => Ok(Fit {
            capacity: class_size(class),
            class: class as u8,
        }),
        None => Ok(Fit {
            capacity: page_capacity(rounded),
            class: NO_CLASS,
        }),
    }
}

/// The capacity of a block of no class serving `bytes`: whole pages. (A request rounded to
/// its alignment first gets the same, every alignment served dividing the page.)
#[inline]
pub(super) fn page_capacity(bytes: usize) -> usize {
    bytes.next_multiple_of(page_size())
}

/// Why a request above 4 EiB is refused: past the largest budget there is (what an
/// unlimited pool counts against), no limit could ever let it through.
pub(super) const BEYOND_ANY_POOL: &str = "more than any pool can hold (4 EiB, the largest budget)";

/// Why a request of 16 PiB (2^54 bytes) or more is refused once it is within the pool's
/// limits (a limited pool refuses it at its limit first): a [`super::Block`] keeps its
/// length in 54 bits, more than any machine's memory (and than the 47 bits of address
/// space a process has under 4-level paging).
pub(super) const BEYOND_ANY_BLOCK: &str =
    "more than one block can hold (16 PiB; no machine maps that much)";

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
                let capacity = fit(size, align).unwrap().capacity;
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
    fn a_fit_carries_the_class_of_its_capacity_and_the_table_matches_the_formula() {
        for class in 0..NUM_CLASSES {
            assert_eq!(
                class_size(class),
                compute_class_size(class),
                "class {class}"
            );
        }
        for align in [1, 8, 16, 32, 64, 128] {
            for size in (1..70_000).step_by(3).chain([MAX_CLASS, MAX_CLASS + 1]) {
                let f = fit(size, align).unwrap();
                let expected = cached_class(f.capacity).map_or(NO_CLASS, |c| c as u8);
                assert_eq!(f.class, expected, "{size} B @ {align} -> {} B", f.capacity);
                // The table path and the general one agree.
                assert_eq!(
                    Ok(f),
                    fit_any(size, align).map_err(|_| ()),
                    "{size} @ {align}"
                );
            }
        }
    }

    #[test]
    fn blocks_above_the_largest_class_are_page_multiples_and_never_cached() {
        let page = page_size();
        let capacity = fit(MAX_CLASS + 1, 64).unwrap().capacity;
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
            match fit(size, align).map(|f| f.capacity) {
                Err(AllocError::InvalidLayout { reason: r, .. }) => {
                    assert!(r.contains(reason), "{size} @ {align}: {r}")
                }
                other => panic!("{size} @ {align}: {other:?}"),
            }
        }
    }
}
