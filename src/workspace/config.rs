//! Workspace configuration: the policies of semantics §2.1, a builder, and the
//! `NDMEM_WORKSPACES` debug mode.
//!
//! Invariant: a [`WorkspaceConfig`] value only exists if it passed [`WorkspaceConfigBuilder::build`]
//! (or is the default), so the arena never sees an invalid combination: sizes are ordered,
//! `overallocation_limit` is finite and non-negative, `alignment` is a power of two up to
//! 4096, mmap workspaces can be sized, and circular workspaces have a ring of at least
//! two slots when they overallocate, and at most [`MAX_RING_SLOTS`].

use std::path::PathBuf;
use std::sync::OnceLock;

use ndmem_alloc::ConfigError;

use super::sizing::Sizing;
pub use super::sizing::MAX_RING_SLOTS;
use crate::error::Error;
use crate::memory::MemorySource;

/// The environment variable selecting a workspace debug mode (semantics §2.5).
pub const ENV_WORKSPACES: &str = "NDMEM_WORKSPACES";

/// The largest workspace alignment (one page).
pub const MAX_ALIGNMENT: usize = 4096;

/// How a learned or initial buffer size is turned into the buffer that is allocated.
///
/// ND4J: `AllocationPolicy` (`STRICT`, `OVERALLOCATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllocationPolicy {
    /// Allocate exactly the learned or initial size. ND4J: `AllocationPolicy.STRICT`.
    Strict,
    /// Multiply the learned or initial size once by `1 + overallocation_limit`.
    /// ND4J: `AllocationPolicy.OVERALLOCATE`.
    #[default]
    Overallocate,
}

/// When a workspace that starts without a buffer learns its size (semantics §2.3).
///
/// ND4J: `LearningPolicy` (`FIRST_LOOP`, `OVER_TIME`, `NONE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LearningPolicy {
    /// After the first cycle. ND4J: `LearningPolicy.FIRST_LOOP`.
    #[default]
    FirstLoop,
    /// After `cycles_before_initialization` cycles (at least one), from the largest cycle
    /// seen. ND4J: `LearningPolicy.OVER_TIME`.
    OverTime,
    /// Never: the buffer keeps its initial size. ND4J: `LearningPolicy.NONE`.
    None,
}

/// What happens to a request that does not fit in the buffer (semantics §2.2).
///
/// ND4J: `SpillPolicy` (`EXTERNAL`, `REALLOCATE`, `FAIL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpillPolicy {
    /// Serve it from the pool for the rest of the cycle; the buffer keeps its size.
    /// ND4J: `SpillPolicy.EXTERNAL`.
    #[default]
    External,
    /// Serve it from the pool, and grow the buffer to the largest cycle when the cycle ends.
    /// ND4J: `SpillPolicy.REALLOCATE`.
    Reallocate,
    /// Refuse it with [`Error::WorkspaceFull`]. ND4J: `SpillPolicy.FAIL`.
    Fail,
}

/// Where the next cycle starts (semantics §2.2, §2.4).
///
/// ND4J: `ResetPolicy` (`BLOCK_LEFT`, `ENDOFBUFFER_REACHED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ResetPolicy {
    /// Every cycle rewinds to offset 0 and frees the previous cycle's spills.
    /// ND4J: `ResetPolicy.BLOCK_LEFT`.
    #[default]
    BlockLeft,
    /// The workspace is a ring of slots; a cycle's memory stays valid until the ring wraps
    /// over it. ND4J: `ResetPolicy.ENDOFBUFFER_REACHED` (a "circular" workspace).
    EndOfBuffer,
}

