//! The command line (clap, derive): `ndmem [train] [OPTIONS]`, `ndmem limits`,
//! `ndmem report FILE [-o SVG]`, with value checks that turn bad input into one-line
//! messages.
//!
//! Invariant: every value reaching the commands has been validated here (positive counts,
//! a finite positive learning rate, a size that parses); clap's multi-line errors are
//! folded into one line. Every option that takes a value takes one starting with `-`
//! (`--max-bytes -5%`, `--lr -inf`, `--seed -x`), so the option's own check names it,
//! rather than clap calling the value an unexpected argument.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::modes::Mode;
use crate::train::{DeviceSpec, TrainOptions};

/// ndmem: memory accounting for tensor workloads. Without a subcommand, runs `train`.
#[derive(Debug, Parser)]
#[command(
    name = "ndmem",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "Limits come from NDMEM_MAX_HEAP, NDMEM_MAX_BYTES, NDMEM_MAX_PHYSICAL_BYTES and NDMEM_MAX_DEVICE_BYTES (see `ndmem limits`); NDMEM_WORKSPACES=spill_everything|bypass is the workspace debug mode; NDMEM_TRACE=FILE records a timeline of memory events to FILE (JSON, written at exit; `ndmem report FILE` draws it)."
)]
pub struct Cli {
    /// What to run (default: train).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Options of `train`, when no subcommand is given.
    #[command(flatten)]
    pub train: TrainArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a small MLP on the Iris data under each memory mode and compare them (default).
    Train(TrainArgs),
    /// Show the effective memory limits, where each came from, the workspace debug mode,
    /// heap and pool statistics, and whether a CUDA driver is present.
    Limits,
    /// Print the table and comparisons of a JSON report of `ndmem train`, or the events of
    /// a timeline (NDMEM_TRACE=trace.json), and draw its SVG chart beside it.
    Report(ReportArgs),
}

/// Which memory modes `train` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Pool blocks owned by their handles (no workspace, no scope).
    Pool,
    /// A FirstLoop workspace cycle per step, gradients in a parent workspace.
    Workspaces,
    /// A child scope per step.
    Scopes,
    /// All three, one after the other.
    All,
}

impl ModeArg {
    /// The modes to run.
    pub fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Pool => vec![Mode::Pool],
            ModeArg::Workspaces => vec![Mode::Workspaces],
            ModeArg::Scopes => vec![Mode::Scopes],
            ModeArg::All => Mode::ALL.to_vec(),
        }
    }
}

