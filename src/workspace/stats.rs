//! The figures of one workspace (semantics §2.5), and their printed form.
//!
//! Invariant: a [`WorkspaceStats`] is a snapshot, a plain value detached from the workspace:
//! reading or keeping one never affects the workspace.

use std::fmt;

use ndmem_alloc::ByteSize;

/// Figures of one workspace (semantics §2.5).
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Bytes of spills a circular workspace keeps for later cycles (ND4J's pinned allocations).
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
            if self.circular {
                format!(", circular ({} slots)", self.slots)
            } else {
                String::new()
            },
        )
    }
}
