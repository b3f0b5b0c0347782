//! The `ndmem` command end to end: a short training run in every mode (identical loss
//! bits, no pool allocation after the first step in `workspaces` mode, the off-heap limit
//! held), its JSON and SVG reports, `report` re-rendering, `limits`, `--help`, and bad
//! input giving one `ndmem: ...` line and a non-zero exit (SEMANTICS 1: garbage limits
//! are errors naming the variable).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ndmem");
/// The modes, in run order.
const MODES: [&str; 3] = ["pool", "workspaces", "scopes"];

/// Arguments, extra environment, and a text the error line must contain.
type BadInput<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the command with `args` and extra environment, the NDMEM_ variables of the test's
/// own environment removed, in `dir`.
fn ndmem(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).current_dir(dir);
    for name in [
        "NDMEM_MAX_HEAP",
        "NDMEM_MAX_BYTES",
        "NDMEM_MAX_PHYSICAL_BYTES",
        "NDMEM_MAX_DEVICE_BYTES",
        "NDMEM_WORKSPACES",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    command.output().expect("the ndmem binary runs")
}

/// Bytes as text (lossy).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The f32 bits of a loss series (JSON holds each f32 as its shortest round-trip decimal,
/// so parsing and narrowing gives back the exact value, sign of zero included).
fn loss_bits(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("a series is an array")
        .iter()
        .map(|v| (v.as_f64().expect("losses are numbers") as f32).to_bits())
        .collect()
}

/// The values of a numeric series.
fn numbers(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("a series is an array")
        .iter()
        .map(|v| v.as_f64().expect("series values are numbers"))
        .collect()
}

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
        lines[header + 4].starts_with("(steps/s"),
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
        // Every step's peak stayed under --max-bytes, and the largest is the mode's peak.
        let peaks = numbers(&mode["series"]["pool_peak_bytes"]);
        assert!(
            peaks.iter().all(|p| *p > 0.0 && *p <= f64::from(4 << 20)),
            "{peaks:?}"
        );
        assert_eq!(peaks.iter().copied().fold(0.0, f64::max), live as f64);
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
        svg.contains("workspaces (0.00 per step after step 1)"),
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
    assert!(stdout.contains("n/a (one mode ran)"), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    // 120 training rows in batches of 64: two steps, the second one short.
    assert_eq!(json["modes"][0]["steps"], 2);
    assert!(dir.join("r.svg").is_file() && !dir.join("ndmem-report.json").exists());
}

#[test]
fn bad_input_is_one_line_and_a_nonzero_exit() {
    let dir = temp_dir("bad-input");
    let cases: [BadInput; 15] = [
        (&["--batch", "0"], &[], "--batch"),
        (&["train", "--epochs", "-1"], &[], "--epochs"),
        (&["--mode", "fast"], &[], "'fast'"),
        (&["--lr", "-0.5"], &[], "--lr"),
        (&["--max-bytes", "lots"], &[], "--max-bytes"),
        (
            &["--steps", "2"],
            &[("NDMEM_MAX_BYTES", "garbage")],
            "NDMEM_MAX_BYTES=\"garbage\"",
        ),
        (
            &["--steps", "2", "--max-bytes", "1K"],
            &[],
            "Can't allocate",
        ),
        (&["report", "missing.json"], &[], "missing.json"),
        (&["--hidden", "18446744073709551615"], &[], "at most 65536"),
        (&["--hidden", "10000000000000"], &[], "--hidden"),
        (&["--batch", "1e9"], &[], "--batch"),
        (
            &["--epochs", "4000000000", "--batch", "1"],
            &[],
            "at most 1000000",
        ),
        (
            &["--epochs", "1000000", "--batch", "1"],
            &[],
            "more than 1000000: lower --epochs",
        ),
        (
            &["--mode", "pool", "--lr", "1e30", "--steps", "20"],
            &[],
            "diverged): lower --lr (now 1e30)",
        ),
        (
            &["limits"],
            &[("NDMEM_MAX_PHYSICAL_BYTES", "1.5.G")],
            "NDMEM_MAX_PHYSICAL_BYTES",
        ),
    ];
    for (args, env, needle) in cases {
        let out = ndmem(&dir, args, env);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?}",
            out.status
        );
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("ndmem: ") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{stderr}"
        );
    }
}

#[test]
fn garbage_heap_limit_is_one_line_and_nothing_runs() {
    // The tracking allocator reads NDMEM_MAX_HEAP at the first allocation, before main,
    // and writes the line; the command then refuses to run without repeating it.
    let dir = temp_dir("bad-heap");
    let out = ndmem(&dir, &["--steps", "2"], &[("NDMEM_MAX_HEAP", "garbage")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("ndmem: NDMEM_MAX_HEAP=\"garbage\" is not a valid size"),
        "{stderr}"
    );
    assert!(!dir.join("ndmem-report.json").exists(), "nothing ran");
}

#[test]
fn a_heap_limit_too_small_to_train_is_one_line_and_exit_1() {
    // The allocator refuses, the command's OOM hook writes one line and exits: no abort.
    let dir = temp_dir("small-heap");
    for limit in ["64K", "1"] {
        let out = ndmem(&dir, &[], &[("NDMEM_MAX_HEAP", limit)]);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{limit}: {:?} {stderr}",
            out.status
        );
        assert_eq!(stderr.lines().count(), 1, "{limit}: {stderr}");
        assert!(
            stderr.starts_with("ndmem: heap limit reached: ")
                && stderr.trim_end().ends_with("raise NDMEM_MAX_HEAP"),
            "{limit}: {stderr}"
        );
    }
}

#[test]
fn limits_names_each_source_and_the_heap_and_cuda_state() {
    let dir = temp_dir("limits");
    let out = ndmem(&dir, &["limits"], &[("NDMEM_MAX_BYTES", "64M")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line: {stdout}"))
            .to_string()
    };
    let bytes = line("NDMEM_MAX_BYTES ");
    assert!(
        bytes.contains("64.0 MiB") && bytes.contains("from the environment"),
        "{bytes}"
    );
    assert!(line("NDMEM_MAX_HEAP").contains("default"));
    assert!(line("NDMEM_MAX_PHYSICAL_BYTES").contains("default"));
    assert!(stdout.contains("physical RAM"));
    assert!(
        stdout.contains("heap (ndmem_alloc::Tracking<System>)"),
        "{stdout}"
    );
    assert!(line("CUDA driver:").contains("present") || line("CUDA driver:").contains("not found"));
}

#[test]
fn help_lists_the_subcommands_and_options() {
    let dir = temp_dir("help");
    let out = ndmem(&dir, &["--help"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    for word in ["train", "limits", "report", "--max-bytes", "--mode"] {
        assert!(stdout.contains(word), "{word}: {stdout}");
    }
    for (sub, word) in [
        ("train", "--epochs"),
        ("limits", "CUDA"),
        ("report", "--output"),
    ] {
        let out = ndmem(&dir, &[sub, "--help"], &[]);
        assert!(out.status.success(), "{sub} --help");
        assert!(
            text(&out.stdout).contains(word),
            "{sub} --help lacks {word}"
        );
    }
}
