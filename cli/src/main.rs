//! The `ndmem` command: trains a small classifier under three memory modes and compares
//! them (`train`, the default), shows the effective limits (`limits`), and re-renders a
//! report's chart (`report`). Everything but the allocator set-up lives in the
//! `ndmem_cli` library.
//!
//! Invariant: `NDMEM_MAX_HEAP` gives one behaviour and one message: a value that is not a
//! size ends every invocation (`--version` included) with exit 2 and the library's line
//! naming the variable, never the allocator's own "not applied" warning beside it.

use std::process::ExitCode;

use ndmem::alloc::{heap, Tracking};

/// Every heap byte of the command is counted, so the reports can set heap figures beside
/// the off-heap ones.
#[global_allocator]
static GLOBAL: Tracking<std::alloc::System> = Tracking::new(std::alloc::System);

/// Runs [`start`] from the executable's initialisers, before the Rust runtime's own first
/// allocation (which comes before `main`, and which a limit of a few bytes refuses).
/// `main` installs the OOM hook again on platforms without `.init_array`.
#[cfg(target_os = "linux")]
#[used]
// SAFETY: `.init_array` entries are `extern "C" fn()` run once by the loader before `main`;
// `start` has that type, runs on the only thread there is, and neither unwinds nor
// touches anything the runtime has yet to set up.
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static START: extern "C" fn() = start;

/// Lets the tracking allocator read `NDMEM_MAX_HEAP` quietly, then installs the OOM hook.
#[cfg(target_os = "linux")]
extern "C" fn start() {
    read_heap_limit_quietly();
    install_oom_hook();
}

/// When `NDMEM_MAX_HEAP` is set, makes the program's first allocation (one byte, freed at
/// once) while stderr points at `/dev/null`: the tracking allocator reads the variable at
/// its first allocation and, for a value that is not a size, warns that the limit is not
/// applied. The command refuses such a value itself, with the "(expected e.g. ...)" hint
/// of every other variable, so that warning would be a second, contradicting line. Any
/// failure here (no `/dev/null`, a refused byte) only means the warning is not hidden.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn read_heap_limit_quietly() {
    // SAFETY: the name is NUL-terminated; getenv only reads the environment, which no
    // other thread can be changing before `main`.
    if unsafe { libc::getenv(c"NDMEM_MAX_HEAP".as_ptr()) }.is_null() {
        return;
    }
    // SAFETY: plain descriptor calls on descriptors this function owns (`saved`, `null`)
    // or on stderr, which it restores from `saved` before closing it.
    unsafe {
        let saved = libc::dup(2);
        if saved < 0 {
            return;
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 && libc::dup2(null, 2) >= 0 {
            let layout = std::alloc::Layout::new::<u8>();
            // `black_box`: an allocation nothing uses is removed by the optimiser, and
            // with it the read of the variable this is here for.
            let byte = std::hint::black_box(std::alloc::alloc(layout));
            if !byte.is_null() {
                std::alloc::dealloc(byte, layout);
            }
            libc::dup2(saved, 2);
        }
        if null >= 0 {
            libc::close(null);
        }
        libc::close(saved);
    }
}

/// Sets [`heap::exit_on_oom`] as the OOM hook (stores one pointer; allocates nothing):
/// a refused heap allocation ends the command with one line and exit status 1.
extern "C" fn install_oom_hook() {
    heap::set_oom_hook(heap::exit_on_oom);
}

fn main() -> ExitCode {
    install_oom_hook();
    ndmem_cli::run()
}