/// Options of `ndmem train`.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Memory mode(s) to train under.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    pub mode: ModeArg,
    /// Passes over the training rows (1 to 1000000; at most 1000000 steps per mode).
    #[arg(long, value_name = "N", default_value_t = 100, allow_hyphen_values = true,
          value_parser = |s: &str| at_most::<u32>(s, MAX_EPOCHS))]
    pub epochs: u32,
    /// Stop each mode after N steps (for quick runs).
    #[arg(long, value_name = "N", allow_hyphen_values = true,
          value_parser = |s: &str| at_most::<u64>(s, u64::MAX))]
    pub steps: Option<u64>,
    /// Rows per batch (1 to 65536; above the 120 training rows, a step takes them all).
    #[arg(long, value_name = "N", default_value_t = 16, allow_hyphen_values = true,
          value_parser = |s: &str| at_most::<usize>(s, MAX_BATCH))]
    pub batch: usize,
    /// Hidden units (1 to 65536).
    #[arg(long, value_name = "N", default_value_t = 32, allow_hyphen_values = true,
          value_parser = |s: &str| at_most::<usize>(s, MAX_HIDDEN))]
    pub hidden: usize,
    /// SGD learning rate (a run whose loss stops being finite fails: lower it).
    #[arg(long, value_name = "RATE", default_value_t = 0.1, allow_hyphen_values = true,
          value_parser = learning_rate)]
    pub lr: f32,
    /// Seed of the train/test split, the shuffles and the initial weights.
    #[arg(long, value_name = "N", default_value_t = 42, allow_hyphen_values = true,
          value_parser = seed)]
    pub seed: u64,
    /// Batches a producer thread builds ahead of training, in a circular workspace
    /// (0 to 64; 0: no prefetching, each batch built on the training thread).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PREFETCH,
          allow_hyphen_values = true, value_parser = prefetch_depth)]
    pub prefetch: usize,
    /// Off-heap limit of the global pool for this run, e.g. 64M, 8GiB, 1T or 50% of RAM
    /// (0: unlimited); default: NDMEM_MAX_BYTES or half of RAM. With --device it also caps
    /// the device's limit, min(SIZE, 90% of the device), unless NDMEM_MAX_DEVICE_BYTES is
    /// set.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = size)]
    pub max_bytes: Option<usize>,
    /// Train on a device: `cuda:N` (`cuda` is `cuda:0`) or `sim` (a device simulated in
    /// host memory); the weights live there and each step copies its batch in and its loss
    /// out.
    #[arg(long, value_name = "DEVICE", allow_hyphen_values = true, value_parser = device_spec)]
    pub device: Option<DeviceSpec>,
    /// With --device: also train once more with each step captured as a device graph and
    /// replayed, check its losses against the launched steps and report the speed-up.
    #[arg(long, requires = "device")]
    pub graph: bool,
    /// Directory for ndmem-report.json and ndmem-report.svg.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out_dir: PathBuf,
    /// Path of the JSON report (default: OUT_DIR/ndmem-report.json).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Path of the SVG report (default: OUT_DIR/ndmem-report.svg).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

impl TrainArgs {
    /// The options `train::run` takes.
    pub fn options(&self) -> TrainOptions {
        TrainOptions {
            modes: self.mode.modes(),
            epochs: self.epochs,
            max_steps: self.steps,
            batch: self.batch,
            hidden: self.hidden,
            lr: self.lr,
            seed: self.seed,
            max_bytes: self.max_bytes,
            prefetch: self.prefetch,
            device: self.device,
            graph: self.graph,
            out_dir: self.out_dir.clone(),
            json: self
                .json
                .clone()
                .unwrap_or_else(|| self.out_dir.join("ndmem-report.json")),
            svg: self
                .svg
                .clone()
                .unwrap_or_else(|| self.out_dir.join("ndmem-report.svg")),
            json_option: if self.json.is_some() {
                "--json"
            } else {
                "--out-dir"
            },
            svg_option: if self.svg.is_some() {
                "--svg"
            } else {
                "--out-dir"
            },
        }
    }
}

/// Options of `ndmem report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// A JSON report written by `ndmem train`, or a timeline written by
    /// `NDMEM_TRACE=FILE ndmem train` or `ndmem::trace::dump`.
    #[arg(value_name = "JSON", default_value = "ndmem-report.json")]
    pub json: PathBuf,
    /// Where to write the SVG (default: JSON with its extension replaced by .svg, e.g.
    /// ndmem-report.svg, trace.svg); never the JSON itself.
    #[arg(short, long, value_name = "SVG")]
    pub output: Option<PathBuf>,
}

impl ReportArgs {
    /// The SVG to write: `-o`, or the JSON's path with its extension replaced by `.svg`.
    pub fn svg(&self) -> PathBuf {
        self.output
            .clone()
            .unwrap_or_else(|| crate::paths::default_svg(&self.json))
    }
}

/// Most passes over the training rows (`train` also bounds the steps they make).
pub const MAX_EPOCHS: u64 = 1_000_000;
/// Most rows per batch (Iris has 120 training rows; a larger batch takes them all).
pub const MAX_BATCH: u64 = 1 << 16;
/// Most hidden units (65536 keeps the model under 2 MiB of parameters).
pub const MAX_HIDDEN: u64 = 1 << 16;

