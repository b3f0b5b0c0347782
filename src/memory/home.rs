//! Where a tensor's bytes live, and the checked ways to touch them.
//!
//! A [`Home`] is a workspace slot (bump memory, valid while its stamp says so), a pool
//! block (valid until its owner frees it), or device memory (a device buffer mirrored on
//! the host on demand, semantics §5; valid like a pool block). For device memory the bytes
//! handed out are the host copy's, made current first (a counted download when stale);
//! device operations reach the device side through [`Home::device_slot`].
//!
//! Invariant: the bytes of a home are reachable only through [`Home::read_checked`] (under
//! an epoch pin, after its [`Probe`] passed), [`Home::hold_for_view`] (under a view count or
//! a workspace view pin), [`Home::write_unshared`] (for the only tensor handle, under a pin)
//! and [`Home::bytes_mut`] (before the home is shared), each after the validity check of
//! semantics §3 and §4 (the workspace stamp, or the block's freed bit; a [`Probe`] is that
//! check with the checked word's address, for a handle to keep beside it). A freed block
//! goes to [`crate::reclaim`] only once no view holds it ([`Handoff`] decides who frees it,
//! once), so a reader that passed the check keeps the memory until it unpins or
//! drops its view. This module and the workspace arena are the only places in the `ndmem`
//! crate that turn raw memory pointers into slices.

#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use ndmem_alloc::Block;

use crate::device::slot::{Access, DeviceSlot};
use crate::error::Error;
use crate::memory::handoff::{Handoff, ViewEntry};
use crate::memory::MemorySource;
use crate::reclaim::{self, Pin};
use crate::workspace::{cycle_word_passes, Stamp, StampProbe, ViewPin, WorkspaceMemory};

/// Why a home's bytes could not be reached.
#[derive(Debug)]
pub(crate) enum Unreachable {
    /// The memory is not live (freed, outdated, leaked): the caller's refusal says why.
    Dead,
    /// Device memory whose host copy could not be made: the host pool refused it (an
    /// out-of-memory error with its report), or the device failed to copy.
    Failed(Error),
}

impl Unreachable {
    /// The error to return: `dead()` (the caller's refusal) for memory that is not live,
    /// the failure itself otherwise.
    pub(crate) fn or_refusal(self, dead: impl FnOnce() -> Error) -> Error {
        match self {
            Unreachable::Dead => dead(),
            Unreachable::Failed(error) => error,
        }
    }
}

/// Where one tensor's bytes live (views of a tensor share its home).
pub(crate) enum Home {
    /// Bump-allocated in a workspace; valid while its stamp says so.
    Workspace(WorkspaceSlot),
    /// A pool block, valid until its owner frees it.
    Pool(PoolBlock),
    /// Device memory, mirrored on the host on demand. Boxed: the mirror is most of its
    /// size, and every op moves a `Home` (inside its header) a few times on the way into
    /// the tensor, so the host variants stay small (one heap allocation beside the device
    /// memory, a driver request or a device pool block, for a device tensor).
    Device(Box<DeviceHome>),
}

/// A tensor's bytes on a device.
pub(crate) struct DeviceHome {
    slot: DeviceSlot,
    /// The freed bit (an owner's close) and the view count, as for a pool block; the
    /// device memory itself is given back when the home drops.
    handoff: Handoff,
}

/// Bytes in a workspace cycle.
pub(crate) struct WorkspaceSlot {
    ptr: NonNull<u8>,
    len: usize,
    stamp: Stamp,
}

/// Bytes in a pool block.
pub(crate) struct PoolBlock {
    ptr: NonNull<u8>,
    len: usize,
    /// The block's capacity (its size class): what the pool counts for it.
    capacity: usize,
    source: MemorySource,
    /// The freed bit and the view count: who frees the block, and when.
    handoff: Handoff,
    /// Taken (once, by the party the hand-off names) when the block is released.
    block: Mutex<Option<Block<'static>>>,
}

