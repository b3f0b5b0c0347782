//! The state word a workspace shares with every validity stamp of its memory (semantics
//! §3): `generation << 2 | DESTROYED | OPEN` in one `AtomicU64`.
//!
//! Invariant: only the owner thread writes the word, with `Release`, and readers load it
//! with `Acquire`; so a thread whose load sees a state sees everything the owner wrote
//! before it opened, closed or destroyed that cycle, and no reader sees the generation go
//! back or a destroyed workspace open again. The loom models in `loom-tests/` check this.
//!
//! This file depends on `crate::sync` alone, so that under `--cfg ndmem_loom` it compiles
//! by itself as `ndmem::workspace_state` (its items are `pub` for those models).

#![cfg_attr(not(ndmem_loom), allow(unreachable_pub))]

use crate::sync::{AtomicU64, Ordering};

/// The bit set while a cycle runs.
pub const OPEN: u64 = 1;
/// The bit set, for good, once the workspace is destroyed.
pub const DESTROYED: u64 = 2;
/// Where the generation starts in the word.
pub const GENERATION_SHIFT: u32 = 2;

/// The word of cycle `generation` while it runs: what a stamp of its memory expects.
#[inline(always)]
pub const fn opened(generation: u64) -> u64 {
    generation << GENERATION_SHIFT | OPEN
}

/// The generation in a state word.
#[inline(always)]
pub const fn generation_of(word: u64) -> u64 {
    word >> GENERATION_SHIFT
}

/// A workspace's lifecycle state, shared with its stamps.
#[derive(Debug)]
pub struct StateWord(AtomicU64);

impl StateWord {
    /// A new workspace: closed, generation 0.
    pub fn new() -> StateWord {
        StateWord(AtomicU64::new(0))
    }

    /// Marks the start of cycle `generation` (owner thread only).
    pub fn open(&self, generation: u64) {
        self.0.store(opened(generation), Ordering::Release);
    }

    /// Marks the end of cycle `generation` (owner thread only).
    pub fn close(&self, generation: u64) {
        self.0
            .store(generation << GENERATION_SHIFT, Ordering::Release);
    }

    /// Marks the workspace destroyed, for good (owner thread only).
    pub fn destroy(&self) {
        // Only the owner thread writes the word, so load-then-store loses nothing.
        let word = self.0.load(Ordering::Relaxed);
        self.0.store((word | DESTROYED) & !OPEN, Ordering::Release);
    }

    /// The word now, from any thread.
    #[inline(always)]
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl Default for StateWord {
    fn default() -> StateWord {
        StateWord::new()
    }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_word_follows_the_lifecycle_and_destroy_is_final() {
        let word = StateWord::new();
        assert_eq!(word.load(), 0);
        word.open(3);
        assert_eq!(word.load(), opened(3));
        assert_eq!(generation_of(word.load()), 3);
        word.close(3);
        assert_eq!(word.load() & OPEN, 0);
        word.open(4);
        word.destroy();
        assert_eq!(word.load(), 4 << GENERATION_SHIFT | DESTROYED);
    }
}