/// A whole number from 1 to `max`.
/// Batches prefetched by default.
pub const DEFAULT_PREFETCH: usize = 2;

/// Most batches `--prefetch` may build ahead.
pub const MAX_PREFETCH: usize = 64;

/// `--prefetch`: a whole number from 0 to [`MAX_PREFETCH`].
fn prefetch_depth(text: &str) -> Result<usize, String> {
    match text.trim().parse::<i128>() {
        Ok(n) if (0..=MAX_PREFETCH as i128).contains(&n) => Ok(n as usize),
        Ok(n) => Err(format!("must be from 0 to {MAX_PREFETCH}, got {n}")),
        Err(_) => Err(format!(
            "{text:?} is not a whole number (expected 0 to {MAX_PREFETCH})"
        )),
    }
}

fn at_most<T: TryFrom<u64>>(text: &str, max: u64) -> Result<T, String> {
    let value: i128 = text.trim().parse().map_err(|_| {
        let trimmed = text.trim();
        if trimmed.parse::<f64>().is_ok_and(f64::is_finite) {
            if trimmed.contains(['e', 'E']) {
                format!(
                    "{text:?} is not a whole number: exponent notation is not accepted (write the digits, e.g. 1000)"
                )
            } else if trimmed.contains('.') {
                format!("{text:?} is not a whole number (expected 1, 2, 3, ..., no decimal point)")
            } else {
                format!("{text:?} is out of range: expected a whole number from 1 to {max}")
            }
        } else {
            format!("{text:?} is not a whole number (expected 1, 2, 3, ...)")
        }
    })?;
    if value < 1 {
        return Err(format!("must be at least 1, got {value}"));
    }
    if value > i128::from(max) {
        return Err(format!("must be at most {max}, got {value}"));
    }
    u64::try_from(value)
        .ok()
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| format!("must be at most {max}, got {value}"))
}

/// A seed: any whole number from 0 to `u64::MAX` (negative numbers reach this parser, so
/// the error names `--seed` instead of calling `-1` an unknown argument).
fn seed(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|_| {
        format!(
            "{text:?} is not a seed: expected a whole number from 0 to {}",
            u64::MAX
        )
    })
}

/// A finite learning rate above 0, as an f32: a number that rounds to 0 or to infinity
/// there is refused as such.
fn learning_rate(text: &str) -> Result<f32, String> {
    let value: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    let wide: f64 = text.trim().parse().unwrap_or(f64::NAN);
    if value == 0.0 && wide > 0.0 {
        return Err(format!(
            "{text} rounds to 0 as an f32 (the smallest above 0 is about 1.4e-45): expected a finite number above 0"
        ));
    }
    if value.is_infinite() && wide.is_finite() && wide > 0.0 {
        return Err(format!(
            "{text} rounds to infinity as an f32 (the largest is about 3.4e38): expected a finite number above 0"
        ));
    }
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("must be a finite number above 0, got {text}"));
    }
    Ok(value)
}

/// A size as `NDMEM_MAX_BYTES` takes it (`64M`, `1.5G`, `50%`, `0` for no limit).
fn size(text: &str) -> Result<usize, String> {
    match ndmem::alloc::parse_size(text) {
        Ok(bytes) => Ok(bytes),
        Err(ndmem::alloc::ConfigError::InvalidSize { reason, .. }) => Err(format!(
            "{reason} (expected e.g. 1048576, 64K, 512M, 8GiB, 1T or 50%)"
        )),
        Err(other) => Err(other.to_string()),
    }
}

fn device_spec(text: &str) -> Result<DeviceSpec, String> {
    DeviceSpec::parse(text)
}

/// How parsing ended when it did not produce a [`Cli`].
#[derive(Debug)]
pub enum Stop {
    /// `--help` or `--version`: printed, exit 0.
    Shown,
    /// A usage error, folded into one line.
    Usage(String),
}