/// Where the buffer lives.
///
/// ND4J: `LocationPolicy` (`RAM`, `MMAP`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum LocationPolicy {
    /// A block of the native pool. ND4J: `LocationPolicy.RAM`.
    #[default]
    Ram,
    /// A memory-mapped file: a temporary file without a name (created in
    /// [`std::env::temp_dir`] and unlinked at once, freed by the system with its last
    /// mapping) for `path: None`, or the given file, created if needed, grown if smaller
    /// than the buffer and kept afterwards. ND4J: `LocationPolicy.MMAP`.
    ///
    /// The buffer is `initial_size` (x the overallocation factor) rounded up to whole pages;
    /// its bytes count against the pool's `max_bytes` like a pool block. Within a process a
    /// file (its device and inode, whatever name reaches it: a hard link is the same file)
    /// is mapped by one workspace at a time, and stays claimed for as long as any tensor or
    /// view can reach its bytes, even after its workspace is destroyed; another workspace
    /// asking for it gets [`Error::WorkspaceFile`]. Without an `initial_size` (which needs
    /// `LearningPolicy::None`) there is no file and every allocation spills to the pool.
    ///
    /// **The one way out of the safe API:** the mapping is shared with the file, so
    /// changing the file by other means while it is mapped (truncating it, with `std::fs`
    /// or otherwise, or writing it from another process) changes or removes memory that
    /// tensors are reading: a truncated file kills the process with `SIGBUS`. As with
    /// `memmap2`, this crate cannot prevent it; don't touch a mapped user file.
    Mmap {
        /// The file to map, or `None` for a temporary file.
        path: Option<PathBuf>,
    },
}

/// Which sides of a host/device pair a workspace buffer exists on (semantics §5; only
/// meaningful with a device).
///
/// ND4J: `MirroringPolicy` (`FULL`, `HOST_ONLY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MirroringPolicy {
    /// Host and device buffers, host copies made lazily. ND4J: `MirroringPolicy.FULL`.
    #[default]
    Full,
    /// Only (pinned) host memory. ND4J: `MirroringPolicy.HOST_ONLY`.
    HostOnly,
}

/// A validated workspace configuration (semantics §2.1). Build it with
/// [`WorkspaceConfig::builder`]; [`WorkspaceConfig::default`] holds the defaults.
///
/// ND4J: `WorkspaceConfiguration`.
///
/// ```
/// use ndmem::{WorkspaceConfig, SpillPolicy};
///
/// let cfg = WorkspaceConfig::builder()
///     .initial_size(1 << 20)
///     .policy_spill(SpillPolicy::Fail)
///     .build()?;
/// assert_eq!(cfg.initial_size(), 1 << 20);
/// assert!(WorkspaceConfig::builder().alignment(24).build().is_err());
/// # Ok::<(), ndmem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceConfig {
    initial_size: usize,
    min_size: usize,
    max_size: usize,
    overallocation_limit: f64,
    alignment: usize,
    policy_allocation: AllocationPolicy,
    policy_learning: LearningPolicy,
    cycles_before_initialization: u64,
    policy_spill: SpillPolicy,
    policy_reset: ResetPolicy,
    policy_location: LocationPolicy,
    policy_mirroring: MirroringPolicy,
    source: MemorySource,
}

impl Default for WorkspaceConfig {
    /// The defaults of semantics §2.1: no initial buffer, learned after the first loop,
    /// overallocated by 30%, 16-byte alignment, external spills, block-left reset, in RAM
    /// of the global pool.
    fn default() -> Self {
        WorkspaceConfig {
            initial_size: 0,
            min_size: 0,
            max_size: 0,
            overallocation_limit: 0.3,
            alignment: 16,
            policy_allocation: AllocationPolicy::Overallocate,
            policy_learning: LearningPolicy::FirstLoop,
            cycles_before_initialization: 0,
            policy_spill: SpillPolicy::External,
            policy_reset: ResetPolicy::BlockLeft,
            policy_location: LocationPolicy::Ram,
            policy_mirroring: MirroringPolicy::Full,
            source: MemorySource::global(),
        }
    }
}

