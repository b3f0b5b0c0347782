//! `ndmem report` and the chart: the picture claims only what the data shows, each legend
//! labels what is drawn, and a report no run could have written is refused.

use super::*;

/// Re-renders `json` in `dir` to `out.svg`; returns stdout and the SVG.
fn render(dir: &Path, json: &str) -> (String, String) {
    let out = ndmem(dir, &["report", json, "-o", "out.svg"], &[]);
    assert!(out.status.success(), "{json}: {}", text(&out.stderr));
    let svg = std::fs::read_to_string(dir.join("out.svg")).unwrap();
    (text(&out.stdout), svg)
}

/// The text of the loss panel's title.
fn loss_title(svg: &str) -> String {
    svg_texts(svg)
        .into_iter()
        .map(|(_, t)| t)
        .find(|t| t.starts_with("Training loss"))
        .unwrap_or_else(|| panic!("no loss title: {svg}"))
}

#[test]
fn the_loss_title_says_what_comparing_the_series_found() {
    let dir = temp_dir("report-honest");
    short_run(&dir);
    let (stdout, svg) = render(&dir, "ndmem-report.json");
    assert_eq!(
        loss_title(&svg),
        "Training loss: same f32 bits in all 3 modes, 12 steps"
    );
    assert!(
        stdout.contains("identical across modes: yes (12 steps"),
        "{stdout}"
    );

    // Edited so that scopes departs at step 3: the chart and the verdict say so.
    let mut json = read_json(&dir.join("ndmem-report.json"));
    json["modes"][2]["series"]["loss"][2] = Value::from(9.5);
    write_json(&dir.join("edited.json"), &json);
    let (stdout, svg) = render(&dir, "edited.json");
    assert_eq!(
        loss_title(&svg),
        "Training loss: scopes differs from pool at step 3"
    );
    assert!(!svg.contains("same f32 bits"));
    assert!(
        stdout.contains("NO (scopes departs from pool at step 3)"),
        "{stdout}"
    );

    // One mode: nothing was compared, and nothing is claimed.
    let mut json = read_json(&dir.join("ndmem-report.json"));
    json["modes"].as_array_mut().unwrap().truncate(1);
    write_json(&dir.join("single.json"), &json);
    let (stdout, svg) = render(&dir, "single.json");
    assert_eq!(
        loss_title(&svg),
        "Training loss (one mode: nothing compared)"
    );
    assert!(
        stdout.contains("one mode ran, nothing to compare"),
        "{stdout}"
    );
}

#[test]
fn legends_give_the_figures_of_the_lines_and_buckets_are_named() {
    let dir = temp_dir("report-legends");
    short_run(&dir);
    let mut json = read_json(&dir.join("ndmem-report.json"));
    // A within-step heap peak far above every live figure drawn: the legend must give
    // the top of the line (the live figures), not that peak.
    for (i, m) in json["modes"].as_array_mut().unwrap().iter_mut().enumerate() {
        m["peak_heap_bytes"] = Value::from(1u64 << 30);
        m["peak_pool_bytes"] = Value::from(1u64 << 30);
        let live = vec![Value::from(2048 * (i + 1)); 12];
        m["series"]["heap_live_bytes"] = Value::from(live);
    }
    write_json(&dir.join("peaks.json"), &json);
    let (_, svg) = render(&dir, "peaks.json");
    let texts: Vec<String> = svg_texts(&svg).into_iter().map(|(_, t)| t).collect();
    for (i, mode) in MODES.iter().enumerate() {
        let heap = format!("{mode} (highest {}.00 KiB)", 2 * (i + 1));
        assert!(texts.contains(&heap), "{heap}: {texts:?}");
        let pool_peaks = numbers(&json["modes"][i]["series"]["pool_peak_bytes"]);
        let top = pool_peaks.iter().copied().fold(0.0, f64::max) as usize;
        let off_heap = format!("{mode} (highest {})", ndmem::alloc::ByteSize(top));
        assert!(texts.contains(&off_heap), "{off_heap}: {texts:?}");
    }
    assert!(
        !svg.contains("1.00 GiB"),
        "no legend gives a figure not drawn"
    );
    assert!(
        !svg.contains("each point"),
        "12 steps: every step is a point"
    );

    // 900 steps make 300 points of 3 steps each: the axes say how they were reduced.
    let mut json = read_json(&dir.join("ndmem-report.json"));
    for m in json["modes"].as_array_mut().unwrap() {
        m["steps"] = Value::from(900);
        for series in m["series"].as_object_mut().unwrap().values_mut() {
            let values = series.as_array().unwrap().clone();
            *series = Value::from(values.iter().cycle().take(900).cloned().collect::<Vec<_>>());
        }
    }
    write_json(&dir.join("long.json"), &json);
    let (_, svg) = render(&dir, "long.json");
    let texts: Vec<String> = svg_texts(&svg).into_iter().map(|(_, t)| t).collect();
    let count = |s: &str| texts.iter().filter(|t| *t == s).count();
    assert_eq!(count("step (each point: max of 3 steps)"), 3, "{texts:?}");
    assert_eq!(count("step (each point: mean of 3 steps)"), 1, "{texts:?}");
}

