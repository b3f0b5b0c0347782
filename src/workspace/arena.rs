//! The cyclic bump arena behind one workspace (semantics §2.2-2.4): entering and leaving
//! cycles, bumping, spilling by policy, learning the buffer size, the circular ring, and
//! destruction. The pieces it composes live below it: the buffer ([`super::buffer`]), the
//! bump region ([`super::bump`]), spills ([`super::spill`]), the ring ([`super::ring`]) and
//! the size arithmetic ([`super::sizing`]).
//!
//! Invariant: every pointer handed out lies in the running cycle's region of the live
//! buffer or in a spill block that the arena holds, and neither is freed or reused while
//! any guard of the cycle that handed it out is alive: the buffer is replaced or freed and
//! spills are dropped only when the last guard leaves (`depth` falls to 0), never through
//! an allocation. Circular workspaces additionally hand out `Arc`s of their spills and
//! counted references to ring slots in stamps: memory another thread may still read is
//! freed only after its last stamp drops, and a slot is reused only when no stamp refers
//! to it. A request that does not fit in the rest of its region (in particular one larger
//! than the whole buffer) spills or fails by policy: it never loops.
//!
//! All memory comes from the configuration's [`crate::MemorySource`].

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use ndmem_alloc::trace::{self, EventKind, NameId, Space};
use ndmem_alloc::{AllocError, Usage};

use super::buffer::{claim_path, Buffer, FileClaim};
use super::bump::{dangling, Region};
use super::config::{DebugMode, LearningPolicy, LocationPolicy, SpillPolicy, WorkspaceConfig};
use super::ring::{heap_refused, Ring};
use super::sizing::{spilled_bytes, RingShape, Sizing};
use super::spill::Spills;
use super::stamp::{KeepAlive, Shared, Stamp, WorkspaceMemory};
use super::stats::{Figures, Published, WorkspaceStats};
use crate::error::Error;

/// The largest alignment the pool serves (a page); a spill aligned beyond it pads.
const POOL_MAX_ALIGN: usize = 4096;

/// What the configuration and the debug mode fixed when the workspace was created.
#[derive(Debug)]
struct Settings {
    config: WorkspaceConfig,
    sizing: Sizing,
    /// `NDMEM_WORKSPACES` asked for every allocation to spill (or bypass): no buffer, ever.
    no_buffer: bool,
    bypass: bool,
    circular: bool,
}

/// Where the cycles stand.
#[derive(Debug)]
struct Cycles {
    /// Where this cycle started (a slot boundary; 0 for BlockLeft).
    start: Cell<usize>,
    /// Live guards of the running cycle (0: closed).
    depth: Cell<u32>,
    /// Cycles started.
    generation: Cell<u64>,
    /// Cycles completed.
    completed: Cell<u64>,
    /// The largest cycle seen: bumped plus spilled bytes.
    max_bytes: Cell<usize>,
    /// The workspace that was current when the current (or last) cycle started; read only
    /// while a cycle runs.
    parent: RefCell<Weak<Arena>>,
    /// The parent's generation when this cycle started: the parent is this cycle's only
    /// while that cycle of it runs (a later cycle of the same workspace is not).
    parent_generation: Cell<u64>,
    /// A cycle that spilled ended while a view held its memory, so its end's work waits:
    /// the next cycle end reallocates (`Reallocate`) as if it had spilled too.
    spill_deferred: Cell<bool>,
    /// The workspace freed its buffer to make room for a larger one, and the pool then
    /// refused both the larger one and one of the old size: it gets a buffer again at a
    /// later cycle end, whatever its learning policy.
    lost_buffer: Cell<bool>,
    destroyed: Cell<bool>,
}

/// Where an allocation landed.
enum Landing {
    /// A zero-size request: a dangling, aligned pointer.
    Empty,
    /// In the buffer.
    Bumped,
    /// In a spill block; for circular workspaces, the block to keep alive.
    Spilled(Option<KeepAlive>),
}

