//! The SVG report: four panels (off-heap bytes per step, heap bytes per step, pool
//! allocations per step, loss), one line per mode, drawn with plotters' SVG backend.
//!
//! Invariant: the picture is a function of a [`Report`] alone, so `ndmem report` renders
//! from the JSON exactly what the run rendered. Series longer than [`MAX_POINTS`] are
//! reduced to bucket maxima (the loss: bucket means), which keeps peaks visible and the
//! file small.

use std::path::Path;

use plotters::prelude::*;

use ndmem::alloc::ByteSize;

use crate::report::{ModeReport, Report};

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

/// One panel: a title, a y-axis label, how to read a mode's values, how to reduce a bucket
/// of them to one point, and the mode's legend entry (its name and the panel's key figure).
struct Panel {
    title: &'static str,
    y_label: &'static str,
    values: fn(&ModeReport) -> Vec<f64>,
    reduce: fn(&[f64]) -> f64,
    legend: fn(&ModeReport) -> String,
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

/// The four panels, left to right and top to bottom.
const PANELS: [Panel; 4] = [
    Panel {
        title: "Off-heap (pool) memory in use: peak within each step",
        y_label: "KiB",
        values: |m| kib(&m.series.pool_peak_bytes),
        reduce: max,
        legend: |m| format!("{} (peak {})", m.mode, ByteSize(m.peak_pool_bytes)),
    },
    Panel {
        title: "Heap bytes live after each step, above the mode's start",
        y_label: "KiB",
        values: |m| kib(&m.series.heap_live_bytes),
        reduce: max,
        legend: |m| format!("{} (peak {})", m.mode, ByteSize(m.peak_heap_bytes)),
    },
    Panel {
        title: "Pool allocations per step",
        y_label: "blocks handed out",
        values: |m| {
            m.series
                .pool_allocations
                .iter()
                .map(|v| *v as f64)
                .collect()
        },
        reduce: max,
        legend: |m| {
            format!(
                "{} ({:.2} per step after step 1)",
                m.mode, m.pool_allocations_per_step
            )
        },
    },
    Panel {
        title: "Training loss: identical bits in every mode, the lines coincide",
        y_label: "cross-entropy",
        values: |m| m.series.loss.iter().map(|v| f64::from(*v)).collect(),
        reduce: mean,
        legend: |m| match m.final_loss {
            Some(loss) => format!("{} (final {loss:.4})", m.mode),
            None => format!("{} (no step)", m.mode),
        },
    },
];

/// `(step, value)` points of `values`, at most `limit` of them: each point stands for a
/// bucket of consecutive steps, reduced by `reduce`, at the bucket's first step.
pub fn downsample(values: &[f64], limit: usize, reduce: fn(&[f64]) -> f64) -> Vec<(f64, f64)> {
    let bucket = values.len().div_ceil(limit.max(1)).max(1);
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

/// Renders `report` into the file `path`.
pub fn write(report: &Report, path: &Path) -> Result<(), String> {
    let svg = render(report)?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Draws the title and the four [`PANELS`] of `report` into `svg`.
fn draw(report: &Report, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let c = &report.config;
    let title = format!(
        "ndmem train: {} MLP {}-{}-{}, batch {}, lr {:?}, seed {}: the same run in {} memory mode{}",
        c.dataset,
        c.features,
        c.hidden,
        c.classes,
        c.batch,
        c.lr,
        c.seed,
        report.modes.len(),
        if report.modes.len() == 1 { "" } else { "s" }
    );
    let root = root.titled(&title, ("sans-serif", 23))?;
    let steps = report
        .modes
        .iter()
        .map(|m| m.steps)
        .max()
        .unwrap_or(0)
        .max(2);
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&PANELS) {
        let lines: Vec<Line> = report
            .modes
            .iter()
            .map(|m| {
                let points = downsample(&(panel.values)(m), MAX_POINTS, panel.reduce);
                (m.mode.as_str(), (panel.legend)(m), points)
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
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, CAPTION_FONT)
            .margin(14)
            .x_label_area_size(46)
            .y_label_area_size(78)
            .build_cartesian_2d(1f64..steps as f64, low..high)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
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
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(width)))?
                .label(legend)
                .legend(move |(x, y)| {
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
    }
}
