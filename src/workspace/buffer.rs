//! The memory a workspace owns: its buffer (a block of its memory source's pool, or a
//! mapped file whose bytes are reserved in that pool) or, for circular workspaces, one
//! spill; and the registry that gives each file (by device and inode) to one workspace of
//! the process, for as long as any of its bytes are reachable.
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
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};
use ndmem_alloc::{page_size, AllocError, Block, Reservation, Usage};

use super::config::LocationPolicy;
use crate::error::Error;
use crate::memory::MemorySource;

/// Memory a workspace owns: its buffer, or (circular workspaces) one spill.
pub(crate) struct Buffer {
    base: NonNull<u8>,
    len: usize,
    _owner: Owner,
}

enum Owner {
    Pool(#[allow(dead_code)] Block<'static>),
    Mapped(#[allow(dead_code)] MappedFile),
}

// SAFETY: a Buffer owns its memory exclusively (a pool block, or a mapping of a file that
// this buffer's claim gives to one workspace of the process), like a Box<[u8]>; `base` is just its address.
// Accesses through it are raw-pointer accesses ordered by the workspace protocol (owner
// thread, or the circular ring discipline), never through `&Buffer`.
unsafe impl Send for Buffer {}
// SAFETY: `&Buffer` gives access to no bytes, only to the address, the length and the
// slot counts (atomics).
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of at least `len` bytes from `source`, where `location` says, aligned to
    /// `align`. A user file is mapped under `claim` (the workspace's), or claimed now.
    pub(crate) fn allocate(
        source: MemorySource,
        workspace: &str,
        location: &LocationPolicy,
        claim: Option<&FileClaim>,
        len: usize,
        align: usize,
    ) -> Result<Buffer, Error> {
        match location {
            LocationPolicy::Ram => Ok(Buffer::from_block(source.allocate(
                len,
                align.max(16),
                Usage::Workspace,
            )?)),
            LocationPolicy::Mmap { path: None } => map_file(source, workspace, None, len),
            LocationPolicy::Mmap { path: Some(path) } => match claim {
                Some(claim) => map_file(source, workspace, Some(claim), len),
                None => map_file(source, workspace, Some(&claim_path(workspace, path)?), len),
            },
        }
    }

    /// A pool block as a buffer (a spill, or a RAM buffer).
    pub(crate) fn from_block(block: Block<'static>) -> Buffer {
        Buffer {
            base: block.ptr(),
            len: block.capacity(),
            _owner: Owner::Pool(block),
        }
    }

    /// The first byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes owned (what the pool or the mapped file really holds).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("mapped", &matches!(self._owner, Owner::Mapped(_)))
            .finish()
    }
}

/// A mapped file; fields drop in order: unmap, then release the claim on the file and the
/// bytes.
struct MappedFile {
    _map: MmapMut,
    _claim: FileClaim,
    _reservation: Reservation<'static>,
}