/// How [`Arena::grow`] or [`Arena::shrink`] served a request.
#[derive(Debug)]
pub(crate) enum Resized {
    /// The allocation kept its address.
    InPlace(NonNull<[u8]>),
    /// A new allocation that the caller must copy the old bytes into.
    Moved(NonNull<[u8]>),
}

/// One workspace of one thread.
#[derive(Debug)]
pub(crate) struct Arena {
    shared: Arc<Shared>,
    settings: Settings,
    buffer: RefCell<Option<Arc<Buffer>>>,
    region: Region,
    cycles: Cycles,
    spills: Spills,
    ring: Ring,
    /// The user file of a mapped workspace (its buffers hold the claim too).
    claim: Option<FileClaim>,
    /// The workspace's name in the timeline recorder (semantics §7).
    trace_name: NameId,
    /// The figures published for other threads (semantics §7).
    published: Arc<Published>,
}

/// Heap a new workspace's fixed bookkeeping takes at most, beside copies of its name: its
/// state, its figures for other threads, its entries in the thread's lists (which may
/// grow) and in the recorder's names.
const FIXED_BOOKKEEPING: usize = 16 << 10;

/// Whether the heap has room for a new workspace's bookkeeping (its fixed part and
/// `ring_refs` bytes of ring references), which Rust allocates infallibly (an abort at a
/// heap limit): one fallible allocation of that size, given back at once, so that a heap
/// at its limit makes creating the workspace an error (semantics §2.1). A ring made later
/// (learned) checks its references where they are made.
fn check_heap_room(id: &str, ring_refs: usize) -> Result<(), Error> {
    let bytes = FIXED_BOOKKEEPING
        + ring_refs
        + std::mem::size_of::<Arena>()
        + std::mem::size_of::<Shared>()
        + std::mem::size_of::<Published>()
        + id.len().saturating_mul(4);
    let mut probe: Vec<u8> = Vec::new();
    probe
        .try_reserve_exact(bytes)
        .map_err(|_| Error::Alloc(heap_refused(bytes)))
}

impl Arena {
    /// A workspace `id` of the calling thread; with `initial_size > 0` its buffer is
    /// allocated now.
    pub(crate) fn new(id: &str, config: &WorkspaceConfig, mode: DebugMode) -> Result<Arena, Error> {
        // A ring made now (with `initial_size`) has a reference per slot: its list and
        // the references themselves (each an `Arc` of a `SlotRef`: two counts and a pointer).
        let ring_refs = match config.sizing().initial_ring(config.initial_size()) {
            Some(shape) if config.is_circular() && config.initial_size() > 0 => {
                shape.slots.saturating_mul(4 * std::mem::size_of::<usize>())
            }
            _ => 0,
        };
        check_heap_room(id, ring_refs)?;
        // A user file is claimed (and created) only by a workspace that maps it: one with a
        // buffer from the start (a mapped workspace never learns one), outside the debug
        // modes, which make none.
        let claim = match config.policy_location() {
            LocationPolicy::Mmap { path: Some(path) }
                if config.initial_size() > 0 && mode == DebugMode::Normal =>
            {
                Some(claim_path(id, path)?)
            }
            _ => None,
        };
        let circular = config.is_circular();
        let sizing = config.sizing();
        let arena = Arena {
            shared: Arc::new(Shared::new(id, circular, config.source())),
            settings: Settings {
                config: config.clone(),
                sizing,
                no_buffer: mode != DebugMode::Normal,
                bypass: mode == DebugMode::Bypass,
                circular,
            },
            buffer: RefCell::new(None),
            region: Region::new(sizing.align),
            cycles: Cycles {
                start: Cell::new(0),
                depth: Cell::new(0),
                generation: Cell::new(0),
                completed: Cell::new(0),
                max_bytes: Cell::new(0),
                parent: RefCell::new(Weak::new()),
                parent_generation: Cell::new(0),
                spill_deferred: Cell::new(false),
                lost_buffer: Cell::new(false),
                destroyed: Cell::new(false),
            },
            spills: Spills::default(),
            ring: Ring::new(),
            claim,
            trace_name: trace::intern(Space::Workspace, id),
            published: Arc::new(Published::new(id, config.source())),
        };
        if config.initial_size() > 0 && !arena.settings.no_buffer {
            let built = if circular {
                match sizing.initial_ring(config.initial_size()) {
                    Some(shape) => arena.build_ring(shape),
                    None => Ok(()),
                }
            } else {
                arena
                    .allocate_buffer(sizing.learned(config.initial_size()))
                    .map(|buffer| arena.install(Arc::new(buffer)))
            };
            if let Err(error) = built {
                // Never created after all: give its slot of the thread's table back.
                arena.shared.destroy();
                return Err(error);
            }
        }
        Ok(arena)
    }

