//! The `ndmem` command as a library: the Iris data, the MLP, the three memory modes a
//! training step runs under, the measured training loop, the JSON report and its table,
//! the SVG chart, and the `limits` subcommand. The binary (`src/main.rs`) installs the
//! tracking allocator and calls [`run`]; the benchmarks use [`data`], [`model`] and
//! [`modes`] directly.
//!
//! Invariant: every failure ends as one line `ndmem: ...` on stderr and a non-zero exit
//! (2 for usage and configuration errors, 1 for failures while running); nothing panics
//! on user input.
//!
//! Modules: [`args`] (the command line), [`data`] (Iris), [`model`] (the MLP), [`modes`]
//! (where a step's tensors live), [`train`] (runs and measures), [`report`] (JSON and
//! table), [`chart`] (SVG), [`limits`] (the `limits` subcommand).

pub mod args;
pub mod chart;
pub mod data;
pub mod limits;
pub mod model;
pub mod modes;
pub mod report;
pub mod train;

use std::process::ExitCode;

use ndmem::alloc::heap;

use args::{Command, Stop};

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

    /// The line printed after `ndmem: ` (`None`: already printed).
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        self.code
    }
}

/// Parses the command line, checks the limits in the environment, runs the subcommand,
/// and turns its outcome into an exit status (see the crate's invariant).
pub fn run() -> ExitCode {
    let cli = match args::parse() {
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

/// The limits from the environment must parse before anything runs (semantics §1:
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
fn render_report(args: &args::ReportArgs) -> Result<(), Failure> {
    let report = report::Report::read_json(&args.json).map_err(Failure::config)?;
    print!("{}", report.table());
    chart::write(&report, &args.output).map_err(Failure::runtime)?;
    println!("wrote {}", args.output.display());
    Ok(())
}