#[test]
fn report_refuses_a_json_no_run_could_have_written() {
    let dir = temp_dir("report-invalid");
    short_run(&dir);
    let json = read_json(&dir.join("ndmem-report.json"));

    let mut empty = json.clone();
    empty["modes"] = Value::from(Vec::<Value>::new());
    write_json(&dir.join("empty.json"), &empty);
    let mut uneven = json.clone();
    uneven["modes"][1]["series"]["pool_live_bytes"]
        .as_array_mut()
        .unwrap()
        .pop();
    write_json(&dir.join("uneven.json"), &uneven);

    let mut twice = json.clone();
    twice["modes"][1] = json["modes"][0].clone();
    write_json(&dir.join("twice.json"), &twice);
    let mut negative = json.clone();
    negative["modes"][2]["steps_per_sec"] = Value::from(-5.0);
    write_json(&dir.join("negative.json"), &negative);

    for (file, needle) in [
        ("empty.json", "it holds no modes"),
        ("twice.json", "mode \"pool\" is listed twice"),
        (
            "negative.json",
            "mode \"scopes\" has steps_per_sec -5, which cannot be negative",
        ),
        (
            "uneven.json",
            "mode \"workspaces\" ran 12 steps but its series pool_live_bytes holds 11 values",
        ),
    ] {
        let out = ndmem(&dir, &["report", file, "-o", "x.svg"], &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.starts_with(&format!("ndmem: {file} is not a usable ndmem report: "))
                && stderr.contains(needle),
            "{file}: {stderr}"
        );
        assert!(!dir.join("x.svg").exists() && out.stdout.is_empty());
    }
}

/// The size the line under the table suggests for `--max-bytes` (the line may wrap).
fn suggested_max_bytes(stdout: &str) -> String {
    let words: Vec<&str> = stdout.split_whitespace().collect();
    words
        .windows(4)
        .find(|w| w[0] == "--max-bytes" && w[2..] == ["or", "more"])
        .map(|w| w[1].to_string())
        .unwrap_or_else(|| panic!("no --max-bytes suggestion: {stdout}"))
}

/// Runs `args` in `dir`, then again with the `--max-bytes` the table suggests (into
/// `limited/`), asserting both succeed; returns the first run's stdout and the suggestion.
fn run_then_rerun_at_the_suggestion(dir: &Path, args: &[&str]) -> (String, String) {
    let out = ndmem(dir, args, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let size = suggested_max_bytes(&stdout);
    let mut limited = args.to_vec();
    limited.extend(["--max-bytes", &size, "--out-dir", "limited"]);
    let out = ndmem(dir, &limited, &[]);
    assert!(
        out.status.success(),
        "--max-bytes {size}: {}",
        text(&out.stderr)
    );
    (stdout, size)
}

#[test]
fn on_a_device_the_suggested_max_bytes_runs_every_mode() {
    // --max-bytes also caps the device's limit, and the device peak is above the off-heap
    // used peak: the suggestion must cover it (every mode runs with it, on the device
    // too), and say so.
    let dir = temp_dir("report-device-limit");
    let (stdout, size) =
        run_then_rerun_at_the_suggestion(&dir, &["--device", "sim", "--steps", "20"]);

    // The line says what sets it, and `report` gives the same line from the JSON.
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("(the highest device peak; the device's limit follows the off-heap limit)."),
        "{stdout}"
    );
    let again = ndmem(&dir, &["report", "ndmem-report.json", "-o", "r.svg"], &[]);
    assert_eq!(suggested_max_bytes(&text(&again.stdout)), size);
    // The rerun's --max-bytes capped the device: its report says so.
    let limited = ndmem(
        &dir,
        &["report", "limited/ndmem-report.json", "-o", "l.svg"],
        &[],
    );
    let flat = text(&limited.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        flat.contains("(the highest device peak; --max-bytes also caps the device)."),
        "{flat}"
    );
}

#[test]
fn with_graph_the_suggested_max_bytes_runs_the_graph_run_too() {
    // The graph run's memory is captured whole and can peak above every mode's.
    let dir = temp_dir("report-graph-limit");
    let (stdout, _) =
        run_then_rerun_at_the_suggestion(&dir, &["--device", "sim", "--graph", "--steps", "10"]);
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("modes and the --graph run"), "{stdout}");
}

#[test]
fn report_prints_the_device_and_graph_lines_train_prints() {
    let dir = temp_dir("report-device-lines");
    let out = ndmem(&dir, &["--device", "sim", "--graph", "--steps", "6"], &[]);
    let train = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let device_lines = |stdout: &str| -> Vec<String> {
        stdout
            .lines()
            .filter(|l| {
                l.contains(" on sim:")
                    || l.starts_with("    transfers/step")
                    || l.contains("replayed vs")
            })
            .map(str::to_string)
            .collect()
    };
    let from_train = device_lines(&train);
    // Three modes of two lines each, and the graph run's two.
    assert_eq!(from_train.len(), 8, "{train}");
    let out = ndmem(&dir, &["report", "ndmem-report.json", "-o", "r.svg"], &[]);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(device_lines(&report), from_train, "{report}");
    // A host run has none.
    let host = temp_dir("report-host-lines");
    short_run(&host);
    let out = ndmem(&host, &["report", "ndmem-report.json", "-o", "r.svg"], &[]);
    assert!(device_lines(&text(&out.stdout)).is_empty());
}

