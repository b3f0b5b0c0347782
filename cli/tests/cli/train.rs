//! `ndmem train`: every mode, identical losses, both reports, the table, limits that
//! hold and grow monotonically, and runs of a single step.

use super::*;

#[test]
fn train_runs_every_mode_with_identical_losses_and_writes_both_reports() {
    let dir = temp_dir("train");
    let out = ndmem(
        &dir,
        &[
            "train",
            "--steps",
            "12",
            "--hidden",
            "8",
            "--max-bytes",
            "4M",
            "--out-dir",
            ".",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("loss curves identical across modes: yes (12 steps"),
        "{stdout}"
    );
    // The table: the header, then exactly one row per mode, in run order.
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("mode ") && l.contains("steps/s"))
        .unwrap_or_else(|| panic!("no table header: {stdout}"));
    for (i, mode) in MODES.iter().enumerate() {
        let row = lines.get(header + 1 + i).copied().unwrap_or("");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.first(), Some(mode), "row {i} of the table: {stdout}");
        assert!(row.ends_with('%'), "row {i} of the table: {row}");
    }
    assert!(
        lines[header + 4].starts_with("steps/s: 1 / median"),
        "a fourth row: {stdout}"
    );

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ndmem-report.json")).unwrap())
            .unwrap();
    assert_eq!(json["config"]["max_bytes"], 4 << 20);
    let modes = json["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, MODES);
    let by_mode: BTreeMap<&str, &Value> = names.iter().copied().zip(modes).collect();

    // The same bits in every mode.
    let losses: Vec<Vec<u32>> = modes
        .iter()
        .map(|m| loss_bits(&m["series"]["loss"]))
        .collect();
    assert_eq!(losses[0].len(), 12);
    assert!(losses[0]
        .iter()
        .all(|l| f32::from_bits(*l).is_finite() && f32::from_bits(*l) > 0.0));
    assert_eq!(losses[0], losses[1]);
    assert_eq!(losses[0], losses[2]);
    for mode in modes {
        let last = mode["final_loss"].as_f64().unwrap() as f32;
        assert_eq!(Some(&last.to_bits()), losses[0].last(), "{}", mode["mode"]);
    }

    // Workspaces: the first step spills and learns, then nothing comes from the pool.
    let ws_allocs = numbers(&by_mode["workspaces"]["series"]["pool_allocations"]);
    assert!(ws_allocs[0] > 0.0, "the first cycle spills: {ws_allocs:?}");
    assert!(ws_allocs[1..].iter().all(|a| *a == 0.0), "{ws_allocs:?}");
    assert_eq!(by_mode["workspaces"]["pool_allocations_per_step"], 0.0);
    // Pool mode does allocate per step, so the zero above is a measurement.
    let pool_allocs = numbers(&by_mode["pool"]["series"]["pool_allocations"]);
    assert!(pool_allocs[1..].iter().all(|a| *a > 0.0), "{pool_allocs:?}");

    for mode in modes {
        let used = mode["peak_pool_used_bytes"].as_u64().unwrap();
        let live = mode["peak_pool_bytes"].as_u64().unwrap();
        assert!(live > 0 && live <= used && used <= 4 << 20, "{mode}");
        // Every step's peak stayed under --max-bytes and within the mode's peak.
        let peaks = numbers(&mode["series"]["pool_peak_bytes"]);
        assert!(
            peaks.iter().all(|p| *p > 0.0 && *p <= f64::from(4 << 20)),
            "{peaks:?}"
        );
        // The mode's peak also covers creating the parameters and evaluating.
        assert!(peaks.iter().copied().fold(0.0, f64::max) <= live as f64);
        assert!(mode["peak_heap_bytes"].as_u64().unwrap() > 0);
        let accuracy = mode["test_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&accuracy));
        for series in ["pool_live_bytes", "os_allocations", "heap_live_bytes"] {
            assert_eq!(numbers(&mode["series"][series]).len(), 12, "{series}");
        }
    }

    // The SVG: well-formed, one line per mode in each of the four panels, a legend entry
    // per mode and panel.
    let svg = std::fs::read_to_string(dir.join("ndmem-report.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let mut lines_by_colour: BTreeMap<&str, usize> = BTreeMap::new();
    for node in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
        let points = node
            .attribute("points")
            .unwrap_or("")
            .split_whitespace()
            .count();
        let stroke = node.attribute("stroke").unwrap_or("");
        if points == 12 && stroke != "#000000" {
            *lines_by_colour.entry(stroke).or_default() += 1;
        }
    }
    assert_eq!(
        lines_by_colour.len(),
        3,
        "one colour per mode: {lines_by_colour:?}"
    );
    assert!(
        lines_by_colour.values().all(|n| *n == 4),
        "{lines_by_colour:?}"
    );
    for mode in MODES {
        let prefix = format!("{mode} (");
        let labels: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(str::trim))
            .filter(|t| t.starts_with(&prefix))
            .collect();
        assert_eq!(labels.len(), 4, "legend entries for {mode}: {labels:?}");
    }
    assert!(
        svg.contains("workspaces (mean 0.00 after step 1)"),
        "the allocations legend gives the figure"
    );

    // `ndmem report` renders the same picture from the JSON.
    let again = ndmem(
        &dir,
        &["report", "ndmem-report.json", "-o", "again.svg"],
        &[],
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(std::fs::read_to_string(dir.join("again.svg")).unwrap(), svg);
}

#[test]
fn one_mode_with_explicit_report_paths() {
    let dir = temp_dir("one-mode");
    let out = ndmem(
        &dir,
        &[
            "--mode", "scopes", "--epochs", "1", "--batch", "64", "--json", "r.json", "--svg",
            "r.svg",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("loss curves: one mode ran, nothing to compare"),
        "{stdout}"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    // 120 training rows in batches of 64: two steps, the second one short.
    assert_eq!(json["modes"][0]["steps"], 2);
    assert!(dir.join("r.svg").is_file() && !dir.join("ndmem-report.json").exists());
}

#[test]
fn the_tables_used_peak_is_a_limit_that_runs_the_modes() {
    let dir = temp_dir("table-limit");
    for mode in ["all", "workspaces"] {
        let args = ["--mode", mode, "--steps", "12", "--hidden", "8"];
        let out = ndmem(&dir, &args, &[]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        // The columns say what they measure; the limit's figure is named as such.
        assert!(
            stdout.contains("off-heap peak") && stdout.contains("the figure --max-bytes limits"),
            "{stdout}"
        );
        let names = stdout
            .lines()
            .find(|l| l.starts_with("mode "))
            .unwrap_or_else(|| panic!("no column names: {stdout}"));
        let used = names
            .split_whitespace()
            .position(|c| c == "used")
            .unwrap_or_else(|| panic!("no used column: {names}"));
        // The figure the table offers is the largest `used` cell, and the JSON's peak.
        let cells: Vec<String> = stdout
            .lines()
            .skip_while(|l| !l.starts_with("mode "))
            .skip(1)
            .take_while(|l| !l.starts_with("steps/s: "))
            .map(|l| l.split_whitespace().nth(used).unwrap().to_string())
            .collect();
        assert!(!cells.is_empty(), "{stdout}");
        let offered = stdout
            .lines()
            .find_map(|l| l.strip_prefix("--max-bytes "))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no --max-bytes line: {stdout}"))
            .to_string();
        let size = |s: &str| ndmem::alloc::parse_size(s).unwrap();
        assert_eq!(
            cells.iter().map(|c| size(c)).max(),
            Some(size(&offered)),
            "{stdout}"
        );
        let json = read_json(&dir.join("ndmem-report.json"));
        for m in json["modes"].as_array().unwrap() {
            assert!(m["peak_pool_used_bytes"].as_u64().unwrap() as usize <= size(&offered));
        }
        // A user who takes that figure as the limit succeeds.
        let again: Vec<&str> = args
            .iter()
            .copied()
            .chain(["--max-bytes", &offered])
            .collect();
        let out = ndmem(&dir, &again, &[]);
        assert!(
            out.status.success(),
            "--max-bytes {offered} from the table: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn larger_limits_never_fail_where_smaller_ones_succeed() {
    let dir = temp_dir("sweep");
    let mut outcomes = Vec::new();
    for kib in 8..=48 {
        let limit = format!("{kib}K");
        let out = ndmem(&dir, &["--steps", "12", "--max-bytes", &limit], &[]);
        let stderr = text(&out.stderr);
        assert!(
            out.status.success() || stderr.contains("Can't allocate"),
            "{limit}: {stderr}"
        );
        outcomes.push((kib, out.status.success(), stderr));
    }
    let first = outcomes
        .iter()
        .position(|(_, ok, _)| *ok)
        .expect("some limit up to 48K runs every mode");
    assert!(first > 0, "8K is too small to train: the sweep must cross");
    for (kib, ok, stderr) in &outcomes[first..] {
        assert!(ok, "{}K ran but {kib}K failed: {stderr}", outcomes[first].0);
    }
}

#[test]
fn a_single_step_run_says_what_it_ran() {
    let dir = temp_dir("one-step");
    let out = ndmem(&dir, &["--steps", "1"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("run: 1 step per mode (--steps 1; 100 epochs of 8 steps would be 800)"),
        "{stdout}"
    );
    assert!(stdout.contains("yes (1 step, compared"), "{stdout}");
    assert!(!stdout.contains("1 steps"), "{stdout}");
    assert!(!stdout.contains("after step 1"), "{stdout}");
    assert!(
        stdout.contains("workspaces vs pool: ")
            && stdout.contains("pool allocs in the only step: "),
        "{stdout}"
    );

    let svg = std::fs::read_to_string(dir.join("ndmem-report.svg")).unwrap();
    // One step makes no line: each mode is a dot in each of the four panels.
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let dots = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .count();
    assert_eq!(dots, 12, "{svg}");
    // Tick labels on one axis share a `y`: none repeats (no "1 1 1 1 1 2 2").
    let mut by_row: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (y, t) in svg_texts(&svg) {
        if t.parse::<f64>().is_ok() {
            by_row.entry(y).or_default().push(t);
        }
    }
    for (y, labels) in by_row {
        let mut unique = labels.clone();
        unique.sort();
        unique.dedup();
        // Two panels side by side share a row: each label at most once per panel.
        assert!(labels.len() <= 2 * unique.len(), "row y={y}: {labels:?}");
        for label in &unique {
            assert!(
                labels.iter().filter(|l| *l == label).count() <= 2,
                "row y={y}: {labels:?}"
            );
        }
    }
    assert!(
        !svg.contains(">2<") && svg.contains("1 step in 3 memory modes"),
        "no step 2 on the axes, and the title says one step"
    );
}

#[test]
fn the_header_names_the_workspace_debug_mode() {
    let dir = temp_dir("debug-mode");
    for mode in ["bypass", "spill_everything"] {
        let out = ndmem(
            &dir,
            &["--steps", "2", "--mode", "workspaces"],
            &[("NDMEM_WORKSPACES", mode)],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{mode}: {}", text(&out.stderr));
        let header: Vec<&str> = stdout.lines().take_while(|l| !l.is_empty()).collect();
        assert!(
            header
                .iter()
                .any(|l| l.starts_with(&format!("NDMEM_WORKSPACES={mode}: "))),
            "{mode}: {stdout}"
        );
    }
    let out = ndmem(&dir, &["--steps", "2", "--mode", "workspaces"], &[]);
    assert!(!text(&out.stdout).contains("NDMEM_WORKSPACES"));
}

#[test]
fn under_bypass_the_header_claims_no_workspace() {
    // NDMEM_WORKSPACES=bypass: workspaces are off for tensors, which are pool blocks
    // (semantics §2), the prefetching ring's batches and workspaces mode's steps too.
    let dir = temp_dir("bypass-header");
    let out = ndmem(&dir, &["--steps", "2"], &[("NDMEM_WORKSPACES", "bypass")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let header: Vec<&str> = stdout.lines().take_while(|l| !l.is_empty()).collect();
    for claim in ["ring workspace", "FirstLoop", "parent one"] {
        assert!(
            header.iter().all(|l| !l.contains(claim)),
            "{claim}: {stdout}"
        );
    }
    assert!(
        header
            .iter()
            .any(|l| l.starts_with("batches: 2 ahead, by a thread, as pool blocks")),
        "{stdout}"
    );
    assert!(header.iter().all(|l| l.chars().count() <= 80), "{stdout}");
    // Without it, the header says what the modes do.
    let out = ndmem(&dir, &["--steps", "2"], &[]);
    assert!(text(&out.stdout).contains("into a 4-slot ring workspace"));
}

#[test]
fn a_device_limit_from_the_environment_is_not_said_to_follow_max_bytes() {
    let dir = temp_dir("device-limit-env");
    for value in ["1G", "0"] {
        let out = ndmem(
            &dir,
            &["--device", "sim", "--steps", "5", "--max-bytes", "20K"],
            &[("NDMEM_MAX_DEVICE_BYTES", value)],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{value}: {}", text(&out.stderr));
        let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!flat.contains("caps the device"), "{value}: {stdout}");
        assert!(
            flat.contains("NDMEM_MAX_DEVICE_BYTES sets the device's limit"),
            "{value}: {stdout}"
        );
        let json = read_json(&dir.join("ndmem-report.json"));
        assert_eq!(
            json["config"]["device_limit_set_by"],
            "NDMEM_MAX_DEVICE_BYTES"
        );
        let again = ndmem(&dir, &["report", "ndmem-report.json", "-o", "r.svg"], &[]);
        let again = text(&again.stdout);
        assert!(!again.contains("caps the device"), "{value}: {again}");
    }
    // A report written before the field existed makes no claim about the device limit.
    let mut json = read_json(&dir.join("ndmem-report.json"));
    json["config"]
        .as_object_mut()
        .unwrap()
        .remove("device_limit_set_by");
    for m in json["modes"].as_array_mut().unwrap() {
        m["device"]["peak_bytes"] = Value::from(1u64 << 30);
    }
    write_json(&dir.join("old.json"), &json);
    let out = ndmem(&dir, &["report", "old.json", "-o", "old.svg"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("(the highest device peak).") && !flat.contains("caps the device"),
        "{stdout}"
    );
}

#[test]
fn on_a_simulated_device_every_mode_agrees_with_the_host_run() {
    let dir = temp_dir("train-device");
    let args = ["train", "--steps", "10", "--hidden", "8", "--out-dir", "."];
    let host = ndmem(&dir, &args, &[]);
    assert!(host.status.success(), "{}", text(&host.stderr));
    let host_json = read_json(&dir.join("ndmem-report.json"));
    let mut with_device = args.to_vec();
    with_device.extend(["--device", "sim"]);
    let out = ndmem(&dir, &with_device, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("device: sim:0 simulated device"),
        "{stdout}"
    );
    for mode in MODES {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{mode} on sim:0")))
            .unwrap_or_else(|| panic!("no device line for {mode}: {stdout}"));
        assert!(line.contains("driver allocations"), "{line}");
    }
    assert!(
        stdout.contains("loss curves identical across modes: yes"),
        "{stdout}"
    );
    let json = read_json(&dir.join("ndmem-report.json"));
    let (h, d) = (
        numbers(&host_json["modes"][0]["series"]["loss"]),
        numbers(&json["modes"][0]["series"]["loss"]),
    );
    assert_eq!(h.len(), d.len());
    for (a, b) in h.iter().zip(&d) {
        assert!(((a - b) / a).abs() < 1e-4, "host {a} vs device {b}");
    }
    // The report carries each mode's device figures; a host run has none.
    assert!(host_json["modes"][0].get("device").is_none());
    for (i, mode) in MODES.iter().enumerate() {
        let device = &json["modes"][i]["device"];
        assert!(
            device["device"].as_str().unwrap().starts_with("sim:0"),
            "{mode}: {device}"
        );
        assert!(
            device["peak_bytes"].as_u64().unwrap() > 0,
            "{mode}: {device}"
        );
        // Each step copies its batch in (features and labels) and its loss out.
        let htod = device["htod_per_step"].as_f64().unwrap();
        let dtoh = device["dtoh_per_step"].as_f64().unwrap();
        assert!((2.0..2.8).contains(&htod), "{mode}: {device}");
        assert!((1.0..1.5).contains(&dtoh), "{mode}: {device}");
        assert!(
            device["htod_bytes"].as_u64().unwrap() > 0,
            "{mode}: {device}"
        );
    }
}

#[test]
fn each_mode_starts_from_a_cold_device_so_its_driver_allocations_are_its_own() {
    // The device's cache is given back between modes, as the host pool's is: scopes mode
    // (run last) asks the driver for as much as when it runs alone, not for nothing
    // because the modes before it filled the cache.
    let dir = temp_dir("train-device-cold");
    let args = ["train", "--steps", "6", "--hidden", "8", "--prefetch", "0"];
    let driver = |extra: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--device", "sim", "--out-dir", "."]);
        all.extend(extra);
        let out = ndmem(&dir, &all, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let json = read_json(&dir.join("ndmem-report.json"));
        let modes = json["modes"].as_array().unwrap().clone();
        let scopes = modes.iter().find(|m| m["mode"] == "scopes").unwrap();
        scopes["device"]["driver_allocations"].as_u64().unwrap()
    };
    let after_others = driver(&[]);
    let alone = driver(&["--mode", "scopes"]);
    assert!(alone > 0);
    assert_eq!(after_others, alone);
}

#[test]
fn a_device_that_cannot_be_opened_fails_with_one_line_and_status_2() {
    let dir = temp_dir("train-no-device");
    for (device, expect) in [("cuda:7", "--device cuda:7: no device"), ("tpu", "cuda:N")] {
        let out = ndmem(&dir, &["train", "--steps", "1", "--device", device], &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{device}: {stderr}");
        assert!(stderr.contains(expect), "{device}: {stderr}");
        if device == "cuda:7" {
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        }
    }
}

#[test]
fn graph_replays_the_step_with_the_launched_losses_and_only_batch_and_loss_copies() {
    let dir = temp_dir("train-graph");
    let out = ndmem(
        &dir,
        &[
            "train",
            "--steps",
            "20",
            "--hidden",
            "8",
            "--device",
            "sim",
            "--graph",
            "--out-dir",
            ".",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("losses match pool mode"), "{stdout}");
    let json = read_json(&dir.join("ndmem-report.json"));
    let graph = &json["graph"];
    // The line shows the graph run's own device peak, which the suggested limit covers.
    let peak = graph["peak_bytes"].as_u64().unwrap() as usize;
    assert!(peak > 0, "{graph}");
    let expected = format!(
        "graph on sim:0: device peak {}, 20 steps",
        ndmem::alloc::ByteSize(peak)
    );
    assert!(stdout.contains(&expected), "{expected}\n{stdout}");
    assert_eq!(graph["steps"], 20, "{graph}");
    assert_eq!(graph["compared_with"], "pool");
    assert!(graph["max_relative_loss_difference"].as_f64().unwrap() <= 1e-5);
    // The 20 steps span two batch sizes (7 of 16 rows and one of 8 per epoch).
    assert_eq!(graph["graphs"], 2, "{graph}");
    assert_eq!(graph["driver_allocations_after_first"], 0, "{graph}");
    assert_eq!(graph["htod_per_step"].as_f64(), Some(2.0), "{graph}");
    assert_eq!(graph["dtoh_per_step"].as_f64(), Some(1.0), "{graph}");
    let replayed = numbers(&graph["loss"]);
    let launched = numbers(&json["modes"][0]["series"]["loss"]);
    assert_eq!(replayed.len(), launched.len());
    for (g, l) in replayed.iter().zip(&launched) {
        assert!(((g - l) / l).abs() <= 1e-5, "replayed {g} vs launched {l}");
    }
}

#[test]
fn graph_without_a_device_is_a_usage_error() {
    let dir = temp_dir("train-graph-no-device");
    let out = ndmem(&dir, &["train", "--steps", "1", "--graph"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--device"), "{stderr}");
}

#[test]
fn heap_allocations_per_step_are_zero_in_workspaces_mode_and_at_most_one_per_tensor_otherwise() {
    // Counted by the command's own global allocator, ndmem_alloc::Tracking<System>, over
    // every thread: the batch producer publishes its tally with each batch.
    let dir = temp_dir("train-heap");
    // Batches built on the training thread: nothing but the step allocates.
    let out = ndmem(
        &dir,
        &[
            "train",
            "--steps",
            "60",
            "--prefetch",
            "0",
            "--out-dir",
            ".",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = read_json(&dir.join("ndmem-report.json"));
    for (i, mode) in MODES.iter().enumerate() {
        let m = &json["modes"][i];
        assert_eq!(m["mode"], *mode);
        let heap = m["heap_allocations_per_step"].as_f64().unwrap();
        let tensors = m["pool_allocations_per_step"].as_f64().unwrap();
        if *mode == "workspaces" {
            assert_eq!(heap, 0.0, "{m}");
        } else {
            // Every tensor of these modes is a pool block.
            assert!(
                tensors > 0.0 && heap <= tensors,
                "{mode}: {heap} heap allocations for {tensors} tensors a step"
            );
        }
    }
    // With a producer thread two batches ahead (the default), counted too: its tensors'
    // headers come back to it through the depot and its ring's slot references live as
    // long as the ring, so workspaces mode allocates nothing on any thread once the
    // producer's first batches (made before any came back: two ahead, one waiting to be
    // sent, one in the step) are behind it.
    let out = ndmem(&dir, &["train", "--steps", "60", "--out-dir", "."], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = read_json(&dir.join("ndmem-report.json"));
    for (i, mode) in MODES.iter().enumerate() {
        let m = &json["modes"][i];
        let heap = m["heap_allocations_per_step"].as_f64().unwrap();
        let tensors = m["pool_allocations_per_step"].as_f64().unwrap();
        if *mode == "workspaces" {
            let series = m["series"]["heap_allocations"].as_array().unwrap();
            assert!(series.iter().skip(4).all(|n| n.as_u64() == Some(0)), "{m}");
        } else {
            // The two batch tensors a step are made on the producer, outside the pool.
            assert!(
                heap <= tensors + 2.0,
                "{mode}: {heap} heap allocations for {tensors} + 2 tensors a step"
            );
        }
    }
}

#[test]
fn the_header_names_the_heap_limit_the_run_is_under() {
    let dir = temp_dir("heap-header");
    let args = ["--mode", "pool", "--steps", "2", "--hidden", "8"];
    for (env, expected) in [
        (None, "; no limit (NDMEM_MAX_HEAP unset)"),
        (Some("64M"), "; limit 64.0 MiB (NDMEM_MAX_HEAP)"),
    ] {
        let envs: Vec<(&str, &str)> = env.map(|v| ("NDMEM_MAX_HEAP", v)).into_iter().collect();
        let out = ndmem(&dir, &args, &envs);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let line = stdout
            .lines()
            .find(|l| l.starts_with("heap: "))
            .unwrap_or_else(|| panic!("no heap line in\n{stdout}"));
        assert!(line.contains(expected), "{env:?}: {line}");
    }
}
