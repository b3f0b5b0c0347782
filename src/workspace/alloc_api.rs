//! `&WorkspaceGuard` as an [`allocator_api2::alloc::Allocator`]: collections built on a
//! guard live in the workspace and, by borrowing the guard, cannot outlive the cycle.
//!
//! Invariant: every method forwards to the arena ([`super::arena::Arena`]); the only work
//! done here is the copy when the arena moves a grown or shrunk allocation, in one place
//! ([`finish`]).

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator};

use super::arena::Resized;
use super::manager::WorkspaceGuard;

// SAFETY: memory returned by `allocate` lies in the workspace's buffer or in a spill block
// held by the arena (see the arena's invariant). Both stay allocated until the cycle ends,
// and the cycle ends only when the last guard of the workspace leaves: `&WorkspaceGuard`
// borrows a guard, so every value using this allocator is dropped before that (the
// reason the impl is on `&WorkspaceGuard` and nothing reachable from it can reset the
// arena; bump-scope #137). Guards are !Send and !Sync, so the allocator is used on the
// owner thread only. `deallocate` is a no-op (memory returns at cycle end), and `grow` /
// `shrink` either keep the block in place within its bounds or move it to a fresh
// allocation with its bytes copied, as the trait requires.
unsafe impl Allocator for &WorkspaceGuard {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.arena().alloc(layout).map_err(|_| AllocError)
    }

    #[inline]
    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _layout: Layout) {}

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let resized = self.arena().grow(ptr, old_layout, new_layout);
        // SAFETY: the caller guarantees `ptr` holds `old_layout.size()` bytes, and a moved
        // allocation is a distinct one of `new_layout.size() >= old_layout.size()` bytes.
        unsafe { finish(resized, ptr, old_layout.size()) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        _old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let resized = self.arena().shrink(ptr, new_layout);
        // SAFETY: the caller guarantees `ptr` holds `old_layout.size() >= new_layout.size()`
        // bytes, and a moved allocation is a distinct one of `new_layout.size()` bytes.
        unsafe { finish(resized, ptr, new_layout.size()) }
    }
}

/// The allocation a grow or shrink ends with: the same one, or a moved one holding the
/// first `keep` bytes of `ptr`.
///
/// # Safety
/// `ptr` is readable for `keep` bytes, and a [`Resized::Moved`] allocation is a distinct
/// one of at least `keep` bytes.
unsafe fn finish(
    resized: Result<Resized, crate::Error>,
    ptr: NonNull<u8>,
    keep: usize,
) -> Result<NonNull<[u8]>, AllocError> {
    match resized.map_err(|_| AllocError)? {
        Resized::InPlace(same) => Ok(same),
        Resized::Moved(fresh) => {
            // SAFETY: by this function's contract: `ptr` is readable for `keep` bytes and
            // `fresh`, a distinct allocation, is writable for as many.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.cast::<u8>().as_ptr(), keep)
            };
            Ok(fresh)
        }
    }
}
