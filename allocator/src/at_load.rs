//! What runs when the program is loaded, before it has a second thread: installing the
//! `pthread_atfork` handlers of the pool's slabs and of the heap limit. Installed later, by
//! the first thread to need them, a `fork` under way on another thread at that moment would
//! run without them (glibc runs the handlers it had when the fork began), and its child
//! could inherit a lock held.

#![allow(unsafe_code)]

/// Runs [`at_load`] from the program's initialisers.
#[cfg(all(target_os = "linux", not(miri)))]
#[used]
// SAFETY: `.init_array` entries are `extern "C" fn()` run once by the loader before `main`;
// `at_load` has that type, runs on the only thread there is, neither unwinds nor allocates
// through Rust, and needs nothing the Rust runtime sets up.
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

#[cfg(all(target_os = "linux", not(miri)))]
extern "C" fn at_load() {
    crate::pool::arm_fork_handlers();
    #[cfg(not(ndmem_loom))]
    crate::tracking::arm_fork_handlers();
}

/// Keeps the initialiser in the link wherever its callers are: the handlers' own `arm`,
/// which installs them lazily where there are no initialisers, calls this.
#[inline]
pub(crate) fn keep() {
    #[cfg(all(target_os = "linux", not(miri)))]
    std::hint::black_box(&AT_LOAD);
}
