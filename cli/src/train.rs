//! `ndmem train`: the same training run under each memory mode, measured step by step
//! from the pool's and the heap's counters, then summarised, compared and written out.
//!
//! Invariant: measurement happens between steps, outside the timed region, and the series
//! it records have their capacity reserved up front, so recording neither allocates during
//! a step nor shows up in steps/s.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use ndmem::alloc::{
    heap, ByteSize, LimitSource, Pool, PoolStats, ENV_MAX_BYTES, ENV_MAX_DEVICE_BYTES, ENV_MAX_HEAP,
};
use ndmem::device::{self, Device};
use ndmem::prefetch::Prefetch;
use ndmem::{reclaim, Tensor};

use crate::data::{fill_batch, shuffler, Dataset, Split, CLASSES, FEATURES};
use crate::env::Environment;
use crate::graph::GraphTrainer;
use crate::model::Dims;
use crate::modes::{Mode, Trainer};
use crate::out::outln;
use crate::report::{
    mean_after_first, plural, steps_per_sec, Agreement, DeviceReport, GraphReport, ModeReport,
    Report, RunConfig, Series,
};
use crate::{chart, limits, paths, Failure};

/// Most steps one mode may run: the per-step figures of a mode (about 60 bytes a step)
/// are held in memory and written to the JSON report.
pub const MAX_STEPS: u64 = 1_000_000;

/// What `ndmem train` was asked to do.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Modes to run, in order.
    pub modes: Vec<Mode>,
    /// Passes over the training rows.
    pub epochs: u32,
    /// Cap on steps per mode.
    pub max_steps: Option<u64>,
    /// Rows per batch.
    pub batch: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Learning rate.
    pub lr: f32,
    /// Seed.
    pub seed: u64,
    /// Off-heap limit to set on the global pool.
    pub max_bytes: Option<usize>,
    /// Batches a producer thread builds ahead (0: built on the training thread).
    pub prefetch: usize,
    /// The device to train on, if any.
    pub device: Option<DeviceSpec>,
    /// Also train through captured device graphs (needs `device`).
    pub graph: bool,
    /// The directory the reports go to by default (created if missing).
    pub out_dir: PathBuf,
    /// Where to write the JSON report.
    pub json: PathBuf,
    /// Where to write the SVG report.
    pub svg: PathBuf,
    /// The flag that named `json`, as errors name it: `--json`, or `--out-dir` for the
    /// default path.
    pub json_option: &'static str,
    /// The flag that named `svg`: `--svg` or `--out-dir`.
    pub svg_option: &'static str,
}

/// A device named on the command line: `sim` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A device simulated in host memory (ordinal 0).
    Sim,
    /// CUDA device `n`.
    Cuda(u32),
}

