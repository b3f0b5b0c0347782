//! The printed forms of the snapshot (semantics §7): `Display` for each part, a few lines
//! each, and the whole [`Snapshot`] as one table in the manner of PyTorch's
//! `memory_summary()`: a row per budget (current, peak, allocated, freed), then the
//! workspaces and the scopes.
//!
//! Invariant: printing reads only the snapshot; it never touches a live counter.

use std::fmt;

use ndmem_alloc::ByteSize;

use super::{
    BudgetCounters, PoolSnapshot, Reclamation, ScopeSnapshot, Snapshot, Stat, WorkspaceEntry,
};

const RULE: &str =
    "|-------------------------------------------------------------------------------------|";
const DOUBLE: &str =
    "|=====================================================================================|";

fn bytes(n: u64) -> String {
    ByteSize(usize::try_from(n).unwrap_or(usize::MAX)).to_string()
}

fn limit(limit: Option<usize>) -> String {
    limit.map_or_else(|| "unlimited".into(), |l| ByteSize(l).to_string())
}

/// Cuts `text` to `width` characters, marking the cut with `~`.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(width - 1).collect();
        cut.push('~');
        cut
    }
}

/// One table row: a label and four figures.
fn row(f: &mut fmt::Formatter<'_>, label: &str, cells: [String; 4]) -> fmt::Result {
    writeln!(
        f,
        "| {:<30} | {:>11} | {:>11} | {:>11} | {:>11} |",
        fit(label, 30),
        cells[0],
        cells[1],
        cells[2],
        cells[3]
    )
}

fn line(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    writeln!(f, "| {:<83} |", fit(text, 83))
}

fn byte_cells(s: &Stat) -> [String; 4] {
    [
        bytes(s.current),
        s.peak.map_or_else(|| "-".into(), bytes),
        bytes(s.allocated),
        bytes(s.freed),
    ]
}

/// Held bytes (live + cached): current and peak; no totals.
fn reserved_cells(s: &Stat) -> [String; 4] {
    [
        bytes(s.current),
        s.peak.map_or_else(|| "-".into(), bytes),
        "-".into(),
        "-".into(),
    ]
}

fn count_cells(s: &Stat) -> [String; 4] {
    [
        s.current.to_string(),
        s.peak.map_or_else(|| "-".into(), |p| p.to_string()),
        s.allocated.to_string(),
        s.freed.to_string(),
    ]
}

impl fmt::Display for Stat {
    /// `1.50 MiB (peak 2.00 MiB, allocated 10.0 MiB, freed 8.50 MiB)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [current, peak, allocated, freed] = byte_cells(self);
        write!(
            f,
            "{current} (peak {peak}, allocated {allocated}, freed {freed})"
        )
    }
}

impl fmt::Display for BudgetCounters {
    /// Two lines: bytes, then counts and limit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "live {}; held {} (peak {})",
            self.bytes,
            bytes(self.reserved.current),
            self.reserved.peak.map_or_else(|| "-".into(), bytes)
        )?;
        write!(
            f,
            "  allocations {} live ({} ever, {} freed), OS calls {}/{}, retries {}, OOMs {}, limit {}",
            self.count.map_or(0, |c| c.current),
            self.count.map_or(0, |c| c.allocated),
            self.count.map_or(0, |c| c.freed),
            self.os_allocations,
            self.os_frees,
            self.num_alloc_retries,
            self.num_ooms,
            limit(self.limit)
        )
    }
}

impl fmt::Display for PoolSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.name, self.stats)
    }
}

impl fmt::Display for WorkspaceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on thread {}", self.stats, self.thread)
    }
}

impl fmt::Display for ScopeSnapshot {
    /// `scope [model]: 2 tensors, 24 B (peak 24 B)`, indented by depth.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:indent$}{} [{}]: {} tensors, {} (peak {})",
            "",
            if self.depth == 0 { "root" } else { "scope" },
            self.name,
            self.tensors,
            ByteSize(self.bytes),
            ByteSize(self.peak_bytes),
            indent = self.depth * 2
        )?;
        if self.borrowed > 0 {
            write!(
                f,
                " (+{} borrowed, {})",
                self.borrowed,
                ByteSize(self.borrowed_bytes)
            )?;
        }
        if self.capped {
            f.write_str(" capped")?;
        }
        if self.closed {
            f.write_str(" closed")?;
        }
        Ok(())
    }
}

