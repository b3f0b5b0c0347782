//! Standard output that a closed pipe cannot break: `ndmem train | head -1` must end
//! quietly (exit 0, the report files still written), not panic as `println!` does when the
//! reader has gone.
//!
//! Invariant: after the first failed write nothing more is written to stdout; a closed
//! pipe (`EPIPE`) is not an error, any other failure is kept for [`finish`].

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Set once a write to stdout has failed.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The first failure that was not a closed pipe.
static ERROR: OnceLock<String> = OnceLock::new();

/// Writes `args` to stdout, unless an earlier write failed.
pub fn print(args: fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(error) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        CLOSED.store(true, Ordering::Relaxed);
        if error.kind() != io::ErrorKind::BrokenPipe {
            let _ = ERROR.set(format!("cannot write to standard output: {error}"));
        }
    }
}

/// The first write failure that was not a closed pipe, if any.
pub fn finish() -> Result<(), String> {
    match ERROR.get() {
        Some(error) => Err(error.clone()),
        None => Ok(()),
    }
}

/// `println!` through [`print`].
macro_rules! outln {
    () => {
        $crate::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use outln;