// SAFETY: the pointer is into workspace memory whose cross-thread use the stamp refuses
// (only circular workspaces hand memory across threads: their stamps keep the ring alive
// and hold a counted reference to the slot, which the ring never reuses while it is held).
unsafe impl Send for WorkspaceSlot {}
// SAFETY: shared access only reads, through `Home::read_checked` or a view, after the
// stamp check.
unsafe impl Sync for WorkspaceSlot {}
// SAFETY: the pointer is into the block this value owns (`Block` is Send + Sync).
unsafe impl Send for PoolBlock {}
// SAFETY: shared access only reads, after the freed check; writes need `&mut` or the
// caller's proof that no other reader exists (`Home::write_unshared`).
unsafe impl Sync for PoolBlock {}

impl Home {
    /// `len` bytes of workspace memory (`memory.len` may be smaller only for a zero-size
    /// request; the workspace padded it to at least `len`).
    pub(crate) fn workspace(memory: WorkspaceMemory, len: usize) -> Home {
        Home::Workspace(WorkspaceSlot {
            ptr: memory.ptr,
            len,
            stamp: memory.stamp,
        })
    }

    /// Device memory (see [`DeviceSlot`]).
    pub(crate) fn device(slot: DeviceSlot) -> Home {
        Home::Device(Box::new(DeviceHome {
            slot,
            handoff: Handoff::new(),
        }))
    }

    /// The device memory, for device operations.
    pub(crate) fn device_slot(&self) -> Option<&DeviceSlot> {
        match self {
            Home::Device(home) => Some(&home.slot),
            _ => None,
        }
    }

    /// The first `len` bytes of `block`, drawn from `source`.
    pub(crate) fn pool(block: Block<'static>, len: usize, source: MemorySource) -> Home {
        debug_assert!(len <= block.len());
        Home::Pool(PoolBlock {
            ptr: block.ptr(),
            len,
            capacity: block.capacity(),
            source,
            handoff: Handoff::new(),
            block: Mutex::new(Some(block)),
        })
    }

