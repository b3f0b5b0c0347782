//! The SVG report: four panels (off-heap bytes per step, heap bytes per step, pool
//! allocations per step, loss), one line per mode, drawn with plotters' SVG backend.
//!
//! Invariant: the picture is a function of a [`Report`] alone, so `ndmem report` renders
//! from the JSON exactly what the run rendered, and it claims only what the data shows:
//! the loss panel's title comes from comparing the series, each legend figure is computed
//! from the line it labels, and when a series longer than [`MAX_POINTS`] is reduced to
//! bucket maxima (the loss: bucket means) the axis says so.

use plotters::prelude::*;

use ndmem::alloc::ByteSize;

use crate::report::{plural, Agreement, ModeReport, Report};

/// Most points drawn per line.
pub const MAX_POINTS: usize = 300;

/// Canvas size in pixels.
const SIZE: (u32, u32) = (1200, 820);

/// Line colour of a mode (colour-blind-safe Okabe-Ito hues).
fn colour(mode: &str) -> RGBColor {
    match mode {
        "pool" => RGBColor(213, 94, 0),
        "workspaces" => RGBColor(0, 114, 178),
        "scopes" => RGBColor(0, 158, 115),
        _ => RGBColor(90, 90, 90),
    }
}

/// Font of the panel titles.
const CAPTION_FONT: (&str, u32) = ("sans-serif", 19);
/// Font of the axis tick labels.
const TICK_FONT: (&str, u32) = ("sans-serif", 14);
/// Font of the axis descriptions and the legends.
const LABEL_FONT: (&str, u32) = ("sans-serif", 15);

/// How a bucket of consecutive steps becomes one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduce {
    /// The bucket's largest value (keeps peaks visible).
    Max,
    /// The bucket's mean (the loss).
    Mean,
}

impl Reduce {
    /// The reduction itself.
    fn apply(self) -> fn(&[f64]) -> f64 {
        match self {
            Reduce::Max => max,
            Reduce::Mean => mean,
        }
    }

    /// The word for it on the axis.
    fn word(self) -> &'static str {
        match self {
            Reduce::Max => "max",
            Reduce::Mean => "mean",
        }
    }
}

/// One panel: a title, a y-axis label, how to read a mode's values, how to reduce a bucket
/// of them to one point, and the mode's legend entry (its name and a figure computed from
/// the values drawn).
struct Panel {
    title: fn(&Report) -> String,
    y_label: &'static str,
    values: fn(&ModeReport) -> Vec<f64>,
    reduce: Reduce,
    legend: fn(&ModeReport, &[f64]) -> String,
}

/// The largest of `values` (`f64::MIN` when empty): bucket reduction that keeps peaks.
fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::MIN, f64::max)
}

/// The mean of `values` (0 when empty): bucket reduction for the loss.
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Byte counts in KiB.
fn kib(values: &[usize]) -> Vec<f64> {
    values.iter().map(|v| *v as f64 / 1024.0).collect()
}

/// "`mode` (highest X)": the top of the line drawn (values in KiB), in bytes.
fn highest(m: &ModeReport, kib: &[f64]) -> String {
    if kib.is_empty() {
        return format!("{} (no step)", m.mode);
    }
    let bytes = (max(kib) * 1024.0).round() as usize;
    format!("{} (highest {})", m.mode, ByteSize(bytes))
}

/// The loss panel's title: what comparing the modes' loss series found.
pub fn loss_title(report: &Report) -> String {
    match report.agreement() {
        Agreement::Single => "Training loss (one mode: nothing compared)".to_string(),
        Agreement::Identical { steps } => format!(
            "Training loss: same f32 bits in all {} modes, {steps} step{}",
            report.modes.len(),
            plural(steps)
        ),
        Agreement::Differs {
            reference,
            mode,
            step,
            ..
        } => format!(
            "Training loss: {mode} differs from {reference} at step {}",
            step + 1
        ),
    }
}

/// The four panels, left to right and top to bottom.
const PANELS: [Panel; 4] = [
    Panel {
        title: |_| "Off-heap (pool) bytes live: peak within each step".into(),
        y_label: "KiB",
        values: |m| kib(&m.series.pool_peak_bytes),
        reduce: Reduce::Max,
        legend: highest,
    },
    Panel {
        title: |_| "Heap bytes live after each step, above the mode's start".into(),
        y_label: "KiB",
        values: |m| kib(&m.series.heap_live_bytes),
        reduce: Reduce::Max,
        legend: highest,
    },
    Panel {
        title: |_| "Pool allocations per step".into(),
        y_label: "blocks handed out",
        values: |m| {
            m.series
                .pool_allocations
                .iter()
                .map(|v| *v as f64)
                .collect()
        },
        reduce: Reduce::Max,
        legend: |m, values| match values {
            [] => format!("{} (no step)", m.mode),
            [first] => format!("{} ({first:.0} in its only step)", m.mode),
            [_, rest @ ..] => format!("{} (mean {:.2} after step 1)", m.mode, mean(rest)),
        },
    },
    Panel {
        title: loss_title,
        y_label: "cross-entropy",
        values: |m| m.series.loss.iter().map(|v| f64::from(*v)).collect(),
        reduce: Reduce::Mean,
        legend: |m, values| match values.last() {
            Some(loss) => format!("{} (final {loss:.4})", m.mode),
            None => format!("{} (no step)", m.mode),
        },
    },
];

