//! The `ndmem` command: trains a small classifier under three memory modes and compares
//! them (`train`, the default), shows the effective limits (`limits`), and re-renders a
//! report's chart (`report`). Everything but the allocator set-up lives in the
//! `ndmem_cli` library.

use std::process::ExitCode;

use ndmem::alloc::{heap, Tracking};

/// Every heap byte of the command is counted, so the reports can set heap figures beside
/// the off-heap ones.
#[global_allocator]
static GLOBAL: Tracking<std::alloc::System> = Tracking::new(std::alloc::System);

/// Installs [`heap::exit_on_oom`] as the tracking allocator's OOM hook from the executable's
/// initialisers, before the Rust runtime's own first allocation (which comes before
/// `main`, and which a limit of a few bytes refuses). `main` installs it again on
/// platforms without `.init_array`.
#[cfg(target_os = "linux")]
#[used]
// SAFETY: `.init_array` entries are `extern "C" fn()` run once by the loader before `main`;
// `install_oom_hook` has that type and only stores a function pointer.
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static INSTALL_OOM_HOOK: extern "C" fn() = install_oom_hook;

/// Sets [`heap::exit_on_oom`] as the OOM hook (stores one pointer; allocates nothing):
/// a refused heap allocation ends the command with one line and exit status 1.
extern "C" fn install_oom_hook() {
    heap::set_oom_hook(heap::exit_on_oom);
}

fn main() -> ExitCode {
    install_oom_hook();
    ndmem_cli::run()
}