    /// Bytes the home holds of its pool or workspace: a pool block's capacity (what the
    /// pool counts for it, semantics §1), else its length.
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Home::Pool(block) => block.capacity,
            _ => self.len(),
        }
    }

    /// Bytes of the home.
    pub(crate) fn len(&self) -> usize {
        match self {
            Home::Workspace(slot) => slot.len,
            Home::Pool(block) => block.len,
            Home::Device(home) => home.slot.len(),
        }
    }

    /// Semantics §3 and §4: may these bytes be used now, from this thread? One atomic
    /// load (and a thread-token compare for workspace memory).
    #[inline(always)]
    pub(crate) fn is_live(&self) -> bool {
        match self {
            Home::Workspace(slot) => slot.stamp.is_valid(),
            Home::Pool(block) => !block.handoff.is_freed(),
            Home::Device(home) => !home.handoff.is_freed(),
        }
    }

    /// This home's validity check, to keep beside a handle to it (see [`Probe`]).
    pub(crate) fn probe(&self) -> Probe {
        match self {
            Home::Workspace(slot) => Probe::from(slot.stamp.probe()),
            Home::Pool(block) => Probe::handoff(NonNull::from(&block.handoff)),
            Home::Device(home) => Probe::handoff(NonNull::from(&home.handoff)),
        }
    }

    /// Whether its owner freed this (pool) memory.
    pub(crate) fn is_freed(&self) -> bool {
        match self {
            Home::Pool(block) => block.handoff.is_freed(),
            Home::Device(home) => home.handoff.is_freed(),
            Home::Workspace(_) => false,
        }
    }

    /// The workspace stamp, for workspace memory.
    pub(crate) fn stamp(&self) -> Option<&Stamp> {
        match self {
            Home::Workspace(slot) => Some(&slot.stamp),
            Home::Pool(_) | Home::Device(_) => None,
        }
    }

    /// The host pool block this home holds and its capacity, if it holds one: a pool
    /// block, or a device tensor's host copy once made (device memory and workspace memory
    /// are no host pool's blocks).
    pub(crate) fn pool_share(&self) -> Option<(MemorySource, usize)> {
        match self {
            Home::Pool(block) => Some((block.source, block.capacity)),
            Home::Device(home) => {
                let held = home.slot.host_held();
                (held > 0).then(|| (home.slot.device().host_source(), held))
            }
            Home::Workspace(_) => None,
        }
    }

    /// The source the bytes were drawn from: the pool block's, or the workspace's.
    pub(crate) fn source(&self) -> MemorySource {
        match self {
            Home::Pool(block) => block.source,
            Home::Workspace(slot) => slot.stamp.source(),
            Home::Device(home) => home.slot.device().host_source(),
        }
    }

    /// Why the bytes may not be used (when [`Home::is_live`] is false): the stamp's error
    /// for workspace memory, [`Error::ScopeClosed`] naming `owner()` for a freed block.
    #[cold]
    #[inline(never)]
    pub(crate) fn refusal(&self, op: &str, arg: &str, owner: impl FnOnce() -> String) -> Error {
        match self {
            Home::Workspace(slot) => {
                slot.stamp
                    .check(op, arg)
                    .err()
                    .unwrap_or_else(|| Error::LeakedWorkspacePointer {
                        op: op.into(),
                        arg: arg.into(),
                        workspace: slot.stamp.workspace_id().into(),
                    })
            }
            Home::Pool(_) | Home::Device(_) => Error::ScopeClosed {
                op: op.into(),
                arg: arg.into(),
                scope: owner(),
            },
        }
    }

    /// The address and length of the bytes; for device memory the host copy's, prepared
    /// for `access` (the error if the host copy could not be made: its host pool refused
    /// it, or the device failed to copy).
    fn raw(&self, access: Access) -> Result<(NonNull<u8>, usize), Unreachable> {
        match self {
            Home::Workspace(slot) => Ok((slot.ptr, slot.len)),
            Home::Pool(block) => Ok((block.ptr, block.len)),
            Home::Device(home) => {
                let ptr = home.slot.host_ptr(access).map_err(Unreachable::Failed)?;
                // A slice's address, never null; should it be, that is the copy's failure
                // (the tensor is live: not a refusal naming its owner).
                let ptr = NonNull::new(ptr).ok_or_else(|| {
                    Unreachable::Failed(Error::Device {
                        device: home.slot.device().ordinal(),
                        message: "the host copy has no address".into(),
                    })
                })?;
                Ok((ptr, home.slot.len()))
            }
        }
    }

    /// The bytes, writable, if live, of a home not shared yet (a fresh output being
    /// filled).
    ///
    /// # Safety
    /// Nothing else can reach this home (nor so its bytes) while the bytes are borrowed:
    /// the caller holds the only reference to its header, exclusively.
    #[allow(clippy::mut_from_ref)] // the exclusivity is the caller's contract
    pub(crate) unsafe fn bytes_mut_unshared(&self) -> Result<&mut [u8], Unreachable> {
        if !self.is_live() {
            return Err(Unreachable::Dead);
        }
        let (ptr, len) = self.raw(Access::Overwrite)?;
        // SAFETY: the memory is live (checked above) and `len` bytes long (a workspace
        // bump or a pool block of at least `len` bytes, both initialised memory); the
        // caller's contract excludes every other access through this home, the only one to
        // the bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) })
    }

    /// The bytes, for as long as `pin` holds the epoch, after the caller ran this home's
    /// check itself (through its [`Probe`], or [`Home::is_live`] where the probe could not
    /// tell).
    ///
    /// # Safety
    /// This home's check answered live on this thread after `pin` was taken.
    #[inline]
    pub(crate) unsafe fn read_checked<'a>(
        &'a self,
        _pin: &'a Pin,
    ) -> Result<&'a [u8], Unreachable> {
        let (ptr, len) = self.raw(Access::Read)?;
        // SAFETY: the check (the probe decides as `is_live` does wherever it passes) passed
        // under `pin` on this thread (the caller's contract), so the memory is live: a pool
        // block or device memory not yet handed to reclamation (and `_pin` keeps a block
        // handed over after the check alive until the borrow ends), or workspace memory of
        // the current generation on its owner thread (whose state and table of open cycles
        // only this thread changes), or of a circular workspace, whose stamp keeps the ring
        // alive and its slot out of the ring's reuse, so no cycle writes the bytes while we
        // read. Shared homes are written only through `write_unshared`, whose caller proves
        // no reader exists.
        Ok(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) })
    }

    /// The bytes, writable, if live, for as long as `pin` holds the epoch.
    ///
    /// # Safety
    /// For as long as the returned borrow lives, nothing else reads or writes these bytes
    /// through any other reference to this home (the caller holds the only tensor handle;
    /// references that never touch the bytes, such as scopes', may exist).
    // `&mut` from `&self`: the exclusivity is the caller's to prove (the contract above).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn write_unshared<'a>(
        &'a self,
        _pin: &'a Pin,
    ) -> Result<&'a mut [u8], Unreachable> {
        if !self.is_live() {
            return Err(Unreachable::Dead);
        }
        let (ptr, len) = self.raw(Access::ReadWrite)?;
        // SAFETY: the memory is live (see `read_checked`); the caller guarantees no other access
        // for the borrow's life; if the owner frees the block concurrently, `_pin` keeps it
        // allocated until this borrow, bound to it, ends.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) })
    }

    /// The bytes for a borrowed view, if live, kept from being freed until the returned
    /// hold drops, without an epoch pin (so a long-lived view stalls no reclamation): a
    /// pool block by its view count, workspace memory by the workspace's view pin.
    pub(crate) fn hold_for_view(&self) -> Result<(ViewHold<'_>, &[u8]), Unreachable> {
        let hold = match self {
            Home::Pool(block) => match block.handoff.enter_view() {
                ViewEntry::Granted => ViewHold::Pool(block),
                ViewEntry::Refused { free_now } => {
                    if free_now {
                        block.release();
                    }
                    return Err(Unreachable::Dead);
                }
            },
            Home::Workspace(slot) => {
                if !slot.stamp.is_valid() {
                    return Err(Unreachable::Dead);
                }
                ViewHold::Workspace(slot.stamp.pin_view())
            }
            Home::Device(home) => match home.handoff.enter_view() {
                // The device memory is given back only when the home drops, which a
                // view (borrowing a handle) outlives never.
                ViewEntry::Granted => ViewHold::Device(&home.handoff),
                ViewEntry::Refused { .. } => return Err(Unreachable::Dead),
            },
        };
        // A device that fails to copy its bytes to the host: the view is given back.
        let (ptr, len) = self.raw(Access::Read)?;
        // SAFETY: the memory is live and stays so while `hold` lives, which the caller
        // keeps with the slice: a granted view keeps a pool block from being released (the
        // hand-off answers "free now" to nobody while it is counted), and workspace memory
        // passed the stamp check on its owner thread and the view pin stops new cycles and
        // destroys. Shared homes are written only through `write_unshared`, whose caller
        // holds the only handle, and a view borrows one.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
        Ok((hold, bytes))
    }

    /// The owner frees the memory: later checks fail; readers pinned before keep it until
    /// they unpin, and live views until the last of them drops. Workspace memory belongs
    /// to its workspace and is left alone.
    pub(crate) fn free(&self) {
        match self {
            Home::Pool(block) => {
                if block.handoff.free() {
                    block.release();
                }
            }
            // Later checks fail; the device memory goes back when the home drops.
            Home::Device(home) => {
                let _ = home.handoff.free();
            }
            Home::Workspace(_) => {}
        }
    }
}