/// Steps per point when `steps` values are reduced to at most `limit` points.
pub fn bucket_size(steps: usize, limit: usize) -> usize {
    steps.div_ceil(limit.max(1)).max(1)
}

/// `(step, value)` points of `values`, at most `limit` of them: each point stands for a
/// bucket of consecutive steps, reduced by `reduce`, at the bucket's first step.
pub fn downsample(values: &[f64], limit: usize, reduce: fn(&[f64]) -> f64) -> Vec<(f64, f64)> {
    let bucket = bucket_size(values.len(), limit);
    values
        .chunks(bucket)
        .enumerate()
        .map(|(i, chunk)| ((i * bucket + 1) as f64, reduce(chunk)))
        .collect()
}

/// One mode's line in a panel: the mode (for its colour), its legend entry, its points.
type Line<'a> = (&'a str, String, Vec<(f64, f64)>);

/// Renders `report` as SVG text.
pub fn render(report: &Report) -> Result<String, String> {
    let mut svg = String::new();
    draw(report, &mut svg).map_err(|e| format!("cannot draw the SVG report: {e}"))?;
    Ok(svg)
}

/// Draws the title and the four [`PANELS`] of `report` into `svg`.
fn draw(report: &Report, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let c = &report.config;
    let steps = report.modes.iter().map(|m| m.steps).max().unwrap_or(0);
    let title = format!(
        "ndmem train: {} MLP {}-{}-{}, batch {}, lr {:?}, seed {}: {steps} step{} in {} memory mode{}",
        c.dataset,
        c.features,
        c.hidden,
        c.classes,
        c.batch,
        c.lr,
        c.seed,
        plural(steps),
        report.modes.len(),
        plural(report.modes.len())
    );
    let root = root.titled(&title, ("sans-serif", 23))?;
    // Steps run from 1; a single step gets a unit-wide axis around it.
    let x_range = if steps <= 1 {
        0.5..1.5
    } else {
        1.0..steps as f64
    };
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&PANELS) {
        let mut bucket = 1;
        let lines: Vec<Line> = report
            .modes
            .iter()
            .map(|m| {
                let values = (panel.values)(m);
                bucket = bucket.max(bucket_size(values.len(), MAX_POINTS));
                let points = downsample(&values, MAX_POINTS, panel.reduce.apply());
                (m.mode.as_str(), (panel.legend)(m, &values), points)
            })
            .collect();
        let (mut low, mut high) = lines
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
            .filter(|y| y.is_finite())
            .fold((f64::MAX, f64::MIN), |(l, h), y| (l.min(y), h.max(y)));
        if low > high {
            (low, high) = (0.0, 1.0);
        }
        low = low.min(0.0);
        // Headroom above the lines for the legend.
        let high = if high > low { high * 1.35 } else { low + 1.0 };
        let x_desc = if bucket > 1 {
            format!(
                "step (each point: {} of {bucket} steps)",
                panel.reduce.word()
            )
        } else {
            "step".to_string()
        };
        let mut chart = ChartBuilder::on(area)
            .caption((panel.title)(report), CAPTION_FONT)
            .margin(14)
            .x_label_area_size(46)
            .y_label_area_size(78)
            .build_cartesian_2d(x_range.clone(), low..high)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .x_labels(steps.clamp(2, 10))
            // Only whole steps are labelled: no "1 1 1 2 2" on a short axis.
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-9 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .y_desc(panel.y_label)
            .label_style(TICK_FONT)
            .axis_desc_style(LABEL_FONT)
            .max_light_lines(2)
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;
        // Widest first, so lines that coincide stay visible as a core inside a halo.
        let count = lines.len() as u32;
        for (i, (mode, legend, points)) in lines.into_iter().enumerate() {
            let color = colour(mode);
            let width = 1 + 2 * (count - 1 - i as u32);
            let series = if points.len() == 1 {
                // One point makes no line: a dot, sized like the line would be.
                chart.draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new(*p, 2 + width, color.filled())),
                )?
            } else {
                chart.draw_series(LineSeries::new(points, color.stroke_width(width)))?
            };
            series.label(legend).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
            });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .label_font(LABEL_FONT)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsample_keeps_short_series_and_bucket_peaks() {
        let values: Vec<f64> = (0..10).map(f64::from).collect();
        assert_eq!(downsample(&values, 400, max).len(), 10);
        let mut long = vec![1.0; 1000];
        long[777] = 50.0;
        let points = downsample(&long, 100, max);
        assert_eq!(points.len(), 100);
        assert_eq!(points.iter().filter(|(_, y)| *y == 50.0).count(), 1);
        assert_eq!(points[1].0, 11.0);
        assert!(downsample(&[], 10, mean).is_empty());
        assert_eq!(bucket_size(900, 300), 3);
        assert_eq!(bucket_size(300, 300), 1);
        assert_eq!(bucket_size(0, 300), 1);
    }
}
