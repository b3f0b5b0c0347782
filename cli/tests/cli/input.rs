//! Bad input and configuration: one `ndmem: ...` line and a non-zero exit, before any
//! work (semantics §1: garbage limits are errors naming the variable); output paths
//! checked before training.

use super::*;

#[test]
fn bad_input_is_one_line_and_a_nonzero_exit() {
    let dir = temp_dir("bad-input");
    let cases: [BadInput; 16] = [
        (
            &["--max-bytes", "-1"],
            &[],
            "--max-bytes <SIZE>': sizes cannot be negative",
        ),
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
fn garbage_heap_limit_is_one_behaviour_and_one_message() {
    // The tracking allocator reads NDMEM_MAX_HEAP at the program's first allocation; its
    // own warning ("not applied") is not shown, the command refuses the value for every
    // invocation, `--version` and `--help` included, with the hint every variable gives.
    let dir = temp_dir("bad-heap");
    for args in [
        &["--steps", "2"][..],
        &["--version"],
        &["--help"],
        &["limits"],
    ] {
        let out = ndmem(&dir, args, &[("NDMEM_MAX_HEAP", "garbage")]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("ndmem: NDMEM_MAX_HEAP=\"garbage\" is not a valid size")
                && stderr.contains("(expected e.g. 1048576, 64K")
                && !stderr.contains("not applied"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing else is printed");
    }
    assert!(!dir.join("ndmem-report.json").exists(), "nothing ran");
}

#[test]
fn the_workspace_variable_is_checked_before_any_work() {
    let dir = temp_dir("bad-workspaces");
    for args in [&["--steps", "2"][..], &["limits"], &["report", "r.json"]] {
        let out = ndmem(&dir, args, &[("NDMEM_WORKSPACES", "garbage")]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr
                .starts_with("ndmem: NDMEM_WORKSPACES: \"garbage\" is not a workspace debug mode")
                && stderr.contains("(expected e.g. spill_everything, bypass"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: no work before the check");
    }
    // The README's table of variables lists it.
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    assert!(
        readme
            .lines()
            .any(|l| l.starts_with("| `NDMEM_WORKSPACES` |")),
        "README lists NDMEM_WORKSPACES"
    );
}

#[test]
fn output_paths_are_checked_before_training() {
    let dir = temp_dir("paths");
    // A missing --out-dir is created.
    let out = ndmem(&dir, &["--steps", "2", "--out-dir", "new/reports"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("new/reports/ndmem-report.json").is_file());
    assert!(dir.join("new/reports/ndmem-report.svg").is_file());
    // Refused before any work: stdout stays empty, nothing is written.
    let refused: [BadInput; 4] = [
        (
            &["--steps", "2", "--json", "r.out", "--svg", "./r.out"],
            &[],
            "--json and --svg both name r.out",
        ),
        (
            &["--steps", "2", "--json", "missing/r.json"],
            &[],
            "--json missing/r.json: the directory missing does not exist",
        ),
        (
            &["--steps", "2", "--out-dir", "new/reports/ndmem-report.json"],
            &[],
            "exists and is not a directory",
        ),
        (
            &[
                "report",
                "new/reports/ndmem-report.json",
                "-o",
                "new/../new/reports/ndmem-report.json",
            ],
            &[],
            "names the JSON report being read",
        ),
    ];
    let before = std::fs::read(dir.join("new/reports/ndmem-report.json")).unwrap();
    for (args, env, needle) in refused {
        let out = ndmem(&dir, args, env);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("ndmem: ") && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
    assert!(!dir.join("r.out").exists() && !dir.join("missing").exists());
    assert_eq!(
        std::fs::read(dir.join("new/reports/ndmem-report.json")).unwrap(),
        before,
        "the report read is never overwritten"
    );
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

#[test]
fn a_limit_set_by_max_bytes_is_the_one_the_refusal_says_to_raise() {
    let dir = temp_dir("max-bytes-advice");
    let cases: [(&[&str], &str); 2] = [
        (
            &["--steps", "5", "--max-bytes", "10K"],
            "raise --max-bytes (now 10.0 KiB)",
        ),
        (
            &["--steps", "5", "--max-bytes", "9K", "--device", "sim"],
            "raise --max-bytes (now 9.00 KiB): with NDMEM_MAX_DEVICE_BYTES unset",
        ),
    ];
    for (args, advice) in cases {
        let out = ndmem(&dir, args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(advice), "{args:?}: {stderr}");
        // Not the advice for a limit set by a call in the user's own code.
        assert!(!stderr.contains("set in code"), "{stderr}");
        assert!(!stderr.contains("Pool::set_max_bytes"), "{stderr}");
    }
}

#[test]
fn unwritable_report_paths_are_refused_before_training_naming_the_flag() {
    let dir = temp_dir("unwritable");
    std::fs::write(dir.join("old.json"), "old").unwrap();
    let cases: [BadInput; 5] = [
        (
            &[
                "--steps",
                "1",
                "--mode",
                "pool",
                "--json",
                "r2.json",
                "--svg",
                "/proc/r2.svg",
            ],
            &[],
            "--svg /proc/r2.svg: cannot create a file there: ",
        ),
        (
            &[
                "--steps",
                "1",
                "--mode",
                "pool",
                "--json",
                "old.json",
                "--svg",
                "/dev/full",
            ],
            &[],
            "--svg /dev/full: cannot write to it: No space left on device",
        ),
        (
            &["--steps", "1", "--mode", "pool", "--json", "/proc/r.json"],
            &[],
            "--json /proc/r.json: cannot create a file there: ",
        ),
        (
            &["--steps", "1", "--mode", "pool", "--out-dir", "/proc"],
            &[],
            "--out-dir /proc/ndmem-report.json: cannot create a file there: ",
        ),
        (
            &["report", "old.json", "-o", "/proc/x.svg"],
            &[],
            "-o /proc/x.svg: cannot create a file there: ",
        ),
    ];
    for (args, env, needle) in cases {
        let out = ndmem(&dir, args, env);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("ndmem: {needle}")),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: no training");
    }
    // Nothing was written, the old report is whole, no probe or temporary file is left.
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["old.json"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("old.json")).unwrap(),
        "old"
    );

    // A run that writes leaves the two reports and nothing beside them.
    let out = ndmem(
        &dir,
        &["--steps", "1", "--mode", "pool", "--json", "old.json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ndmem-report.svg", "old.json"]);
    assert!(read_json(&dir.join("old.json"))["modes"].is_array());
}

#[test]
fn a_trace_file_that_cannot_be_written_is_refused_before_any_work() {
    let dir = temp_dir("trace-unwritable");
    for (value, needle) in [
        (
            "/proc/t.json",
            "NDMEM_TRACE=\"/proc/t.json\": cannot create a file there: ",
        ),
        (
            "/dev/full",
            "NDMEM_TRACE=\"/dev/full\": cannot write to it: No space left",
        ),
        (" ", "NDMEM_TRACE=\" \" is only whitespace"),
        ("\t  ", "NDMEM_TRACE=\"\\t  \" is only whitespace"),
    ] {
        let out = ndmem(
            &dir,
            &["--steps", "2", "--mode", "pool"],
            &[("NDMEM_TRACE", value)],
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{value:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("ndmem: {needle}")),
            "{value:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{value:?}: no training");
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written"
    );
    // A file it can write: written once, at the end, with nothing said on stderr.
    let out = ndmem(
        &dir,
        &["--steps", "2", "--mode", "pool"],
        &[("NDMEM_TRACE", "t.json")],
    );
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(read_json(&dir.join("t.json"))["format"], "ndmem-trace");
}

#[test]
fn a_trace_naming_a_report_is_refused_before_any_work() {
    // The trace is written at exit: naming a report, it would replace what the run has
    // just said it wrote.
    let dir = temp_dir("trace-names-report");
    for (args, trace, needle) in [
        (
            &["--steps", "2", "--mode", "pool"][..],
            "ndmem-report.json",
            "NDMEM_TRACE names ./ndmem-report.json, the JSON report (--out-dir): the trace, written at exit, would overwrite it",
        ),
        (
            &["--steps", "2", "--mode", "pool", "--svg", "r.svg"][..],
            "./r.svg",
            "NDMEM_TRACE names r.svg, the SVG (--svg): the trace, written at exit, would overwrite it",
        ),
    ] {
        let out = ndmem(&dir, args, &[("NDMEM_TRACE", trace)]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{trace}: {stderr}");
        assert_eq!(stderr.trim_end(), format!("ndmem: {needle}"), "{trace}");
        assert!(out.stdout.is_empty(), "{trace}: no training");
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn a_configuration_error_leaves_no_out_dir_behind() {
    let dir = temp_dir("out-dir-config");
    for args in [
        &["--steps", "1", "--device", "cuda:99", "--out-dir", "od/a/b"][..],
        &[
            "--steps",
            "1",
            "--out-dir",
            "od/a/b",
            "--svg",
            "/proc/x.svg",
        ],
        &["--epochs", "1000000", "--batch", "1", "--out-dir", "od/a/b"],
    ] {
        let out = ndmem(&dir, args, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!dir.join("od").exists(), "{args:?}: od/a/b was left behind");
    }
}

#[test]
fn a_run_that_fails_before_its_reports_leaves_no_out_dir_behind() {
    let dir = temp_dir("out-dir-runtime");
    // Too small a limit to train, and a learning rate that makes the loss diverge: both
    // stop the run (exit 1) before the reports are written.
    for args in [
        &["--steps", "2", "--max-bytes", "1K", "--out-dir", "od/a/b"][..],
        &["--steps", "20", "--lr", "1e30", "--out-dir", "od/a/b"],
    ] {
        let out = ndmem(&dir, args, &[]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!dir.join("od").exists(), "{args:?}: od/a/b was left behind");
    }
    // An out-dir that existed stays.
    std::fs::create_dir_all(dir.join("kept")).unwrap();
    let out = ndmem(
        &dir,
        &["--steps", "2", "--max-bytes", "1K", "--out-dir", "kept"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(dir.join("kept").is_dir());
}

#[test]
fn option_values_are_judged_by_the_option_that_takes_them() {
    let dir = temp_dir("hyphen-values");
    for (args, needle) in [
        (&["--max-bytes", "-5%"][..], "'--max-bytes <SIZE>'"),
        (&["--max-bytes", "-1K"], "'--max-bytes <SIZE>'"),
        (&["--lr", "-inf"], "'--lr <RATE>'"),
        (&["--lr", "-nan"], "'--lr <RATE>'"),
        (&["--device", "-1"], "'--device <DEVICE>'"),
        (&["--seed", "-x"], "'--seed <N>'"),
        (&["--steps", "1e3"], "exponent notation is not accepted"),
        (&["--lr", "1e-50"], "1e-50 rounds to 0 as an f32"),
    ] {
        let out = ndmem(&dir, args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle) && !stderr.contains("unexpected argument"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("out of range"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_quoted_value_in_an_error_is_shown_as_given() {
    let dir = temp_dir("quoted-value");
    let out = ndmem(&dir, &["limits"], &[("NDMEM_MAX_BYTES", "   ")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("ndmem: NDMEM_MAX_BYTES=\"   \" is not a valid size"),
        "{stderr}"
    );
}

#[test]
fn a_heap_variable_meaning_no_limit_is_not_called_unset() {
    let dir = temp_dir("heap-no-limit");
    for (value, says) in [
        ("0", "(NDMEM_MAX_HEAP=0: 0 means no limit)"),
        (
            "4096P",
            "(NDMEM_MAX_HEAP=4096P: 4 EiB or more means no limit)",
        ),
        (
            "9223372036854775807",
            "(NDMEM_MAX_HEAP=9223372036854775807: 4 EiB or more means no limit)",
        ),
    ] {
        let out = ndmem(
            &dir,
            &["--steps", "2", "--mode", "pool"],
            &[("NDMEM_MAX_HEAP", value)],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{value}: {}", text(&out.stderr));
        assert!(!stdout.contains("unset"), "{value}: {stdout}");
        assert!(stdout.contains(says), "{value}: {stdout}");
        assert!(stdout.lines().all(|l| l.chars().count() <= 80), "{stdout}");
    }
    let out = ndmem(&dir, &["--steps", "2", "--mode", "pool"], &[]);
    assert!(text(&out.stdout).contains("no limit (NDMEM_MAX_HEAP unset)"));
}

#[test]
fn an_option_followed_by_another_option_is_missing_its_value() {
    // The options that take values starting with '-' (for their own "cannot be negative")
    // used to take the next option as their value: `--max-bytes --steps 5` said "the
    // subcommand '5' cannot be used with '--max-bytes <SIZE>'".
    let dir = temp_dir("missing-value");
    for (args, option) in [
        (&["--max-bytes", "--steps", "5"][..], "'--max-bytes <SIZE>'"),
        (&["--batch", "--help"], "'--batch <N>'"),
        (&["--epochs", "--mode", "pool"], "'--epochs <N>'"),
        (
            &["train", "--max-bytes", "--out-dir", "x"],
            "'--max-bytes <SIZE>'",
        ),
        (&["--device", "--graph"], "'--device <DEVICE>'"),
    ] {
        let out = ndmem(&dir, args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("a value is required for {option}"))
                && stderr.contains("is an option, not its value"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!dir.join("ndmem-report.json").exists(), "no work started");
}
