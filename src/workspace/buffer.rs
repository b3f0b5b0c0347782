//! The memory a workspace owns: its buffer (a block of its memory source's pool, or a
//! mapped file whose bytes are reserved in that pool) or, for circular workspaces, one
//! spill; and the registry that gives each user file to one workspace of the process.
//!
//! Invariant: a [`Buffer`] owns `[base, base + len)` exclusively for its whole life, like a
//! `Box<[u8]>`: the pool block or the mapping is released only when the `Buffer` drops, so
//! the address stays valid while anything holds it (the arena, or a stamp's `Arc`). A
//! buffer never reads or writes its bytes: accesses through `base` are ordered by the
//! workspace protocol (the owner thread, or the ring's slot counts).

#![allow(unsafe_code)]

use std::fmt;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use memmap2::{MmapMut, MmapOptions};
use ndmem_alloc::{page_size, AllocError, Block, MemoryKind, Reservation, Usage};

use super::config::LocationPolicy;
use super::slots::SlotCounts;
use crate::error::Error;
use crate::memory::MemorySource;

/// `errno` for a heap that cannot hold a ring's bookkeeping.
const ENOMEM: i32 = 12;

/// Memory a workspace owns: its buffer, or (circular workspaces) one spill.
pub(crate) struct Buffer {
    base: NonNull<u8>,
    len: usize,
    /// For a ring: live references per slot (empty otherwise).
    slots: SlotCounts,
    _owner: Owner,
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
// SAFETY: `&Buffer` gives access to no bytes, only to the address, the length and the
// slot counts (atomics).
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of at least `len` bytes from `source`, where `location` says, aligned to
    /// `align`.
    pub(crate) fn allocate(
        source: MemorySource,
        workspace: &str,
        location: &LocationPolicy,
        len: usize,
        align: usize,
    ) -> Result<Buffer, Error> {
        match location {
            LocationPolicy::Ram => Ok(Buffer::from_block(source.allocate(
                len,
                align.max(16),
                Usage::Workspace,
            )?)),
            LocationPolicy::Mmap { path } => map_file(source, workspace, path.as_deref(), len),
        }
    }

    /// A pool block as a buffer (a spill, or a RAM buffer).
    pub(crate) fn from_block(block: Block<'static>) -> Buffer {
        Buffer {
            base: block.ptr(),
            len: block.capacity(),
            slots: SlotCounts::new(0),
            _owner: Owner::Pool(block),
        }
    }

    /// The buffer as a ring of `slots` slots, none referenced; an error if the heap cannot
    /// hold the slots' counts.
    pub(crate) fn into_ring(mut self, slots: usize) -> Result<Buffer, Error> {
        self.slots = SlotCounts::try_new(slots).ok_or(AllocError::Os {
            kind: MemoryKind::Host,
            requested: slots.saturating_mul(std::mem::size_of::<usize>()),
            errno: ENOMEM,
        })?;
        Ok(self)
    }

    /// The first byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes owned (what the pool or the mapped file really holds).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The ring's slot reference counts (empty if the buffer is not a ring).
    pub(crate) fn slots(&self) -> &SlotCounts {
        &self.slots
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("slots", &self.slots)
            .field("mapped", &matches!(self._owner, Owner::Mapped(_)))
            .finish()
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

/// Maps `len` bytes (rounded up to pages) of `path`, or of a new temporary file, with the
/// bytes reserved in `source`'s pool.
fn map_file(
    source: MemorySource,
    workspace: &str,
    path: Option<&Path>,
    len: usize,
) -> Result<Buffer, Error> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let len =
        len.checked_next_multiple_of(page_size())
            .ok_or_else(|| AllocError::InvalidLayout {
                size: len,
                align: page_size(),
                reason: "the size overflows when rounded to whole pages",
            })?;
    let reservation = source.reserve(len, Usage::Workspace)?;
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
        slots: SlotCounts::new(0),
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
pub(crate) fn claim_path(workspace: &str, path: &Path) -> Result<PathClaim, Error> {
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

/// A user file given to one workspace (see [`claim_path`]).
#[derive(Debug)]
pub(crate) struct PathClaim(PathBuf);

impl Drop for PathClaim {
    fn drop(&mut self) {
        let mut paths = MAPPED_PATHS.lock().unwrap_or_else(|p| p.into_inner());
        paths.retain(|(p, _)| *p != self.0);
    }
}