impl WorkspaceConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> WorkspaceConfigBuilder {
        WorkspaceConfigBuilder {
            config: WorkspaceConfig::default(),
        }
    }

    /// A builder starting from this configuration (to derive a variant of it).
    pub fn to_builder(&self) -> WorkspaceConfigBuilder {
        WorkspaceConfigBuilder {
            config: self.clone(),
        }
    }

    /// Bytes of the buffer created with the workspace (before overallocation); 0: learned.
    pub fn initial_size(&self) -> usize {
        self.initial_size
    }

    /// Smallest learned buffer.
    pub fn min_size(&self) -> usize {
        self.min_size
    }

    /// Largest buffer; 0 means unbounded.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// The overallocation factor minus one (0.3 = 30% more).
    pub fn overallocation_limit(&self) -> f64 {
        self.overallocation_limit
    }

    /// The alignment every allocation's offset is rounded to (at least).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// See [`AllocationPolicy`].
    pub fn policy_allocation(&self) -> AllocationPolicy {
        self.policy_allocation
    }

    /// See [`LearningPolicy`].
    pub fn policy_learning(&self) -> LearningPolicy {
        self.policy_learning
    }

    /// Cycles [`LearningPolicy::OverTime`] waits before sizing the buffer (at least one).
    pub fn cycles_before_initialization(&self) -> u64 {
        self.cycles_before_initialization
    }

    /// See [`SpillPolicy`].
    pub fn policy_spill(&self) -> SpillPolicy {
        self.policy_spill
    }

    /// See [`ResetPolicy`].
    pub fn policy_reset(&self) -> ResetPolicy {
        self.policy_reset
    }

    /// See [`LocationPolicy`].
    pub fn policy_location(&self) -> &LocationPolicy {
        &self.policy_location
    }

    /// See [`MirroringPolicy`].
    pub fn policy_mirroring(&self) -> MirroringPolicy {
        self.policy_mirroring
    }

    /// Where the workspace's memory comes from: its buffer, its spills and the bytes of a
    /// mapped file are drawn from (or reserved in) this source's pool.
    pub fn source(&self) -> MemorySource {
        self.source
    }

    /// Whether the workspace is a ring ([`ResetPolicy::EndOfBuffer`]).
    pub fn is_circular(&self) -> bool {
        self.policy_reset == ResetPolicy::EndOfBuffer
    }

    /// The factor a learned or initial size is multiplied by once: `1 + limit` with
    /// [`AllocationPolicy::Overallocate`], 1 with [`AllocationPolicy::Strict`].
    pub fn overallocation_factor(&self) -> f64 {
        match self.policy_allocation {
            AllocationPolicy::Strict => 1.0,
            AllocationPolicy::Overallocate => 1.0 + self.overallocation_limit,
        }
    }

    /// The size rules of this configuration.
    pub(crate) fn sizing(&self) -> Sizing {
        Sizing::new(
            self.alignment(),
            self.min_size(),
            self.max_size(),
            self.overallocation_factor(),
        )
    }

    /// The bytes of the buffer `initial_size` makes at creation, as the arena sizes it
    /// (the sizing rules, which saturate instead of overflowing): `initial_size`
    /// overallocated once, clamped to `[min_size, max_size]` and rounded to the alignment;
    /// for a circular workspace the whole ring (slots of `initial_size` rounded, times the
    /// factor). `None` when it makes none. Needs a valid alignment and factor.
    fn first_buffer(&self) -> Option<usize> {
        if self.initial_size == 0 {
            return None;
        }
        let sizing = self.sizing();
        Some(if self.is_circular() {
            sizing
                .initial_ring(self.initial_size)
                .map_or(0, |ring| ring.buffer)
        } else {
            sizing.learned(self.initial_size)
        })
    }

    fn validate(&self) -> Result<(), Error> {
        /// A factor or limit as a message shows it: exponent notation when it is huge (an
        /// `f64` of 1e300 written out has 301 digits).
        struct Number(f64);
        impl std::fmt::Display for Number {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                if self.0.abs() >= 1e9 {
                    write!(f, "{:e}", self.0)
                } else {
                    write!(f, "{}", self.0)
                }
            }
        }
        let invalid = |variable: &str, message: String| {
            Err(Error::Config(ConfigError::Invalid {
                variable: format!("WorkspaceConfig::{variable}"),
                message,
            }))
        };
        if self.max_size > 0 && self.initial_size > self.max_size {
            return invalid(
                "initial_size",
                format!(
                    "initial_size {} is larger than max_size {} (max_size 0 means unbounded)",
                    self.initial_size, self.max_size
                ),
            );
        }
        if self.max_size > 0 && self.min_size > self.max_size {
            return invalid(
                "min_size",
                format!(
                    "min_size {} is larger than max_size {} (max_size 0 means unbounded)",
                    self.min_size, self.max_size
                ),
            );
        }
        if !self.overallocation_limit.is_finite() || self.overallocation_limit < 0.0 {
            return invalid(
                "overallocation_limit",
                format!(
                    "overallocation_limit {} must be a finite number >= 0 (0.3 = 30% more)",
                    self.overallocation_limit
                ),
            );
        }
        if !self.alignment.is_power_of_two() || self.alignment > MAX_ALIGNMENT {
            return invalid(
                "alignment",
                format!(
                    "alignment {} must be a power of two from 1 to {MAX_ALIGNMENT}",
                    self.alignment
                ),
            );
        }
        if self.max_size > 0 && self.max_size < self.alignment {
            return invalid(
                "max_size",
                format!(
                    "max_size {} is below the alignment {}: every allocation takes at least \
                     the alignment, so none could ever be bumped from the buffer (max_size 0 \
                     means unbounded)",
                    self.max_size, self.alignment
                ),
            );
        }
        if self.initial_size == 0
            && self.max_size == 0
            && self.policy_learning != LearningPolicy::None
            && self.alignment as f64 * self.overallocation_factor() > MAX_BUFFER as f64
        {
            return invalid(
                "overallocation_limit",
                format!(
                    "overallocation_limit {} would make even the smallest learned buffer (one \
                     allocation of the alignment {} bytes, overallocated) larger than the \
                     {MAX_BUFFER} bytes (isize::MAX) a buffer can have, so none could ever be \
                     allocated; use a smaller limit or set max_size",
                    Number(self.overallocation_limit),
                    self.alignment
                ),
            );
        }
        // The alignment is valid here: a learned buffer is at least `min_size` rounded up
        // to it.
        let min_buffer = self.min_size.checked_next_multiple_of(self.alignment);
        if !matches!(min_buffer, Some(b) if b <= MAX_BUFFER) {
            return invalid(
                "min_size",
                format!(
                    "min_size {} rounded up to the alignment {} is larger than the {MAX_BUFFER} \
                     bytes (isize::MAX) a buffer can have, so no learned buffer could be \
                     allocated",
                    self.min_size, self.alignment
                ),
            );
        }
        if let Some(buffer) = self.first_buffer().filter(|&b| b > MAX_BUFFER) {
            // The sizing rules saturate at the largest aligned size.
            let or_more = if buffer > usize::MAX - self.alignment {
                " or more"
            } else {
                ""
            };
            return invalid(
                "initial_size",
                format!(
                    "initial_size {} gives a first buffer of {buffer} bytes{or_more} \
                     (overallocated x{}, clamped and rounded to the alignment {}{}), more than \
                     the {MAX_BUFFER} bytes (isize::MAX) a buffer can have",
                    self.initial_size,
                    Number(self.overallocation_factor()),
                    self.alignment,
                    if self.is_circular() {
                        "; the whole ring"
                    } else {
                        ""
                    },
                ),
            );
        }
        if let LocationPolicy::Mmap { path: Some(path) } = &self.policy_location {
            // What the path's text alone shows: build() looks at no file system (the file
            // is opened, and can still fail, when the workspace is created).
            if path.as_os_str().is_empty() {
                return invalid(
                    "policy_location",
                    "policy_location Mmap with an empty path: it names no file (path None \
                     maps a temporary file)"
                        .into(),
                );
            }
        }
        if matches!(self.policy_location, LocationPolicy::Mmap { .. })
            && self.policy_learning != LearningPolicy::None
            && self.initial_size == 0
        {
            return invalid(
                "policy_location",
                format!(
                    "policy_location Mmap with policy_learning {:?} and initial_size 0: a mapped \
                     workspace is not learned; give it an initial_size > 0 (or policy_learning None)",
                    self.policy_learning
                ),
            );
        }
        if self.is_circular()
            && self.policy_allocation == AllocationPolicy::Overallocate
            && self.overallocation_limit < 1.0
        {
            return invalid(
                "overallocation_limit",
                format!(
                    "overallocation_limit {} with policy_reset EndOfBuffer and policy_allocation \
                     Overallocate gives a ring of fewer than 2 slots; use a limit >= 1.0 \
                     (slots = floor(1 + limit)) or AllocationPolicy::Strict",
                    self.overallocation_limit
                ),
            );
        }
        if self.is_circular()
            && self.policy_allocation == AllocationPolicy::Overallocate
            && 1.0 + self.overallocation_limit >= (MAX_RING_SLOTS + 1) as f64
        {
            return invalid(
                "overallocation_limit",
                format!(
                    "overallocation_limit {} with policy_reset EndOfBuffer gives a ring of \
                     floor(1 + limit) slots, more than the {MAX_RING_SLOTS} allowed; use a \
                     limit below {MAX_RING_SLOTS}",
                    self.overallocation_limit
                ),
            );
        }
        if self.policy_spill == SpillPolicy::Fail && self.initial_size == 0 {
            return invalid(
                "policy_spill",
                "policy_spill Fail with initial_size 0: the workspace has no buffer until it \
                 learns, and a Fail workspace refuses every request before that, so it could \
                 never allocate; give it an initial_size > 0 (or use SpillPolicy::External)"
                    .to_string(),
            );
        }
        if self.is_circular()
            && self.policy_spill == SpillPolicy::Reallocate
            && matches!(self.policy_location, LocationPolicy::Mmap { path: Some(_) })
        {
            return invalid(
                "policy_spill",
                "policy_spill Reallocate on a circular workspace mapped to a user file: a \
                 rebuilt ring would map the same file over memory the old ring's tensors still \
                 use; use LocationPolicy::Mmap { path: None } (a temporary file per ring) or \
                 SpillPolicy::External"
                    .to_string(),
            );
        }
        Ok(())
    }
}