fn file_error(workspace: &str, path: &Path, message: impl ToString) -> Error {
    Error::WorkspaceFile {
        workspace: workspace.to_string(),
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Maps `len` bytes (rounded up to pages) of the claimed user file `claim`, or of a new
/// temporary file without a name, with the bytes reserved in `source`'s pool.
fn map_file(
    source: MemorySource,
    workspace: &str,
    claim: Option<&FileClaim>,
    len: usize,
) -> Result<Buffer, Error> {
    let len =
        len.checked_next_multiple_of(page_size())
            .ok_or_else(|| AllocError::InvalidLayout {
                size: len,
                align: page_size(),
                reason: "the size overflows when rounded to whole pages",
            })?;
    let reservation = source.reserve(len, Usage::Workspace)?;
    let claim = match claim {
        Some(claim) => claim.clone(),
        None => temporary_file(workspace)?,
    };
    let (file, path) = (&claim.0.file, &claim.0.path);
    let current = file
        .metadata()
        .map_err(|e| file_error(workspace, path, e))?
        .len();
    let wanted = u64::try_from(len).map_err(|e| file_error(workspace, path, e))?;
    if current < wanted {
        // Files only ever grow, so older mappings of the same file stay valid.
        file.set_len(wanted)
            .map_err(|e| file_error(workspace, path, e))?;
    }
    // SAFETY: the file (its device and inode, not its name) is claimed for this workspace in
    // the process-wide registry, and the claim lives in the returned buffer, so no other
    // workspace maps it while these bytes are reachable; a temporary file has no name at
    // all. It is at least `len` bytes long and never shrunk by this crate. Changing the
    // file by other means while it is mapped (truncating it, or writing to it from another
    // process) is outside the safe API, as documented on `LocationPolicy::Mmap`.
    let mut map = unsafe { MmapOptions::new().len(len).map_mut(file) }
        .map_err(|e| file_error(workspace, path, e))?;
    let base = NonNull::new(map.as_mut_ptr())
        .ok_or_else(|| file_error(workspace, path, "the mapping is at address 0"))?;
    Ok(Buffer {
        base,
        len,
        _owner: Owner::Mapped(MappedFile {
            _map: map,
            _claim: claim,
            _reservation: reservation,
        }),
    })
}

/// A new temporary file, claimed, whose name is removed at once: no path can reach it, and
/// the system frees it when its last descriptor and mapping are gone.
fn temporary_file(workspace: &str) -> Result<FileClaim, Error> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // A name already taken (a file left by an earlier process of the same pid, or another
    // user's) is passed over for the next: up to 64 tries.
    let mut tries = 0;
    let (file, path) = loop {
        let path = std::env::temp_dir().join(format!(
            "ndmem-workspace-{}-{}.bin",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => break (file, path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 63 => tries += 1,
            Err(e) => return Err(file_error(workspace, &path, e)),
        }
    };
    // Claimed before the name goes, so that while it exists nothing else can map the file.
    let claim = claim_file(workspace, file, &path);
    let removed = std::fs::remove_file(&path).map_err(|e| file_error(workspace, &path, e));
    let claim = claim?;
    removed?;
    Ok(claim)
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

/// A file's identity: its device and inode, whatever name reaches it.
type FileId = (u64, u64);

/// Files mapped by workspaces of this process, by identity, with the workspace that
/// claimed each, so two workspaces (of any threads) never share bytes through one file.
static MAPPED_FILES: Mutex<Vec<(FileId, String)>> = Mutex::new(Vec::new());

/// Claims the user file at `path` for `workspace` (opening it, created if needed).
pub(crate) fn claim_path(workspace: &str, path: &Path) -> Result<FileClaim, Error> {
    claim_file(workspace, open_user_file(workspace, path)?, path)
}

/// Claims the open `file` (named `path` in messages) for `workspace`: refused if another
/// claim on the same device and inode lives.
fn claim_file(workspace: &str, file: File, path: &Path) -> Result<FileClaim, Error> {
    use std::os::unix::fs::MetadataExt;
    let meta = file
        .metadata()
        .map_err(|e| file_error(workspace, path, e))?;
    let id = (meta.dev(), meta.ino());
    let mut files = MAPPED_FILES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, owner)) = files.iter().find(|(f, _)| *f == id) {
        return Err(file_error(
            workspace,
            path,
            format!(
                "already mapped by workspace [{owner}] in this process (the same file, by \
                 this or another name), or still reachable through its tensors; give each \
                 workspace its own file"
            ),
        ));
    }
    files.push((id, workspace.to_string()));
    Ok(FileClaim(Arc::new(ClaimedFile {
        file,
        id,
        path: path.to_path_buf(),
    })))
}

/// A file given to one workspace (see [`claim_path`]): the arena holds one, and so does
/// every buffer mapping the file, so the claim lasts while any tensor or view can reach
/// the bytes (a ring buffer outlives its workspace while its stamps refer to it). The open
/// descriptor keeps the inode from being reused meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct FileClaim(Arc<ClaimedFile>);

#[derive(Debug)]
struct ClaimedFile {
    file: File,
    id: FileId,
    path: PathBuf,
}

impl Drop for ClaimedFile {
    fn drop(&mut self) {
        let mut files = MAPPED_FILES.lock().unwrap_or_else(|p| p.into_inner());
        files.retain(|(f, _)| *f != self.id);
    }
}
