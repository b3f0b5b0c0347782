//! The run's results: what `ndmem-report.json` holds (serde), the summary table printed at
//! the end of a run, and the bit-for-bit comparison of the modes' loss curves.
//!
//! Invariant: every figure is read from the `ndmem-alloc` counters during the run; this
//! module only stores, compares and formats them.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Everything a run measured; the JSON report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Version of the `ndmem` package that wrote it.
    pub ndmem_version: String,
    /// The training set-up.
    pub config: RunConfig,
    /// One entry per mode, in run order.
    pub modes: Vec<ModeReport>,
    /// The run through captured device graphs (`--graph`), if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphReport>,
}

/// What `--graph` measured: the same training, each step a replayed device graph.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GraphReport {
    /// Steps run.
    pub steps: usize,
    /// Graphs captured (one per batch size).
    pub graphs: usize,
    /// Device operations one replayed step runs.
    pub ops_per_step: usize,
    /// Steps per second: one over the median step time after the first.
    pub steps_per_sec: f64,
    /// The mode whose launched steps it is compared with.
    pub compared_with: String,
    /// That mode's steps per second.
    pub launched_steps_per_sec: f64,
    /// The largest relative difference between a replayed and a launched step's loss.
    pub max_relative_loss_difference: f64,
    /// Driver allocations during the graph run after its first step.
    pub driver_allocations_after_first: u64,
    /// The device's peak live bytes by the end of the graph run (the modes ran before it,
    /// so this is the graph run's own peak when it is the highest). 0 in reports written
    /// before it was recorded.
    #[serde(default)]
    pub peak_bytes: usize,
    /// Host-to-device and device-to-host copies per step (the batch in, the loss out).
    pub htod_per_step: f64,
    /// Device-to-host copies per step.
    pub dtoh_per_step: f64,
    /// Per-step losses.
    pub loss: Vec<f32>,
}

/// The training set-up shared by every mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunConfig {
    /// Data set name.
    pub dataset: String,
    /// Training rows.
    pub train_rows: usize,
    /// Test rows.
    pub test_rows: usize,
    /// Input features.
    pub features: usize,
    /// Classes.
    pub classes: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Epochs asked for.
    pub epochs: u32,
    /// Cap on steps per mode, if one was given.
    pub max_steps: Option<u64>,
    /// Rows per batch.
    pub batch: usize,
    /// SGD learning rate.
    pub lr: f32,
    /// Seed of the split, the shuffles and the initial weights.
    pub seed: u64,
    /// The pool's off-heap limit during the run (`None`: unlimited).
    pub max_bytes: Option<usize>,
    /// Batches built ahead by a producer thread (`Some(0)`: none, built on the training
    /// thread; `None`: a report written before batches were prefetched).
    #[serde(default)]
    pub prefetch: Option<usize>,
    /// With a device: what set the device's limit, `NDMEM_MAX_DEVICE_BYTES` when it was
    /// set, else what set the off-heap limit the device's followed (min(that, 90% of the
    /// device)): `--max-bytes`, `NDMEM_MAX_BYTES` or `default`. `None` on the host, and in
    /// reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_limit_set_by: Option<String>,
}

/// What one mode measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModeReport {
    /// `pool`, `workspaces` or `scopes`.
    pub mode: String,
    /// Steps run.
    pub steps: usize,
    /// Seconds spent inside steps (measurement excluded).
    pub step_seconds: f64,
    /// Steps per second: one over the median step time after the first step (robust to
    /// the odd step that lost its core to another process).
    pub steps_per_sec: f64,
    /// Pool blocks handed out by the first step.
    pub first_step_pool_allocations: u64,
    /// Mean pool blocks handed out per step after the first.
    pub pool_allocations_per_step: f64,
    /// Mean times per step after the first that the pool went to the OS.
    pub os_allocations_per_step: f64,
    /// Mean heap allocations per step after the first.
    pub heap_allocations_per_step: f64,
    /// Highest pool live bytes during the mode (creating the parameters, the steps and the
    /// evaluation).
    pub peak_pool_bytes: usize,
    /// Highest pool used bytes during the mode (live + cached): what `--max-bytes` limits,
    /// so a limit at least this large runs the mode.
    pub peak_pool_used_bytes: usize,
    /// Highest heap live bytes during the mode, above the heap live when it started.
    pub peak_heap_bytes: usize,
    /// Loss of the last step (`None`, JSON `null`, when no step ran). Always finite: a run
    /// whose loss stops being finite fails instead (JSON has no NaN or infinity).
    pub final_loss: Option<f32>,
    /// Test-set accuracy after training.
    pub test_accuracy: f64,
    /// Per-step figures.
    pub series: Series,
    /// The device the mode trained on, with its figures (`None`, absent from the JSON, for
    /// a run on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceReport>,
}

