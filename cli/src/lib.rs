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
//! Modules: [`args`] (the command line), [`env`](mod@env) (the `NDMEM_*` variables), [`data`]
//! (Iris), [`model`] (the MLP), [`modes`] (where a step's tensors live), [`train`] (runs
//! and measures), [`report`] (JSON and table), [`chart`] (SVG), [`timeline`] (a trace file
//! and its SVG), [`limits`] (the `limits`
//! subcommand), [`paths`] (output files checked before work), [`out`] (stdout that a
//! closed pipe cannot break).

pub mod out;

pub mod args;
pub mod chart;
pub mod data;
pub mod env;
pub mod graph;
pub mod limits;
pub mod model;
pub mod modes;
pub mod paths;
pub mod report;
pub mod timeline;
pub mod train;

use std::process::ExitCode;

use args::{Command, Stop};
use out::outln;

/// A failure to report on one line, with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The line to print after `ndmem: `.
    message: String,
    /// The exit status.
    code: u8,
}

impl Failure {
    /// Bad input or configuration (exit 2).
    pub fn config(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }

    /// A failure while running (exit 1).
    pub fn runtime(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 1,
        }
    }

    /// The line printed after `ndmem: `.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        self.code
    }
}

/// Checks the `NDMEM_*` variables, parses the command line, runs the subcommand, and
/// turns its outcome into an exit status (see the crate's invariant). The environment
/// comes first, so even `--version` refuses a garbage limit (one behaviour, one message).
pub fn run() -> ExitCode {
    let environment = match env::check() {
        Ok(environment) => environment,
        Err(failure) => return fail(failure),
    };
    let cli = match args::parse() {
        Ok(cli) => cli,
        Err(Stop::Shown) => return ExitCode::SUCCESS,
        Err(Stop::Usage(message)) => return fail(Failure::config(message)),
    };
    // The timeline records what uses the pool (train, limits), as the library's own
    // NDMEM_TRACE does, and is written once the command is done, unless it stopped on a
    // configuration error (nothing ran).
    let traced = !matches!(cli.command, Some(Command::Report(_)));
    let result = if traced {
        env::start_trace(&environment)
    } else {
        Ok(())
    }
    .and_then(|()| match cli.command {
        None => train::run(&cli.train.options(), &environment),
        Some(Command::Train(args)) => train::run(&args.options(), &environment),
        Some(Command::Limits) => limits::run(&environment),
        Some(Command::Report(args)) => render_report(&args),
    });
    let result = match result {
        Err(failure) if failure.code == 2 => Err(failure),
        _ if !traced => result,
        Ok(()) => env::write_trace(&environment),
        // The run's failure comes first; a trace that could not be written is added.
        Err(failure) => match env::write_trace(&environment) {
            Ok(()) => Err(failure),
            Err(also) => Err(Failure::runtime(format!(
                "{}; and {}",
                failure.message, also.message
            ))),
        },
    }
    .and_then(|()| out::finish().map_err(Failure::runtime));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(failure),
    }
}

/// Prints `failure` as one `ndmem: ...` line on stderr and gives its exit status.
fn fail(failure: Failure) -> ExitCode {
    // One line, whatever the underlying message held: line breaks become spaces, other
    // whitespace stays as it is (a quoted value such as NDMEM_MAX_BYTES="   " is shown
    // as given).
    let message = failure
        .message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("ndmem: {message}");
    ExitCode::from(failure.code)
}

/// `ndmem report`: reads a JSON report, prints its table, verdict and mode comparisons as
/// `train` does, and writes its SVG (by default beside the JSON, never over it).
fn render_report(args: &args::ReportArgs) -> Result<(), Failure> {
    let svg = args.svg();
    paths::check_report_paths(&args.json, &svg).map_err(Failure::config)?;
    let write_svg = |content: &str| {
        paths::write_files(&[paths::OutputFile {
            label: format!("-o {}", svg.display()),
            path: &svg,
            content: content.as_bytes(),
        }])
        .map_err(Failure::runtime)
    };
    // A timeline file (NDMEM_TRACE, ndmem::trace::dump) is told by its content, a broken
    // one by its opening.
    let text = std::fs::read_to_string(&args.json).unwrap_or_default();
    if timeline::is_trace(&text) || timeline::opens_as_trace(&text) {
        let trace = timeline::Trace::parse(&text, &args.json).map_err(Failure::config)?;
        outln!("{}", trace.summary().trim_end());
        write_svg(&timeline::render(&trace).map_err(Failure::runtime)?)?;
        outln!("wrote {}", svg.display());
        return Ok(());
    }
    let report = report::Report::read_json(&args.json).map_err(Failure::config)?;
    let device_lines = report.device_lines();
    for line in &device_lines {
        outln!("{line}");
    }
    if !device_lines.is_empty() {
        outln!();
    }
    outln!("{}", report.table().trim_end());
    outln!();
    outln!("{}", report.agreement().verdict());
    train::print_comparison(&report);
    write_svg(&chart::render(&report).map_err(Failure::runtime)?)?;
    outln!("wrote {}", svg.display());
    Ok(())
}
