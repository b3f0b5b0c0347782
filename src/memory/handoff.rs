//! The freed/views hand-off of one pool block: who frees it, and when.
//!
//! A scope-owned pool block is released by whichever of three parties comes last: the
//! scope closing it ([`Handoff::free`]), the last borrowed view of it dropping
//! ([`Handoff::leave_view`]), or the last handle to it dropping
//! ([`Handoff::last_reference_dropped`]). Each method answers with a decision, "you free it
//! now" (`true`) or not; this module frees nothing itself.
//!
//! Invariant: over one block's life exactly one call answers `true`, and none does while a
//! granted view is alive (a view is granted only while the block is not freed, and the
//! freeing side sees every granted view). Everything lives in one atomic word (views
//! count, freed bit, claimed bit), so each step is a read-modify-write of the same
//! location: the steps are totally ordered, and every release orders a view's reads
//! before the free that follows it. `loom-tests/tests/storage.rs` checks this over every
//! interleaving.

use crate::sync::{AtomicUsize, Ordering};

/// Set (once) when the owner freed the block: later checks and views are refused.
const FREED: usize = 1;
/// Set (once) by the one party that frees the block.
const CLAIMED: usize = 2;
/// One granted (or being refused) view.
const VIEW: usize = 4;

/// The freed flag and view count of one pool block (see the module doc).
#[derive(Debug)]
pub struct Handoff {
    state: AtomicUsize,
}

/// What [`Handoff::enter_view`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ViewEntry {
    /// The view may read the block until it calls [`Handoff::leave_view`].
    Granted,
    /// The block was freed: no view. `free_now`: this caller must free the block (its
    /// brief count was the last thing holding it).
    Refused {
        /// Whether the caller must free the block now.
        free_now: bool,
    },
}

impl Handoff {
    /// A live block with no views.
    pub fn new() -> Handoff {
        Handoff {
            state: AtomicUsize::new(0),
        }
    }

    /// Whether the owner freed the block: one atomic load, the validity check's.
    #[inline(always)]
    pub fn is_freed(&self) -> bool {
        self.state.load(Ordering::Acquire) & FREED != 0
    }

    /// The owner frees the block: later checks and views are refused. `true`: no view is
    /// alive, free it now; `false`: the last view to leave frees it (or it was freed
    /// before).
    #[must_use]
    pub fn free(&self) -> bool {
        let before = self.state.fetch_or(FREED, Ordering::AcqRel);
        before & FREED == 0 && before / VIEW == 0 && self.claim()
    }

    /// A view asks to read the block without an epoch pin. Counted first, then the freed
    /// bit read from the same word: a free ordered before sees the count, one ordered
    /// after is seen.
    pub fn enter_view(&self) -> ViewEntry {
        let before = self.state.fetch_add(VIEW, Ordering::AcqRel);
        if before & FREED == 0 {
            ViewEntry::Granted
        } else {
            ViewEntry::Refused {
                free_now: self.leave_view(),
            }
        }
    }

    /// A view (granted, or refused by [`Handoff::enter_view`]) is gone. `true`: it was the
    /// last thing holding a freed block, free it now.
    #[must_use]
    pub fn leave_view(&self) -> bool {
        let before = self.state.fetch_sub(VIEW, Ordering::AcqRel);
        before / VIEW == 1 && before & FREED != 0 && self.claim()
    }

    /// The last reference to the block is gone (no view can exist: views borrow one).
    /// `true`: nobody freed it yet, free it now.
    #[must_use]
    pub fn last_reference_dropped(&self) -> bool {
        self.claim()
    }

    /// Takes the right to free the block; `true` exactly once.
    fn claim(&self) -> bool {
        self.state.fetch_or(CLAIMED, Ordering::AcqRel) & CLAIMED == 0
    }
}

impl Default for Handoff {
    fn default() -> Handoff {
        Handoff::new()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn free_without_views_frees_now_and_only_once() {
        let h = Handoff::new();
        assert!(!h.is_freed());
        assert!(h.free());
        assert!(h.is_freed());
        assert!(!h.free(), "a second free is not a second release");
        assert!(!h.last_reference_dropped());
    }

    #[test]
    fn a_view_defers_the_free_to_its_leaving() {
        let h = Handoff::new();
        assert_eq!(h.enter_view(), ViewEntry::Granted);
        assert!(!h.free(), "a view is alive");
        assert!(h.is_freed());
        assert_eq!(h.enter_view(), ViewEntry::Refused { free_now: false });
        assert!(h.leave_view(), "the last view frees");
        assert!(!h.last_reference_dropped());
    }

    #[test]
    fn an_unfreed_block_is_released_by_its_last_reference() {
        let h = Handoff::new();
        assert_eq!(h.enter_view(), ViewEntry::Granted);
        assert!(!h.leave_view(), "not freed: the view leaving frees nothing");
        assert!(h.last_reference_dropped());
        assert!(!h.free(), "already released");
    }
}
