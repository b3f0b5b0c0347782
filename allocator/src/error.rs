//! Error values of the allocator crate: configuration mistakes and failed allocations.
//!
//! Every message names what was wrong and what the user can change; nothing here panics.

use std::fmt;

/// A value in the configuration (an environment variable or a builder call) is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not a size (`123`, `64K`, `512M`, `8G`, `1T`, `50%`).
    #[error("{variable}={value:?} is not a valid size: {reason} (expected e.g. 1048576, 64K, 512M, 8GiB, 1T or 50%)")]
    InvalidSize {
        /// The variable or setting that held the value.
        variable: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A value that parses but cannot be used (an invalid combination, a bad mode name, ...).
    #[error("{variable}: {message}")]
    Invalid {
        /// The variable or setting concerned.
        variable: String,
        /// What is wrong with it and what would be accepted.
        message: String,
    },
}

/// Which memory an error is about: host memory or the memory of GPU `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host ("off-heap") memory held by the native pool.
    Host,
    /// Memory of the GPU with this ordinal.
    Device(u32),
}

impl MemoryKind {
    /// The budget's name in messages: `off-heap` for the host pool, `device` for a GPU.
    pub fn budget(&self) -> &'static str {
        match self {
            MemoryKind::Host => "off-heap",
            MemoryKind::Device(_) => "device",
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Host => f.write_str("[HOST]"),
            MemoryKind::Device(n) => write!(f, "[DEVICE {n}]"),
        }
    }
}

/// What holds the bytes of a budget when an allocation fails, so the user knows what to free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Holders {
    /// Bytes of workspace buffers and their spills.
    pub workspaces: usize,
    /// Bytes of tensors outside workspaces.
    pub tensors: usize,
    /// Bytes of host mirrors of device buffers.
    pub mirrors: usize,
    /// Bytes allocated without a more specific purpose.
    pub other: usize,
    /// Freed blocks the pool keeps for reuse (released before an allocation fails).
    pub cached: usize,
}

impl fmt::Display for Holders {
    /// A host pool's holders; [`Holders::of`] words them for a device.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, MemoryKind::Host)
    }
}

impl Holders {
    /// The holders of `kind`'s budget: a host pool's mirror bytes are host copies of device
    /// buffers (`host mirrors`), a device's are the mirrors' device sides (`mirror device
    /// sides`).
    pub fn of(&self, kind: MemoryKind) -> impl fmt::Display + '_ {
        struct Of<'a>(&'a Holders, MemoryKind);
        impl fmt::Display for Of<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, self.1)
            }
        }
        Of(self, kind)
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, kind: MemoryKind) -> fmt::Result {
        write!(
            f,
            "workspaces {}, tensors {}, cached {}",
            ByteSize(self.workspaces),
            ByteSize(self.tensors),
            ByteSize(self.cached)
        )?;
        if self.mirrors > 0 {
            let label = match kind {
                MemoryKind::Host => "host mirrors",
                MemoryKind::Device(_) => "mirror device sides",
            };
            write!(f, ", {label} {}", ByteSize(self.mirrors))?;
        }
        if self.other > 0 {
            write!(f, ", other {}", ByteSize(self.other))?;
        }
        Ok(())
    }
}

