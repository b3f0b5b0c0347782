//! The printed forms of the snapshot (semantics §7): `Display` for each part, a few lines
//! each, and the whole [`Snapshot`] as one table in the manner of PyTorch's
//! `memory_summary()`: a row per budget (current, peak, allocated, freed), then the
//! workspaces and the scopes.
//!
//! Invariant: printing reads only the snapshot; it never touches a live counter.

use std::fmt;

use ndmem_alloc::ByteSize;

use super::{
    BudgetCounters, DeviceSnapshot, PoolSnapshot, Reclamation, ScopeSnapshot, Snapshot, Stat,
    TraceState, WorkspaceEntry,
};
use crate::device::DeviceStats;

/// Characters of the label column of a budget row.
const LABEL: usize = 30;
/// The narrowest a figure column is; a wider figure widens all four.
const MIN_CELL: usize = 11;
/// The heap row when no [`ndmem_alloc::Tracking`] is the global allocator.
const HEAP_UNTRACKED_LABEL: &str = "heap bytes (not tracked)";
const HEAP_UNTRACKED_HINT: &str = "install ndmem_alloc::Tracking as #[global_allocator]";

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
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('~');
        cut
    }
}

/// A budget row's label, `what [name] figure`, within [`LABEL`] characters: a long name is
/// cut (marked `~`), never the figure's word, so the rows of one name stay apart.
fn named(what: &str, name: &str, figure: &str) -> String {
    let frame = what.chars().count() + figure.chars().count() + "[] ".len() + 1;
    format!(
        "{what} [{}] {figure}",
        fit(name, LABEL.saturating_sub(frame).max(2))
    )
}

/// What the budget part of the table holds in a row beside its label.
enum Figures {
    /// Four figures, one a column.
    Cells([String; 4]),
    /// One text across the four figure columns.
    Span(String),
}

/// The widths of the summary table, derived from the figures it prints, so that every
/// line (borders, budget rows, text lines) comes out equally wide.
#[derive(Clone, Copy)]
struct Table {
    /// Characters of each of the four figure columns.
    cell: usize,
}

impl Table {
    /// The table for these budget rows: each figure column as wide as the widest figure,
    /// at least [`MIN_CELL`].
    fn for_rows(rows: &[(String, Figures)]) -> Table {
        let cell = rows
            .iter()
            .filter_map(|(_, figures)| match figures {
                Figures::Cells(cells) => cells.iter().map(|c| c.chars().count()).max(),
                Figures::Span(_) => None,
            })
            .fold(MIN_CELL, usize::max);
        Table { cell }
    }

    /// Characters between the `| ` and the ` |` of every line.
    fn inner(self) -> usize {
        LABEL + 4 * (" | ".len() + self.cell)
    }

    /// Characters the four figure columns and the three separators between them take.
    fn span(self) -> usize {
        4 * self.cell + 3 * " | ".len()
    }

    /// A border: `|`, `fill` across, `|`.
    fn rule(self, fill: char) -> String {
        let fill: String = std::iter::repeat(fill).take(self.inner() + 2).collect();
        format!("|{fill}|")
    }

    /// A border line.
    fn border(self, f: &mut fmt::Formatter<'_>, fill: char) -> fmt::Result {
        writeln!(f, "{}", self.rule(fill))
    }

    /// One budget row: a label and its figures.
    fn row(self, f: &mut fmt::Formatter<'_>, label: &str, figures: &Figures) -> fmt::Result {
        write!(f, "| {:<LABEL$} |", fit(label, LABEL))?;
        match figures {
            Figures::Cells(cells) => {
                for cell in cells {
                    write!(f, " {:>width$} |", fit(cell, self.cell), width = self.cell)?;
                }
                writeln!(f)
            }
            Figures::Span(text) => {
                writeln!(
                    f,
                    " {:<width$} |",
                    fit(text, self.span()),
                    width = self.span()
                )
            }
        }
    }