    /// The workspace id.
    pub(crate) fn id(&self) -> &str {
        self.shared.id()
    }

    /// The state shared with the stamps of this workspace's memory.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether `NDMEM_WORKSPACES=bypass` was in force when the workspace was created.
    pub(crate) fn is_bypassed(&self) -> bool {
        self.settings.bypass
    }

    /// Whether a cycle is running (entered, not left, not destroyed).
    pub(crate) fn is_open(&self) -> bool {
        self.cycles.depth.get() > 0 && !self.cycles.destroyed.get()
    }

    /// The generation of the current or last cycle.
    pub(crate) fn generation(&self) -> u64 {
        self.cycles.generation.get()
    }

    /// The workspace that was current when this cycle started, while the cycle it was in
    /// then still runs. Guards may be dropped in any order (semantics §2.5): a parent whose
    /// cycle has ended (even if a later cycle of it runs now), or that was destroyed, is no
    /// parent any more, so `leverage` detaches (semantics §3) instead of allocating in a
    /// cycle this one did not start in.
    pub(crate) fn parent(&self) -> Option<Rc<Arena>> {
        let generation = self.cycles.parent_generation.get();
        self.cycles
            .parent
            .borrow()
            .upgrade()
            .filter(|parent| parent.is_open() && parent.generation() == generation)
    }

    // ---- the buffer -------------------------------------------------------------------

    fn allocate_buffer(&self, bytes: usize) -> Result<Buffer, Error> {
        Buffer::allocate(
            self.settings.config.source(),
            self.id(),
            self.settings.config.policy_location(),
            self.claim.as_ref(),
            bytes,
            self.settings.sizing.align,
        )
    }

    fn install(&self, buffer: Arc<Buffer>) {
        self.region.set_base(buffer.base().as_ptr());
        *self.buffer.borrow_mut() = Some(buffer);
        self.cycles.lost_buffer.set(false);
    }

    /// Drops the workspace's reference to its buffer (freeing it if nothing else refers to
    /// it); the workspace has no buffer until the next [`Arena::install`].
    fn drop_buffer(&self) {
        self.region.set_base(std::ptr::null_mut());
        *self.buffer.borrow_mut() = None;
    }

    /// Bytes of the buffer (0: none).
    fn size(&self) -> usize {
        self.buffer.borrow().as_ref().map_or(0, |b| b.len())
    }

    /// Allocates a ring of `shape` and starts at its slot 0. Stamps of earlier cycles keep
    /// an old ring alive while they need it.
    ///
    /// If the pool refuses the new ring beside the old one while nothing but the ring
    /// refers to the old one, the old ring is freed and the new one asked for again, as
    /// ND4J frees a workspace's buffer before it allocates the larger one: a pool with room
    /// for the new ring alone must not keep the workspace spilling forever (only when the
    /// refusal says the new ring fits once the old one is gone: [`fits_once_freed`]). If the pool
    /// refuses that too, a ring of the old shape is built again (the workspace spills
    /// until one is, see [`Cycles::lost_buffer`]) and the error is returned.
    fn build_ring(&self, shape: RingShape) -> Result<(), Error> {
        let fresh = match self.allocate_buffer(shape.buffer) {
            Ok(fresh) => fresh,
            Err(error) if fits_once_freed(&error, self.size()) && self.ring.unreferenced() => {
                let old = self.ring.shape();
                self.ring.clear();
                self.drop_buffer();
                match self.allocate_buffer(shape.buffer) {
                    Ok(fresh) => fresh,
                    Err(error) => {
                        let rebuilt = old.is_some_and(|old| self.build_ring(old).is_ok());
                        self.cycles.lost_buffer.set(!rebuilt);
                        return Err(error);
                    }
                }
            }
            Err(error) => return Err(error),
        };
        let fresh = Arc::new(fresh);
        if let Err(error) = self.ring.reset(shape, &fresh) {
            self.cycles.lost_buffer.set(!self.region.has_buffer());
            return Err(error);
        }
        self.install(fresh);
        self.cycles.start.set(0);
        Ok(())
    }