/// An allocation that could not be served. Nothing was allocated and no counter changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The budget (`NDMEM_MAX_BYTES`, or a device budget) would be exceeded. With a
    /// [`report`](AllocError::OutOfMemory::report) attached, the message is the report's.
    #[error("{}", OomMessage::of(.kind, (.requested, .needed), .thread, .used, .limit, .holders, .variable, .report))]
    OutOfMemory {
        /// Host or device memory.
        kind: MemoryKind,
        /// Bytes asked for.
        requested: usize,
        /// Bytes the request would count against the limit: `requested` rounded up to the
        /// block that serves it (its size class, or whole pages); the message names it
        /// when it is more than `requested`, since that is what did not fit.
        needed: usize,
        /// OS thread id of the requesting thread.
        thread: u64,
        /// Bytes counted against the limit when the request failed.
        used: usize,
        /// The limit in bytes.
        limit: usize,
        /// What holds the used bytes.
        holders: Holders,
        /// The variable (or setting) that raises the limit.
        variable: &'static str,
        /// What the runtime above the pool found when it refused (ndmem attaches its
        /// out-of-memory report: the largest holders and what to do); `None` from the pool
        /// itself.
        report: Option<AttachedReport>,
    },
    /// The resident set size of the process would pass `NDMEM_MAX_PHYSICAL_BYTES`.
    #[error("Can't allocate {kind} memory: {requested} bytes; threadId: {thread}; physical memory (RSS) {rss} of {limit} limit in use; raise {variable} or free memory",
        rss = ByteSize(*.rss), limit = ByteSize(*.limit))]
    PhysicalLimit {
        /// Host or device memory.
        kind: MemoryKind,
        /// Bytes asked for.
        requested: usize,
        /// OS thread id of the requesting thread.
        thread: u64,
        /// Resident set size of the process when the request failed.
        rss: usize,
        /// The physical limit in bytes.
        limit: usize,
        /// The variable (or setting) that raises the limit.
        variable: &'static str,
    },
    /// The size or alignment cannot be served at all.
    #[error("invalid allocation of {size} bytes aligned to {align}: {reason}")]
    InvalidLayout {
        /// Bytes asked for.
        size: usize,
        /// Alignment asked for.
        align: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A new limit is below what is already held against the old one: in use, and for the
    /// heap also each thread's cell (at most 128 KiB a thread, which only that thread can
    /// give back; an exited thread has given its back).
    #[error(
        "cannot set {what} to {limit} bytes: {used} bytes are already in use or held against it{}",
        held_note(what)
    )]
    LimitBelowUse {
        /// The limit being changed.
        what: &'static str,
        /// The rejected limit.
        limit: usize,
        /// Bytes in use or held against the limit.
        used: usize,
    },
    /// The operating system refused memory although the budget allowed it.
    #[error("Can't allocate {kind} memory: {requested} bytes; the operating system refused (errno {errno})")]
    Os {
        /// Host or device memory.
        kind: MemoryKind,
        /// Bytes asked for.
        requested: usize,
        /// The `errno` the OS returned.
        errno: i32,
    },
    /// A reclaimer registered with the pool panicked while the pool relieved a limit for
    /// this request; the panic was caught and nothing was allocated.
    #[error("Can't allocate {kind} memory: {requested} bytes; a reclaimer registered with the pool panicked: {message}")]
    ReclaimerPanicked {
        /// Host or device memory.
        kind: MemoryKind,
        /// Bytes asked for.
        requested: usize,
        /// The reclaimer's panic message.
        message: String,
    },
    /// The pool's configuration (its environment variables) is invalid.
    #[error("the memory pool is not configured: {0}")]
    Config(#[from] ConfigError),
}

impl AllocError {
    /// The bytes asked for, if this is a refusal at a limit: the off-heap limit
    /// ([`AllocError::OutOfMemory`], a host pool's or a device's) or the physical limit
    /// ([`AllocError::PhysicalLimit`]), the refusals a smaller request, freed memory or a
    /// higher limit can cure; `None` for every other error.
    pub fn refused_at_limit(&self) -> Option<usize> {
        match self {
            AllocError::OutOfMemory { requested, .. }
            | AllocError::PhysicalLimit { requested, .. } => Some(*requested),
            _ => None,
        }
    }
}

/// The message of [`AllocError::OutOfMemory`]: its attached report's, or one line.
struct OomMessage<'a> {
    kind: MemoryKind,
    requested: usize,
    needed: usize,
    thread: u64,
    used: usize,
    limit: usize,
    holders: &'a Holders,
    variable: &'static str,
    report: Option<&'a AttachedReport>,
}

impl<'a> OomMessage<'a> {
    #[allow(clippy::too_many_arguments)] // the variant's fields, as thiserror passes them
    fn of(
        kind: &MemoryKind,
        (requested, needed): (&usize, &usize),
        thread: &u64,
        used: &usize,
        limit: &usize,
        holders: &'a Holders,
        variable: &&'static str,
        report: &'a Option<AttachedReport>,
    ) -> OomMessage<'a> {
        OomMessage {
            kind: *kind,
            requested: *requested,
            needed: *needed,
            thread: *thread,
            used: *used,
            limit: *limit,
            holders,
            variable,
            report: report.as_ref(),
        }
    }
}

/// The bytes of a refused request as a refusal's message opens with them: `1000000 bytes`,
/// and the block that would have served it when that is larger (`1000000 bytes (a block of
/// 1.00 MiB)`), since the block's bytes are what did not fit. The fields are
/// [`AllocError::OutOfMemory`]'s `requested` and `needed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestedBytes(pub usize, pub usize);

impl fmt::Display for RequestedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)?;
        if self.1 > self.0 {
            write!(f, " (a block of {})", ByteSize(self.1))?;
        }
        Ok(())
    }
}

