//! The memory source: which pool a workspace, scope or tensor draws its bytes from.
//!
//! Invariant: a source's pool lives for the rest of the program (the global pool, or one
//! made with [`MemorySource::new`] and kept alive from then on), so blocks drawn from it
//! are `Block<'static>` and can outlive every handle that carried the source. A source
//! registers [`crate::reclaim::collect`] with its pool once, so a pool at its limit flushes
//! deferred frees before it refuses an allocation (semantics §1).

use std::fmt;
use std::sync::OnceLock;

use ndmem_alloc::{AllocError, Block, Pool, Reservation, Usage};

/// A handle to the pool that memory is drawn from: cheap to copy, compared by identity.
///
/// The default is the process-wide [`Pool::global`]. A program or a test that wants its
/// own budget makes a source of its own with [`MemorySource::new`] and hands it to
/// [`crate::WorkspaceConfig`], [`crate::Scope`] or tensor constructors.
///
/// ```
/// use ndmem::alloc::{Limits, Pool};
/// use ndmem::MemorySource;
///
/// let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(1 << 20).build()));
/// let block = source.pool().allocate(4096, 64)?;
/// assert_eq!(source.pool().stats().live_bytes, 4096);
/// assert_ne!(source, MemorySource::global());
/// drop(block);
/// # Ok::<(), ndmem::alloc::AllocError>(())
/// ```
#[derive(Clone, Copy)]
pub struct MemorySource {
    pool: &'static Pool,
}

impl MemorySource {
    /// The global pool ([`Pool::global`]), with limits from the environment.
    ///
    /// If an `NDMEM_*` limit variable holds garbage, this still returns the source, and
    /// every allocation from it fails with [`ndmem_alloc::AllocError::Config`] naming the
    /// variable, as [`Pool::global`]'s do; [`Pool::try_global`] reports it up front.
    pub fn global() -> MemorySource {
        static GLOBAL: OnceLock<MemorySource> = OnceLock::new();
        *GLOBAL.get_or_init(|| MemorySource::of(Pool::global()))
    }

    /// A source over a pool of its own. The pool is kept for the rest of the program (its
    /// blocks may outlive any handle); [`Pool::trim`] gives its cached memory back to the OS.
    pub fn new(pool: Pool) -> MemorySource {
        MemorySource::of(Box::leak(Box::new(pool)))
    }

    /// A source over a pool that already lives for the rest of the program. Registers
    /// deferred-free collection with the pool the first time a pool is seen.
    pub fn of(pool: &'static Pool) -> MemorySource {
        crate::reclaim::register_with(pool);
        MemorySource { pool }
    }

    /// The pool itself, for its statistics and limits.
    pub fn pool(&self) -> &'static Pool {
        self.pool
    }

    /// Allocates `size` bytes aligned to `align`, counted as `usage`.
    pub fn allocate(
        &self,
        size: usize,
        align: usize,
        usage: Usage,
    ) -> Result<Block<'static>, AllocError> {
        self.pool.allocate_for(size, align, usage)
    }

    /// Reserves `bytes` of the pool's budget without memory (for buffers obtained elsewhere,
    /// such as mapped files), counted as `usage`.
    pub fn reserve(&self, bytes: usize, usage: Usage) -> Result<Reservation<'static>, AllocError> {
        self.pool.reserve(bytes, usage)
    }
}

impl Default for MemorySource {
    fn default() -> MemorySource {
        MemorySource::global()
    }
}

impl PartialEq for MemorySource {
    fn eq(&self, other: &MemorySource) -> bool {
        std::ptr::eq(self.pool, other.pool)
    }
}

impl Eq for MemorySource {}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("pool", &(self.pool as *const Pool))
            .finish()
    }
}