    /// Replaces a BlockLeft buffer by one of `bytes` if that is larger (learning never
    /// shrinks). If the pool refuses, the workspace keeps its buffer (or keeps spilling) and
    /// tries again at a later cycle end.
    ///
    /// Between cycles nothing but the workspace refers to a BlockLeft buffer (a cycle end
    /// that a view outlives does not come here), so when the pool refuses the new buffer
    /// beside the old one, the old one is freed and the new one asked for again, as ND4J
    /// frees a workspace's buffer before it allocates the larger one (only when the refusal
    /// says the new one fits once the old one is gone: [`fits_once_freed`], so a buffer that
    /// can never fit is not freed and asked for again at every cycle end). If the pool
    /// refuses that too, the workspace asks for a buffer of the old size again (and, refused once
    /// more, spills until a later cycle end gets it one: [`Cycles::lost_buffer`]).
    fn replace_buffer(&self, bytes: usize) {
        let old = self.size();
        if bytes == 0 || bytes <= old {
            return;
        }
        let fresh = match self.allocate_buffer(bytes) {
            Err(error) if fits_once_freed(&error, old) && self.buffer_unreferenced() => {
                self.drop_buffer();
                self.allocate_buffer(bytes)
                    .or_else(|_| self.allocate_buffer(old))
            }
            result => result,
        };
        match fresh {
            Ok(fresh) => self.install(Arc::new(fresh)),
            // Only a buffer given up for this one is lost: a first learned buffer the
            // pool refused is learned again (at its learned size) at a later cycle end.
            Err(_) => {
                if old > 0 && !self.region.has_buffer() {
                    self.cycles.lost_buffer.set(true);
                }
            }
        }
    }

    /// Whether the workspace's reference is the only one to its buffer.
    fn buffer_unreferenced(&self) -> bool {
        self.buffer
            .borrow_mut()
            .as_mut()
            .is_some_and(|buffer| Arc::get_mut(buffer).is_some())
    }

    // ---- the cycle --------------------------------------------------------------------

    /// Enters the workspace: starts a cycle, or only nests if one is running.
    ///
    /// A new cycle is refused while views of the memory are alive (semantics §3: the safe
    /// API never reads memory that is being reused); re-entry is always allowed.
    pub(crate) fn enter(&self, parent: Option<&Rc<Arena>>) -> Result<(), Error> {
        let cycles = &self.cycles;
        let depth = cycles.depth.get();
        let destroyed = cycles.destroyed.get();
        let views = self.shared.views();
        if depth == 0 && !destroyed && views > 0 {
            return Err(Error::WorkspaceInUse {
                workspace: self.id().to_string(),
                action: "start a new cycle",
                views,
            });
        }
        cycles.depth.set(depth + 1);
        if depth > 0 || destroyed {
            return Ok(());
        }
        let generation = cycles.generation.get() + 1;
        cycles.generation.set(generation);
        // The parent is read only while this cycle runs (`parent`), so the link is kept
        // between cycles and replaced only when the parent changes: a loop re-entering
        // under the same parent does not touch the reference counts.
        let mut link = cycles.parent.borrow_mut();
        let same = match parent {
            Some(p) => std::ptr::eq(link.as_ptr(), Rc::as_ptr(p)),
            None => Weak::ptr_eq(&link, &Weak::new()),
        };
        if !same {
            *link = parent.map(Rc::downgrade).unwrap_or_default();
        }
        drop(link);
        cycles
            .parent_generation
            .set(parent.map_or(0, |p| p.generation()));
        let (start, end) = match self.buffer.borrow().as_ref() {
            None => (0, 0),
            // Every slot holds memory a tensor still refers to: this cycle spills.
            Some(_) if self.settings.circular => self.ring.start_cycle().unwrap_or((0, 0)),
            // The pool's size class may round the buffer past `max_size`: a cycle bumps
            // no further than `max_size` (semantics §2.1), the rest stays unused.
            Some(buffer) => (0, self.settings.sizing.bump_limit(buffer.len())),
        };
        cycles.start.set(start);
        self.region.set_offset(start);
        self.region.set_end_offset(end);
        self.region.take_slack();
        self.spills.new_cycle();
        self.shared.open(generation);
        Ok(())
    }

