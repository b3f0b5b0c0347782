//! `ndmem limits`: every source named, under any limit.

use super::*;

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
fn limits_reports_under_any_limit() {
    let dir = temp_dir("limits-small");
    for env in [
        &[("NDMEM_MAX_BYTES", "512K")][..],
        &[("NDMEM_MAX_BYTES", "1")],
        &[("NDMEM_MAX_PHYSICAL_BYTES", "1M")],
        &[("NDMEM_MAX_BYTES", "1"), ("NDMEM_MAX_PHYSICAL_BYTES", "1")],
    ] {
        let out = ndmem(&dir, &["limits"], env);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{env:?}: {}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{env:?}: {}", text(&out.stderr));
        assert!(
            stdout.contains("off-heap pool") && stdout.contains("CUDA driver:"),
            "{env:?}: the whole report: {stdout}"
        );
    }
}

#[test]
fn a_device_percentage_is_a_share_of_each_device_not_of_ram() {
    let dir = temp_dir("limits-device");
    let out = ndmem(&dir, &["limits"], &[("NDMEM_MAX_DEVICE_BYTES", "50%")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("NDMEM_MAX_DEVICE_BYTES"))
        .unwrap_or_else(|| panic!("no device line: {stdout}"));
    let (line, next) = (lines[at], lines[at + 1]);
    assert!(
        line.contains("50%") && line.contains("of each device"),
        "{line}"
    );
    assert!(
        !line.contains("iB"),
        "not resolved against host RAM: {line}"
    );
    assert!(
        next.contains("resolved against each device's memory"),
        "{next}"
    );
    // The workspace debug mode has its row too.
    assert!(
        lines
            .iter()
            .any(|l| l.trim_start().starts_with("NDMEM_WORKSPACES")),
        "{stdout}"
    );
}

#[test]
fn a_device_variable_of_0_is_shown_as_no_limit() {
    let dir = temp_dir("limits-device-0");
    let out = ndmem(&dir, &["limits"], &[("NDMEM_MAX_DEVICE_BYTES", "0")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("NDMEM_MAX_DEVICE_BYTES"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("unlimited") && line.contains("from the environment"),
        "{line}"
    );
}

#[test]
fn train_refuses_a_physical_limit_below_the_resident_set_before_any_work() {
    // `ndmem limits` reports under it (above); a training run would fail at its first pool
    // allocation, so it is refused as configuration (exit 2), naming the variable, before
    // the header or any report.
    let dir = temp_dir("train-physical");
    let out = ndmem(
        &dir,
        &["--steps", "2", "--out-dir", "out"],
        &[("NDMEM_MAX_PHYSICAL_BYTES", "1M")],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "no work: {}", text(&out.stdout));
    assert!(
        stderr.starts_with("ndmem: NDMEM_MAX_PHYSICAL_BYTES=\"1M\": 1.00 MiB is below")
            && stderr.contains("resident"),
        "{stderr}"
    );
    assert!(!dir.join("out").exists(), "no --out-dir was created");
}