    /// One line of text across the table, cut to fit.
    fn line(self, f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
        writeln!(
            f,
            "| {:<width$} |",
            fit(text, self.inner()),
            width = self.inner()
        )
    }
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
        match &self.config_error {
            Some(error) => write!(f, "[{}] unusable: {error}", self.name),
            None => write!(f, "[{}] {}", self.name, self.stats),
        }
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

impl fmt::Display for DeviceStats {
    /// Three lines: held against the limit, driver and pinned memory, transfers.
    ///
    /// ```text
    /// device: used 3.00 MiB of 8.00 GiB (live 2.00 MiB, cached 1.00 MiB), peak live 2.50 MiB
    ///   driver allocations 4, frees 1, pool hits 20; pinned 64.0 KiB in 2 allocations; deferred 0 B
    ///   transfers 3 in (12.0 KiB), 2 out (8.00 KiB), 0 on device (0 B); staged 4.00 KiB; synchronizations 5
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "device: used {} of {} (live {}, cached {}), peak live {}",
            ByteSize(self.used_bytes),
            limit(self.limit),
            ByteSize(self.live_bytes),
            ByteSize(self.cached_bytes),
            ByteSize(self.peak_live_bytes)
        )?;
        writeln!(
            f,
            "  driver allocations {}, frees {}, pool hits {}; pinned {} in {} allocations; \
             deferred {}",
            self.driver_allocations,
            self.driver_frees,
            self.pool_hits,
            ByteSize(self.pinned_bytes),
            self.pinned_allocations,
            ByteSize(self.deferred_bytes)
        )?;
        write!(
            f,
            "  transfers {} in ({}), {} out ({}), {} on device ({}); staged {}; \
             synchronizations {}",
            self.htod_transfers,
            bytes(self.htod_bytes),
            self.dtoh_transfers,
            bytes(self.dtoh_bytes),
            self.dtod_transfers,
            bytes(self.dtod_bytes),
            bytes(self.staged_bytes),
            self.synchronizations
        )
    }
}

impl fmt::Display for DeviceSnapshot {
    /// `[sim:0] simulated device` and the device's figures ([`DeviceStats`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}\n{}", self.id, self.name, self.stats)
    }
}

impl fmt::Display for TraceState {
    /// `trace: on, ring of 65536 events, 0 dropped`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trace: {}, ring of {} events, {} dropped",
            if self.on { "on" } else { "off" },
            self.capacity,
            self.dropped
        )
    }
}

impl Snapshot {
    /// The budget rows of the summary: the heap, each pool and each device.
    fn budget_rows(&self) -> Vec<(String, Figures)> {
        let mut rows = Vec::new();
        if !self.heap_tracked {
            // Every heap figure is 0 without the tracking allocator: say why.
            rows.push((
                HEAP_UNTRACKED_LABEL.to_string(),
                Figures::Span(HEAP_UNTRACKED_HINT.to_string()),
            ));
        }
        let mut cells =
            |label: String, cells: [String; 4]| rows.push((label, Figures::Cells(cells)));
        if self.heap_tracked {
            cells("heap bytes".into(), byte_cells(&self.heap_counters.bytes));
            if let Some(count) = &self.heap_counters.count {
                cells("heap allocations".into(), count_cells(count));
            }
        }
        for pool in &self.pools {
            let c = &pool.counters;
            cells(named("pool", &pool.name, "live"), byte_cells(&c.bytes));
            cells(
                named("pool", &pool.name, "live+cached"),
                reserved_cells(&c.reserved),
            );
            if let Some(count) = &c.count {
                cells(named("pool", &pool.name, "blocks"), count_cells(count));
            }
        }
        for d in &self.devices {
            let c = &d.counters;
            cells(named("device", &d.id, "live"), byte_cells(&c.bytes));
            cells(
                named("device", &d.id, "live+cached"),
                reserved_cells(&c.reserved),
            );
        }
        rows
    }
}