/// Builds a [`WorkspaceConfig`]; [`WorkspaceConfigBuilder::build`] checks it (semantics §2.1).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct WorkspaceConfigBuilder {
    config: WorkspaceConfig,
}

impl WorkspaceConfigBuilder {
    /// Bytes of the buffer created with the workspace, before overallocation (default 0:
    /// learned).
    /// ND4J: `initialSize`.
    pub fn initial_size(mut self, bytes: usize) -> Self {
        self.config.initial_size = bytes;
        self
    }

    /// Smallest learned buffer (default 0). ND4J: `minSize`.
    pub fn min_size(mut self, bytes: usize) -> Self {
        self.config.min_size = bytes;
        self
    }

    /// Largest buffer (default 0 = unbounded). ND4J: `maxSize`.
    pub fn max_size(mut self, bytes: usize) -> Self {
        self.config.max_size = bytes;
        self
    }

    /// Overallocation as a fraction (default 0.3). ND4J: `overallocationLimit`.
    pub fn overallocation_limit(mut self, limit: f64) -> Self {
        self.config.overallocation_limit = limit;
        self
    }

    /// Alignment of every allocation, a power of two up to 4096 (default 16).
    pub fn alignment(mut self, bytes: usize) -> Self {
        self.config.alignment = bytes;
        self
    }

