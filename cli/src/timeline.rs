//! The timeline file written by `NDMEM_TRACE` or `ndmem::trace::dump` (semantics §7):
//! reading it, telling it from a training report by its content, a short text summary,
//! and its SVG: the memory of each budget over time (each pool's bytes held against its
//! limit, each workspace's buffer), with cycle ends and spills marked and refusals
//! flagged, device transfers marked.
//!
//! Invariant: the picture is a function of the file alone, and it draws only what the
//! events say: a budget's line joins the figures its own events carried.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use serde::Deserialize;

use ndmem::alloc::ByteSize;

use crate::chart::MAX_POINTS;

/// The `format` field of a timeline file.
pub const FORMAT: &str = "ndmem-trace";

/// A timeline file.
#[derive(Debug, Clone, Deserialize)]
pub struct Trace {
    /// Always [`FORMAT`].
    pub format: String,
    /// The file's version (1).
    pub version: u32,
    /// Events the ring held at most.
    pub capacity: usize,
    /// Events recorded that the ring no longer held.
    pub dropped: u64,
    /// Interned names; events index them.
    pub names: Vec<Name>,
    /// The events, oldest first.
    pub events: Vec<Event>,
}

/// An interned name.
#[derive(Debug, Clone, Deserialize)]
pub struct Name {
    /// `pool`, `workspace`, `scope` or `device`.
    pub space: String,
    /// The name.
    pub name: String,
}

/// One event of the file.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    /// Position in the recording.
    pub seq: u64,
    /// Nanoseconds since the recording started.
    pub time_ns: u64,
    /// `alloc`, `free`, `spill`, `cycle_end`, `learn`, `reallocate`, `oom`, `transfer`.
    pub kind: String,
    /// Whose name `name` is.
    pub space: String,
    /// Index into the names.
    pub name: usize,
    /// The recorder's id of the thread.
    pub thread: u32,
    /// Bytes of the event.
    pub bytes: u64,
    /// The figure after the event (a pool's held bytes, a workspace's buffer or cycle use).
    pub value: u64,
}

/// Whether `text` is a timeline file (rather than a training report): a JSON object whose
/// `format` is [`FORMAT`].
pub fn is_trace(text: &str) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<String>,
    }
    serde_json::from_str::<Probe>(text).is_ok_and(|p| p.format.as_deref() == Some(FORMAT))
}

/// Whether `text` opens as a timeline file does, `{"format": "ndmem-trace"`, whatever
/// follows: a file cut short (a full disk, a killed process) is still told to be a broken
/// timeline rather than a broken training report.
pub fn opens_as_trace(text: &str) -> bool {
    let rest = text.trim_start();
    let Some(rest) = rest.strip_prefix('{') else {
        return false;
    };
    let Some(rest) = rest.trim_start().strip_prefix("\"format\"") else {
        return false;
    };
    let Some(rest) = rest.trim_start().strip_prefix(':') else {
        return false;
    };
    rest.trim_start()
        .strip_prefix('"')
        .and_then(|r| r.strip_prefix(FORMAT))
        .is_some_and(|r| r.starts_with('"'))
}

impl Trace {
    /// Parses a timeline file's text.
    pub fn parse(text: &str, origin: &Path) -> Result<Trace, String> {
        let trace: Trace = serde_json::from_str(text).map_err(|e| {
            if opens_as_trace(text) {
                format!(
                    "{} is a broken timeline file (cut short or damaged): {e}",
                    origin.display()
                )
            } else {
                format!("{} is not a timeline file: {e}", origin.display())
            }
        })?;
        if trace.format != FORMAT {
            return Err(format!("{} is not a timeline file", origin.display()));
        }
        Ok(trace)
    }

    fn label(&self, e: &Event) -> String {
        let name = self.names.get(e.name).map_or("?", |n| n.name.as_str());
        format!("{} [{name}]", e.space)
    }

