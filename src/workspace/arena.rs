//! The cyclic bump arena behind one workspace: its buffer (a pool block or a mapped file),
//! bump allocation, spills, learning, the circular ring, and destruction (SEMANTICS 2.2-2.4).
//!
//! Invariant: every pointer handed out lies in `[base, base + limit)` of the live buffer or
//! in a spill block that the arena holds, and neither is freed or reused while any guard of
//! the cycle that handed it out is alive: the buffer is replaced or freed and spills are
//! dropped only when the last guard leaves (`depth` falls to 0), never through an allocation.
//! Circular workspaces additionally hand out `Arc`s of their spills, and counted references
//! to ring slots ([`SlotRef`]), in stamps: memory another thread may still read is freed
//! only after its last stamp drops, and a slot is reused only when no stamp refers to it.
//!
//! The ring (SEMANTICS 2.4): a circular buffer is `slots` blocks; cycle `n` bumps only
//! inside its own block `[k x block, (k + 1) x block)` and the next cycle starts at the next
//! block, wrapping to offset 0 after the last one, so a cycle's memory is overwritten only
//! `slots` cycles later, and never while a tensor still refers to it: a cycle starts in the
//! next slot whose reference count is 0, and spills everything if every slot is in use.
//! A request that does not fit in the rest of its block (in
//! particular one larger than the whole buffer) spills or fails by policy: it never loops.
//! Spills are pinned for two cycles; with `Reallocate` a ring that spilled is rebuilt two
//! cycles later with blocks of `max_cycle` bytes and the same slot count.
//!
//! The bump path reads and writes `Cell`s only: no lock, no allocation, no system call.
//! All of the workspace's `unsafe` code is in this module.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};
use ndmem_alloc::{page_size, AllocError, Block, Pool, Reservation, Usage};

use super::config::{DebugMode, LearningPolicy, LocationPolicy, SpillPolicy, WorkspaceConfig};
use super::manager::{WorkspaceGuard, WorkspaceStats};
use super::stamp::{KeepAlive, Shared, Stamp, WorkspaceMemory};
use crate::error::Error;

/// Margin on a circular workspace's first cycle when its block size is learned (SEMANTICS 2.4).
const CIRCULAR_BLOCK_MARGIN: f64 = 1.3;
/// Cycles a circular workspace keeps a spill (ND4J's "pinned" allocations), and waits
/// before rebuilding a ring that spilled (SEMANTICS 2.4).
const PINNED_CYCLES: u64 = 2;

/// Memory a workspace owns: its buffer, or (circular workspaces) one spill.
pub(crate) struct Buffer {
    base: NonNull<u8>,
    len: usize,
    /// For a ring: live [`SlotRef`]s per slot (empty otherwise).
    slot_refs: Box<[AtomicUsize]>,
    _owner: Owner,
}

/// A counted reference to one slot of a ring, held (through an `Arc`) by the stamps of the
/// memory bumped there. The ring starts no cycle in a slot while its count is above 0, so
/// the bytes stay as written for as long as any thread can reach them (SEMANTICS 3: the safe
/// API never reads memory that is being reused).
struct SlotRef {
    ring: Arc<Buffer>,
    slot: usize,
}

impl SlotRef {
    fn new(ring: Arc<Buffer>, slot: usize) -> SlotRef {
        // Counted on the owner thread, which is also the only one that reads the count.
        ring.slot_refs[slot].fetch_add(1, Ordering::Relaxed);
        SlotRef { ring, slot }
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        // Release: a reader's accesses happen before the owner's Acquire load sees the
        // count at 0 and starts writing the slot again.
        self.ring.slot_refs[self.slot].fetch_sub(1, Ordering::Release);
    }
}