    /// [`AllocationPolicy`] (default Overallocate). ND4J: `policyAllocation`.
    pub fn policy_allocation(mut self, policy: AllocationPolicy) -> Self {
        self.config.policy_allocation = policy;
        self
    }

    /// [`LearningPolicy`] (default FirstLoop). ND4J: `policyLearning`.
    pub fn policy_learning(mut self, policy: LearningPolicy) -> Self {
        self.config.policy_learning = policy;
        self
    }

    /// Cycles [`LearningPolicy::OverTime`] waits (default 0 = after the first).
    /// ND4J: `cyclesBeforeInitialization`.
    pub fn cycles_before_initialization(mut self, cycles: u64) -> Self {
        self.config.cycles_before_initialization = cycles;
        self
    }

    /// [`SpillPolicy`] (default External). ND4J: `policySpill`.
    pub fn policy_spill(mut self, policy: SpillPolicy) -> Self {
        self.config.policy_spill = policy;
        self
    }

    /// [`ResetPolicy`] (default BlockLeft). ND4J: `policyReset`.
    pub fn policy_reset(mut self, policy: ResetPolicy) -> Self {
        self.config.policy_reset = policy;
        self
    }

    /// [`LocationPolicy`] (default Ram). ND4J: `policyLocation`.
    pub fn policy_location(mut self, policy: LocationPolicy) -> Self {
        self.config.policy_location = policy;
        self
    }

    /// [`MirroringPolicy`] (default Full). ND4J: `policyMirroring`.
    pub fn policy_mirroring(mut self, policy: MirroringPolicy) -> Self {
        self.config.policy_mirroring = policy;
        self
    }

