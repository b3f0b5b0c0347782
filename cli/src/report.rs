//! The run's results: what `ndmem-report.json` holds (serde), the summary table printed at
//! the end of a run, and the bit-for-bit comparison of the modes' loss curves.
//!
//! Invariant: every figure is read from the `ndmem-alloc` counters during the run; this
//! module only stores, compares and formats them.

use std::fs;
use std::path::Path;

use ndmem::alloc::ByteSize;
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
    /// Highest pool live bytes during the mode.
    pub peak_pool_bytes: usize,
    /// Highest pool used bytes (live + cached, what counts against the limit).
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

    /// The report as JSON.
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let mut text = serde_json::to_string(self)
            .map_err(|e| format!("cannot encode the report as JSON: {e}"))?;
        text.push('\n');
        fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Reads a report written by [`Report::write_json`].
    pub fn read_json(path: &Path) -> Result<Report, String> {
        let text =
            fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{} is not an ndmem report: {e}", path.display()))
    }

    /// The summary table, one row per mode.
    pub fn table(&self) -> String {
        let header = [
            "mode",
            "steps/s",
            "pool allocs/step",
            "OS allocs/step",
            "heap allocs/step",
            "peak off-heap",
            "heap peak",
            "final loss",
            "test acc",
        ];
        let mut rows = vec![header.map(String::from).to_vec()];
        for m in &self.modes {
            rows.push(vec![
                m.mode.clone(),
                format!("{:.0}", m.steps_per_sec),
                format!("{:.2}", m.pool_allocations_per_step),
                format!("{:.2}", m.os_allocations_per_step),
                format!("{:.1}", m.heap_allocations_per_step),
                ByteSize(m.peak_pool_bytes).to_string(),
                ByteSize(m.peak_heap_bytes).to_string(),
                m.final_loss
                    .map_or_else(|| "-".to_string(), |l| format!("{l:.4}")),
                format!("{:.1}%", m.test_accuracy * 100.0),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c == 0 {
                    line.push_str(&format!("{cell:<w$}", w = widths[c]));
                } else {
                    line.push_str(&format!("  {cell:>w$}", w = widths[c]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str(
            "(steps/s: 1 / median step time; per step: means over the steps after the first; \
             peak off-heap: pool bytes live; heap peak: bytes live through Tracking<System> \
             above the mode's start)\n",
        );
        out
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
                ..Series::default()
            },
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
            },
            modes,
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
        // A mode that ran no step has no final loss: `null`, read back as such.
        let r = report(vec![mode("pool", &[])]);
        r.write_json(&path).unwrap();
        assert!(fs::read_to_string(&path)
            .unwrap()
            .contains("\"final_loss\":null"));
        let back = Report::read_json(&path).unwrap();
        assert_eq!(back.modes[0].final_loss, None);
        assert!(back.table().lines().nth(1).unwrap().contains(" - "));
        fs::write(&path, "{}").unwrap();
        assert!(Report::read_json(&path)
            .unwrap_err()
            .contains("not an ndmem report"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn table_has_a_row_per_mode_and_aligned_columns() {
        let r = report(vec![mode("pool", &[1.0]), mode("workspaces", &[1.0])]);
        let table = r.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[3].starts_with("(steps/s"));
        assert!(lines[1].starts_with("pool ") && lines[2].starts_with("workspaces"));
        assert!(lines[0].contains("pool allocs/step") && lines[2].contains("90.0%"));
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