impl DeviceSpec {
    /// Parses `sim`, `cuda` (device 0) or `cuda:N`.
    pub fn parse(text: &str) -> Result<DeviceSpec, String> {
        match text {
            "sim" => Ok(DeviceSpec::Sim),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => match text.strip_prefix("cuda:") {
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    n.parse::<u32>().map(DeviceSpec::Cuda).map_err(|_| {
                        format!("device number {n} is out of range (at most {})", u32::MAX)
                    })
                }
                _ => Err("expected cuda:N (e.g. cuda:0) or sim".to_string()),
            },
        }
    }

    /// Opens the device (`Error::NoDevice` with the reason when there is none).
    pub fn open(self) -> ndmem::Result<Device> {
        match self {
            DeviceSpec::Sim => device::sim(device::SimConfig::new(0)),
            DeviceSpec::Cuda(n) => device::cuda(n),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Sim => f.write_str("sim"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Runs the training in every requested mode, prints the summary and writes the reports.
/// Fails (after writing the reports) if the loss curves are not identical.
pub fn run(options: &TrainOptions, environment: &Environment) -> Result<(), Failure> {
    // Everything that can fail as configuration (the limit, the device, the run's length)
    // is checked before the output paths, whose check may create --out-dir.
    let pool = Pool::try_global().map_err(|e| Failure::config(e.to_string()))?;
    crate::env::check_physical(&environment.limits)?;
    if let Some(limit) = options.max_bytes {
        pool.set_max_bytes_by(Some(limit), "--max-bytes")
            .map_err(|e| Failure::config(format!("--max-bytes {}: {e}", ByteSize(limit))))?;
    }
    let device = match options.device {
        Some(spec) => Some(
            spec.open()
                .map_err(|e| Failure::config(format!("--device {spec}: {e}")))?,
        ),
        None => None,
    };
    let data = Dataset::iris().map_err(Failure::runtime)?;
    let split = Split::new(&data, options.seed);
    let dims = Dims {
        inputs: FEATURES,
        hidden: options.hidden,
        classes: CLASSES.len(),
    };
    let steps_per_epoch = split.train.rows().div_ceil(options.batch) as u64;
    let planned = steps_per_epoch.saturating_mul(u64::from(options.epochs));
    let total = options.max_steps.map_or(planned, |cap| planned.min(cap));
    if total > MAX_STEPS {
        return Err(Failure::config(format!(
            "{} epochs of {steps_per_epoch} steps (batch {}) make {total} steps per mode, more than {MAX_STEPS}: lower --epochs, raise --batch or cap with --steps",
            options.epochs, options.batch
        )));
    }
    let parameters = dims
        .parameters()
        .ok_or_else(|| Failure::config(format!("--hidden {} is too large", options.hidden)))?;
    // What it created for the reports goes again if the run stops before writing them
    // (the directories are empty then).
    let mut cleanup = RemoveUnlessWritten(Some(
        paths::check_train_paths(
            &options.out_dir,
            (&options.json, options.json_option),
            (&options.svg, options.svg_option),
            environment.trace.as_ref().map(|(path, _)| path.as_path()),
        )
        .map_err(Failure::config)?,
    ));
    outln!(
        "ndmem train: Iris, {} flowers ({} train, {} test), {} features, {} classes",
        data.rows(),
        split.train.rows(),
        split.test.rows(),
        FEATURES,
        CLASSES.len(),
    );
    outln!(
        "model: MLP {}-{}-{} ({} parameters), SGD lr {:?}, batch {}, seed {}",
        dims.inputs,
        dims.hidden,
        dims.classes,
        parameters,
        options.lr,
        options.batch,
        options.seed
    );
    outln!(
        "{}",
        run_length(options.epochs, steps_per_epoch, options.max_steps, total)
    );
    let limit = pool.limits().0;
    // What set the off-heap limit: a key for the report, words for the header.
    let (set_by, source) = if options.max_bytes.is_some() {
        ("--max-bytes", "--max-bytes".to_string())
    } else {
        match environment.limits.sources.max_bytes {
            LimitSource::Environment => (ENV_MAX_BYTES, ENV_MAX_BYTES.to_string()),
            _ => (
                "default",
                format!("default: {}", limits::default_max_bytes()),
            ),
        }
    };
    // A device's limit is NDMEM_MAX_DEVICE_BYTES when it is set (whatever its value, 0
    // included), else min(off-heap limit, 90% of the device): it follows what set that.
    let device_limit_set_by = device.as_ref().map(|_| {
        if std::env::var_os(ENV_MAX_DEVICE_BYTES).is_some() {
            ENV_MAX_DEVICE_BYTES.to_string()
        } else {
            set_by.to_string()
        }
    });
    outln!(
        "off-heap limit {} ({source})",
        limit.map_or_else(|| "unlimited".to_string(), |l| ByteSize(l).to_string())
    );
    outln!(
        "{}",
        describe_heap(
            heap::stats().limit,
            environment.limits.sources.max_heap,
            std::env::var(ENV_MAX_HEAP).ok().as_deref()
        )
    );
    let bypass = environment.workspaces == crate::env::WorkspaceDebug::Bypass;
    outln!("{}", describe_prefetch(options.prefetch, bypass));
    if let Some(line) = crate::env::describe_workspaces(environment.workspaces) {
        outln!("{line}");
    }
    for mode in &options.modes {
        let what = match mode {
            Mode::Workspaces if bypass => BYPASSED_WORKSPACES,
            _ => mode.describe(),
        };
        outln!("  {:<11} {what}", mode.name());
    }
    if let Some(gpu) = &device {
        outln!("device: {}", gpu.describe());
    }

    let mut report = Report {
        ndmem_version: env!("CARGO_PKG_VERSION").to_string(),
        config: RunConfig {
            dataset: "iris".into(),
            train_rows: split.train.rows(),
            test_rows: split.test.rows(),
            features: FEATURES,
            classes: CLASSES.len(),
            hidden: options.hidden,
            epochs: options.epochs,
            max_steps: options.max_steps,
            batch: options.batch,
            lr: options.lr,
            seed: options.seed,
            max_bytes: limit,
            prefetch: Some(options.prefetch),
            device_limit_set_by,
        },
        modes: Vec::new(),
        graph: None,
    };
    // With stdout elsewhere (a pipe, a file), the bars vanish when their mode ends, so no
    // stale progress line stays on the terminal above what the reader of stdout prints.
    let keep_bars = std::io::stdout().is_terminal();
    for &mode in &options.modes {
        let bar = progress_bar(mode, total);
        let measured =
            run_mode(mode, options, &split, dims, &bar, device.as_ref()).map_err(|e| {
                // The error line says which mode and step failed; no half-drawn bar stays.
                bar.finish_and_clear();
                let e = match e {
                    StepError::Memory(e) => e,
                    StepError::Diverged(e) => format!("{e}: lower --lr (now {:?})", options.lr),
                };
                Failure::runtime(format!("training in {} mode failed {e}", mode.name()))
            })?;
        if keep_bars {
            bar.finish_with_message(format!(
                "{}, acc {:.1}%",
                measured
                    .final_loss
                    .map_or_else(|| "-".to_string(), |l| format!("{l:.4}")),
                measured.test_accuracy * 100.0
            ));
        } else {
            bar.finish_and_clear();
        }
        if let Some(d) = &measured.device {
            for line in crate::report::mode_device_lines(mode.name(), d) {
                outln!("{line}");
            }
        }
        report.modes.push(measured);
    }

    if let (true, Some(gpu)) = (options.graph, &device) {
        let graph = run_graph(options, &split, dims, gpu, &report)?;
        let on = format!("{}:{}", gpu.kind(), gpu.ordinal());
        for line in crate::report::graph_lines(&on, &graph) {
            outln!("{line}");
        }
        report.graph = Some(graph);
    }

    outln!();
    outln!("{}", report.table().trim_end());
    outln!();
    let agreement = report.agreement();
    outln!("{}", agreement.verdict());
    print_comparison(&report);
    // Both reports are rendered, then written all or none (paths::write_files).
    let json = report.to_json().map_err(Failure::runtime)?;
    let svg = chart::render(&report).map_err(Failure::runtime)?;
    paths::write_files(&[
        paths::OutputFile {
            label: format!("{} {}", options.json_option, options.json.display()),
            path: &options.json,
            content: json.as_bytes(),
        },
        paths::OutputFile {
            label: format!("{} {}", options.svg_option, options.svg.display()),
            path: &options.svg,
            content: svg.as_bytes(),
        },
    ])
    .map_err(Failure::runtime)?;
    cleanup.0 = None;
    outln!(
        "report: {} and {}",
        options.json.display(),
        options.svg.display()
    );
    if let Agreement::Differs {
        reference,
        mode,
        step,
        values,
    } = agreement
    {
        let detail = values.map_or_else(
            || "one curve is shorter".to_string(),
            |(a, b)| {
                format!(
                    "{a:e} ({:#010x}) vs {b:e} ({:#010x})",
                    a.to_bits(),
                    b.to_bits()
                )
            },
        );
        return Err(Failure::runtime(format!(
            "loss curves differ: {mode} departs from {reference} at step {}: {detail}",
            step + 1
        )));
    }
    Ok(())
}

/// Directories `train` created for its reports, removed (if still empty) when it is
/// dropped holding them: the run stopped before the reports were written.
struct RemoveUnlessWritten(Option<paths::Created>);

impl Drop for RemoveUnlessWritten {
    fn drop(&mut self) {
        if let Some(created) = &self.0 {
            paths::remove_created(created);
        }
    }
}

/// The header line saying how many steps each mode runs and why.
pub fn run_length(epochs: u32, steps_per_epoch: u64, max_steps: Option<u64>, total: u64) -> String {
    let planned = steps_per_epoch.saturating_mul(u64::from(epochs));
    let epochs_text = format!(
        "{epochs} epoch{} of {steps_per_epoch} step{}",
        plural(epochs as usize),
        plural(steps_per_epoch as usize)
    );
    match max_steps {
        Some(cap) if cap < planned => format!(
            "run: {total} step{} per mode (--steps {cap}; {epochs_text} would be {planned})",
            plural(total as usize)
        ),
        Some(cap) if cap > planned => format!(
            "run: {epochs_text} = {total} step{} per mode (--steps {cap} caps, and the \
             epochs end first: raise --epochs for more)",
            plural(total as usize)
        ),
        _ => format!(
            "run: {epochs_text} = {total} step{} per mode",
            plural(total as usize)
        ),
    }
}

/// The header's heap line: what counts the heap, and its limit when one is set (the report
/// and the chart are written under it too, after the modes ran). `source` and `value` are
/// where the limit came from and `NDMEM_MAX_HEAP`'s value: a variable set to 0, or to
/// 4 EiB or more, means no limit (semantics §1), and a second line says so.
pub fn describe_heap(limit: Option<usize>, source: LimitSource, value: Option<&str>) -> String {
    let counted = "heap: every byte counted by Tracking<System>";
    match (limit, source, value) {
        (Some(limit), _, _) => format!("{counted}; limit {} ({ENV_MAX_HEAP})", ByteSize(limit)),
        (None, LimitSource::Environment, Some(value)) => {
            let value = value.trim();
            let why = if ndmem::alloc::parse_size(value) == Ok(0) {
                "0 means no limit"
            } else {
                "4 EiB or more means no limit"
            };
            format!("{counted}; no limit\n  ({ENV_MAX_HEAP}={value}: {why})")
        }
        (None, LimitSource::Environment, None) => format!("{counted}; no limit ({ENV_MAX_HEAP})"),
        (None, _, _) => format!("{counted}; no limit ({ENV_MAX_HEAP} unset)"),
    }
}

/// What the header says of `workspaces` mode under `NDMEM_WORKSPACES=bypass` (semantics
/// §2: workspaces are off for tensors, which go to the pool).
pub const BYPASSED_WORKSPACES: &str =
    "workspace cycles entered but bypassed: tensors are pool blocks";

/// The header line saying how the batches are read; `bypass`: `NDMEM_WORKSPACES=bypass`,
/// under which the producer's ring workspace holds no batch (they are pool blocks).
pub fn describe_prefetch(prefetch: usize, bypass: bool) -> String {
    if prefetch == 0 {
        "batches: built on the training thread, no prefetching (--prefetch 0)".to_string()
    } else if bypass {
        // At most 78 columns (--prefetch 64).
        format!(
            "batches: {prefetch} ahead, by a thread, as pool blocks (ring bypassed; --prefetch {prefetch})"
        )
    } else {
        // At most 76 columns (--prefetch 64).
        format!(
            "batches: {prefetch} ahead, by a thread into a {}-slot ring workspace (--prefetch {prefetch})",
            prefetch + 2
        )
    }
}

/// Largest relative difference allowed between a replayed and a launched step's loss.
pub const GRAPH_LOSS_TOLERANCE: f64 = 1e-5;

/// `--graph`: trains once more on the same batches, each step a replayed device graph
/// (captured once per batch size), and compares its losses with the launched steps of the
/// first mode that ran. Fails if they differ by more than [`GRAPH_LOSS_TOLERANCE`].
fn run_graph(
    options: &TrainOptions,
    split: &Split,
    dims: Dims,
    device: &Device,
    report: &Report,
) -> Result<GraphReport, Failure> {
    let failed = |e: String| Failure::runtime(format!("training through device graphs failed {e}"));
    let launched = report
        .modes
        .first()
        .ok_or_else(|| failed("with no launched mode to compare with".into()))?;
    let total = launched.steps as u64;
    let mut trainer = GraphTrainer::new(
        device,
        dims,
        options.seed,
        options.batch.min(split.train.rows()),
        options.lr,
    )
    .map_err(|e| failed(format!("creating the graph memory: {e}")))?;
    let host_only = TrainOptions {
        prefetch: 0,
        ..options.clone()
    };
    let batches = batches(&host_only, split, total, None).map_err(&failed)?;
    let mut losses = Vec::with_capacity(launched.steps);
    let mut nanos = Vec::with_capacity(launched.steps);
    let mut after_first = None;
    for batch in batches {
        let step = losses.len() + 1;
        let at = |e: ndmem::Error| failed(format!("at step {step}: {e}"));
        let batch = batch.map_err(at)?;
        let (x, y) = batch.get().map_err(at)?;
        let (x, y) = (
            x.to_vec::<f32>().map_err(at)?,
            y.to_vec::<f32>().map_err(at)?,
        );
        let started = Instant::now();
        let loss = trainer.step(&x, &y).map_err(at)?;
        nanos.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        losses.push(loss);
        if step == 1 {
            after_first = Some(device.stats());
        }
    }
    let since = after_first.map(|s| device.stats().since(&s));
    let steps = losses.len();
    let mut worst: f64 = 0.0;
    for (i, (g, l)) in losses.iter().zip(&launched.series.loss).enumerate() {
        let (g, l) = (f64::from(*g), f64::from(*l));
        let diff = (g - l).abs() / l.abs().max(f64::MIN_POSITIVE);
        if diff > GRAPH_LOSS_TOLERANCE {
            return Err(failed(format!(
                "at step {}: the replayed loss {g:e} differs from the launched {l:e} ({} mode)",
                i + 1,
                launched.mode
            )));
        }
        worst = worst.max(diff);
    }
    let later = steps.saturating_sub(1).max(1) as f64;
    Ok(GraphReport {
        steps,
        graphs: trainer.graphs(),
        ops_per_step: trainer.ops_per_step(),
        steps_per_sec: steps_per_sec(&nanos),
        compared_with: launched.mode.clone(),
        launched_steps_per_sec: launched.steps_per_sec,
        max_relative_loss_difference: worst,
        driver_allocations_after_first: since.map_or(0, |s| s.driver_allocations),
        peak_bytes: device.stats().peak_live_bytes,
        htod_per_step: since.map_or(0.0, |s| s.htod_transfers as f64 / later),
        dtoh_per_step: since.map_or(0.0, |s| s.dtoh_transfers as f64 / later),
        loss: losses,
    })
}

/// Id of the producer's workspace (and the name of the iterator in errors).
pub const BATCH_WORKSPACE: &str = "BATCHES";

/// The training batches of `total` steps, in the order of the per-epoch shuffles: built
/// `options.prefetch` ahead by a producer thread in its circular workspace (and copied to
/// `device` there, if one is given), or, with 0, on this thread (semantics §6). The order
/// is the same either way, so the losses are too.
fn batches(
    options: &TrainOptions,
    split: &Split,
    total: u64,
    device: Option<&Device>,
) -> Result<Prefetch<(Tensor, Tensor)>, String> {
    let data = split.train.clone();
    let rows = data.rows();
    let batch = options.batch;
    let steps_per_epoch = rows.div_ceil(batch) as u64;
    let mut order: Vec<usize> = (0..rows).collect();
    let mut shuffle = shuffler(options.seed);
    let batch_rows = batch.min(rows);
    let mut x = Vec::with_capacity(batch_rows * FEATURES);
    let mut y = Vec::with_capacity(batch_rows * CLASSES.len());
    let build = move |step: u64| {
        let chunk = (step % steps_per_epoch) as usize;
        if chunk == 0 {
            shuffle.shuffle(&mut order);
        }
        let taken = &order[chunk * batch..rows.min((chunk + 1) * batch)];
        fill_batch(&data, taken, &mut x, &mut y);
        let built = (
            Tensor::from_slice(&x, &[taken.len(), FEATURES])?,
            Tensor::from_slice(&y, &[taken.len(), CLASSES.len()])?,
        );
        // Publishes this thread's heap tally (reading the statistics does), so that the
        // training loop's heap figures per step count the producer's allocations too
        // rather than up to 4096 of them late (semantics §1).
        let _ = heap::stats();
        Ok(built)
    };
    let builder = Prefetch::builder()
        .name(BATCH_WORKSPACE)
        .capacity(options.prefetch);
    let started = match device {
        _ if options.prefetch == 0 => return Ok(builder.shield(0..total, build)),
        Some(gpu) => builder.device(gpu).spawn(0..total, build),
        None => builder.spawn(0..total, build),
    };
    started.map_err(|e| format!("starting the batch producer: {e}"))
}

/// One line comparing `workspaces` (and `scopes`) with `pool`, when they ran (`train` and
/// `report` print them after the verdict).
pub(crate) fn print_comparison(report: &Report) {
    let find = |name: &str| report.modes.iter().find(|m| m.mode == name);
    let Some(pool) = find("pool") else { return };
    for other in [find("workspaces"), find("scopes")].into_iter().flatten() {
        let speed = other.steps_per_sec / pool.steps_per_sec.max(f64::MIN_POSITIVE);
        if other.steps < 2 {
            // No step after the first: compare the one step there is.
            outln!(
                "{} vs pool: {speed:.2}x steps/s; pool allocs in the only step: {} vs {}",
                other.mode,
                other.first_step_pool_allocations,
                pool.first_step_pool_allocations
            );
        } else {
            outln!(
                "{} vs pool: {speed:.2}x steps/s; pool allocs/step after step 1: {:.2} vs {:.2}",
                other.mode,
                other.pool_allocations_per_step,
                pool.pool_allocations_per_step
            );
        }
    }
}

/// A progress bar on stderr for `total` steps of `mode` (hidden when stderr is not a
/// terminal); its message shows the loss.
fn progress_bar(mode: Mode, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>10} [{bar:16}] {pos:>5}/{len} {rate:>7} loss {msg}")
    {
        // Whole steps per second: indicatif's own {per_sec} prints every digit.
        let rate = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.0}/s", state.per_sec());
        };
        bar.set_style(style.progress_chars("=> ").with_key("rate", rate));
    }
    bar.set_prefix(mode.name());
    bar
}