/// The `variable` of a device's [`AllocError::OutOfMemory`] when the driver, not the
/// device's budget, refused for want of memory: there is no limit of ndmem's to raise, and
/// `limit` is the device's memory.
pub const DRIVER_REFUSED: &str = "the device's memory (the driver had none left)";

impl fmt::Display for OomMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(report) = self.report {
            return write!(f, "{}", report.0);
        }
        if self.variable == DRIVER_REFUSED {
            return write!(
                f,
                "Can't allocate {} memory: {}; threadId: {}; the driver had no device memory \
                 left ({} of {} in use, by this process's pool ({}) and whatever else uses \
                 the device); free device memory",
                self.kind,
                RequestedBytes(self.requested, self.needed),
                self.thread,
                ByteSize(self.used),
                ByteSize(self.limit),
                self.holders.of(self.kind),
            );
        }
        write!(
            f,
            "Can't allocate {} memory: {}; threadId: {}; {} {} of {} limit in use ({}); \
             raise {} or free memory (close scopes, detach fewer tensors, destroy unused \
             workspaces)",
            self.kind,
            RequestedBytes(self.requested, self.needed),
            self.thread,
            self.kind.budget(),
            ByteSize(self.used),
            ByteSize(self.limit),
            self.holders.of(self.kind),
            self.variable
        )
    }
}

/// A report a runtime above the pool attaches to a refusal at a limit
/// ([`AllocError::OutOfMemory::report`]): its `Display` becomes the error's message. `ndmem`
/// attaches its `stats::OomReport` (the largest holders, the bytes held for reuse, what to
/// do); [`AttachedReport::downcast_ref`] gets it back.
pub trait OomDetail: fmt::Display + fmt::Debug + Send + Sync + 'static {
    /// The report as `Any`, for [`AttachedReport::downcast_ref`].
    fn as_any(&self) -> &dyn std::any::Any;
}

/// An [`OomDetail`] shared by the clones of the error it is attached to. Two are equal
/// when they are the same report or print the same.
#[derive(Clone)]
pub struct AttachedReport(std::sync::Arc<dyn OomDetail>);

impl AttachedReport {
    /// Attaches `report`.
    pub fn new(report: impl OomDetail) -> AttachedReport {
        AttachedReport(std::sync::Arc::new(report))
    }

    /// The report, if it is a `T`.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
}

impl fmt::Debug for AttachedReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for AttachedReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for AttachedReport {
    fn eq(&self, other: &AttachedReport) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for AttachedReport {}

/// A byte count printed the way people read it: `512 B`, `64.0 KiB`, `1.50 GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        // Decide on the value as printed: 1023.96 KiB would print as "1024.0 KiB", and
        // 9.996 KiB as "10.00 KiB".
        if value >= 1023.95 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        let decimals = if value < 9.995 { 2 } else { 1 };
        write!(f, "{value:.decimals$} {}", UNITS[unit])
    }
}

/// What [`AllocError::LimitBelowUse`] adds for `what`: where the heap's held bytes are.
fn held_note(what: &str) -> &'static str {
    if what == HEAP_LIMIT {
        " (live bytes, and the threads' cells of at most 128 KiB each, which each thread \
         spends before it takes more)"
    } else {
        ""
    }
}

/// The `what` of the heap's [`AllocError::LimitBelowUse`].
pub(crate) const HEAP_LIMIT: &str = "the heap limit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_size_reads_like_a_person_writes() {
        assert_eq!(ByteSize(512).to_string(), "512 B");
        assert_eq!(ByteSize(64 << 10).to_string(), "64.0 KiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.50 GiB");
        assert_eq!(ByteSize(8 << 30).to_string(), "8.00 GiB");
        // Rounding never prints 1024 of a unit, nor 10.00.
        assert_eq!(ByteSize((1 << 20) - 1).to_string(), "1.00 MiB");
        assert_eq!(ByteSize((1 << 30) - (1 << 10)).to_string(), "1.00 GiB");
        assert_eq!(ByteSize(1023 << 10).to_string(), "1023.0 KiB");
        assert_eq!(ByteSize(10 * 1024 - 1).to_string(), "10.0 KiB");
        assert_eq!(ByteSize(10 * 1024 - 10).to_string(), "9.99 KiB");
    }

    #[test]
    fn memory_kind_prints_nd4j_tags() {
        assert_eq!(MemoryKind::Host.to_string(), "[HOST]");
        assert_eq!(MemoryKind::Device(1).to_string(), "[DEVICE 1]");
    }
}
