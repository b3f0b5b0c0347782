//! The ring of a circular workspace (semantics §2.4): which slot the running cycle bumps
//! in, the counted reference to it that the cycle's stamps share, and when a ring that
//! spilled is rebuilt.
//!
//! Invariant: cycle `n` bumps only inside its own slot `[k x slot_bytes, (k + 1) x
//! slot_bytes)`, and a cycle starts only in a slot that nothing but the ring refers to,
//! looking from the slot after the last one used, so a cycle's memory is overwritten only
//! after the ring came round and every stamp of it is gone. With every slot referenced,
//! the cycle gets no slot (it spills).
//! The references are one `Arc` per slot ([`SlotRefs`]), made with the ring, so a cycle
//! allocates nothing.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use ndmem_alloc::{AllocError, MemoryKind};

use super::buffer::Buffer;
use super::sizing::{RingShape, PINNED_CYCLES};
use super::slots::SlotRefs;
use super::stamp::KeepAlive;
use crate::error::Error;

/// The heap could not hold `bytes` of a workspace's bookkeeping (the error of
/// `Arena::new`'s room check and of a ring's references).
pub(super) fn heap_refused(bytes: usize) -> AllocError {
    /// `errno` for memory the heap cannot give.
    const ENOMEM: i32 = 12;
    AllocError::Os {
        kind: MemoryKind::Host,
        requested: bytes,
        errno: ENOMEM,
    }
}

/// One slot of a ring, referred to (through an `Arc`) by the ring and by the stamps of
/// the memory bumped there, which so keep the ring's buffer alive and the slot's bytes as
/// written while any thread can reach them.
#[derive(Debug)]
pub(crate) struct SlotRef {
    _ring: Arc<Buffer>,
}

/// The ring's shape and the running cycle's place in it.
#[derive(Debug)]
pub(crate) struct Ring {
    shape: Cell<Option<RingShape>>,
    /// The slot of the running or last cycle.
    slot: Cell<usize>,
    /// The ring's reference to each of its slots.
    refs: RefCell<SlotRefs<SlotRef>>,
    /// This cycle's clone of its slot's reference, which its stamps clone in turn (a bump
    /// costs an `Arc` clone, not an allocation).
    slot_ref: RefCell<Option<Arc<SlotRef>>>,
    /// The generation at whose end a ring that spilled is rebuilt.
    rebuild_at: Cell<Option<u64>>,
}

impl Ring {
    /// No ring yet.
    pub(crate) fn new() -> Ring {
        Ring {
            shape: Cell::new(None),
            slot: Cell::new(0),
            refs: RefCell::new(SlotRefs::empty()),
            slot_ref: RefCell::new(None),
            rebuild_at: Cell::new(None),
        }
    }

    /// The ring's shape, once it exists.
    pub(crate) fn shape(&self) -> Option<RingShape> {
        self.shape.get()
    }

    /// A new ring of `shape` in `buffer`: makes its slots' references (an error, changing
    /// nothing, if the heap cannot hold them); the next cycle starts at slot 0.
    pub(crate) fn reset(&self, shape: RingShape, buffer: &Arc<Buffer>) -> Result<(), Error> {
        let refs = SlotRefs::try_new(shape.slots, |_| SlotRef {
            _ring: Arc::clone(buffer),
        })
        .ok_or_else(|| {
            heap_refused(
                shape
                    .slots
                    .saturating_mul(std::mem::size_of::<Arc<SlotRef>>()),
            )
        })?;
        // The old ring's references go; stamps that still hold theirs keep it alive.
        *self.refs.borrow_mut() = refs;
        self.shape.set(Some(shape));
        self.slot.set(0);
        Ok(())
    }

    /// Whether nothing outside the ring refers to it: no stamp holds a slot and no cycle
    /// runs, so dropping the ring's references (and the workspace's buffer) frees it.
    pub(crate) fn unreferenced(&self) -> bool {
        self.slot_ref.borrow().is_none() && self.refs.borrow_mut().all_free()
    }

    /// No ring any more: drops the ring's references to its slots.
    pub(crate) fn clear(&self) {
        *self.refs.borrow_mut() = SlotRefs::empty();
        self.shape.set(None);
        self.slot.set(0);
    }

    /// Starts a cycle in the ring: the `[start, end)` offsets of the first slot, from the
    /// current one, that nothing but the ring refers to, or `None` if every slot is
    /// referenced.
    pub(crate) fn start_cycle(&self) -> Option<(usize, usize)> {
        let shape = self.shape.get()?;
        let mut refs = self.refs.borrow_mut();
        let slot = refs.first_free(self.slot.get())?;
        self.slot.set(slot);
        *self.slot_ref.borrow_mut() = Some(refs.hold(slot));
        let start = shape.start(slot);
        Some((start, start + shape.slot_bytes))
    }

    /// What a stamp of memory bumped in the running cycle keeps alive.
    pub(crate) fn keep_alive(&self) -> Option<KeepAlive> {
        self.slot_ref
            .borrow()
            .as_ref()
            .map(|slot| Arc::clone(slot) as KeepAlive)
    }

    /// Drops the cycle's own reference to its slot (stamps keep theirs).
    pub(crate) fn end_cycle(&self) {
        self.slot_ref.borrow_mut().take();
    }

    /// Moves on to the slot after the current one; returns the offset where it starts.
    pub(crate) fn advance(&self) -> usize {
        let Some(shape) = self.shape.get() else {
            return 0;
        };
        let slot = shape.next(self.slot.get());
        self.slot.set(slot);
        shape.start(slot)
    }

    /// Whether a ring whose cycle `generation` just ended should be rebuilt now: a cycle
    /// that spilled (with `Reallocate`) schedules the rebuild [`PINNED_CYCLES`] cycles later,
    /// when its spills are no longer pinned (semantics §2.4).
    pub(crate) fn rebuild_due(&self, generation: u64, spilled: bool) -> bool {
        if spilled && self.rebuild_at.get().is_none() {
            self.rebuild_at.set(Some(generation + PINNED_CYCLES));
        }
        if self.rebuild_at.get().is_some_and(|at| generation >= at) {
            self.rebuild_at.set(None);
            return true;
        }
        false
    }
}
