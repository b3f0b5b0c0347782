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

    for (file, needle) in [
        ("empty.json", "it holds no modes"),
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