impl fmt::Display for Reclamation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pending reclamation {}", ByteSize(self.pending_bytes))
    }
}

impl fmt::Display for Snapshot {
    /// The memory summary: one table, a row per budget (current, peak, allocated, freed,
    /// `-` where no peak is kept), then workspaces, scopes, reclamation and devices.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{DOUBLE}")?;
        line(f, "                         ndmem memory summary")?;
        writeln!(f, "{DOUBLE}")?;
        row(
            f,
            "budget",
            [
                "current".into(),
                "peak".into(),
                "allocated".into(),
                "freed".into(),
            ],
        )?;
        writeln!(f, "{RULE}")?;
        row(f, "heap bytes", byte_cells(&self.heap_counters.bytes))?;
        if let Some(count) = &self.heap_counters.count {
            row(f, "heap allocations", count_cells(count))?;
        }
        for pool in &self.pools {
            let c = &pool.counters;
            row(
                f,
                &format!("pool [{}] live", pool.name),
                byte_cells(&c.bytes),
            )?;
            row(
                f,
                &format!("pool [{}] live+cached", pool.name),
                reserved_cells(&c.reserved),
            )?;
            if let Some(count) = &c.count {
                row(
                    f,
                    &format!("pool [{}] blocks", pool.name),
                    count_cells(count),
                )?;
            }
        }
        for d in &self.devices {
            let c = &d.counters;
            row(f, &format!("device [{}] live", d.id), byte_cells(&c.bytes))?;
            row(
                f,
                &format!("device [{}] live+cached", d.id),
                reserved_cells(&c.reserved),
            )?;
        }
        writeln!(f, "{RULE}")?;
        let mut limits = format!("limits: heap {}", limit(self.heap.limit));
        for pool in &self.pools {
            limits.push_str(&format!(
                "; [{}] {} (cached {}, OS calls {}/{}, retries {}, OOMs {})",
                pool.name,
                limit(pool.stats.limit_bytes),
                ByteSize(pool.stats.cached_bytes),
                pool.counters.os_allocations,
                pool.counters.os_frees,
                pool.counters.num_alloc_retries,
                pool.counters.num_ooms
            ));
        }
        for d in &self.devices {
            limits.push_str(&format!(
                "; [{}] {} (cached {}, driver calls {}/{}, transfers {}, pinned {})",
                d.id,
                limit(d.stats.limit),
                ByteSize(d.stats.cached_bytes),
                d.stats.driver_allocations,
                d.stats.driver_frees,
                d.stats.transfers(),
                ByteSize(d.stats.pinned_bytes)
            ));
        }
        for chunk in wrap(&limits, 83) {
            line(f, &chunk)?;
        }
        writeln!(f, "{RULE}")?;
        line(
            f,
            &format!(
                "{:<30} {:>9} {:>9} {:>9} {:>9} {:>6}",
                "workspace (thread)", "size", "used", "max cycle", "spilled", "cycles"
            ),
        )?;
        if self.workspaces.is_empty() {
            line(f, "  (none)")?;
        }
        for w in &self.workspaces {
            let s = &w.stats;
            line(
                f,
                &format!(
                    "{:<30} {:>9} {:>9} {:>9} {:>9} {:>6}",
                    fit(&format!("[{}] {}", s.id, w.thread), 30),
                    ByteSize(s.size).to_string(),
                    ByteSize(s.used).to_string(),
                    ByteSize(s.max_cycle).to_string(),
                    ByteSize(s.spilled_bytes + s.pinned_bytes).to_string(),
                    s.cycles
                ),
            )?;
        }
        writeln!(f, "{RULE}")?;
        for scope in &self.scopes {
            line(f, &scope.to_string())?;
        }
        writeln!(f, "{RULE}")?;
        line(
            f,
            &format!(
                "{}; devices: {}; trace: {}",
                self.reclamation,
                if self.devices.is_empty() {
                    "none open".to_string()
                } else {
                    self.devices.len().to_string()
                },
                if self.trace.on {
                    format!("on ({} events)", self.trace.capacity)
                } else {
                    "off".into()
                }
            ),
        )?;
        write!(f, "{DOUBLE}")
    }
}

/// Splits `text` at `; ` so that each piece fits in `width` characters where possible.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in text.split("; ") {
        match out.last_mut() {
            Some(last) if last.len() + 2 + part.len() <= width => {
                last.push_str("; ");
                last.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}