/// The highest pool figures seen so far in a mode, each phase measured from a reset peak.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    /// Highest live bytes.
    live: usize,
    /// Highest used bytes (live + cached).
    used: usize,
}

impl Peaks {
    /// Takes in the peaks of `stats` (read after a phase).
    fn take(&mut self, stats: &PoolStats) {
        self.live = self.live.max(stats.peak_bytes);
        self.used = self.used.max(stats.peak_used_bytes);
    }
}

/// Why a mode stopped early.
enum StepError {
    /// An allocation or other ndmem error (the message says which).
    Memory(String),
    /// The loss stopped being finite.
    Diverged(String),
}

impl From<String> for StepError {
    fn from(message: String) -> StepError {
        StepError::Memory(message)
    }
}

/// Trains in one mode and measures every step, advancing `bar` (the caller finishes it).
fn run_mode(
    mode: Mode,
    options: &TrainOptions,
    split: &Split,
    dims: Dims,
    bar: &ProgressBar,
    device: Option<&Device>,
) -> Result<ModeReport, StepError> {
    let pool = Pool::global();
    // Start from cold pools: memory deferred or cached by an earlier mode goes back, on
    // the device too, so each mode's driver allocations are its own.
    reclaim::collect();
    pool.trim();
    if let Some(gpu) = device {
        gpu.trim();
    }
    let total = usize::try_from(bar.length().unwrap_or(0)).unwrap_or(usize::MAX);
    let mut series = Series::with_capacity(total)?;
    let mut peak_heap = 0;
    let mut peaks = Peaks::default();
    let mut elapsed = Duration::ZERO;
    // Heap figures are taken above this baseline, so what earlier modes left (their
    // series, held in the report) does not count against this one.
    heap::reset_peak();
    let heap_base = heap::stats().live_bytes;

    // The mode's off-heap peaks cover everything it does (the parameters, the steps, the
    // evaluation), so the table's "used" figure is a limit that runs the whole mode.
    pool.reset_peak();
    let mut trainer = Trainer::new(mode, dims, options.seed)
        .and_then(|t| match device {
            Some(gpu) => t.on_device(gpu),
            None => Ok(t),
        })
        .map_err(|e| format!("creating the parameters: {e}"))?;
    peaks.take(&pool.stats());
    let device_start = device.map(Device::stats);
    let mut device_steps: Vec<u64> = Vec::new();
    // Started once the parameters exist: the producer's pool allocations (its first batch,
    // then its ring) come before the first batch is handed over, outside every step, and
    // reading a batch is outside the timed region.
    let batches = batches(options, split, total as u64, device)?;
    for batch in batches {
        let step = series.loss.len() + 1;
        let batch = batch.map_err(|e| format!("reading the batch of step {step}: {e}"))?;
        let (x, y) = batch.get().map_err(|e| format!("at step {step}: {e}"))?;
        // Host batches are read in place; prefetched device batches go to the step as they
        // are (the copy in was the producer's).
        let host = if x.is_on_device() {
            None
        } else {
            let at = |e| format!("at step {step}: {e}");
            Some((x.view::<f32>().map_err(at)?, y.view::<f32>().map_err(at)?))
        };
        pool.reset_peak();
        let (before, heap_before) = (pool.stats(), heap::stats());
        let device_before = device.map(|d| d.stats().driver_allocations);

        let started = Instant::now();
        let loss = match &host {
            Some((xv, yv)) => trainer.step(
                xv.as_array().to_slice().unwrap_or_default(),
                yv.as_array().to_slice().unwrap_or_default(),
                options.lr,
            ),
            None => trainer.step_on_device(x, y, options.lr),
        }
        .map_err(|e| format!("at step {step}: {e}"))?;
        let took = started.elapsed();
        elapsed += took;
        if !loss.is_finite() {
            // JSON has no NaN or infinity, and nothing after this step would mean anything.
            return Err(StepError::Diverged(format!(
                "at step {}: the loss is {loss} (the run diverged)",
                series.loss.len() + 1
            )));
        }

        let (after, heap_after) = (pool.stats(), heap::stats());
        if let (Some(gpu), Some(b)) = (device, device_before) {
            device_steps.push(gpu.stats().driver_allocations - b);
        }
        peaks.take(&after);
        peak_heap = peak_heap.max(heap_after.peak_bytes.saturating_sub(heap_base));
        series.loss.push(loss);
        series
            .step_nanos
            .push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        series.pool_peak_bytes.push(after.peak_bytes);
        series.pool_live_bytes.push(after.live_bytes);
        series
            .pool_allocations
            .push(after.allocations - before.allocations);
        series
            .os_allocations
            .push(after.os_allocations - before.os_allocations);
        series
            .heap_live_bytes
            .push(heap_after.live_bytes.saturating_sub(heap_base));
        series
            .heap_allocations
            .push(heap_after.allocations - heap_before.allocations);
        bar.inc(1);
        if series.loss.len() % 16 == 1 {
            bar.set_message(format!("{loss:.4}"));
        }
    }
    pool.reset_peak();
    let accuracy = trainer
        .accuracy(&split.test.features, &split.test.labels)
        .map_err(|e| format!("evaluating the test rows: {e}"))?;
    drop(trainer);
    peaks.take(&pool.stats());
    let final_loss = series.loss.last().copied();
    let steps = series.loss.len();
    let device = match (device, device_start) {
        (Some(gpu), Some(start)) => {
            let s = gpu.stats().since(&start);
            let per_step = |n: u64| n as f64 / steps.max(1) as f64;
            Some(DeviceReport {
                device: gpu.describe(),
                peak_bytes: s.peak_live_bytes,
                driver_allocations: s.driver_allocations,
                first_step_driver_allocations: device_steps.first().copied().unwrap_or(0),
                driver_allocations_per_step: mean_after_first(&device_steps),
                htod_per_step: per_step(s.htod_transfers),
                dtoh_per_step: per_step(s.dtoh_transfers),
                htod_bytes: s.htod_bytes,
                dtoh_bytes: s.dtoh_bytes,
            })
        }
        _ => None,
    };
    let seconds = elapsed.as_secs_f64();
    Ok(ModeReport {
        mode: mode.name().to_string(),
        steps,
        step_seconds: seconds,
        steps_per_sec: steps_per_sec(&series.step_nanos),
        first_step_pool_allocations: series.pool_allocations.first().copied().unwrap_or(0),
        pool_allocations_per_step: mean_after_first(&series.pool_allocations),
        os_allocations_per_step: mean_after_first(&series.os_allocations),
        heap_allocations_per_step: mean_after_first(&series.heap_allocations),
        peak_pool_bytes: peaks.live,
        peak_pool_used_bytes: peaks.used,
        peak_heap_bytes: peak_heap,
        final_loss,
        test_accuracy: accuracy,
        series,
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_spec_names_what_is_wrong_with_it() {
        assert!(matches!(
            DeviceSpec::parse("cuda:3"),
            Ok(DeviceSpec::Cuda(3))
        ));
        assert!(matches!(DeviceSpec::parse("cuda"), Ok(DeviceSpec::Cuda(0))));
        assert!(matches!(DeviceSpec::parse("sim"), Ok(DeviceSpec::Sim)));
        let far = DeviceSpec::parse("cuda:99999999999").unwrap_err();
        assert!(far.contains("out of range"), "{far}");
        for bad in ["cuda:", "cuda:x", "cuda:-1", "gpu", "cuda:+1"] {
            let err = DeviceSpec::parse(bad).unwrap_err();
            assert!(err.contains("expected cuda:N"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_run_length_says_which_of_steps_and_epochs_ends_the_run() {
        assert_eq!(
            run_length(100, 8, None, 800),
            "run: 100 epochs of 8 steps = 800 steps per mode"
        );
        assert_eq!(
            run_length(100, 8, Some(10), 10),
            "run: 10 steps per mode (--steps 10; 100 epochs of 8 steps would be 800)"
        );
        let capped_late = run_length(100, 8, Some(2000), 800);
        assert!(
            capped_late.starts_with("run: 100 epochs of 8 steps = 800 steps per mode")
                && capped_late.contains("--steps 2000")
                && capped_late.contains("raise --epochs"),
            "{capped_late}"
        );
        assert_eq!(
            run_length(1, 1, Some(1), 1),
            "run: 1 epoch of 1 step = 1 step per mode"
        );
    }

    fn options(prefetch: usize, batch: usize) -> TrainOptions {
        TrainOptions {
            modes: Vec::new(),
            epochs: 3,
            max_steps: None,
            batch,
            hidden: 8,
            lr: 0.1,
            seed: 7,
            max_bytes: None,
            prefetch,
            device: None,
            graph: false,
            out_dir: PathBuf::new(),
            json: PathBuf::new(),
            svg: PathBuf::new(),
            json_option: "--json",
            svg_option: "--svg",
        }
    }

    /// Every batch of `total` steps, read back.
    fn stream(prefetch: usize, batch: usize, total: u64) -> Vec<(Vec<f32>, Vec<f32>)> {
        let split = Split::new(&Dataset::iris().unwrap(), 7);
        batches(&options(prefetch, batch), &split, total, None)
            .unwrap()
            .map(|b| {
                let b = b.unwrap();
                let (x, y) = b.get().unwrap();
                (x.to_vec().unwrap(), y.to_vec().unwrap())
            })
            .collect()
    }

    #[test]
    fn prefetched_batches_are_the_shuffled_epochs_in_order() {
        // The batches of the loop this replaced: shuffle per epoch, then chunks.
        let split = Split::new(&Dataset::iris().unwrap(), 7);
        let mut order: Vec<usize> = (0..split.train.rows()).collect();
        let mut shuffle = shuffler(7);
        let mut expected = Vec::new();
        for _ in 0..3 {
            shuffle.shuffle(&mut order);
            for rows in order.chunks(16) {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                fill_batch(&split.train, rows, &mut x, &mut y);
                expected.push((x, y));
            }
        }
        assert_eq!(
            expected.len(),
            24,
            "8 steps of 16 rows (the last one 8) per epoch"
        );
        for prefetch in [0, 1, 2, 5] {
            assert_eq!(stream(prefetch, 16, 24), expected, "--prefetch {prefetch}");
        }
        assert_eq!(stream(2, 16, 10), expected[..10], "a --steps cap");
    }

    #[test]
    fn with_a_device_the_producer_copies_the_batches_there_and_the_steps_agree() {
        let gpu = device::sim(device::SimConfig::new(0)).unwrap();
        let split = Split::new(&Dataset::iris().unwrap(), 7);
        let on_device: Vec<(Tensor, Tensor)> = batches(&options(2, 16), &split, 8, Some(&gpu))
            .unwrap()
            .map(|b| b.unwrap().get().unwrap().clone())
            .collect();
        let host = stream(2, 16, 8);
        assert_eq!(on_device.len(), host.len());
        let dims = Dims {
            inputs: FEATURES,
            hidden: 8,
            classes: CLASSES.len(),
        };
        for mode in Mode::ALL {
            let mut copied_in = Trainer::new(mode, dims, 7)
                .unwrap()
                .on_device(&gpu)
                .unwrap();
            let mut prefetched = Trainer::new(mode, dims, 7)
                .unwrap()
                .on_device(&gpu)
                .unwrap();
            for ((x, y), (hx, hy)) in on_device.iter().zip(&host) {
                assert!(x.is_on_device() && y.is_on_device());
                assert_eq!(&x.to_host().unwrap().to_vec::<f32>().unwrap(), hx);
                assert_eq!(&y.to_host().unwrap().to_vec::<f32>().unwrap(), hy);
                let a = copied_in.step(hx, hy, 0.1).unwrap();
                let b = prefetched.step_on_device(x, y, 0.1).unwrap();
                assert_eq!(a.to_bits(), b.to_bits(), "{}", mode.name());
            }
        }
    }
}