enum Owner {
    Pool(#[allow(dead_code)] Block<'static>),
    Mapped(#[allow(dead_code)] MappedFile),
}

// SAFETY: a Buffer owns its memory exclusively (a pool block, or a private mapping of a file
// that only this process's one workspace maps), like a Box<[u8]>; `base` is just its address.
// Accesses through it are raw-pointer accesses ordered by the workspace protocol (owner
// thread, or the circular ring discipline), never through `&Buffer`.
unsafe impl Send for Buffer {}
// SAFETY: `&Buffer` gives access to no bytes, only to the address and length.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of at least `len` bytes where `location` says, aligned to `align`.
    fn allocate(
        workspace: &str,
        location: &LocationPolicy,
        len: usize,
        align: usize,
    ) -> Result<Buffer, Error> {
        match location {
            LocationPolicy::Ram => Ok(Buffer::from_block(Pool::global().allocate_for(
                len,
                align.max(16),
                Usage::Workspace,
            )?)),
            LocationPolicy::Mmap { path } => map_file(workspace, path.as_deref(), len),
        }
    }

    fn from_block(block: Block<'static>) -> Buffer {
        Buffer {
            base: block.ptr(),
            len: block.capacity(),
            slot_refs: Box::new([]),
            _owner: Owner::Pool(block),
        }
    }

    /// The buffer as a ring of `slots` slots, none referenced.
    fn into_ring(mut self, slots: usize) -> Buffer {
        self.slot_refs = (0..slots).map(|_| AtomicUsize::new(0)).collect();
        self
    }

    /// Whether no stamp refers to ring slot `slot`.
    fn slot_is_free(&self, slot: usize) -> bool {
        self.slot_refs[slot].load(Ordering::Acquire) == 0
    }
}

/// A mapped file; fields drop in order: unmap, remove the temporary file, release the bytes.
struct MappedFile {
    _map: MmapMut,
    _file: FileHandle,
    _reservation: Reservation<'static>,
}

/// A file backing a buffer; a temporary one is removed when the handle drops.
struct FileHandle {
    path: PathBuf,
    temporary: bool,
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn file_error(workspace: &str, path: &Path, message: impl ToString) -> Error {
    Error::WorkspaceFile {
        workspace: workspace.to_string(),
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Maps `len` bytes (rounded up to pages) of `path`, or of a new temporary file.
fn map_file(workspace: &str, path: Option<&Path>, len: usize) -> Result<Buffer, Error> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let len =
        len.checked_next_multiple_of(page_size())
            .ok_or_else(|| AllocError::InvalidLayout {
                size: len,
                align: page_size(),
                reason: "the size overflows when rounded to whole pages",
            })?;
    let reservation = Pool::global().reserve(len, Usage::Workspace)?;
    let (file, handle) = match path {
        None => {
            let path = std::env::temp_dir().join(format!(
                "ndmem-workspace-{}-{}.bin",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| file_error(workspace, &path, e))?;
            (
                file,
                FileHandle {
                    path,
                    temporary: true,
                },
            )
        }
        Some(path) => (
            open_user_file(workspace, path)?,
            FileHandle {
                path: path.to_path_buf(),
                temporary: false,
            },
        ),
    };
    let current = file
        .metadata()
        .map_err(|e| file_error(workspace, &handle.path, e))?
        .len();
    let wanted = u64::try_from(len).map_err(|e| file_error(workspace, &handle.path, e))?;
    if current < wanted {
        // Files only ever grow, so older mappings of the same file stay valid.
        file.set_len(wanted)
            .map_err(|e| file_error(workspace, &handle.path, e))?;
    }
    // SAFETY: the file is either new and private to this call (create_new), or a user file
    // that the path registry gives to this workspace alone within the process; it is at
    // least `len` bytes long and never shrunk by us. Other processes writing to a user file
    // concurrently is documented as unsupported (LocationPolicy::Mmap).
    let mut map = unsafe { MmapOptions::new().len(len).map_mut(&file) }
        .map_err(|e| file_error(workspace, &handle.path, e))?;
    let base = NonNull::new(map.as_mut_ptr())
        .ok_or_else(|| file_error(workspace, &handle.path, "the mapping is at address 0"))?;
    Ok(Buffer {
        base,
        len,
        slot_refs: Box::new([]),
        _owner: Owner::Mapped(MappedFile {
            _map: map,
            _file: handle,
            _reservation: reservation,
        }),
    })
}

fn open_user_file(workspace: &str, path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| file_error(workspace, path, e))
}

/// User files mapped by a workspace of this process, so two workspaces (of any threads)
/// never share bytes through the same file.
static MAPPED_PATHS: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// Claims `path` for `workspace`; released when the returned claim drops.
fn claim_path(workspace: &str, path: &Path) -> Result<PathClaim, Error> {
    open_user_file(workspace, path)?;
    let canonical = path
        .canonicalize()
        .map_err(|e| file_error(workspace, path, e))?;
    let mut paths = MAPPED_PATHS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, owner)) = paths.iter().find(|(p, _)| *p == canonical) {
        return Err(file_error(
            workspace,
            path,
            format!("already mapped by workspace [{owner}] in this process; give each workspace its own file"),
        ));
    }
    paths.push((canonical.clone(), workspace.to_string()));
    Ok(PathClaim(canonical))
}

struct PathClaim(PathBuf);

impl Drop for PathClaim {
    fn drop(&mut self) {
        let mut paths = MAPPED_PATHS.lock().unwrap_or_else(|p| p.into_inner());
        paths.retain(|(p, _)| *p != self.0);
    }
}

/// `bytes x factor`, rounded up, tolerant of floating-point noise (1000 x 1.3 is 1300).
fn scaled(bytes: usize, factor: f64) -> usize {
    let exact = bytes as f64 * factor;
    let nearest = exact.round();
    let value = if (exact - nearest).abs() <= 1e-9 * nearest.max(1.0) {
        nearest
    } else {
        exact.ceil()
    };
    if value >= usize::MAX as f64 {
        usize::MAX
    } else {
        value as usize
    }
}

/// Where an allocation was placed.
enum Placement {
    /// A zero-size request: a dangling, aligned pointer.
    Empty,
    /// In the buffer.
    Bumped,
    /// In a spill block; for circular workspaces, the block to keep alive.
    Spilled(Option<KeepAlive>),
}

/// One workspace of one thread.
pub(crate) struct Arena {
    shared: Arc<Shared>,
    config: WorkspaceConfig,
    align: usize,
    /// `NDMEM_WORKSPACES` asked for every allocation to spill (or bypass): no buffer, ever.
    no_buffer: bool,
    bypass: bool,
    circular: bool,