#[test]
fn report_prints_the_comparisons_train_prints() {
    let dir = temp_dir("report-comparisons");
    let train = short_run(&dir);
    let out = ndmem(&dir, &["report", "ndmem-report.json", "-o", "r.svg"], &[]);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // From the table's last line to the comparisons, both commands print the same lines.
    let tail = |stdout: &str| -> Vec<String> {
        let lines: Vec<&str> = stdout.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.starts_with("--max-bytes"))
            .unwrap();
        let end = lines
            .iter()
            .position(|l| l.starts_with("scopes vs pool:"))
            .unwrap();
        lines[start..=end].iter().map(|l| l.to_string()).collect()
    };
    let (from_train, from_report) = (tail(&train), tail(&report));
    assert_eq!(from_report, from_train, "{report}");
    assert!(from_report.iter().any(|l| l.is_empty()), "{report}");
    for mode in ["workspaces", "scopes"] {
        let prefix = format!("{mode} vs pool: ");
        assert!(
            from_report.iter().any(|l| l.starts_with(&prefix)),
            "{prefix}: {report}"
        );
    }
    // A blank line comes before the verdict.
    let lines: Vec<&str> = report.lines().collect();
    let verdict = lines
        .iter()
        .position(|l| l.starts_with("loss curves identical"))
        .unwrap();
    assert_eq!(lines[verdict - 1], "", "{report}");
}

#[test]
fn a_timeline_is_drawn_beside_itself_not_over_the_training_chart() {
    let dir = temp_dir("report-timeline");
    let out = ndmem(
        &dir,
        &["--steps", "3", "--hidden", "8"],
        &[("NDMEM_TRACE", "trace.json")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let chart = std::fs::read(dir.join("ndmem-report.svg")).unwrap();
    assert!(dir.join("trace.json").is_file());

    let out = ndmem(&dir, &["report", "trace.json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("wrote trace.svg"));
    assert!(dir.join("trace.svg").is_file());
    assert_eq!(
        std::fs::read(dir.join("ndmem-report.svg")).unwrap(),
        chart,
        "the training chart is left alone"
    );
    // A path without an extension gets .svg appended.
    std::fs::copy(dir.join("trace.json"), dir.join("timeline")).unwrap();
    let out = ndmem(&dir, &["report", "timeline"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("timeline.svg").is_file());
    // The report's default is unchanged: ndmem-report.json -> ndmem-report.svg.
    std::fs::remove_file(dir.join("ndmem-report.svg")).unwrap();
    let out = ndmem(&dir, &["report"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("ndmem-report.svg").is_file());
    // An input whose default SVG is itself is still refused, and left as it was.
    std::fs::copy(dir.join("trace.json"), dir.join("t.svg")).unwrap();
    let out = ndmem(&dir, &["report", "t.svg"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("names the JSON report being read"));
    assert_eq!(
        std::fs::read(dir.join("t.svg")).unwrap(),
        std::fs::read(dir.join("trace.json")).unwrap()
    );

    // The help says both.
    let help = text(&ndmem(&dir, &["report", "--help"], &[]).stdout);
    for word in [
        "timeline",
        "NDMEM_TRACE",
        "extension replaced by .svg",
        "trace.svg",
    ] {
        assert!(help.contains(word), "{word}: {help}");
    }
}

#[test]
fn a_truncated_timeline_is_called_a_broken_timeline() {
    let dir = temp_dir("report-broken-timeline");
    let out = ndmem(
        &dir,
        &["--steps", "2", "--mode", "pool"],
        &[("NDMEM_TRACE", "trace.json")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let whole = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    std::fs::write(dir.join("cut.json"), &whole[..whole.len() / 2]).unwrap();
    let out = ndmem(&dir, &["report", "cut.json"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("ndmem: cut.json is a broken timeline file")
            && !stderr.contains("report"),
        "{stderr}"
    );
    assert!(!dir.join("cut.svg").exists());
}

#[test]
fn a_timeline_whose_events_are_out_of_order_is_drawn() {
    // The time axis ends at the latest event, not the last one listed: a point past the
    // axis made the plotting library overflow (a panic in a debug build).
    let dir = temp_dir("report-unordered-timeline");
    let out = ndmem(
        &dir,
        &["--steps", "2", "--mode", "pool"],
        &[("NDMEM_TRACE", "trace.json")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let whole = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    // The first event's time, far beyond every other.
    let at = whole.find("\"time_ns\":").expect("an event") + "\"time_ns\":".len();
    let end = at + whole[at..].find(',').unwrap();
    let edited = format!("{}18446744073709551615{}", &whole[..at], &whole[end..]);
    std::fs::write(dir.join("late.json"), edited).unwrap();
    let out = ndmem(&dir, &["report", "late.json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("late.svg").is_file());
}