/// What a mode did on its device (`--device`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceReport {
    /// The device, as `ndmem limits` describes it (`cuda:0 NVIDIA H100 ...`).
    pub device: String,
    /// Highest device bytes live during the mode.
    pub peak_bytes: usize,
    /// Times the mode asked the driver for memory (parameters and evaluation included).
    pub driver_allocations: u64,
    /// Driver allocations made by the first step.
    pub first_step_driver_allocations: u64,
    /// Mean driver allocations per step after the first (measured around each step).
    pub driver_allocations_per_step: f64,
    /// Host-to-device copies per step over the whole mode (parameters, the prefetched
    /// batches and evaluation included).
    pub htod_per_step: f64,
    /// Device-to-host copies per step over the whole mode.
    pub dtoh_per_step: f64,
    /// Bytes copied to the device during the mode.
    pub htod_bytes: u64,
    /// Bytes copied back during the mode.
    pub dtoh_bytes: u64,
}

/// Per-step figures, one value per step.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Series {
    /// Batch loss before the step's update.
    pub loss: Vec<f32>,
    /// Pool live bytes at the step's highest point.
    pub pool_peak_bytes: Vec<usize>,
    /// Pool live bytes after the step.
    pub pool_live_bytes: Vec<usize>,
    /// Pool blocks handed out during the step.
    pub pool_allocations: Vec<u64>,
    /// Times the pool went to the OS during the step.
    pub os_allocations: Vec<u64>,
    /// Heap live bytes after the step, above the heap live when the mode started.
    pub heap_live_bytes: Vec<usize>,
    /// Heap allocations during the step.
    pub heap_allocations: Vec<u64>,
    /// Wall-clock nanoseconds of the step.
    pub step_nanos: Vec<u64>,
}

impl Series {
    /// Empty series with room for `steps` values each (so recording never reallocates), or
    /// an error naming the size when the heap cannot hold them. Callers bound `steps` first
    /// (`ndmem train` takes at most `train::MAX_STEPS` steps per mode).
    pub fn with_capacity(steps: usize) -> Result<Series, String> {
        /// An empty vector with room for exactly `steps` values.
        fn reserve<T>(steps: usize) -> Result<Vec<T>, String> {
            let mut values = Vec::new();
            values.try_reserve_exact(steps).map_err(|e| {
                format!("cannot reserve the per-step figures of {steps} steps: {e}")
            })?;
            Ok(values)
        }
        Ok(Series {
            loss: reserve(steps)?,
            pool_peak_bytes: reserve(steps)?,
            pool_live_bytes: reserve(steps)?,
            pool_allocations: reserve(steps)?,
            os_allocations: reserve(steps)?,
            heap_live_bytes: reserve(steps)?,
            heap_allocations: reserve(steps)?,
            step_nanos: reserve(steps)?,
        })
    }
}

/// Mean of `values` after the first (0 when there are fewer than two).
pub fn mean_after_first(values: &[u64]) -> f64 {
    match values.len() {
        0 | 1 => 0.0,
        n => values[1..].iter().sum::<u64>() as f64 / (n - 1) as f64,
    }
}

/// Steps per second from the median of `nanos` after the first step (all of them when
/// there is only one); 0 when nothing was timed.
pub fn steps_per_sec(nanos: &[u64]) -> f64 {
    let mut timed = nanos
        .get(1..)
        .filter(|t| !t.is_empty())
        .unwrap_or(nanos)
        .to_vec();
    if timed.is_empty() {
        return 0.0;
    }
    timed.sort_unstable();
    let middle = timed.len() / 2;
    let median = if timed.len() % 2 == 0 {
        (timed[middle - 1] + timed[middle]) as f64 / 2.0
    } else {
        timed[middle] as f64
    };
    if median > 0.0 {
        1e9 / median
    } else {
        0.0
    }
}

/// How the modes' loss curves compare.
#[derive(Debug, Clone, PartialEq)]
pub enum Agreement {
    /// Fewer than two modes ran.
    Single,
    /// Every curve has the same f32 bits at every step.
    Identical {
        /// Steps compared.
        steps: usize,
    },
    /// Some curve differs from the first mode's.
    Differs {
        /// The mode compared against.
        reference: String,
        /// The mode that differs.
        mode: String,
        /// First differing step (0-based), or the shorter length.
        step: usize,
        /// The two values there, if both curves reach it.
        values: Option<(f32, f32)>,
    },
}