/// Parses the process arguments.
pub fn parse() -> Result<Cli, Stop> {
    parse_from(std::env::args_os())
}

/// Parses `args` (the program name first).
pub fn parse_from<I, T>(args: I) -> Result<Cli, Stop>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    if let Some(message) = missing_value(&args) {
        return Err(Stop::Usage(message));
    }
    match Cli::try_parse_from(args) {
        Ok(cli) => Ok(cli),
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                Err(Stop::Shown)
            }
            _ => Err(Stop::Usage(one_line(&e.render().to_string()))),
        },
    }
}

/// The error for an option that takes a value written with a long option after it
/// instead (`--max-bytes --steps 5`): the options that accept values starting with `-`
/// (so that `--max-bytes -1` reaches the size parser and its "cannot be negative") would
/// otherwise take the next option as their value, and the error would be about that.
fn missing_value(args: &[std::ffi::OsString]) -> Option<String> {
    use clap::CommandFactory;
    let command = Cli::command();
    let hyphen_options: Vec<(String, String)> = std::iter::once(&command)
        .chain(command.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .filter(|a| a.is_allow_hyphen_values_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            let value = a
                .get_value_names()
                .and_then(|names| names.first())
                .map_or_else(|| "VALUE".to_string(), ToString::to_string);
            Some((format!("--{long}"), value))
        })
        .collect();
    let mut words = args.iter().skip(1).map(|a| a.to_str());
    while let Some(word) = words.next() {
        let Some(word) = word else { continue };
        if word == "--" {
            return None; // positional from here on
        }
        let Some((option, value)) = hyphen_options.iter().find(|(o, _)| o == word) else {
            continue;
        };
        match words.next() {
            Some(Some(next)) if next.starts_with("--") => {
                return Some(format!(
                    "a value is required for '{option} <{value}>' but none was supplied \
                     ('{next}' is an option, not its value)"
                ));
            }
            _ => {}
        }
    }
    None
}

