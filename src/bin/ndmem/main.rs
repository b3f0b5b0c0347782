//! The `ndmem` command: trains a small classifier under three memory modes and compares
//! them (`train`, the default), shows the effective limits (`limits`), and re-renders a
//! report's chart (`report`).
//!
//! Invariant: every failure ends as one line `ndmem: ...` on stderr and a non-zero exit
//! (2 for usage and configuration errors, 1 for failures while running); nothing panics
//! on user input.
//!
//! Modules: `cli` (arguments), `data` (Iris), `model` (the MLP), `modes` (where a step's
//! tensors live), `train` (runs and measures), `report` (JSON and table), `chart` (SVG),
//! `limits` (the `limits` subcommand).

mod chart;
mod cli;
mod data;
mod limits;
mod model;
mod modes;
mod report;
mod train;

use std::alloc::Layout;
use std::process::ExitCode;

use ndmem::alloc::{heap, ByteSize, HeapStats, Tracking};

use cli::{Command, Stop};

/// Every heap byte of the command is counted, so the reports can set heap figures beside
/// the off-heap ones.
#[global_allocator]
static GLOBAL: Tracking<std::alloc::System> = Tracking::new(std::alloc::System);

/// A failure to report on one line, with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The line to print after `ndmem: ` (`None`: already printed).
    message: Option<String>,
    /// The exit status.
    code: u8,
}

impl Failure {
    /// Bad input or configuration (exit 2).
    pub fn config(message: impl Into<String>) -> Failure {
        Failure {
            message: Some(message.into()),
            code: 2,
        }
    }

    /// A failure while running (exit 1).
    pub fn runtime(message: impl Into<String>) -> Failure {
        Failure {
            message: Some(message.into()),
            code: 1,
        }
    }
}

/// Installs [`heap_exhausted`] as the tracking allocator's OOM hook from the executable's
/// initialisers, before the Rust runtime's own first allocation (which comes before
/// `main`, and which a limit of a few bytes refuses). `main` installs it again on
/// platforms without `.init_array`.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static INSTALL_OOM_HOOK: extern "C" fn() = install_oom_hook;

/// Sets [`heap_exhausted`] as the OOM hook (stores one pointer; allocates nothing).
extern "C" fn install_oom_hook() {
    heap::set_oom_hook(heap_exhausted);
}

/// Parses the command line, checks the limits in the environment, runs the subcommand,
/// and turns its outcome into an exit status (see the module's invariant).
fn main() -> ExitCode {
    install_oom_hook();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(Stop::Shown) => return ExitCode::SUCCESS,
        Err(Stop::Usage(message)) => return fail(Failure::config(message)),
    };
    let result = check_environment().and_then(|()| match cli.command {
        None => train::run(&cli.train.options()),
        Some(Command::Train(args)) => train::run(&args.options()),
        Some(Command::Limits) => limits::run(),
        Some(Command::Report(args)) => render_report(&args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(failure),
    }
}

/// Prints `failure` as one `ndmem: ...` line on stderr (unless it was printed already)
/// and gives its exit status.
fn fail(failure: Failure) -> ExitCode {
    if let Some(message) = failure.message {
        // One line, whatever the underlying message held.
        let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        eprintln!("ndmem: {message}");
    }
    ExitCode::from(failure.code)
}

/// The limits from the environment must parse before anything runs (SEMANTICS 1:
/// garbage is an error naming the variable, never a silent default).
fn check_environment() -> Result<(), Failure> {
    if let Some(error) = heap::env_error() {
        // The tracking allocator read NDMEM_MAX_HEAP at the program's first allocation and
        // has already written one line naming the variable and its value; a second line
        // would say the same again.
        return Err(if heap::is_tracking() {
            Failure {
                message: None,
                code: 2,
            }
        } else {
            Failure::config(error.to_string())
        });
    }
    ndmem::alloc::Limits::from_env().map_err(|e| Failure::config(e.to_string()))?;
    Ok(())
}

/// `ndmem report`: reads a JSON report, prints its table and writes its SVG.
fn render_report(args: &cli::ReportArgs) -> Result<(), Failure> {
    let report = report::Report::read_json(&args.json).map_err(Failure::config)?;
    print!("{}", report.table());
    chart::write(&report, &args.output).map_err(Failure::runtime)?;
    println!("wrote {}", args.output.display());
    Ok(())
}

/// Called by the tracking allocator when it is about to refuse an allocation: writes one
/// line on stderr and ends the process with status 1, instead of the abort that would
/// follow. It allocates nothing (the heap is what just ran out): the line is formatted
/// into a stack buffer and written with write(2); `_exit` skips unwinding and destructors.
fn heap_exhausted(layout: Layout, stats: &HeapStats) {
    use std::fmt::Write as _;

    let mut line = StackLine::default();
    // SAFETY: isatty only inspects file descriptor 2.
    if unsafe { libc::isatty(2) } == 1 {
        // Clear a progress bar that may be on the current terminal line.
        let _ = line.write_str("\r\x1b[2K");
    }
    let _ = match stats.limit {
        Some(limit) => write!(
            line,
            "ndmem: heap limit reached: {} more would exceed NDMEM_MAX_HEAP={} ({} live); raise NDMEM_MAX_HEAP",
            ByteSize(layout.size()),
            ByteSize(limit),
            ByteSize(stats.live_bytes)
        ),
        None => write!(
            line,
            "ndmem: out of memory: the system refused {} ({} of heap live)",
            ByteSize(layout.size()),
            ByteSize(stats.live_bytes)
        ),
    };
    line.finish();
    // SAFETY: the bytes are a live stack buffer that write(2) only reads; _exit ends the
    // process at once, which is sound from any thread.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(1);
    }
}

/// A fixed-size line buffer for [`heap_exhausted`]: text past its end is dropped, and it
/// always ends with a newline.
struct StackLine {
    /// The bytes written so far.
    bytes: [u8; 256],
    /// How many of `bytes` are used.
    len: usize,
}

impl Default for StackLine {
    fn default() -> StackLine {
        StackLine {
            bytes: [0; 256],
            len: 0,
        }
    }
}

impl StackLine {
    /// Ends the line with a newline, overwriting the last byte when the buffer is full.
    fn finish(&mut self) {
        let at = self.len.min(self.bytes.len() - 1);
        self.bytes[at] = b'\n';
        self.len = at + 1;
    }
}

impl std::fmt::Write for StackLine {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let room = self.bytes.len() - self.len;
        let take = text.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&text.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    #[test]
    fn stack_line_truncates_and_always_ends_with_a_newline() {
        let mut line = StackLine::default();
        write!(line, "{} of {}", ByteSize(2048), 7).unwrap();
        line.finish();
        assert_eq!(&line.bytes[..line.len], b"2.00 KiB of 7\n");
        let mut line = StackLine::default();
        for _ in 0..100 {
            line.write_str("abcdef").unwrap();
        }
        line.finish();
        assert_eq!(line.len, 256);
        assert_eq!(line.bytes[255], b'\n');
        assert_eq!(line.bytes[254], b'c'); // byte 254 of "abcdef" repeated
    }
}