impl Report {
    /// Compares the loss curves of every mode with the first mode's, bit for bit.
    pub fn agreement(&self) -> Agreement {
        let Some((first, rest)) = self.modes.split_first() else {
            return Agreement::Single;
        };
        if rest.is_empty() {
            return Agreement::Single;
        }
        let reference = &first.series.loss;
        for other in rest {
            let curve = &other.series.loss;
            let mismatch = reference
                .iter()
                .zip(curve)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            let step = match mismatch {
                Some(step) => step,
                None if curve.len() != reference.len() => reference.len().min(curve.len()),
                None => continue,
            };
            return Agreement::Differs {
                reference: first.mode.clone(),
                mode: other.mode.clone(),
                step,
                values: reference.get(step).copied().zip(curve.get(step).copied()),
            };
        }
        Agreement::Identical {
            steps: reference.len(),
        }
    }

    /// The report as JSON text, ending in a newline.
    pub fn to_json(&self) -> Result<String, String> {
        let mut text = serde_json::to_string(self)
            .map_err(|e| format!("cannot encode the report as JSON: {e}"))?;
        text.push('\n');
        Ok(text)
    }

    /// The report as JSON, written to `path`.
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text = self.to_json()?;
        fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Reads a report written by [`Report::write_json`].
    pub fn read_json(path: &Path) -> Result<Report, String> {
        let text =
            fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let report: Report = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not an ndmem report: {e}", path.display()))?;
        report
            .validate()
            .map_err(|e| format!("{} is not a usable ndmem report: {e}", path.display()))?;
        Ok(report)
    }