    buffer: RefCell<Option<Arc<Buffer>>>,
    base: Cell<*mut u8>,
    size: Cell<usize>,

    /// The next free byte: `base + offset` (kept as a pointer so the bump reads one field).
    cursor: Cell<*mut u8>,
    /// Where this cycle started (a slot boundary; 0 for BlockLeft).
    start: Cell<usize>,
    /// Address of the end of the region this cycle may bump into; 0 when no cycle runs.
    end: Cell<usize>,
    /// Bytes this cycle spilled (padded as they would be in the buffer).
    spilled: Cell<usize>,
    spills: RefCell<Vec<Block<'static>>>,
    /// Circular spills with the generation that made them.
    pinned: RefCell<VecDeque<(u64, Arc<Buffer>)>>,
    pinned_bytes: Cell<usize>,
    total_spilled: Cell<u64>,

    max_cycle: Cell<usize>,
    cycles: Cell<u64>,
    generation: Cell<u64>,
    depth: Cell<u32>,
    parent: RefCell<Weak<Arena>>,
    destroyed: Cell<bool>,

    /// Circular ring: bytes per slot, slot count, slot of this cycle, when to rebuild.
    block: Cell<usize>,
    slots: Cell<usize>,
    slot: Cell<usize>,
    /// The reference to this cycle's slot that its stamps share (one per cycle, so a bump
    /// costs an `Arc` clone, not an allocation).
    slot_ref: RefCell<Option<Arc<SlotRef>>>,
    grow_at: Cell<Option<u64>>,

    _claim: Option<PathClaim>,
}

impl Arena {
    /// A workspace `id` of the calling thread; with `initial_size > 0` its buffer is
    /// allocated now.
    pub(crate) fn new(id: &str, config: &WorkspaceConfig, mode: DebugMode) -> Result<Arena, Error> {
        let claim = match config.policy_location() {
            LocationPolicy::Mmap { path: Some(path) } => Some(claim_path(id, path)?),
            _ => None,
        };
        let circular = config.is_circular();
        let arena = Arena {
            shared: Arc::new(Shared::new(id, circular)),
            config: config.clone(),
            align: config.alignment(),
            no_buffer: mode != DebugMode::Normal,
            bypass: mode == DebugMode::Bypass,
            circular,
            buffer: RefCell::new(None),
            base: Cell::new(std::ptr::null_mut()),
            size: Cell::new(0),
            cursor: Cell::new(std::ptr::null_mut()),
            start: Cell::new(0),
            end: Cell::new(0),
            spilled: Cell::new(0),
            spills: RefCell::new(Vec::new()),
            pinned: RefCell::new(VecDeque::new()),
            pinned_bytes: Cell::new(0),
            total_spilled: Cell::new(0),
            max_cycle: Cell::new(0),
            cycles: Cell::new(0),
            generation: Cell::new(0),
            depth: Cell::new(0),
            parent: RefCell::new(Weak::new()),
            destroyed: Cell::new(false),
            block: Cell::new(0),
            slots: Cell::new(1),
            slot: Cell::new(0),
            slot_ref: RefCell::new(None),
            grow_at: Cell::new(None),
            _claim: claim,
        };
        if config.initial_size() > 0 && !arena.no_buffer {
            if circular {
                let block = arena.round(config.initial_size());
                arena.build_ring(
                    block,
                    arena.clamp(scaled(block, config.overallocation_factor())),
                )?;
            } else {
                let bytes = arena.clamp(scaled(
                    config.initial_size(),
                    config.overallocation_factor(),
                ));
                arena.install(Buffer::allocate(
                    id,
                    config.policy_location(),
                    bytes,
                    arena.align,
                )?);
            }
        }
        Ok(arena)
    }