    /// Leaves the workspace; the last leave of a cycle ends it (semantics §2.2).
    pub(crate) fn leave(&self) {
        let cycles = &self.cycles;
        let depth = cycles.depth.get().saturating_sub(1);
        cycles.depth.set(depth);
        if depth > 0 {
            return;
        }
        self.ring.end_cycle();
        if cycles.destroyed.get() {
            self.release_all();
            return;
        }
        self.shared.close(cycles.generation.get());
        let spilled = self.spills.new_cycle();
        // Bumps aligned beyond the workspace count the most padding they could need, as
        // spills do: a buffer sized from this cycle holds it wherever it lies.
        let bytes = (self.region.offset() - cycles.start.get())
            .saturating_add(self.region.take_slack())
            .saturating_add(spilled);
        cycles.max_bytes.set(cycles.max_bytes.get().max(bytes));
        cycles.completed.set(cycles.completed.get() + 1);
        if self.shared.views() > 0 {
            // A view still reads this cycle's memory: keep spills and buffer as they are;
            // the next cycle cannot start before the view is gone, and its end frees them
            // and reallocates for this cycle's spills too.
            if spilled > 0 {
                cycles.spill_deferred.set(true);
            }
        } else {
            let spilled = spilled > 0 || cycles.spill_deferred.replace(false);
            if self.settings.circular {
                self.end_circular_cycle(spilled);
            } else {
                self.end_cycle(spilled);
            }
        }
        self.region.set_offset(cycles.start.get());
        self.region.set_end_offset(0);
    }

    /// Frees a BlockLeft cycle's spills and learns or reallocates (semantics §2.3).
    fn end_cycle(&self, spilled: bool) {
        self.spills.free_cycle();
        if self.settings.no_buffer {
            return;
        }
        let (sizing, max_bytes) = (&self.settings.sizing, self.cycles.max_bytes.get());
        if !self.region.has_buffer() {
            // A cycle that asked for nothing learns nothing (not even `min_size`).
            if max_bytes > 0 && self.cycles.lost_buffer.get() {
                self.replace_buffer(sizing.reallocated(max_bytes));
            } else if max_bytes > 0 && self.should_learn() {
                self.replace_buffer(sizing.learned(max_bytes));
            }
        } else if spilled && self.settings.config.policy_spill() == SpillPolicy::Reallocate {
            self.replace_buffer(sizing.reallocated(max_bytes));
        }
    }

