//! The printed form of the allocator's statistics (semantics §7): a few readable lines
//! per value, with byte counts as people read them ([`ByteSize`]), instead of the
//! field-by-field `Debug` dump.
//!
//! Invariant: printing reads only the value printed; it never touches a live counter.

use std::fmt;

use crate::error::ByteSize;
use crate::pool::PoolStats;
#[cfg(not(ndmem_loom))]
use crate::tracking::HeapStats;

/// `Some(n)` as a byte size, `None` as `unlimited`.
pub(crate) struct Limit(pub(crate) Option<usize>);

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => ByteSize(n).fmt(f),
            None => f.write_str("unlimited"),
        }
    }
}

/// A `u64` byte total as a [`ByteSize`].
fn total(n: u64) -> ByteSize {
    ByteSize(usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(not(ndmem_loom))]
impl fmt::Display for HeapStats {
    /// Three lines: live/peak/limit, totals, counts.
    ///
    /// ```text
    /// heap: live 1.50 MiB, peak 2.00 MiB, limit unlimited (reserved 2.50 MiB)
    ///   allocated 10.0 MiB, freed 8.50 MiB
    ///   allocations 1200, frees 1100, reallocations 30, refused 0
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "heap: live {}, peak {}, limit {} (reserved {})",
            ByteSize(self.live_bytes),
            ByteSize(self.peak_bytes),
            Limit(self.limit),
            ByteSize(self.reserved_bytes)
        )?;
        writeln!(
            f,
            "  allocated {}, freed {}",
            total(self.total_allocated_bytes),
            total(self.total_freed_bytes)
        )?;
        write!(
            f,
            "  allocations {}, frees {}, reallocations {}, refused {}",
            self.allocations, self.deallocations, self.reallocations, self.failed_allocations
        )
    }
}

impl fmt::Display for PoolStats {
    /// Four lines: held against the limit, by use, totals, counts.
    ///
    /// ```text
    /// pool: used 12.0 MiB of 8.00 GiB (live 10.0 MiB, cached 2.00 MiB), peak used 14.0 MiB, peak live 11.0 MiB
    ///   tensors 4.00 MiB, workspaces 6.00 MiB, mirrors 0 B, other 0 B; RSS 120.0 MiB of unlimited
    ///   allocated 100.0 MiB, freed 90.0 MiB
    ///   allocations 420, frees 400, cache hits 380, OS allocations 40, OS frees 20, refused 0
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "pool: used {} of {} (live {}, cached {}), peak used {}, peak live {}",
            ByteSize(self.used_bytes),
            Limit(self.limit_bytes),
            ByteSize(self.live_bytes),
            ByteSize(self.cached_bytes),
            ByteSize(self.peak_used_bytes),
            ByteSize(self.peak_bytes)
        )?;
        writeln!(
            f,
            "  tensors {}, workspaces {}, mirrors {}, other {}; RSS {} of {}",
            ByteSize(self.tensor_bytes),
            ByteSize(self.workspace_bytes),
            ByteSize(self.mirror_bytes),
            ByteSize(self.other_bytes),
            ByteSize(self.physical_bytes),
            Limit(self.physical_limit_bytes)
        )?;
        writeln!(
            f,
            "  allocated {}, freed {}",
            total(self.total_allocated_bytes),
            total(self.total_freed_bytes)
        )?;
        write!(
            f,
            "  allocations {}, frees {}, cache hits {}, OS allocations {}, OS frees {}, refused {}",
            self.allocations,
            self.deallocations,
            self.cache_hits,
            self.os_allocations,
            self.os_frees,
            self.failed_allocations
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_stats_print_in_four_lines_with_units() {
        let stats = PoolStats {
            live_bytes: 10 << 20,
            cached_bytes: 2 << 20,
            used_bytes: 12 << 20,
            limit_bytes: Some(8 << 30),
            allocations: 420,
            ..PoolStats::default()
        };
        let text = stats.to_string();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            text.starts_with("pool: used 12.0 MiB of 8.00 GiB (live 10.0 MiB, cached 2.00 MiB)"),
            "{text}"
        );
        assert!(text.contains("allocations 420,"), "{text}");
    }

    #[test]
    fn heap_stats_print_unlimited_without_a_limit() {
        let text = HeapStats::default().to_string();
        assert!(
            text.starts_with("heap: live 0 B, peak 0 B, limit unlimited"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3);
    }
}