impl fmt::Display for Snapshot {
    /// The memory summary: one table, a row per budget (current, peak, allocated, freed,
    /// `-` where no peak is kept), then workspaces, scopes, reclamation and devices. Every
    /// line is equally wide: the figure columns widen to the widest figure. Without the
    /// tracking allocator the heap row says so instead of printing zeros.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.budget_rows();
        let table = Table::for_rows(&rows);
        table.border(f, '=')?;
        table.line(
            f,
            &format!("{:^width$}", "ndmem memory summary", width = table.inner()),
        )?;
        table.border(f, '=')?;
        table.row(
            f,
            "budget",
            &Figures::Cells([
                "current".into(),
                "peak".into(),
                "allocated".into(),
                "freed".into(),
            ]),
        )?;
        table.border(f, '-')?;
        for (label, figures) in &rows {
            table.row(f, label, figures)?;
        }
        table.border(f, '-')?;
        let mut limits = format!("limits: heap {}", limit(self.heap.limit));
        for pool in &self.pools {
            if let Some(error) = &pool.config_error {
                limits.push_str(&format!("; [{}] unusable: {error}", pool.name));
                continue;
            }
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
                "; [{}] {} (cached {}, driver calls {}/{}, retries {}, OOMs {}, \
                 transfers {}, pinned {})",
                d.id,
                limit(d.stats.limit),
                ByteSize(d.stats.cached_bytes),
                d.stats.driver_allocations,
                d.stats.driver_frees,
                d.counters.num_alloc_retries,
                d.counters.num_ooms,
                d.stats.transfers(),
                ByteSize(d.stats.pinned_bytes)
            ));
        }
        for chunk in wrap(&limits, table.inner()) {
            table.line(f, &chunk)?;
        }
        table.border(f, '-')?;
        table.line(
            f,
            &format!(
                "{:<30} {:>9} {:>9} {:>9} {:>9} {:>6}",
                "workspace (thread)", "size", "used", "max cycle", "spilled", "cycles"
            ),
        )?;
        if self.workspaces.is_empty() {
            table.line(f, "  (none)")?;
        }
        for w in &self.workspaces {
            let s = &w.stats;
            table.line(
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
        table.border(f, '-')?;
        for scope in &self.scopes {
            table.line(f, &scope.to_string())?;
        }
        table.border(f, '-')?;
        table.line(
            f,
            &format!(
                "{}; devices: {}; trace: {}",
                self.reclaim,
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
        // The last border without a newline after it.
        f.write_str(&table.rule('='))
    }
}

/// Splits `text` at `; ` so that each piece fits in `width` characters where possible.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in text.split("; ") {
        match out.last_mut() {
            Some(last) if last.chars().count() + 2 + part.chars().count() <= width => {
                last.push_str("; ");
                last.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;
    use ndmem_alloc::{HeapStats, PoolStats};

    fn snapshot(heap_tracked: bool, pool_counters: BudgetCounters) -> Snapshot {
        Snapshot {
            heap: HeapStats::default(),
            heap_tracked,
            heap_counters: BudgetCounters {
                count: Some(Stat::default()),
                ..BudgetCounters::default()
            },
            pools: vec![PoolSnapshot {
                name: "a pool whose name is longer than the label column".into(),
                stats: PoolStats::default(),
                counters: pool_counters,
                config_error: None,
            }],
            workspaces: Vec::new(),
            scopes: Vec::new(),
            devices: Vec::new(),
            reclaim: Reclamation::default(),
            trace: super::super::TraceState::default(),
        }
    }

    fn widths(summary: &str) -> Vec<usize> {
        summary.lines().map(|l| l.chars().count()).collect()
    }

    #[test]
    fn borders_rows_and_lines_are_equally_wide() {
        let summary = snapshot(true, BudgetCounters::default()).to_string();
        let widths = widths(&summary);
        assert!(widths.iter().all(|w| *w == widths[0]), "{summary}");
        assert_eq!(widths[0], 2 + LABEL + 4 * (3 + MIN_CELL) + 2, "{summary}");
        assert!(summary.contains("| heap allocations"), "{summary}");
    }

    #[test]
    fn a_long_pool_name_is_cut_so_its_rows_stay_apart() {
        let summary = snapshot(true, BudgetCounters::default()).to_string();
        let labels: Vec<&str> = summary
            .lines()
            .filter(|l| l.starts_with("| pool ["))
            .map(|l| l[2..2 + LABEL].trim_end())
            .collect();
        assert_eq!(labels.len(), 2, "{summary}");
        for (label, figure) in labels.iter().zip(["live", "live+cached"]) {
            assert!(label.starts_with("pool [a pool who"), "{label}");
            assert!(label.ends_with(&format!("~] {figure}")), "{label}");
        }
        assert_eq!(named("pool", "gpu", "live"), "pool [gpu] live");
    }

    #[test]
    fn a_figure_wider_than_its_column_widens_the_whole_table() {
        let huge = Stat {
            current: u64::MAX,
            peak: Some(u64::MAX),
            allocated: u64::MAX,
            freed: 0,
        };
        let counters = BudgetCounters {
            count: Some(huge),
            ..BudgetCounters::default()
        };
        let summary = snapshot(true, counters).to_string();
        assert!(summary.contains(&u64::MAX.to_string()), "{summary}");
        let widths = widths(&summary);
        assert!(widths.iter().all(|w| *w == widths[0]), "{summary}");
        let digits = u64::MAX.to_string().len();
        assert_eq!(widths[0], 2 + LABEL + 4 * (3 + digits) + 2, "{summary}");
    }

    #[test]
    fn an_untracked_heap_says_how_to_track_it() {
        let summary = snapshot(false, BudgetCounters::default()).to_string();
        let heap: Vec<&str> = summary
            .lines()
            .filter(|l| l.starts_with("| heap"))
            .collect();
        assert_eq!(heap.len(), 1, "{summary}");
        assert!(heap[0].contains(HEAP_UNTRACKED_LABEL), "{summary}");
        assert!(heap[0].contains(HEAP_UNTRACKED_HINT), "{summary}");
        let widths = widths(&summary);
        assert!(widths.iter().all(|w| *w == widths[0]), "{summary}");
    }
}