    /// Unpins old spills, learns the ring, rebuilds it, or moves to the next slot
    /// (semantics §2.4).
    fn end_circular_cycle(&self, spilled: bool) {
        let generation = self.cycles.generation.get();
        self.spills.unpin_before(generation);
        if self.settings.no_buffer {
            return;
        }
        let (sizing, max_bytes) = (&self.settings.sizing, self.cycles.max_bytes.get());
        let current = match self.ring.shape() {
            Some(shape) if self.region.has_buffer() => shape,
            _ => {
                if self.should_learn() || self.cycles.lost_buffer.get() {
                    if let Some(shape) = sizing.learned_ring(max_bytes) {
                        let _ = self.build_ring(shape);
                    }
                }
                return;
            }
        };
        let reallocate = self.settings.config.policy_spill() == SpillPolicy::Reallocate;
        if self.ring.rebuild_due(generation, spilled && reallocate) {
            if let Some(shape) = sizing.rebuilt_ring(max_bytes, current) {
                if self.build_ring(shape).is_ok() {
                    return;
                }
            }
        }
        self.cycles.start.set(self.ring.advance());
    }

    /// Whether a workspace without a buffer learns its size now (semantics §2.3).
    fn should_learn(&self) -> bool {
        let config = &self.settings.config;
        if config.initial_size() > 0 {
            return false;
        }
        match config.policy_learning() {
            LearningPolicy::FirstLoop => true,
            LearningPolicy::OverTime => {
                self.cycles.completed.get() >= config.cycles_before_initialization().max(1)
            }
            LearningPolicy::None => false,
        }
    }

    /// Destroys the workspace: stamps fail from now on, and its memory is freed now, or
    /// when its last guard leaves if it is open (semantics §2.2).
    pub(crate) fn destroy(&self) {
        // Never with views alive: the manager refuses to destroy such a workspace, and at
        // thread exit leaks it instead.
        if self.cycles.destroyed.replace(true) {
            return;
        }
        self.shared.destroy();
        self.region.set_end_offset(0);
        if self.cycles.depth.get() == 0 {
            self.release_all();
        }
    }

    fn release_all(&self) {
        self.region.set_base(std::ptr::null_mut());
        self.cycles.start.set(0);
        self.spills.clear();
        *self.buffer.borrow_mut() = None;
    }

    // ---- allocation -------------------------------------------------------------------

