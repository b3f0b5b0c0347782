//! The figures of one workspace (semantics §2.5), and their printed form.
//!
//! Invariant: a [`WorkspaceStats`] is a snapshot, a plain value detached from the workspace:
//! reading or keeping one never affects the workspace. The same figures ([`Figures`]) feed
//! the per-thread statistics, the copy published for other threads ([`Published`]) and
//! `ndmem::stats::snapshot` (semantics §7).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use ndmem_alloc::ByteSize;

use crate::memory::MemorySource;

/// Figures of one workspace (semantics §2.5).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WorkspaceStats {
    /// The workspace id.
    pub id: String,
    /// Bytes of the buffer (what the pool or the mapped file really holds), 0 before learning.
    pub size: usize,
    /// Bytes bumped this cycle, alignment padding included, spills excluded (0 when closed).
    pub used: usize,
    /// The largest cycle seen: bumped plus spilled bytes.
    pub max_cycle: usize,
    /// Bytes spilled this cycle (0 when closed: BlockLeft frees them at cycle end).
    pub spilled_bytes: usize,
    /// Bytes of spills a circular workspace keeps for later cycles (ND4J's pinned
    /// allocations): the capacities (size classes) of the pool blocks they hold, where
    /// `spilled_bytes` counts the padded requests.
    pub pinned_bytes: usize,
    /// Bytes spilled over the workspace's life.
    pub total_spilled_bytes: u64,
    /// Cycles completed.
    pub cycles: u64,
    /// Cycles started (the generation of the current or last cycle).
    pub generation: u64,
    /// Whether a cycle is running.
    pub open: bool,
    /// Whether the workspace is circular ([`crate::ResetPolicy::EndOfBuffer`]).
    pub circular: bool,
    /// Slots of a circular workspace's ring (0 for others, or before the ring exists).
    pub slots: usize,
}

impl fmt::Display for WorkspaceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] size {}, used {}, max cycle {}, spilled {}, pinned {}, cycles {}, generation {}{}{}",
            self.id,
            ByteSize(self.size),
            ByteSize(self.used),
            ByteSize(self.max_cycle),
            ByteSize(self.spilled_bytes),
            ByteSize(self.pinned_bytes),
            self.cycles,
            self.generation,
            if self.open { ", open" } else { "" },
            if self.circular && self.slots == 0 {
                ", circular (slots not learned yet)".to_string()
            } else if self.circular {
                format!(", circular ({} slots)", self.slots)
            } else {
                String::new()
            },
        )
    }
}

/// The figures of a [`WorkspaceStats`] without its id: what an arena reads from its cells
/// (no allocation), publishes for other threads ([`Published`]) and prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) size: usize,
    pub(crate) used: usize,
    pub(crate) max_cycle: usize,
    pub(crate) spilled_bytes: usize,
    pub(crate) pinned_bytes: usize,
    pub(crate) total_spilled_bytes: u64,
    pub(crate) cycles: u64,
    pub(crate) generation: u64,
    pub(crate) open: bool,
    pub(crate) circular: bool,
    pub(crate) slots: usize,
}

impl Figures {
    /// The statistics of the workspace `id` with these figures.
    pub(crate) fn named(self, id: &str) -> WorkspaceStats {
        WorkspaceStats {
            id: id.to_string(),
            size: self.size,
            used: self.used,
            max_cycle: self.max_cycle,
            spilled_bytes: self.spilled_bytes,
            pinned_bytes: self.pinned_bytes,
            total_spilled_bytes: self.total_spilled_bytes,
            cycles: self.cycles,
            generation: self.generation,
            open: self.open,
            circular: self.circular,
            slots: self.slots,
        }
    }
}

/// A workspace's figures as last published by its thread (at creation and every leave,
/// the generation and `open` at every enter; semantics §7), readable from any thread. Publishing is a handful of relaxed
/// stores: no lock and no allocation, and nothing on the bump path.
#[derive(Debug)]
pub(crate) struct Published {
    id: String,
    thread: String,
    /// The owning thread, to tell its entries from other threads'.
    owner: std::thread::ThreadId,
    /// The workspace's memory source.
    source: MemorySource,
    words: [AtomicU64; 11],
}

impl Published {
    pub(crate) fn new(id: &str, source: MemorySource) -> Published {
        let current = std::thread::current();
        let thread = match current.name() {
            Some(name) => format!("{name} ({:?})", current.id()),
            None => format!("{:?}", current.id()),
        };
        Published {
            id: id.to_string(),
            thread,
            owner: current.id(),
            source,
            words: Default::default(),
        }
    }

    /// The thread that owns the workspace, as `name (ThreadId(n))`.
    pub(crate) fn thread(&self) -> &str {
        &self.thread
    }

    /// Whether the calling thread owns the workspace (its figures are then exact).
    pub(crate) fn is_this_threads(&self) -> bool {
        self.owner == std::thread::current().id()
    }

    /// The workspace's memory source.
    pub(crate) fn source(&self) -> MemorySource {
        self.source
    }

    /// Publishes `f` (relaxed: a reader may see one publication's figures mixed with the
    /// next one's, never torn words).
    pub(crate) fn store(&self, f: &Figures) {
        let values = [
            f.size as u64,
            f.used as u64,
            f.max_cycle as u64,
            f.spilled_bytes as u64,
            f.pinned_bytes as u64,
            f.total_spilled_bytes,
            f.cycles,
            f.generation,
            u64::from(f.open),
            u64::from(f.circular),
            f.slots as u64,
        ];
        for (word, value) in self.words.iter().zip(values) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Publishes that a cycle of `generation` runs (entering: two stores; the rest of
    /// the figures are those of the last full publication).
    pub(crate) fn store_entered(&self, generation: u64) {
        self.words[7].store(generation, Ordering::Relaxed);
        self.words[8].store(1, Ordering::Relaxed);
    }

    /// The figures as last published.
    pub(crate) fn load(&self) -> WorkspaceStats {
        let w = |i: usize| self.words[i].load(Ordering::Relaxed);
        Figures {
            size: w(0) as usize,
            used: w(1) as usize,
            max_cycle: w(2) as usize,
            spilled_bytes: w(3) as usize,
            pinned_bytes: w(4) as usize,
            total_spilled_bytes: w(5),
            cycles: w(6),
            generation: w(7),
            open: w(8) != 0,
            circular: w(9) != 0,
            slots: w(10) as usize,
        }
        .named(&self.id)
    }
}