    /// The workspace id.
    pub(crate) fn id(&self) -> &str {
        self.shared.id()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether `NDMEM_WORKSPACES=bypass` was in force when the workspace was created.
    pub(crate) fn is_bypassed(&self) -> bool {
        self.bypass
    }

    /// Whether a cycle is running (entered, not left, not destroyed).
    pub(crate) fn is_open(&self) -> bool {
        self.depth.get() > 0 && !self.destroyed.get()
    }

    /// The generation of the current or last cycle.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// The workspace that was current when this cycle started, if it still exists.
    pub(crate) fn parent(&self) -> Option<Rc<Arena>> {
        self.parent.borrow().upgrade()
    }

    // ---- sizes ------------------------------------------------------------------------

    fn round(&self, bytes: usize) -> usize {
        bytes
            .checked_next_multiple_of(self.align)
            .unwrap_or(usize::MAX - (self.align - 1))
    }

    /// Clamps a buffer size to `[min_size, max_size]` and rounds it to the alignment.
    fn clamp(&self, bytes: usize) -> usize {
        let mut bytes = bytes.max(self.config.min_size());
        if self.config.max_size() > 0 {
            bytes = bytes.min(self.config.max_size());
        }
        self.round(bytes)
    }

    fn install(&self, buffer: Buffer) {
        self.base.set(buffer.base.as_ptr());
        self.size.set(buffer.len);
        *self.buffer.borrow_mut() = Some(Arc::new(buffer));
    }

    /// Allocates a ring of `buffer` bytes in blocks of `block` bytes and starts at slot 0.
    fn build_ring(&self, block: usize, buffer: usize) -> Result<(), Error> {
        let block = block.min(buffer);
        if block == 0 {
            return Ok(());
        }
        let slots = (buffer / block).max(1);
        let fresh = Buffer::allocate(self.id(), self.config.policy_location(), buffer, self.align)?;
        self.install(fresh.into_ring(slots));
        self.block.set(block);
        self.slots.set(slots);
        self.slot.set(0);
        Ok(())
    }

    // ---- the cycle --------------------------------------------------------------------

    /// Enters the workspace: starts a cycle, or only nests if one is running.
    ///
    /// A new cycle is refused while views of the memory are alive (SEMANTICS 3: the safe
    /// API never reads memory that is being reused); re-entry is always allowed.
    pub(crate) fn enter(&self, parent: Option<&Rc<Arena>>) -> Result<(), Error> {
        let depth = self.depth.get();
        let views = self.shared.views();
        if depth == 0 && !self.destroyed.get() && views > 0 {
            return Err(Error::WorkspaceInUse {
                workspace: self.id().to_string(),
                action: "start a new cycle",
                views,
            });
        }
        self.depth.set(depth + 1);
        if depth > 0 || self.destroyed.get() {
            return Ok(());
        }
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        *self.parent.borrow_mut() = parent.map(Rc::downgrade).unwrap_or_default();
        let (start, limit) = if self.base.get().is_null() {
            (0, 0)
        } else if self.circular {
            match self.free_slot() {
                Some((ring, slot)) => {
                    self.slot.set(slot);
                    *self.slot_ref.borrow_mut() = Some(Arc::new(SlotRef::new(ring, slot)));
                    let start = slot * self.block.get();
                    (start, start + self.block.get())
                }
                // Every slot holds memory a tensor still refers to: this cycle spills.
                None => (0, 0),
            }
        } else {
            (0, self.size.get())
        };
        self.start.set(start);
        self.set_offset(start);
        self.set_limit(limit);
        self.spilled.set(0);
        self.shared.open(generation);
        Ok(())
    }

    /// The ring and its first slot, from the next one, that no stamp refers to.
    fn free_slot(&self) -> Option<(Arc<Buffer>, usize)> {
        let buffer = self.buffer.borrow();
        let ring = buffer.as_ref()?;
        let (next, slots) = (self.slot.get(), self.slots.get());
        (0..slots)
            .map(|i| (next + i) % slots)
            .find(|&slot| ring.slot_is_free(slot))
            .map(|slot| (Arc::clone(ring), slot))
    }

    /// Leaves the workspace; the last leave of a cycle ends it (SEMANTICS 2.2).
    pub(crate) fn leave(&self) {
        let depth = self.depth.get().saturating_sub(1);
        self.depth.set(depth);
        if depth > 0 {
            return;
        }
        *self.parent.borrow_mut() = Weak::new();
        // The cycle's own reference to its slot; stamps keep theirs.
        self.slot_ref.borrow_mut().take();
        if self.destroyed.get() {
            self.release_all();
            return;
        }
        self.shared.close(self.generation.get());
        let spilled = self.spilled.get();
        let bytes = (self.offset() - self.start.get()).saturating_add(spilled);
        self.max_cycle.set(self.max_cycle.get().max(bytes));
        self.cycles.set(self.cycles.get() + 1);
        self.spilled.set(0);
        let had_buffer = !self.base.get().is_null();
        if self.shared.views() > 0 {
            // A view still reads this cycle's memory: keep spills and buffer as they are;
            // the next cycle cannot start before the view is gone, and its end frees them.
        } else if self.circular {
            self.end_circular_cycle(had_buffer, spilled > 0);
        } else {
            self.spills.borrow_mut().clear();
            if !self.no_buffer {
                if !had_buffer {
                    if self.should_learn() {
                        let target = self.clamp(scaled(
                            self.max_cycle.get(),
                            self.config.overallocation_factor(),
                        ));
                        self.replace_buffer(target);
                    }
                } else if spilled > 0 && self.config.policy_spill() == SpillPolicy::Reallocate {
                    self.replace_buffer(self.clamp(self.max_cycle.get()));
                }
            }
        }
        self.set_offset(self.start.get());
        self.set_limit(0);
    }

    /// Whether a workspace without a buffer learns its size now (SEMANTICS 2.3).
    fn should_learn(&self) -> bool {
        if self.config.initial_size() > 0 {
            return false;
        }
        match self.config.policy_learning() {
            LearningPolicy::FirstLoop => true,
            LearningPolicy::OverTime => {
                self.cycles.get() >= self.config.cycles_before_initialization().max(1)
            }
            LearningPolicy::None => false,
        }
    }

    /// Replaces a BlockLeft buffer by one of `bytes` if that is larger (learning never
    /// shrinks). If the pool refuses, the workspace keeps its buffer (or keeps spilling) and
    /// tries again at a later cycle end.
    fn replace_buffer(&self, bytes: usize) {
        if bytes == 0 || bytes <= self.size.get() {
            return;
        }
        if let Ok(fresh) =
            Buffer::allocate(self.id(), self.config.policy_location(), bytes, self.align)
        {
            self.install(fresh);
        }
    }

    fn end_circular_cycle(&self, had_buffer: bool, spilled: bool) {
        let generation = self.generation.get();
        {
            let mut pinned = self.pinned.borrow_mut();
            while let Some((made_in, spill)) = pinned.front() {
                if made_in + PINNED_CYCLES > generation {
                    break;
                }
                self.pinned_bytes.set(self.pinned_bytes.get() - spill.len);
                pinned.pop_front();
            }
        }
        if self.no_buffer {
            return;
        }
        if !had_buffer {
            if self.should_learn() {
                let block = self.round(scaled(self.max_cycle.get(), CIRCULAR_BLOCK_MARGIN));
                let buffer = self.clamp(scaled(block, self.config.overallocation_factor()));
                let _ = self.build_ring(block, buffer);
                self.start.set(0);
            }
            return;
        }
        if spilled
            && self.config.policy_spill() == SpillPolicy::Reallocate
            && self.grow_at.get().is_none()
        {
            self.grow_at.set(Some(generation + PINNED_CYCLES));
        }
        if self.grow_at.get().is_some_and(|at| generation >= at) {
            self.grow_at.set(None);
            let block = self.round(self.max_cycle.get());
            let buffer = self.clamp(block.saturating_mul(self.slots.get()));
            // Compared with the bytes the ring uses, not the pool block's capacity: a size
            // class may round the old block up past the new ring, which must still be built.
            let used = self.block.get().saturating_mul(self.slots.get());
            if block > self.block.get() && buffer > used {
                // Stamps of earlier cycles keep the old ring alive while they need it.
                let _ = self.build_ring(block, buffer);
                self.start.set(0);
                return;
            }
        }
        let slot = (self.slot.get() + 1) % self.slots.get();
        self.slot.set(slot);
        self.start.set(slot * self.block.get());
    }

    /// Destroys the workspace: stamps fail from now on, and its memory is freed now, or
    /// when its last guard leaves if it is open (SEMANTICS 2.2).
    pub(crate) fn destroy(&self) {
        // Never with views alive: the manager refuses to destroy such a workspace, and at
        // thread exit leaks it instead.
        if self.destroyed.replace(true) {
            return;
        }
        self.shared.destroy();
        self.set_limit(0);
        if self.depth.get() == 0 {
            self.release_all();
        }
    }

    fn release_all(&self) {
        self.base.set(std::ptr::null_mut());
        self.size.set(0);
        self.set_offset(0);
        self.start.set(0);
        self.set_limit(0);
        self.spills.borrow_mut().clear();
        self.pinned.borrow_mut().clear();
        self.pinned_bytes.set(0);
        *self.buffer.borrow_mut() = None;
    }

    // ---- allocation -------------------------------------------------------------------

    /// Bump-allocates `layout` (SEMANTICS 2.2): the returned slice has `layout.size()` bytes.
    #[inline]
    pub(crate) fn alloc(&self, layout: Layout) -> Result<NonNull<[u8]>, Error> {
        match self.bump(layout) {
            Some(ptr) => Ok(NonNull::slice_from_raw_parts(ptr, layout.size())),
            None => self.alloc_slow(layout),
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<[u8]>, Error> {
        let (ptr, _) = self.place(layout)?;
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    /// The bump itself: a pointer if the request fits the running cycle's region.
    #[inline(always)]
    fn bump(&self, layout: Layout) -> Option<NonNull<u8>> {
        let size = layout.size();
        let align = self.align.max(layout.align());
        let cursor = self.cursor.get();
        let pad = (cursor as usize).wrapping_neg() & (align - 1);
        // `end` is 0 unless a cycle is running, so a left or destroyed workspace never
        // passes this test. `pad + size` cannot overflow: `pad` is below the larger of the
        // workspace alignment (at most 4096) and `layout.align()`, and a Layout's size plus
        // its alignment fits in isize.
        let new_end = (cursor as usize).checked_add(pad + size)?;
        if size == 0 || new_end > self.end.get() {
            return None;
        }
        self.cursor.set(cursor.wrapping_add(pad + size));
        // SAFETY: `cursor + pad < new_end <= end`, and whenever `end > 0` the region
        // `[cursor, end)` lies inside the live buffer, so the result is in it and not null.
        Some(unsafe { NonNull::new_unchecked(cursor.add(pad)) })
    }

    /// Offset of the next free byte from the buffer's base.
    fn offset(&self) -> usize {
        (self.cursor.get() as usize).wrapping_sub(self.base.get() as usize)
    }

    fn set_offset(&self, offset: usize) {
        self.cursor.set(self.base.get().wrapping_add(offset));
    }

    /// Offset of the end of this cycle's region (0: no cycle runs).
    fn limit(&self) -> usize {
        self.end.get().saturating_sub(self.base.get() as usize)
    }

    fn set_limit(&self, limit: usize) {
        let end = if limit == 0 {
            0
        } else {
            (self.base.get() as usize).wrapping_add(limit)
        };
        self.end.set(end);
    }

    /// [`Arena::alloc`] with a validity stamp.
    pub(crate) fn alloc_memory(&self, layout: Layout) -> Result<WorkspaceMemory, Error> {
        let (ptr, placement) = self.place(layout)?;
        let keep_alive = match placement {
            Placement::Bumped if self.circular => self
                .slot_ref
                .borrow()
                .as_ref()
                .map(|slot| Arc::clone(slot) as KeepAlive),
            Placement::Spilled(keep) => keep,
            Placement::Bumped | Placement::Empty => None,
        };
        Ok(WorkspaceMemory {
            ptr,
            len: layout.size(),
            stamp: Stamp::new(self.shared.clone(), self.generation.get(), keep_alive),
        })
    }

    #[inline]
    fn place(&self, layout: Layout) -> Result<(NonNull<u8>, Placement), Error> {
        if let Some(ptr) = self.bump(layout) {
            return Ok((ptr, Placement::Bumped));
        }
        let align = self.align.max(layout.align());
        let address = self.cursor.get() as usize;
        self.place_slow(layout, align, address.wrapping_neg() & (align - 1))
    }

    /// Everything but a bump: a closed workspace, a zero-size request, or a spill.
    #[cold]
    fn place_slow(
        &self,
        layout: Layout,
        align: usize,
        pad: usize,
    ) -> Result<(NonNull<u8>, Placement), Error> {
        if self.depth.get() == 0 || self.destroyed.get() {
            return Err(self.not_open());
        }
        if layout.size() == 0 {
            return Ok((dangling(align), Placement::Empty));
        }
        self.spill(layout, align, pad)
    }

    /// Serves a request that does not fit, by spill policy (SEMANTICS 2.2, 2.4).
    #[cold]
    fn spill(
        &self,
        layout: Layout,
        align: usize,
        pad: usize,
    ) -> Result<(NonNull<u8>, Placement), Error> {
        let size = layout.size();
        // What the request occupies in a buffer: rounded to its alignment, plus the worst
        // padding before it when it is more aligned than the workspace.
        let counted = size
            .checked_next_multiple_of(align)
            .and_then(|s| s.checked_add(align - align.min(self.align)))
            .filter(|s| *s <= isize::MAX as usize)
            .ok_or(Error::Alloc(AllocError::InvalidLayout {
                size,
                align,
                reason: "the size overflows when padded to the workspace alignment",
            }))?;
        // Debug modes have no buffer to fill: every request goes to the pool, whatever the
        // spill policy says.
        if self.config.policy_spill() == SpillPolicy::Fail && !self.no_buffer {
            return Err(Error::WorkspaceFull {
                workspace: self.id().to_string(),
                requested: size.saturating_add(pad),
                available: self.limit().saturating_sub(self.offset()),
            });
        }
        let block = Pool::global().allocate_for(size, align, Usage::Workspace)?;
        let ptr = block.ptr();
        self.spilled.set(self.spilled.get().saturating_add(counted));
        self.total_spilled
            .set(self.total_spilled.get().saturating_add(counted as u64));
        if self.circular {
            let spill = Arc::new(Buffer::from_block(block));
            self.pinned_bytes.set(self.pinned_bytes.get() + spill.len);
            self.pinned
                .borrow_mut()
                .push_back((self.generation.get(), Arc::clone(&spill)));
            Ok((ptr, Placement::Spilled(Some(spill as KeepAlive))))
        } else {
            self.spills.borrow_mut().push(block);
            Ok((ptr, Placement::Spilled(None)))
        }
    }

    #[cold]
    fn not_open(&self) -> Error {
        Error::WorkspaceNotOpen {
            workspace: self.id().to_string(),
            reason: if self.destroyed.get() {
                "it was destroyed"
            } else {
                "no cycle is running: it was left"
            },
        }
    }

    /// Extends the allocation at `ptr` of `old` bytes to `new` bytes in place if it is the
    /// last one bumped and the cycle's region has room.
    fn grow_in_place(&self, ptr: NonNull<u8>, old: usize, new: usize) -> bool {
        if self.depth.get() == 0 || self.destroyed.get() || self.base.get().is_null() {
            return false;
        }
        let at = (ptr.as_ptr() as usize).wrapping_sub(self.base.get() as usize);
        if at.checked_add(old) != Some(self.offset()) {
            return false;
        }
        match at.checked_add(new) {
            Some(end) if end <= self.limit() => {
                self.set_offset(end);
                true
            }
            _ => false,
        }
    }

    // ---- statistics -------------------------------------------------------------------

    /// A snapshot of the workspace's figures.
    pub(crate) fn stats(&self) -> WorkspaceStats {
        WorkspaceStats {
            id: self.id().to_string(),
            size: self.size.get(),
            used: if self.is_open() {
                self.offset() - self.start.get()
            } else {
                0
            },
            max_cycle: self.max_cycle.get(),
            spilled_bytes: self.spilled.get(),
            pinned_bytes: self.pinned_bytes.get(),
            total_spilled_bytes: self.total_spilled.get(),
            cycles: self.cycles.get(),
            generation: self.generation.get(),
            open: self.is_open(),
            circular: self.circular,
            slots: if self.circular && self.size.get() > 0 {
                self.slots.get()
            } else {
                0
            },
        }
    }
}

/// A dangling pointer aligned to `align`, for zero-size requests.
fn dangling(align: usize) -> NonNull<u8> {
    // SAFETY: `align` is a power of two, so never 0; the pointer is never dereferenced
    // (zero-size allocations are only compared and passed back).
    unsafe { NonNull::new_unchecked(std::ptr::null_mut::<u8>().wrapping_add(align)) }
}

// SAFETY: the pointer in a WorkspaceMemory is a plain address; every access through it is
// an `unsafe` operation of the holder that must be preceded by `Stamp::check` (which refuses
// non-owner threads for non-circular workspaces), and the Stamp itself is Send + Sync.
unsafe impl Send for WorkspaceMemory {}
// SAFETY: as above; `&WorkspaceMemory` exposes only copies of the address and the stamp.
unsafe impl Sync for WorkspaceMemory {}

// SAFETY: memory returned by `allocate` lies in the workspace's buffer or in a spill block
// held by the arena (see the module invariant). Both stay allocated until the cycle ends,
// and the cycle ends only when the last guard of the workspace leaves: `&WorkspaceGuard`
// borrows a guard, so every value using this allocator is dropped before that (the
// reason the impl is on `&WorkspaceGuard` and nothing reachable from it can reset the
// arena; bump-scope #137). Guards are !Send and !Sync, so the allocator is used on the
// owner thread only. `deallocate` is a no-op (memory returns at cycle end), and `grow` /
// `shrink` either keep the block in place within its bounds or fall back to
// allocate-copy, as the trait requires.
unsafe impl allocator_api2::alloc::Allocator for &WorkspaceGuard {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        self.arena()
            .alloc(layout)
            .map_err(|_| allocator_api2::alloc::AllocError)
    }

    #[inline]
    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _layout: Layout) {}

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if (ptr.as_ptr() as usize) % new_layout.align() == 0
            && self
                .arena()
                .grow_in_place(ptr, old_layout.size(), new_layout.size())
        {
            return Ok(NonNull::slice_from_raw_parts(ptr, new_layout.size()));
        }
        let fresh = self
            .arena()
            .alloc(new_layout)
            .map_err(|_| allocator_api2::alloc::AllocError)?;
        // SAFETY: the caller guarantees `ptr` holds `old_layout.size()` bytes, and `fresh`
        // is a distinct allocation of at least that many (`new >= old` for grow).
        unsafe {
            std::ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                fresh.cast::<u8>().as_ptr(),
                old_layout.size(),
            );
        }
        Ok(fresh)
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        _old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if (ptr.as_ptr() as usize) % new_layout.align() == 0 {
            return Ok(NonNull::slice_from_raw_parts(ptr, new_layout.size()));
        }
        let fresh = self
            .arena()
            .alloc(new_layout)
            .map_err(|_| allocator_api2::alloc::AllocError)?;
        // SAFETY: the caller guarantees `ptr` holds at least `new_layout.size()`
        // bytes, and `fresh` is a distinct allocation of `new_layout.size()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                fresh.cast::<u8>().as_ptr(),
                new_layout.size(),
            );
        }
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_ignores_floating_point_noise() {
        assert_eq!(scaled(1000, 1.3), 1300);
        assert_eq!(scaled(65536, 1.3), 85197);
        assert_eq!(scaled(7, 1.0), 7);
        assert_eq!(scaled(usize::MAX, 2.0), usize::MAX);
    }

    #[test]
    fn dangling_pointers_are_aligned() {
        for shift in 0..13 {
            let align = 1usize << shift;
            assert_eq!(dangling(align).as_ptr() as usize % align, 0);
        }
    }
}