/// clap's message without its usage and "for more information" lines, on one line.
pub fn one_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    let mut in_usage = false;
    for line in rendered.lines().map(str::trim) {
        // The usage block runs from "Usage:" to the next blank line.
        in_usage = (in_usage || line.starts_with("Usage:")) && !line.is_empty();
        if in_usage || line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_train_with_defaults() {
        let cli = Cli::try_parse_from(["ndmem"]).unwrap();
        assert!(cli.command.is_none());
        let o = cli.train.options();
        assert_eq!(
            (o.epochs, o.batch, o.hidden, o.modes.len()),
            (100, 16, 32, 3)
        );
        assert_eq!(o.json, PathBuf::from("./ndmem-report.json"));
        let cli = Cli::try_parse_from(["ndmem", "--mode", "pool", "--max-bytes", "64K"]).unwrap();
        assert_eq!(cli.train.options().modes, vec![Mode::Pool]);
        assert_eq!(cli.train.max_bytes, Some(65536));
    }

    #[test]
    fn prefetch_defaults_on_and_zero_turns_it_off() {
        let prefetch = |args: &[&str]| Cli::try_parse_from(args).unwrap().train.prefetch;
        assert_eq!(prefetch(&["ndmem"]), DEFAULT_PREFETCH);
        assert_eq!(prefetch(&["ndmem", "--prefetch", "0"]), 0);
        assert_eq!(prefetch(&["ndmem", "--prefetch", "64"]), 64);
    }

    #[test]
    fn subcommands_parse() {
        let cli = Cli::try_parse_from(["ndmem", "train", "--epochs", "3", "--out-dir", "/tmp/x"])
            .unwrap();
        let Some(Command::Train(args)) = cli.command else {
            panic!("train expected")
        };
        assert_eq!(args.options().svg, PathBuf::from("/tmp/x/ndmem-report.svg"));
        let cli = Cli::try_parse_from(["ndmem", "report", "r.json", "-o", "r.svg"]).unwrap();
        let Some(Command::Report(args)) = cli.command else {
            panic!("report expected")
        };
        assert_eq!((args.svg(), args.json), ("r.svg".into(), "r.json".into()));
        // Without -o, the SVG is the input with its extension replaced.
        let svg = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Some(Command::Report(args)) => args.svg(),
            _ => panic!("report expected"),
        };
        assert_eq!(svg(&["ndmem", "report"]), PathBuf::from("ndmem-report.svg"));
        assert_eq!(
            svg(&["ndmem", "report", "t/trace.json"]),
            PathBuf::from("t/trace.svg")
        );
        assert_eq!(
            svg(&["ndmem", "report", "trace"]),
            PathBuf::from("trace.svg")
        );
        assert!(matches!(
            Cli::try_parse_from(["ndmem", "limits"]).unwrap().command,
            Some(Command::Limits)
        ));
    }

    #[test]
    fn bad_values_give_one_line_naming_the_option() {
        for (args, needle) in [
            (&["ndmem", "--batch", "0"][..], "--batch"),
            (
                &["ndmem", "train", "--epochs", "-1"][..],
                "at least 1, got -1",
            ),
            (&["ndmem", "--mode", "heap"][..], "possible values"),
            (&["ndmem", "--lr", "nan"][..], "--lr"),
            (&["ndmem", "--max-bytes", "8X"][..], "unknown unit"),
            (&["ndmem", "--hidden", "many"][..], "not a whole number"),
            (&["ndmem", "bogus"][..], "unrecognized subcommand 'bogus'"),
            (
                &["ndmem", "--hidden", "18446744073709551615"][..],
                "at most 65536, got 18446744073709551615",
            ),
            (
                &["ndmem", "--hidden", "10000000000000"][..],
                "at most 65536",
            ),
            (&["ndmem", "--batch", "65537"][..], "at most 65536"),
            (&["ndmem", "--epochs", "4000000000"][..], "at most 1000000"),
            (
                &["ndmem", "--steps", "99999999999999999999999999"][..],
                "at most 18446744073709551615",
            ),
            (&["ndmem", "--seed", "-1"][..], "--seed"),
            (&["ndmem", "--prefetch", "-1"][..], "from 0 to 64, got -1"),
            (&["ndmem", "--prefetch", "65"][..], "from 0 to 64, got 65"),
            (&["ndmem", "--prefetch", "two"][..], "--prefetch"),
            (&["ndmem", "--max-bytes", "-1"][..], "--max-bytes"),
            // A value starting with `-` reaches the option's own check.
            (&["ndmem", "--max-bytes", "-5%"][..], "--max-bytes"),
            (&["ndmem", "--max-bytes", "-1K"][..], "--max-bytes"),
            (&["ndmem", "--lr", "-inf"][..], "--lr"),
            (&["ndmem", "--lr", "-nan"][..], "--lr"),
            (&["ndmem", "--device", "-1"][..], "--device"),
            (&["ndmem", "--seed", "-x"][..], "--seed"),
            (
                &["ndmem", "--steps", "1e3"][..],
                "exponent notation is not accepted",
            ),
            (&["ndmem", "--batch", "1.5"][..], "is not a whole number"),
            (
                &["ndmem", "--lr", "1e-50"][..],
                "1e-50 rounds to 0 as an f32",
            ),
            (
                &["ndmem", "--lr", "1e39"][..],
                "1e39 rounds to infinity as an f32",
            ),
        ] {
            let err = Cli::try_parse_from(args).unwrap_err();
            let line = one_line(&err.render().to_string());
            assert!(
                !line.contains('\n') && line.contains(needle) && !line.contains("Usage"),
                "{args:?}: {line}"
            );
            assert!(!line.contains("ndmem <COMMAND>"), "{args:?}: {line}");
        }
    }
}
