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

use std::process::ExitCode;

use ndmem::alloc::{heap, Tracking};

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