    /// Bump-allocates `layout` (semantics §2.2): the returned slice has `layout.size()` bytes.
    #[inline]
    pub(crate) fn alloc(&self, layout: Layout) -> Result<NonNull<[u8]>, Error> {
        match self.region.bump(layout) {
            Some(ptr) => {
                self.trace_bump(layout.size());
                Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
            }
            None => self.alloc_slow(layout),
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<[u8]>, Error> {
        let (ptr, _) = self.place(layout)?;
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    /// [`Arena::alloc`] with a validity stamp.
    pub(crate) fn alloc_memory(&self, layout: Layout) -> Result<WorkspaceMemory, Error> {
        let (ptr, landing) = self.place(layout)?;
        let keep_alive = match landing {
            Landing::Bumped if self.settings.circular => self.ring.keep_alive(),
            Landing::Spilled(keep) => keep,
            Landing::Bumped | Landing::Empty => None,
        };
        Ok(WorkspaceMemory {
            ptr,
            len: layout.size(),
            stamp: Stamp::new(self.shared.clone(), self.generation(), keep_alive),
        })
    }

    #[inline]
    fn place(&self, layout: Layout) -> Result<(NonNull<u8>, Landing), Error> {
        if let Some(ptr) = self.region.bump(layout) {
            self.trace_bump(layout.size());
            return Ok((ptr, Landing::Bumped));
        }
        self.place_slow(layout)
    }

    /// Everything but a bump: a closed workspace, a zero-size request, or a spill.
    #[cold]
    fn place_slow(&self, layout: Layout) -> Result<(NonNull<u8>, Landing), Error> {
        let align = self.settings.sizing.align.max(layout.align());
        if !self.is_open() {
            return Err(self.not_open());
        }
        if layout.size() == 0 {
            return Ok((dangling(align), Landing::Empty));
        }
        self.spill(layout, align)
    }

    /// Serves a request that does not fit, by spill policy (semantics §2.2, §2.4).
    #[cold]
    fn spill(&self, layout: Layout, align: usize) -> Result<(NonNull<u8>, Landing), Error> {
        let size = layout.size();
        let settings = &self.settings;
        let counted = spilled_bytes(size, align, settings.sizing.align).ok_or(Error::Alloc(
            AllocError::InvalidLayout {
                size,
                align,
                reason: "the size overflows when padded to the workspace alignment",
            },
        ))?;
        // Debug modes have no buffer to fill: every request goes to the pool, whatever the
        // spill policy says.
        if settings.config.policy_spill() == SpillPolicy::Fail && !settings.no_buffer {
            return Err(Error::WorkspaceFull {
                workspace: self.id().to_string(),
                requested: self.region.footprint(size, align),
                available: self
                    .region
                    .end_offset()
                    .saturating_sub(self.region.offset()),
            });
        }
        // The pool aligns to a page at most: a larger alignment (which the buffer serves)
        // takes a page-aligned block long enough to hold an aligned start.
        let (block_size, block_align) = if align > POOL_MAX_ALIGN {
            let padded = size
                .checked_add(align - POOL_MAX_ALIGN)
                .ok_or(Error::Alloc(AllocError::InvalidLayout {
                    size,
                    align,
                    reason: "the size overflows when padded to the alignment",
                }))?;
            (padded, POOL_MAX_ALIGN)
        } else {
            (size, align)
        };
        let block = settings
            .config
            .source()
            .allocate(block_size, block_align, Usage::Workspace)
            .map_err(|e| match e {
                // The padded page-aligned request is ours: name the caller's layout.
                AllocError::InvalidLayout { reason, .. } => AllocError::InvalidLayout {
                    size,
                    align,
                    reason,
                },
                other => other,
            })?;
        let start = block.ptr().as_ptr();
        // In bounds: the block starts on a page and holds `align - page` bytes more than
        // `size`, so the next multiple of `align` leaves `size` bytes after it.
        let ptr = NonNull::new(start.wrapping_add(start.align_offset(align)))
            .expect("a pointer into a block is not null");
        let used = self.spills.this_cycle() + counted;
        trace::record(
            EventKind::Spill,
            Space::Workspace,
            self.trace_name,
            size as u64,
            used as u64,
        );
        let landing = if settings.circular {
            let keep = self.spills.pin(block, counted, self.generation());
            Landing::Spilled(Some(keep))
        } else {
            self.spills.keep(block, counted);
            Landing::Spilled(None)
        };
        // A spill is pool memory other threads' reports must see (semantics §7): publish
        // it now, off the bump path, rather than at the end of the cycle.
        self.publish();
        Ok((ptr, landing))
    }

    #[cold]
    fn not_open(&self) -> Error {
        Error::WorkspaceNotOpen {
            workspace: self.id().to_string(),
            reason: if self.cycles.destroyed.get() {
                "it was destroyed"
            } else {
                "no cycle is running: it was left"
            },
        }
    }

    /// Grows the allocation at `ptr` from `old` to `new` (`new.size() >= old.size()`): in
    /// place if it is the last one bumped, suitably aligned and the cycle's region has
    /// room, else as a new allocation the caller copies into.
    pub(crate) fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<Resized, Error> {
        if (ptr.as_ptr() as usize) % new.align() == 0
            && self.is_open()
            && self.region.grow_last(ptr, old.size(), new.size())
        {
            return Ok(Resized::InPlace(NonNull::slice_from_raw_parts(
                ptr,
                new.size(),
            )));
        }
        self.alloc(new).map(Resized::Moved)
    }

    /// Shrinks the allocation at `ptr` to `new` (`new.size() <= old.size()`): in place if
    /// it is suitably aligned (the tail stays until the cycle ends), else as a new
    /// allocation the caller copies into.
    pub(crate) fn shrink(&self, ptr: NonNull<u8>, new: Layout) -> Result<Resized, Error> {
        if (ptr.as_ptr() as usize) % new.align() == 0 {
            return Ok(Resized::InPlace(NonNull::slice_from_raw_parts(
                ptr,
                new.size(),
            )));
        }
        self.alloc(new).map(Resized::Moved)
    }

    // ---- statistics -------------------------------------------------------------------

    /// A snapshot of the workspace's figures.
    pub(crate) fn stats(&self) -> WorkspaceStats {
        self.figures().named(self.id())
    }

    /// The figures of [`Arena::stats`], read without allocating.
    pub(crate) fn figures(&self) -> Figures {
        let size = self.size();
        Figures {
            size,
            used: if self.is_open() {
                self.region.offset() - self.cycles.start.get()
            } else {
                0
            },
            max_cycle: self.cycles.max_bytes.get(),
            spilled_bytes: self.spills.this_cycle(),
            pinned_bytes: self.spills.pinned_bytes(),
            total_spilled_bytes: self.spills.total(),
            cycles: self.cycles.completed.get(),
            generation: self.generation(),
            open: self.is_open(),
            circular: self.settings.circular,
            slots: match self.ring.shape() {
                Some(shape) if self.settings.circular && size > 0 => shape.slots,
                _ => 0,
            },
        }
    }
}

impl Arena {
    /// Records a bump of `bytes` in the timeline (semantics §7); one relaxed load when the
    /// recorder is off.
    #[inline]
    fn trace_bump(&self, bytes: usize) {
        if trace::is_on() {
            self.record_bump(bytes);
        }
    }

    /// The recording half of [`Arena::trace_bump`], out of line: the bump falls through to
    /// its caller when the recorder is off.
    #[cold]
    #[inline(never)]
    fn record_bump(&self, bytes: usize) {
        let used = self.region.offset() - self.cycles.start.get();
        trace::record(
            EventKind::Alloc,
            Space::Workspace,
            self.trace_name,
            bytes as u64,
            used as u64,
        );
    }

    /// The workspace's name in the timeline recorder.
    pub(crate) fn trace_name(&self) -> NameId {
        self.trace_name
    }

    /// The copy of the figures published for other threads.
    pub(crate) fn published(&self) -> &Arc<Published> {
        &self.published
    }

    /// Publishes the figures for other threads: a few relaxed stores.
    pub(crate) fn publish(&self) {
        self.published.store(&self.figures());
    }

    /// Publishes that a cycle runs (after an enter): two relaxed stores.
    pub(crate) fn publish_entered(&self) {
        if self.is_open() {
            self.published.store_entered(self.generation());
        }
    }
}

/// Whether a refusal of a new buffer would be a grant once the workspace gave back `freed`
/// bytes of its own: a refusal at the off-heap limit whose request fits in the room it
/// found plus those bytes. Anything else (another error, the physical limit, a request
/// too large even then) is not worth freeing the old buffer for: it would only be freed,
/// refused again and asked for back at every cycle end.
fn fits_once_freed(error: &Error, freed: usize) -> bool {
    match error.alloc_error() {
        Some(AllocError::OutOfMemory {
            needed,
            used,
            limit,
            ..
        }) => freed > 0 && *needed <= limit.saturating_sub(*used).saturating_add(freed),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemorySource;
    use ndmem_alloc::{Limits, Pool};

    #[test]
    #[cfg_attr(
        miri,
        ignore = "a MemorySource leaks its pool on purpose, and this binary keeps Miri's leak check"
    )]
    fn a_workspace_that_fails_to_be_created_gives_its_table_slot_back() {
        // 300 refused creations on one thread, more than the table's 255 slots: the next
        // workspace still gets a slot (and so the fast validity check).
        let tiny = MemorySource::new(Pool::new(Limits::builder().max_bytes(4 << 10).build()));
        let too_big = WorkspaceConfig::builder()
            .initial_size(1 << 20)
            .source(tiny)
            .build()
            .unwrap();
        for _ in 0..300 {
            assert!(matches!(
                Arena::new("REFUSED", &too_big, DebugMode::Normal),
                Err(Error::Alloc(AllocError::OutOfMemory { .. }))
            ));
        }
        let fine = Arena::new("FINE", &WorkspaceConfig::default(), DebugMode::Normal).unwrap();
        assert!(fine.shared().has_slot());
        fine.destroy();
    }
}