    /// The [`MemorySource`] whose pool the workspace draws every byte from (its buffer,
    /// its spills, the bytes of a mapped file); default: the global pool. Its limits apply: a
    /// request the pool refuses fails with [`Error::Alloc`] (at its limit
    /// `AllocError::OutOfMemory`, with the report attached). Like every other setting, it is
    /// read when the workspace is created; entering an existing workspace with another source
    /// keeps the first.
    pub fn source(mut self, source: MemorySource) -> Self {
        self.config.source = source;
        self
    }

    /// The configuration, or [`Error::Config`] naming the field and value of the first
    /// invalid setting or combination (semantics §2.1).
    pub fn build(self) -> Result<WorkspaceConfig, Error> {
        self.config.validate()?;
        Ok(self.config)
    }
}

/// The most bytes any buffer can have (an allocation's bound).
const MAX_BUFFER: usize = isize::MAX as usize;

/// A workspace debug mode from `NDMEM_WORKSPACES` (semantics §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugMode {
    /// Workspaces work normally (variable unset or empty).
    Normal,
    /// Every allocation spills: the buffers are never used.
    SpillEverything,
    /// Workspaces are off: `allocate_in_current` answers `None`.
    Bypass,
}

impl DebugMode {
    /// Parses a value of `NDMEM_WORKSPACES` (case-insensitive, surrounding spaces ignored;
    /// unset or empty means [`DebugMode::Normal`]). Anything else is an error naming the
    /// variable and the value.
    pub fn parse(value: Option<&str>) -> Result<DebugMode, ConfigError> {
        let Some(value) = value else {
            return Ok(DebugMode::Normal);
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "" => Ok(DebugMode::Normal),
            "spill_everything" => Ok(DebugMode::SpillEverything),
            "bypass" => Ok(DebugMode::Bypass),
            _ => Err(ConfigError::Invalid {
                variable: ENV_WORKSPACES.to_string(),
                message: format!(
                    "{value:?} is not a workspace debug mode (expected e.g. spill_everything, bypass, or unset)"
                ),
            }),
        }
    }

    /// The mode `NDMEM_WORKSPACES` asks for now (read from the environment on each call;
    /// workspaces read it once, at their first use in the process).
    pub fn from_env() -> Result<DebugMode, ConfigError> {
        match std::env::var(ENV_WORKSPACES) {
            Ok(value) => DebugMode::parse(Some(&value)),
            Err(std::env::VarError::NotPresent) => Ok(DebugMode::Normal),
            Err(std::env::VarError::NotUnicode(value)) => Err(ConfigError::Invalid {
                variable: ENV_WORKSPACES.to_string(),
                message: format!(
                    "{:?} is not a workspace debug mode: it is not valid UTF-8 (invalid bytes \
                     shown as U+FFFD; expected e.g. spill_everything, bypass, or unset)",
                    value.to_string_lossy()
                ),
            }),
        }
    }
}

/// The process's debug mode, read from the environment once.
#[inline]
pub(crate) fn debug_mode() -> Result<DebugMode, Error> {
    static MODE: OnceLock<Result<DebugMode, ConfigError>> = OnceLock::new();
    match MODE.get_or_init(DebugMode::from_env) {
        Ok(mode) => Ok(*mode),
        Err(error) => Err(Error::Config(error.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_modes_parse_and_garbage_is_named() {
        assert_eq!(DebugMode::parse(None), Ok(DebugMode::Normal));
        assert_eq!(DebugMode::parse(Some("")), Ok(DebugMode::Normal));
        assert_eq!(
            DebugMode::parse(Some("  ")),
            Ok(DebugMode::Normal),
            "spaces alone: empty"
        );
        assert_eq!(
            DebugMode::parse(Some(" Spill_Everything ")),
            Ok(DebugMode::SpillEverything)
        );
        assert_eq!(DebugMode::parse(Some("bypass")), Ok(DebugMode::Bypass));
        let err = DebugMode::parse(Some("bypas")).unwrap_err().to_string();
        assert!(
            err.contains(ENV_WORKSPACES) && err.contains("\"bypas\""),
            "{err}"
        );
    }

    #[test]
    fn overallocation_factor_follows_the_policy() {
        let strict = WorkspaceConfig::builder()
            .policy_allocation(AllocationPolicy::Strict)
            .build()
            .unwrap();
        assert_eq!(strict.overallocation_factor(), 1.0);
        assert_eq!(WorkspaceConfig::default().overallocation_factor(), 1.3);
    }
}