impl Home {
    /// [`Home::free`], but a pool block whose free falls to this call is added to `batch`
    /// instead of being deferred alone (a closing scope defers all of its blocks at once).
    pub(crate) fn free_into(&self, batch: &mut Vec<Block<'static>>) {
        match self {
            Home::Pool(block) if batch.len() < batch.capacity() => {
                if block.handoff.free() {
                    let taken = block
                        .block
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    batch.extend(taken);
                }
            }
            _ => self.free(),
        }
    }
}

impl PoolBlock {
    /// Hands the block to epoch reclamation (the hand-off named this caller, once).
    fn release(&self) {
        let taken = self
            .block
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(block) = taken {
            reclaim::defer_free(block);
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if let Home::Pool(block) = self {
            // No view is alive: views borrow a handle, and this is the last reference.
            if block.handoff.last_reference_dropped() {
                block.release();
            }
        }
    }
}

impl fmt::Debug for Home {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Home::Workspace(slot) => f
                .debug_struct("Workspace")
                .field("workspace", &slot.stamp.workspace_id())
                .field("len", &slot.len)
                .field("live", &self.is_live())
                .finish(),
            Home::Pool(block) => f
                .debug_struct("Pool")
                .field("source", &block.source)
                .field("len", &block.len)
                .field("freed", &block.handoff.is_freed())
                .finish(),
            Home::Device(home) => f
                .debug_struct("Device")
                .field("device", &home.slot.device().ordinal())
                .field("len", &home.slot.len())
                .field("freed", &home.handoff.is_freed())
                .finish(),
        }
    }
}

