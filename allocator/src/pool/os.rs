//! The pool's calls into the operating system: obtaining and returning block memory, and
//! the calling thread's id for error messages.
//!
//! Invariant: a block of `capacity` bytes is returned with the call that matches the one it
//! was obtained with, which the capacity alone decides (`mmap`/`munmap` from
//! [`MMAP_THRESHOLD`] bytes on, `posix_memalign`/`free` below), and every block handed out
//! here is zero-filled, so its bytes are initialised from the start.

#![allow(unsafe_code)]

use std::ptr::NonNull;

use super::class::natural_align;

/// Blocks of at least this many bytes come from `mmap`.
const MMAP_THRESHOLD: usize = 256 << 10;

/// `capacity` fresh, zero-filled bytes aligned to [`natural_align`]`(capacity)` (mapped
/// blocks: to a page), or the OS error number.
pub(super) fn obtain(capacity: usize) -> Result<NonNull<u8>, i32> {
    let ptr = if capacity >= MMAP_THRESHOLD {
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        ptr.cast::<u8>()
    } else {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer and the alignment is a power of two that is
        // a multiple of `size_of::<*mut c_void>()` (at least 16).
        let rc = unsafe { libc::posix_memalign(&mut ptr, natural_align(capacity), capacity) };
        if rc != 0 {
            return Err(rc);
        }
        // SAFETY: posix_memalign succeeded, so `ptr` points to `capacity` fresh writable
        // bytes; zeroing them keeps the promise that block bytes are initialised.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, capacity) };
        ptr.cast::<u8>()
    };
    NonNull::new(ptr).ok_or(libc::ENOMEM)
}

/// Returns a block obtained by [`obtain`] to the OS.
///
/// # Safety
///
/// `ptr` must come from [`obtain`]`(capacity)` with this same `capacity`, and the caller
/// must own the block (neither live nor cached any more): nothing may use it afterwards.
pub(super) unsafe fn give_back(ptr: NonNull<u8>, capacity: usize) {
    if capacity >= MMAP_THRESHOLD {
        // SAFETY: blocks of this capacity were mapped by `obtain` with exactly this length,
        // and the caller owns the block.
        unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
    } else {
        // SAFETY: blocks of this capacity came from posix_memalign in `obtain`, and the
        // caller owns the block.
        unsafe { libc::free(ptr.as_ptr().cast()) };
    }
}

/// The OS id of the calling thread (what `top -H` and debuggers show).
#[cfg(target_os = "linux")]
pub(super) fn thread_id() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// An id of the calling thread: elsewhere than Linux, the `pthread_t` value (what
/// debuggers print there), obtained without allocating.
#[cfg(not(target_os = "linux"))]
pub(super) fn thread_id() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize as u64 }
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn blocks_from_both_sources_are_zeroed_and_aligned() {
        for capacity in [64, 4096 + 1024, MMAP_THRESHOLD, 2 * MMAP_THRESHOLD] {
            let ptr = obtain(capacity).unwrap();
            assert_eq!(ptr.as_ptr() as usize % natural_align(capacity), 0);
            // SAFETY: `obtain` handed out `capacity` initialised bytes owned here.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), capacity) };
            assert!(bytes.iter().all(|b| *b == 0), "{capacity} bytes not zeroed");
            // SAFETY: obtained just above with this capacity, and no longer used.
            unsafe { give_back(ptr, capacity) };
        }
    }

    #[test]
    fn an_impossible_request_is_an_os_error() {
        assert!(obtain(isize::MAX as usize & !4095).is_err());
    }

    #[test]
    fn thread_ids_differ_between_threads() {
        let here = thread_id();
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(here, there);
        assert_eq!(here, thread_id());
    }
}
