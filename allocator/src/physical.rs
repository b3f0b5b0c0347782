//! Physical memory figures read without allocating: resident set size and installed RAM.
//!
//! Both functions may run inside `GlobalAlloc::alloc`, so they only make system calls into
//! stack buffers; neither touches the heap.

#![allow(unsafe_code)]

// Not modelled under loom: a cached constant, written once with the same value by anyone.
use std::sync::atomic::{AtomicUsize, Ordering};

/// The resident set size (RSS) of this process in bytes, from `/proc/self/statm`.
///
/// Returns 0 where the figure cannot be read (a system without procfs).
pub fn physical_bytes() -> usize {
    #[cfg(target_os = "linux")]
    {
        read_statm_resident_pages().map_or(0, |pages| pages.saturating_mul(page_size()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// Bytes of physical RAM installed in this machine (`sysconf(_SC_PHYS_PAGES)`).
pub fn physical_ram() -> usize {
    static RAM: AtomicUsize = AtomicUsize::new(0);
    let cached = RAM.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let pages = phys_pages();
    let ram = usize::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(page_size());
    RAM.store(ram, Ordering::Relaxed);
    ram
}

/// Pages of physical RAM (`sysconf(_SC_PHYS_PAGES)`).
#[cfg(not(miri))]
fn phys_pages() -> libc::c_long {
    // SAFETY: sysconf only reads a system constant.
    unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) }
}

/// Under Miri, which has no `_SC_PHYS_PAGES`: a machine of 16 GiB of 4 KiB pages, so the
/// caching and the percentages of RAM built on it stay under test.
#[cfg(miri)]
fn phys_pages() -> libc::c_long {
    (16 << 30) / 4096
}

/// The size of a virtual-memory page in bytes (asked of the OS once, then cached).
pub fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf only reads a system constant.
            let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let size = usize::try_from(size)
                .ok()
                .filter(|s| *s > 0)
                .unwrap_or(4096);
            PAGE.store(size, Ordering::Relaxed);
            size
        }
        size => size,
    }
}

/// Under Miri, which isolates the program from the file system: no procfs, so the RSS is
/// unknown (0), as on a system without procfs.
#[cfg(all(target_os = "linux", miri))]
fn read_statm_resident_pages() -> Option<usize> {
    None
}

#[cfg(all(target_os = "linux", not(miri)))]
fn read_statm_resident_pages() -> Option<usize> {
    let mut buf = [0u8; 128];
    // SAFETY: the path is a NUL-terminated literal; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `buf` is a live stack buffer of `buf.len()` writable bytes, and `fd` is open.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` was opened above and is closed exactly once.
    unsafe { libc::close(fd) };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    // statm: "size resident shared text lib data dt", in pages.
    let resident = text.split(|b| *b == b' ').nth(1)?;
    resident.iter().try_fold(0usize, |acc, b| {
        b.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(usize::from(b - b'0')))
            .flatten()
    })
}

#[cfg(all(test, not(ndmem_loom)))]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "Miri has no procfs to read the RSS from")]
    fn rss_grows_when_pages_are_touched() {
        let before = physical_bytes();
        assert!(before > 0, "RSS should be readable on Linux");
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        let after = physical_bytes();
        assert!(
            after >= before + (32 << 20),
            "RSS {before} -> {after} after touching 64 MiB"
        );
    }

    #[test]
    fn ram_is_a_plausible_machine_size() {
        let ram = physical_ram();
        assert!(ram >= 256 << 20, "physical RAM {ram}");
        assert_eq!(ram % page_size(), 0);
    }
}