/// [`Home::is_live`] without going through the home, kept beside a handle to it: one word,
/// so that every kind of memory is checked with one load of the handle and one more load.
///
/// The word is either the address of a hand-off (a pool block's, device memory's, or a
/// circular workspace's destroyed flag; bit 0 clear, as the hand-off is aligned), live
/// while not freed, or the cycle word of non-circular workspace memory (bit 0 set),
/// live if the calling thread's table of open cycles holds it
/// ([`crate::workspace::cycle_word_passes`]). One load of the word decides which.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe(*const Handoff);

const _: () = assert!(
    std::mem::align_of::<Handoff>() > 1,
    "bit 0 tells the forms apart"
);

impl From<StampProbe> for Probe {
    fn from(probe: StampProbe) -> Probe {
        match probe {
            StampProbe::Cycle(word) => Probe::cycle(word),
            StampProbe::Flag(flag) => Probe::handoff(flag),
        }
    }
}

impl Probe {
    fn handoff(handoff: NonNull<Handoff>) -> Probe {
        Probe(handoff.as_ptr())
    }

    /// A cycle word as a probe: an address with no provenance, never dereferenced.
    fn cycle(word: usize) -> Probe {
        debug_assert_eq!(word & 1, 1, "a cycle word has bit 0 set");
        Probe(std::ptr::null::<Handoff>().wrapping_byte_add(word))
    }

    /// `true`: the home this probe was made from is live ([`Home::is_live`]). `false`: it
    /// is not, except for workspace memory with the stamp module's `NO_CYCLE_WORD`, which
    /// only the home can tell: the caller asks the home then.
    ///
    /// # Safety
    /// That home is alive and has not moved since [`Home::probe`] (it sits in a shared
    /// header the caller holds a reference to).
    #[inline(always)]
    pub(crate) unsafe fn passes(&self) -> bool {
        let word = self.0 as usize;
        if word & 1 == 0 {
            // SAFETY: bit 0 clear: the address of the hand-off the probe was made from,
            // which lives where it was while its home does (the caller's contract): in the
            // home, or in the workspace state the home's stamp keeps alive.
            !unsafe { &*self.0 }.is_freed()
        } else {
            cycle_word_passes(word)
        }
    }
}

/// Keeps a home's memory alive for a borrowed view (see [`Home::hold_for_view`]).
pub(crate) enum ViewHold<'a> {
    Pool(&'a PoolBlock),
    Device(&'a Handoff),
    Workspace(#[allow(dead_code)] ViewPin),
}

impl Drop for ViewHold<'_> {
    fn drop(&mut self) {
        match self {
            ViewHold::Pool(block) => {
                if block.handoff.leave_view() {
                    block.release();
                }
            }
            ViewHold::Device(handoff) => {
                let _ = handoff.leave_view();
            }
            ViewHold::Workspace(_) => {}
        }
    }
}

impl fmt::Debug for ViewHold<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViewHold::Pool(_) => "ViewHold::Pool",
            ViewHold::Device(_) => "ViewHold::Device",
            ViewHold::Workspace(_) => "ViewHold::Workspace",
        })
    }
}