    /// A few lines: events by kind, budgets, refusals.
    pub fn summary(&self) -> String {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &self.events {
            *kinds.entry(e.kind.as_str()).or_default() += 1;
        }
        let span = self.events.last().map_or(0, |e| e.time_ns) as f64 / 1e6;
        let mut out = format!(
            "timeline: {} events over {span:.3} ms (ring of {}, {} dropped)\n",
            self.events.len(),
            self.capacity,
            self.dropped
        );
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out.push_str(&format!("  {}\n", kinds.join(", ")));
        for e in self.events.iter().filter(|e| e.kind == "oom") {
            out.push_str(&format!(
                "  OOM at {:.3} ms: {} refused {} ({} held)\n",
                e.time_ns as f64 / 1e6,
                self.label(e),
                ByteSize(e.bytes as usize),
                ByteSize(e.value as usize)
            ));
        }
        out
    }

    /// The budgets' lines: `(label, points (ms, KiB))`. A pool's points are its held bytes
    /// after each of its events; a workspace's, its buffer size at each cycle end.
    fn lines(&self) -> Vec<(String, Vec<(f64, f64)>)> {
        let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for e in &self.events {
            let point = (e.time_ns as f64 / 1e6, e.value as f64 / 1024.0);
            let budget = matches!(
                (e.space.as_str(), e.kind.as_str()),
                ("pool", "alloc" | "free" | "oom")
                    | ("workspace", "cycle_end" | "learn" | "reallocate")
            );
            if budget {
                lines.entry(self.label(e)).or_default().push(point);
            }
        }
        lines
            .into_iter()
            .map(|(label, points)| (label, thin(&points, MAX_POINTS)))
            .collect()
    }

    /// The times (ms) and figures (KiB) of the events of `kind`, at most [`MAX_POINTS`].
    fn marks(&self, kind: &str) -> Vec<(f64, f64)> {
        let points: Vec<(f64, f64)> = self
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| (e.time_ns as f64 / 1e6, e.value as f64 / 1024.0))
            .collect();
        thin(&points, MAX_POINTS)
    }
}

/// Keeps at most `limit` of `points`, evenly spaced, the last one included.
fn thin(points: &[(f64, f64)], limit: usize) -> Vec<(f64, f64)> {
    if points.len() <= limit {
        return points.to_vec();
    }
    let step = points.len().div_ceil(limit);
    let mut out: Vec<(f64, f64)> = points.iter().step_by(step).copied().collect();
    if let Some(last) = points.last() {
        out.push(*last);
    }
    out
}

/// Line colours (Okabe-Ito), by line index.
const COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
];

/// Renders `trace` as SVG text.
pub fn render(trace: &Trace) -> Result<String, String> {
    let mut svg = String::new();
    draw(trace, &mut svg).map_err(|e| format!("cannot draw the timeline: {e}"))?;
    Ok(svg)
}