    /// Refuses a report no run could have written: no modes, a mode listed twice, a mode
    /// that ran no steps or other steps than the first mode, a negative figure where none
    /// can be, a test accuracy above 100%, or a mode whose series do not all hold one
    /// value per step. The message names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.modes.is_empty() {
            return Err("it holds no modes (\"modes\" is empty)".into());
        }
        for (i, m) in self.modes.iter().enumerate() {
            if self.modes[..i].iter().any(|earlier| earlier.mode == m.mode) {
                return Err(format!(
                    "mode {:?} is listed twice (a run trains each mode once)",
                    m.mode
                ));
            }
            let mut figures = vec![
                ("step_seconds", m.step_seconds),
                ("steps_per_sec", m.steps_per_sec),
                ("pool_allocations_per_step", m.pool_allocations_per_step),
                ("os_allocations_per_step", m.os_allocations_per_step),
                ("heap_allocations_per_step", m.heap_allocations_per_step),
                ("test_accuracy", m.test_accuracy),
            ];
            if let Some(d) = &m.device {
                figures.extend([
                    (
                        "device.driver_allocations_per_step",
                        d.driver_allocations_per_step,
                    ),
                    ("device.htod_per_step", d.htod_per_step),
                    ("device.dtoh_per_step", d.dtoh_per_step),
                ]);
            }
            for (name, value) in figures {
                if value.is_nan() || value < 0.0 {
                    return Err(format!(
                        "mode {:?} has {name} {value}, which cannot be negative",
                        m.mode
                    ));
                }
            }
            if m.steps == 0 {
                return Err(format!(
                    "mode {:?} ran no steps (a run trains every mode at least one)",
                    m.mode
                ));
            }
            if let Some(first) = self.modes.first().filter(|f| f.steps != m.steps) {
                return Err(format!(
                    "mode {:?} ran {} step{} but mode {:?} ran {} (a run trains every mode \
                     the same steps)",
                    m.mode,
                    m.steps,
                    plural(m.steps),
                    first.mode,
                    first.steps
                ));
            }
            if m.test_accuracy > 1.0 {
                return Err(format!(
                    "mode {:?} has test_accuracy {} (above 1, i.e. 100%)",
                    m.mode, m.test_accuracy
                ));
            }
        }
        if let Some(g) = &self.graph {
            for (name, value) in [
                ("steps_per_sec", g.steps_per_sec),
                ("launched_steps_per_sec", g.launched_steps_per_sec),
                (
                    "max_relative_loss_difference",
                    g.max_relative_loss_difference,
                ),
                ("htod_per_step", g.htod_per_step),
                ("dtoh_per_step", g.dtoh_per_step),
            ] {
                if value.is_nan() || value < 0.0 {
                    return Err(format!(
                        "the graph run has {name} {value}, which cannot be negative"
                    ));
                }
            }
        }
        for m in &self.modes {
            let s = &m.series;
            let lengths = [
                ("loss", s.loss.len()),
                ("pool_peak_bytes", s.pool_peak_bytes.len()),
                ("pool_live_bytes", s.pool_live_bytes.len()),
                ("pool_allocations", s.pool_allocations.len()),
                ("os_allocations", s.os_allocations.len()),
                ("heap_live_bytes", s.heap_live_bytes.len()),
                ("heap_allocations", s.heap_allocations.len()),
                ("step_nanos", s.step_nanos.len()),
            ];
            for (name, length) in lengths {
                if length != m.steps {
                    return Err(format!(
                        "mode {:?} ran {} step{} but its series {name} holds {length} value{}",
                        m.mode,
                        m.steps,
                        plural(m.steps),
                        plural(length)
                    ));
                }
            }
        }
        Ok(())
    }

    /// The smallest `--max-bytes` that runs every mode of this report, and what sets it:
    /// the highest off-heap used peak or, when the modes ran on a device and its peak is
    /// higher, the highest device peak (the device's limit follows the off-heap one, so
    /// `--max-bytes` caps it too), unless `NDMEM_MAX_DEVICE_BYTES` set the device's limit.
    pub fn limit_needed(&self) -> (usize, LimitBasis) {
        let off_heap = self
            .modes
            .iter()
            .map(|m| m.peak_pool_used_bytes)
            .max()
            .unwrap_or(0);
        let set_by = self.config.device_limit_set_by.as_deref();
        if set_by == Some(ndmem::alloc::ENV_MAX_DEVICE_BYTES) && self.device_peak().is_some() {
            return (off_heap, LimitBasis::OffHeapDeviceSeparate);
        }
        match self.device_peak() {
            Some(device) if device > off_heap => (
                device,
                match set_by {
                    Some("--max-bytes") => LimitBasis::DeviceCappedByMaxBytes,
                    Some(_) => LimitBasis::DeviceFollowsOffHeap,
                    None => LimitBasis::Device,
                },
            ),
            Some(_) => (off_heap, LimitBasis::OffHeapAboveDevice),
            None => (off_heap, LimitBasis::OffHeap),
        }
    }

    /// The highest device peak of any mode or of the `--graph` run, or `None` when nothing
    /// ran on a device.
    pub fn device_peak(&self) -> Option<usize> {
        self.modes
            .iter()
            .filter_map(|m| m.device.as_ref().map(|d| d.peak_bytes))
            .chain(self.graph.as_ref().map(|g| g.peak_bytes))
            .max()
    }

    /// The summary table, one row per mode under a two-line header, then what the columns
    /// measure; every line fits 80 columns.
    pub fn table(&self) -> String {
        // (group, name, left-aligned); consecutive columns of one group share its label.
        const COLUMNS: [(&str, &str, bool); 10] = [
            ("", "mode", true),
            ("", "steps/s", false),
            ("allocs/step", "pool", false),
            ("allocs/step", "OS", false),
            ("allocs/step", "heap", false),
            ("off-heap peak", "live", false),
            ("off-heap peak", "used", false),
            ("heap", "peak", false),
            ("final", "loss", false),
            ("test", "acc", false),
        ];
        let rows: Vec<[String; 10]> = self
            .modes
            .iter()
            .map(|m| {
                [
                    m.mode.clone(),
                    format!("{:.0}", m.steps_per_sec),
                    per_step(m, m.pool_allocations_per_step, 2),
                    per_step(m, m.os_allocations_per_step, 2),
                    per_step(m, m.heap_allocations_per_step, 1),
                    size_up(m.peak_pool_bytes),
                    size_up(m.peak_pool_used_bytes),
                    size_up(m.peak_heap_bytes),
                    m.final_loss
                        .map_or_else(|| "-".to_string(), |l| format!("{l:.4}")),
                    format!("{:.1}%", m.test_accuracy * 100.0),
                ]
            })
            .collect();
        let mut widths: Vec<usize> = COLUMNS
            .iter()
            .enumerate()
            .map(|(c, (_, name, _))| {
                rows.iter()
                    .map(|r| r[c].chars().count())
                    .chain([name.len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        // Each group label spans its columns (and the gaps between them); a label wider
        // than its span widens the group's last column.
        let mut groups: Vec<(&str, usize, usize)> = Vec::new(); // (label, first, last)
        for (c, (group, _, _)) in COLUMNS.iter().enumerate() {
            match groups.last_mut() {
                Some((label, _, last)) if label == group && !group.is_empty() => *last = c,
                _ => groups.push((group, c, c)),
            }
        }
        for &(label, first, last) in &groups {
            let span: usize = widths[first..=last].iter().sum::<usize>() + 2 * (last - first);
            if label.len() > span {
                widths[last] += label.len() - span;
            }
        }
        let mut out = String::new();
        let mut top = String::new();
        for &(label, first, last) in &groups {
            let span: usize = widths[first..=last].iter().sum::<usize>() + 2 * (last - first);
            if first > 0 {
                top.push_str("  ");
            }
            top.push_str(&format!("{label:>span$}"));
        }
        out.push_str(top.trim_end());
        out.push('\n');
        let names: [String; 10] = COLUMNS.map(|(_, name, _)| name.to_string());
        for row in std::iter::once(&names).chain(&rows) {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let w = widths[c];
                if c > 0 {
                    line.push_str("  ");
                }
                if COLUMNS[c].2 {
                    line.push_str(&format!("{cell:<w$}"));
                } else {
                    line.push_str(&format!("{cell:>w$}"));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str(TABLE_NOTE);
        if !self.modes.is_empty() {
            let (bytes, basis) = self.limit_needed();
            let sentence = format!(
                "--max-bytes {} or more runs {} ({}).",
                size_up(bytes),
                match (self.modes.len(), self.graph.is_some()) {
                    (1, false) => "this mode".to_string(),
                    (1, true) => "this mode and the --graph run".to_string(),
                    (n, false) => format!("these {n} modes"),
                    (n, true) => format!("these {n} modes and the --graph run"),
                },
                basis.describe()
            );
            out.push_str(&wrap(&sentence, 80));
        }
        out
    }
}

/// What sets the smallest `--max-bytes` that runs a report's modes
/// ([`Report::limit_needed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitBasis {
    /// The highest off-heap used peak; the modes ran on the host.
    OffHeap,
    /// The highest off-heap used peak, at least the highest device peak.
    OffHeapAboveDevice,
    /// The highest device peak, in a report that does not say what set the device's limit
    /// (written before that was recorded): nothing is claimed about it.
    Device,
    /// The highest device peak: `--max-bytes` capped the device's limit (min(max_bytes,
    /// 90% of the device), `NDMEM_MAX_DEVICE_BYTES` unset).
    DeviceCappedByMaxBytes,
    /// The highest device peak: the device's limit followed the off-heap limit set by
    /// `NDMEM_MAX_BYTES` or the default, as it would follow `--max-bytes`.
    DeviceFollowsOffHeap,
    /// The highest off-heap used peak: `NDMEM_MAX_DEVICE_BYTES` set the device's limit,
    /// which `--max-bytes` does not change.
    OffHeapDeviceSeparate,
}

impl LimitBasis {
    /// The words in the table's parenthesis.
    pub fn describe(self) -> &'static str {
        match self {
            LimitBasis::OffHeap => "the highest off-heap used peak",
            LimitBasis::OffHeapAboveDevice => {
                "the highest off-heap used peak, which also covers the device peak"
            }
            LimitBasis::Device => "the highest device peak",
            LimitBasis::DeviceCappedByMaxBytes => {
                "the highest device peak; --max-bytes also caps the device"
            }
            LimitBasis::DeviceFollowsOffHeap => {
                "the highest device peak; the device's limit follows the off-heap limit"
            }
            LimitBasis::OffHeapDeviceSeparate => {
                "the highest off-heap used peak; NDMEM_MAX_DEVICE_BYTES sets the device's limit"
            }
        }
    }
}

/// `text` broken at spaces into lines of at most `width` columns (a longer word stands
/// alone), each ending in a newline.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// A mean over the steps after the first, with `decimals`, or "-" for a mode that ran
/// one step (no step comes after it).
fn per_step(m: &ModeReport, mean: f64, decimals: usize) -> String {
    if m.steps <= 1 {
        "-".into()
    } else {
        format!("{mean:.decimals$}")
    }
}

/// What the table's columns measure (lines of at most 80 columns).
const TABLE_NOTE: &str = "\
steps/s: 1 / median step time. allocs/step: means over the steps after the
first (pool blocks, OS requests, heap allocations of every thread, the batch
producer's included; - after a single step). off-heap peak: pool bytes over
the whole mode; live: held by tensors and workspaces; used: live + cached,
the figure --max-bytes limits. heap peak: bytes live through Tracking<System>
above the mode's start. Sizes rounded up, written as --max-bytes takes them.
";

impl DeviceReport {
    /// The device's `kind:ordinal`, the first word of its description.
    pub fn name(&self) -> &str {
        self.device.split(' ').next().unwrap_or_default()
    }
}

/// The two lines `train` prints after a mode that ran on a device.
pub fn mode_device_lines(mode: &str, d: &DeviceReport) -> [String; 2] {
    [
        format!(
            "  {mode} on {}: device peak {}, driver allocations {} ({} in step 1, {:.2}/step after)",
            d.name(),
            ndmem::alloc::ByteSize(d.peak_bytes),
            d.driver_allocations,
            d.first_step_driver_allocations,
            d.driver_allocations_per_step,
        ),
        format!(
            "    transfers/step: {:.2} in, {:.2} out (parameters and evaluation included)",
            d.htod_per_step, d.dtoh_per_step,
        ),
    ]
}

/// The two lines `train` prints after the graph run on `device` (`kind:ordinal`).
pub fn graph_lines(device: &str, g: &GraphReport) -> [String; 2] {
    [
        format!(
            "  graph on {device}: device peak {}, {} steps, {} graph(s) of {} device operations; losses match {} mode (largest relative difference {:.1e})",
            ndmem::alloc::ByteSize(g.peak_bytes),
            g.steps,
            g.graphs,
            g.ops_per_step,
            g.compared_with,
            g.max_relative_loss_difference,
        ),
        format!(
            "    {:.0} steps/s replayed vs {:.0} launched ({:.2}x); driver allocations after step 1: {}; transfers/step: {:.2} in, {:.2} out",
            g.steps_per_sec,
            g.launched_steps_per_sec,
            g.steps_per_sec / g.launched_steps_per_sec.max(f64::MIN_POSITIVE),
            g.driver_allocations_after_first,
            g.htod_per_step,
            g.dtoh_per_step,
        ),
    ]
}

impl Report {
    /// The device lines `train` printed for this report's run: each device mode's, then the
    /// graph run's (on the modes' device); none for a host run.
    pub fn device_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .modes
            .iter()
            .filter_map(|m| m.device.as_ref().map(|d| mode_device_lines(&m.mode, d)))
            .flatten()
            .collect();
        if let Some(g) = &self.graph {
            let device = self
                .modes
                .iter()
                .find_map(|m| m.device.as_ref())
                .map_or("the device", DeviceReport::name);
            lines.extend(graph_lines(device, g));
        }
        lines
    }
}

/// `"s"` unless `n` is 1.
pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `bytes` rounded up to three significant digits, in the form `--max-bytes` takes
/// (`512B`, `36.6K`, `1.05M`): the size it names is never below `bytes`.
pub fn size_up(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let bytes = bytes as u128;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u128 << (10 * (unit + 2)) {
        unit += 1;
    }
    let scale = 1u128 << (10 * (unit + 1));
    // Decimals for three significant digits, chosen on the rounded-up value.
    let rounded = |decimals: u32| (bytes * 10u128.pow(decimals)).div_ceil(scale);
    let decimals = [2u32, 1]
        .into_iter()
        .find(|d| rounded(*d) < 1000)
        .unwrap_or(0);
    let (units, ten) = (rounded(decimals), 10u128.pow(decimals));
    if decimals == 0 {
        format!("{units}{}", UNITS[unit])
    } else {
        format!(
            "{}.{:0w$}{}",
            units / ten,
            units % ten,
            UNITS[unit],
            w = decimals as usize
        )
    }
}

impl Agreement {
    /// The verdict line printed after the table.
    pub fn verdict(&self) -> String {
        match self {
            Agreement::Single => "loss curves: one mode ran, nothing to compare".to_string(),
            Agreement::Identical { steps } => format!(
                "loss curves identical across modes: yes ({steps} step{}, compared as f32 bits)",
                plural(*steps)
            ),
            Agreement::Differs {
                reference,
                mode,
                step,
                ..
            } => format!(
                "loss curves identical across modes: NO ({mode} departs from {reference} at step {})",
                step + 1
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(name: &str, loss: &[f32]) -> ModeReport {
        ModeReport {
            mode: name.into(),
            steps: loss.len(),
            step_seconds: 0.5,
            steps_per_sec: 2.0 * loss.len() as f64,
            first_step_pool_allocations: 9,
            pool_allocations_per_step: 0.0,
            os_allocations_per_step: 0.0,
            heap_allocations_per_step: 3.0,
            peak_pool_bytes: 4096,
            peak_pool_used_bytes: 8192,
            peak_heap_bytes: 1 << 20,
            final_loss: loss.last().copied(),
            test_accuracy: 0.9,
            series: Series {
                loss: loss.to_vec(),
                pool_peak_bytes: vec![4096; loss.len()],
                pool_live_bytes: vec![0; loss.len()],
                pool_allocations: vec![9; loss.len()],
                os_allocations: vec![0; loss.len()],
                heap_live_bytes: vec![512; loss.len()],
                heap_allocations: vec![3; loss.len()],
                step_nanos: vec![1000; loss.len()],
            },
            device: None,
        }
    }

    fn report(modes: Vec<ModeReport>) -> Report {
        Report {
            ndmem_version: "0".into(),
            config: RunConfig {
                dataset: "iris".into(),
                train_rows: 120,
                test_rows: 30,
                features: 4,
                classes: 3,
                hidden: 8,
                epochs: 1,
                max_steps: None,
                batch: 16,
                lr: 0.1,
                seed: 1,
                max_bytes: None,
                prefetch: Some(2),
                device_limit_set_by: None,
            },
            modes,
            graph: None,
        }
    }

    #[test]
    fn agreement_compares_bits_and_names_the_first_difference() {
        let a = [1.0f32, 0.5, 0.25];
        let r = report(vec![mode("pool", &a), mode("scopes", &a)]);
        assert_eq!(r.agreement(), Agreement::Identical { steps: 3 });
        let r = report(vec![
            mode("pool", &a),
            mode("scopes", &[1.0, 0.5, 0.250001]),
        ]);
        assert!(
            matches!(r.agreement(), Agreement::Differs { step: 2, ref mode, .. } if mode == "scopes")
        );
        // 0.0 and -0.0 compare equal as floats but not as bits.
        let r = report(vec![mode("pool", &[0.0]), mode("scopes", &[-0.0])]);
        assert!(matches!(r.agreement(), Agreement::Differs { step: 0, .. }));
        let r = report(vec![mode("pool", &a), mode("scopes", &a[..2])]);
        assert!(matches!(
            r.agreement(),
            Agreement::Differs {
                step: 2,
                values: None,
                ..
            }
        ));
        assert_eq!(
            report(vec![mode("pool", &a)]).agreement(),
            Agreement::Single
        );
    }

    #[test]
    fn sizes_round_up_to_what_max_bytes_takes() {
        for bytes in [
            0,
            1,
            1023,
            1024,
            1025,
            37_440,
            37_478,
            99_999,
            1 << 20,
            (10 << 20) + 1,
            usize::MAX / 4,
        ] {
            let text = size_up(bytes);
            let parsed = ndmem::alloc::parse_size(&text).unwrap();
            assert!(
                parsed >= bytes && text.len() <= 6,
                "{bytes}: {text} = {parsed}"
            );
            if bytes >= 1024 {
                // Three significant digits: within 1% above.
                assert!((parsed as f64) < bytes as f64 * 1.01, "{bytes}: {text}");
            }
        }
        assert_eq!(size_up(37_440), "36.6K");
        assert_eq!(size_up(512), "512B");
        assert_eq!(size_up(1 << 20), "1.00M");
    }

    #[test]
    fn validation_names_what_is_wrong() {
        assert!(report(vec![]).validate().unwrap_err().contains("no modes"));
        // Every mode of a run trains the same steps, at least one.
        let error = report(vec![mode("pool", &[1.0, 0.5]), mode("scopes", &[1.0])])
            .validate()
            .unwrap_err();
        assert!(
            error.contains("\"scopes\" ran 1 step but mode \"pool\" ran 2"),
            "{error}"
        );
        let error = report(vec![mode("pool", &[])]).validate().unwrap_err();
        assert!(error.contains("\"pool\" ran no steps"), "{error}");
        let mut m = mode("pool", &[1.0, 0.5]);
        m.series.heap_live_bytes.pop();
        let error = report(vec![m]).validate().unwrap_err();
        assert!(
            error.contains("\"pool\" ran 2 steps")
                && error.contains("heap_live_bytes holds 1 value"),
            "{error}"
        );
        assert!(report(vec![mode("pool", &[1.0])]).validate().is_ok());
    }

    #[test]
    fn validation_refuses_a_mode_twice_and_negative_figures() {
        let a = [1.0f32, 0.5];
        let error = report(vec![mode("pool", &a), mode("pool", &a)])
            .validate()
            .unwrap_err();
        assert!(error.contains("mode \"pool\" is listed twice"), "{error}");
        let mut m = mode("pool", &a);
        m.steps_per_sec = -3.0;
        let error = report(vec![m]).validate().unwrap_err();
        assert!(
            error.contains("steps_per_sec -3") && error.contains("cannot be negative"),
            "{error}"
        );
        let mut m = mode("scopes", &a);
        m.test_accuracy = 1.5;
        assert!(report(vec![m])
            .validate()
            .unwrap_err()
            .contains("test_accuracy"));
    }

    #[test]
    fn json_round_trips_loss_bits() {
        let loss = [1.0986123f32, 0.1 + 0.2, f32::MIN_POSITIVE, 3.4e38];
        let r = report(vec![mode("pool", &loss)]);
        let dir = std::env::temp_dir().join(format!("ndmem-report-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        r.write_json(&path).unwrap();
        let back = Report::read_json(&path).unwrap();
        let bits = |l: &[f32]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.modes[0].series.loss), bits(&loss));
        assert_eq!(
            back.modes[0].final_loss.map(f32::to_bits),
            Some(3.4e38f32.to_bits())
        );
        // A mode that ran no step has no final loss: `null`, shown as "-"; no run writes
        // one, so reading it back is refused.
        let r = report(vec![mode("pool", &[])]);
        r.write_json(&path).unwrap();
        assert!(fs::read_to_string(&path)
            .unwrap()
            .contains("\"final_loss\":null"));
        assert!(r.table().lines().nth(2).unwrap().contains(" - "));
        assert!(Report::read_json(&path)
            .unwrap_err()
            .contains("ran no steps"));
        fs::write(&path, "{}").unwrap();
        assert!(Report::read_json(&path)
            .unwrap_err()
            .contains("not an ndmem report"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_suggested_limit_covers_the_device_peak_too() {
        let on_device = |peak_bytes: usize| {
            let mut m = mode("pool", &[1.0]);
            m.device = Some(DeviceReport {
                device: "sim:0 simulated device".into(),
                peak_bytes,
                driver_allocations: 1,
                first_step_driver_allocations: 1,
                driver_allocations_per_step: 0.0,
                htod_per_step: 2.0,
                dtoh_per_step: 1.0,
                htod_bytes: 64,
                dtoh_bytes: 4,
            });
            m
        };
        // On the host: the off-heap used peak (8 KiB).
        let host = report(vec![mode("pool", &[1.0]), mode("scopes", &[1.0])]);
        assert_eq!(host.limit_needed(), (8192, LimitBasis::OffHeap));
        // A device peak above it sets the limit, and the table says so.
        let mut r = report(vec![on_device(17_920), on_device(12_000)]);
        assert_eq!(r.limit_needed(), (17_920, LimitBasis::Device));
        assert!(
            !r.table().contains("caps the device"),
            "an old report: no claim"
        );
        r.config.device_limit_set_by = Some("NDMEM_MAX_BYTES".into());
        assert_eq!(r.limit_needed(), (17_920, LimitBasis::DeviceFollowsOffHeap));
        // NDMEM_MAX_DEVICE_BYTES set the device's limit: --max-bytes does not change it,
        // so the device peak sets no --max-bytes and nothing says --max-bytes caps it.
        r.config.device_limit_set_by = Some("NDMEM_MAX_DEVICE_BYTES".into());
        assert_eq!(r.limit_needed(), (8192, LimitBasis::OffHeapDeviceSeparate));
        let table = r.table();
        assert!(!table.contains("caps the device"), "{table}");
        assert!(
            table.contains("NDMEM_MAX_DEVICE_BYTES sets the device's limit"),
            "{table}"
        );
        assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
        r.config.device_limit_set_by = Some("--max-bytes".into());
        assert_eq!(
            r.limit_needed(),
            (17_920, LimitBasis::DeviceCappedByMaxBytes)
        );
        let table = r.table();
        let tail = table
            .split("--max-bytes 17.5K or more runs these 2 modes")
            .nth(1);
        assert!(
            tail.is_some_and(|t| t.split_whitespace().collect::<Vec<_>>().join(" ")
                == "(the highest device peak; --max-bytes also caps the device)."),
            "{table}"
        );
        assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
        // A device peak below the off-heap one leaves the off-heap figure.
        let r = report(vec![on_device(4096)]);
        assert_eq!(r.limit_needed(), (8192, LimitBasis::OffHeapAboveDevice));
        assert!(r
            .table()
            .contains("--max-bytes 8.00K or more runs this mode (the highest off-heap used peak,"));
    }

    #[test]
    fn table_has_a_row_per_mode_and_aligned_columns() {
        let r = report(vec![mode("pool", &[1.0]), mode("workspaces", &[1.0])]);
        let table = r.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("allocs/step") && lines[0].contains("off-heap peak"));
        assert!(lines[1].starts_with("mode ") && lines[1].ends_with("acc"));
        assert!(lines[2].starts_with("pool ") && lines[3].starts_with("workspaces"));
        assert!(lines[3].contains("90.0%") && lines[3].contains(" 8.00K "));
        assert!(lines[4].starts_with("steps/s: 1 / median step time"));
        assert!(lines
            .last()
            .unwrap()
            .starts_with("--max-bytes 8.00K or more runs"));
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{table}");
        // Every cell ends where its header ends.
        let ends = |line: &str| -> Vec<usize> {
            line.match_indices(|c: char| c != ' ')
                .filter(|(i, _)| line[i + 1..].starts_with(' ') || i + 1 == line.len())
                .map(|(i, _)| i)
                .collect()
        };
        assert_eq!(ends(lines[1])[1..], ends(lines[3])[1..], "{table}");
        // One step: no step after the first to take a mean over.
        let cells =
            |line: &str| -> Vec<String> { line.split_whitespace().map(str::to_string).collect() };
        assert_eq!(cells(lines[2])[2..5], ["-", "-", "-"], "{table}");
        let two = report(vec![mode("pool", &[1.0, 0.5])]).table();
        assert_eq!(
            cells(two.lines().nth(2).unwrap())[2..5],
            ["0.00", "0.00", "3.0"],
            "{two}"
        );
        assert_eq!(mean_after_first(&[7, 1, 3]), 2.0);
        assert_eq!(mean_after_first(&[7]), 0.0);
        // The first step and a preempted one do not move the median.
        assert_eq!(
            steps_per_sec(&[9_000_000, 1000, 1000, 5_000_000, 1000]),
            1e6
        );
        assert_eq!(steps_per_sec(&[500]), 2e6);
        assert_eq!(steps_per_sec(&[7, 1000, 3000]), 5e5);
        assert_eq!(steps_per_sec(&[]), 0.0);
    }
}
