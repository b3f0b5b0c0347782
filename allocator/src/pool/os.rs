//! The pool's calls into the operating system: obtaining and returning block memory, the
//! calling thread's id for error messages, and the process-wide memory barrier the threads'
//! caches are recalled with.
//!
//! Invariant: a block of `capacity` bytes is returned with the call that matches the one it
//! was obtained with, which the capacity alone decides (the slabs of `slab` up to
//! [`SLAB_MAX`](super::slab::SLAB_MAX) bytes, `posix_memalign`/`free` above, `mmap`/`munmap`
//! from [`MMAP_THRESHOLD`] bytes on), and every block handed out here is zero-filled, so its
//! bytes are initialised from the start.

#![allow(unsafe_code)]

use std::ptr::NonNull;

use super::class::natural_align;
use super::slab::{Slabs, SLABS};

/// Blocks of at least this many bytes come from `mmap`.
const MMAP_THRESHOLD: usize = 256 << 10;

/// `capacity` fresh, zero-filled bytes aligned to [`natural_align`]`(capacity)` (mapped
/// blocks: to a page), or the OS error number.
pub(super) fn obtain(capacity: usize) -> Result<NonNull<u8>, i32> {
    if Slabs::serves(capacity) {
        return SLABS.obtain(capacity);
    }
    let ptr = if capacity >= MMAP_THRESHOLD {
        map_anonymous(capacity)?
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

/// `len` fresh, zero-filled, page-aligned bytes mapped from the OS (read and write,
/// private), or the OS error number.
pub(super) fn map_anonymous(len: usize) -> Result<*mut u8, i32> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
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
    Ok(ptr.cast::<u8>())
}

/// Returns a block obtained by [`obtain`] to the OS.
///
/// # Safety
///
/// `ptr` must come from [`obtain`]`(capacity)` with this same `capacity`, and the caller
/// must own the block (neither live nor cached any more): nothing may use it afterwards.
pub(super) unsafe fn give_back(ptr: NonNull<u8>, capacity: usize) {
    if Slabs::serves(capacity) {
        // SAFETY: blocks of this capacity came from the slabs in `obtain`, and the caller
        // owns the block.
        unsafe { SLABS.give_back(ptr, capacity) };
    } else if capacity >= MMAP_THRESHOLD {
        // SAFETY: blocks of this capacity were mapped by `obtain` with exactly this length,
        // and the caller owns the block.
        unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
    } else {
        // SAFETY: blocks of this capacity came from posix_memalign in `obtain`, and the
        // caller owns the block.
        unsafe { libc::free(ptr.as_ptr().cast()) };
    }
}

/// Whether [`heavy_barrier`] is the process-wide barrier: asked once, the answer kept.
/// 0: not asked yet, 1: yes, 2: no (every side then fences for itself).
static PROCESS_BARRIER: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Asks for the process-wide barrier (Linux `membarrier`, private expedited) once; called
/// before any thread cache exists, so every cache sees the answer (see `light_barrier`).
pub(super) fn prepare_barrier() {
    use std::sync::atomic::Ordering;
    if PROCESS_BARRIER.load(Ordering::Acquire) == 0 {
        let available = register_process_barrier();
        PROCESS_BARRIER.store(if available { 1 } else { 2 }, Ordering::Release);
    }
}

#[cfg(all(target_os = "linux", not(miri)))]
fn register_process_barrier() -> bool {
    const QUERY: libc::c_long = 0;
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    // SAFETY: membarrier's query and register commands take no pointers.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0, 0) };
    if supported < 0 || supported & PRIVATE_EXPEDITED == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn register_process_barrier() -> bool {
    false
}

/// Whether the process-wide barrier is registered (after [`prepare_barrier`]); a thread's
/// cache keeps the answer beside its flags, so its barrier reads no global.
#[cfg_attr(ndmem_loom, allow(dead_code))]
pub(super) fn has_process_barrier() -> bool {
    PROCESS_BARRIER.load(std::sync::atomic::Ordering::Relaxed) == 1
}

/// The cheap side of an asymmetric store-load barrier: orders this thread's earlier stores
/// before its later loads *as seen by a thread that runs [`heavy_barrier`]*. On Linux a
/// compiler fence: the heavy side then makes every running thread execute a full fence
/// (`membarrier`), and a thread cache, the only user, exists there only once that barrier
/// is registered ([`has_process_barrier`]). Elsewhere (and under Miri) a full fence.
#[inline(always)]
pub(super) fn light_barrier() {
    #[cfg(all(target_os = "linux", not(miri)))]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(all(target_os = "linux", not(miri))))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Whether a thread may use [`light_barrier`] against [`heavy_barrier`]: always where the
/// light side fences for itself; on Linux once the process-wide barrier is registered.
#[cfg_attr(ndmem_loom, allow(dead_code))]
pub(super) fn light_barrier_usable() -> bool {
    cfg!(not(all(target_os = "linux", not(miri)))) || has_process_barrier()
}

/// The costly side of the barrier of [`light_barrier_given`]: a full fence on every thread of
/// the process (a few microseconds), or on this thread alone when the other side fences
/// for itself.
pub(super) fn heavy_barrier() {
    use std::sync::atomic::{fence, Ordering};
    fence(Ordering::SeqCst);
    #[cfg(all(target_os = "linux", not(miri)))]
    if PROCESS_BARRIER.load(Ordering::Relaxed) == 1 {
        const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        // SAFETY: registered by `prepare_barrier` (the value 1 says so); no pointers.
        let rc = unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) };
        // Registered, so it cannot fail; if it ever did, the light side would be unsafe.
        assert_eq!(rc, 0, "membarrier failed after registration");
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
        for capacity in [
            64,
            4096 + 1024,
            32 << 10,
            MMAP_THRESHOLD,
            2 * MMAP_THRESHOLD,
        ] {
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
    fn the_barrier_is_asked_for_once_and_both_sides_run() {
        prepare_barrier();
        let mode = PROCESS_BARRIER.load(std::sync::atomic::Ordering::Relaxed);
        assert!(mode == 1 || mode == 2, "{mode}");
        prepare_barrier();
        assert_eq!(
            PROCESS_BARRIER.load(std::sync::atomic::Ordering::Relaxed),
            mode
        );
        if light_barrier_usable() {
            light_barrier();
        }
        heavy_barrier();
        eprintln!("process-wide barrier available: {}", mode == 1);
    }

    #[test]
    fn thread_ids_differ_between_threads() {
        let here = thread_id();
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(here, there);
        assert_eq!(here, thread_id());
    }
}