fn draw(trace: &Trace, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let lines = trace.lines();
    let (cycles, spills, ooms, transfers) = (
        trace.marks("cycle_end"),
        trace.marks("spill"),
        trace.marks("oom"),
        trace.marks("transfer"),
    );
    // The latest event, not the last one: a file whose events are out of order (edited,
    // or joined from two recordings) would put points past the axis, which the plotting
    // library cannot map.
    let end = trace
        .events
        .iter()
        .map(|e| e.time_ns as f64 / 1e6)
        .fold(0.0f64, f64::max);
    let end = if end > 0.0 { end } else { 1.0 };
    let high = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .chain(ooms.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max);
    let high = if high > 0.0 { high * 1.3 } else { 1.0 };
    let title =
        format!(
        "ndmem timeline: {} events ({} dropped), {} budget{}, {} cycle ends, {} spills, {} OOM{}",
        trace.events.len(),
        trace.dropped,
        lines.len(),
        if lines.len() == 1 { "" } else { "s" },
        trace.events.iter().filter(|e| e.kind == "cycle_end").count(),
        trace.events.iter().filter(|e| e.kind == "spill").count(),
        ooms.len(),
        if ooms.len() == 1 { "" } else { "s" },
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 21))
        .margin(16)
        .x_label_area_size(46)
        .y_label_area_size(84)
        .build_cartesian_2d(0.0..end, 0.0..high)?;
    chart
        .configure_mesh()
        .x_desc("time (ms)")
        .y_desc("KiB")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .max_light_lines(2)
        .light_line_style(RGBColor(240, 240, 240))
        .draw()?;
    for (i, (label, points)) in lines.into_iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()];
        let series = if points.len() == 1 {
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?
        } else {
            chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?
        };
        series.label(label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
        });
    }
    let grey = RGBColor(150, 150, 150);
    if !cycles.is_empty() {
        chart
            .draw_series(
                cycles
                    .iter()
                    .map(|(t, _)| PathElement::new(vec![(*t, 0.0), (*t, high * 0.03)], grey)),
            )?
            .label("cycle end")
            .legend(move |(x, y)| PathElement::new(vec![(x + 11, y - 6), (x + 11, y + 6)], grey));
    }
    let orange = RGBColor(230, 159, 0);
    if !spills.is_empty() {
        chart
            .draw_series(
                spills
                    .iter()
                    .map(|(t, _)| Cross::new((*t, high * 0.06), 4, orange)),
            )?
            .label("spill")
            .legend(move |(x, y)| Cross::new((x + 11, y), 4, orange));
    }
    let blue = RGBColor(86, 180, 233);
    if !transfers.is_empty() {
        chart
            .draw_series(
                transfers
                    .iter()
                    .map(|(t, _)| TriangleMarker::new((*t, high * 0.09), 4, blue)),
            )?
            .label("device transfer")
            .legend(move |(x, y)| TriangleMarker::new((x + 11, y), 4, blue));
    }
    if !ooms.is_empty() {
        chart
            .draw_series(ooms.iter().map(|p| {
                EmptyElement::at(*p)
                    + Circle::new((0, 0), 7, RED.stroke_width(3))
                    + Text::new("OOM", (9, -16), ("sans-serif", 15).into_font().color(&RED))
            }))?
            .label("OOM (refused)")
            .legend(|(x, y)| Circle::new((x + 11, y), 5, RED.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> String {
        let mut events = Vec::new();
        let mut t = 0;
        for cycle in 0..5u64 {
            for (kind, space, name, value) in [
                ("alloc", "pool", 0, 4096 * (cycle + 1)),
                ("spill", "workspace", 1, 256),
                ("cycle_end", "workspace", 1, 1024),
                ("free", "pool", 0, 4096 * cycle),
                ("transfer", "device", 2, 0),
            ] {
                t += 1000;
                events.push(format!(
                    r#"{{"seq":{},"time_ns":{t},"kind":"{kind}","space":"{space}","name":{name},"thread":1,"bytes":256,"value":{value}}}"#,
                    events.len()
                ));
            }
        }
        events.push(format!(
            r#"{{"seq":{},"time_ns":{},"kind":"oom","space":"pool","name":0,"thread":1,"bytes":65536,"value":20480}}"#,
            events.len(),
            t + 500
        ));
        format!(
            r#"{{"format":"ndmem-trace","version":1,"capacity":1024,"dropped":0,"names":[{{"space":"pool","name":"global pool"}},{{"space":"workspace","name":"LOOP"}},{{"space":"device","name":"device 0"}}],"events":[{}]}}"#,
            events.join(",")
        )
    }

    #[test]
    fn a_trace_is_told_from_a_report_by_its_content() {
        assert!(is_trace(&sample()));
        assert!(!is_trace(r#"{"ndmem_version":"0.1.0","modes":[]}"#));
        assert!(!is_trace("not json"));
    }

    #[test]
    fn the_svg_is_well_formed_and_marks_cycles_spills_and_ooms() {
        let trace = Trace::parse(&sample(), Path::new("t.json")).unwrap();
        let svg = render(&trace).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        let all = texts.join("|");
        for wanted in [
            "pool [global pool]",
            "workspace [LOOP]",
            "cycle end",
            "spill",
            "OOM",
            "device transfer",
        ] {
            assert!(all.contains(wanted), "{wanted} missing from {all}");
        }
        assert!(all.contains("26 events (0 dropped)"), "{all}");
        let summary = trace.summary();
        assert!(summary.contains("OOM at"), "{summary}");
        assert!(summary.contains("cycle_end 5"), "{summary}");
    }

    #[test]
    fn thinning_keeps_the_bound_and_the_last_point() {
        let points: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64, i as f64)).collect();
        let thinned = thin(&points, 300);
        assert!(thinned.len() <= 301);
        assert_eq!(thinned.last(), Some(&(999.0, 999.0)));
    }
}
