//! The `ndmem` command end to end: a short training run in every mode (identical loss
//! bits, no pool allocation after the first step in `workspaces` mode, the off-heap limit
//! held), its JSON and SVG reports, `report` re-rendering, `limits`, `--help`, and bad
//! input giving one `ndmem: ...` line and a non-zero exit (semantics §1: garbage limits
//! are errors naming the variable), and the command's manners at a terminal and a pipe.
//! One module per area; the helpers are here.

mod input;
mod limits;
mod report;
mod terminal;
mod train;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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
    command(dir, args, env)
        .output()
        .expect("the ndmem binary runs")
}

/// The command [`ndmem`] runs, for tests that set up its standard streams themselves.
fn command(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
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
    command
}

/// A short run of every mode (12 steps, 8 hidden units) in `dir`, its reports at the
/// default paths; returns its stdout.
fn short_run(dir: &Path) -> String {
    let out = ndmem(dir, &["--steps", "12", "--hidden", "8"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    stdout
}

/// The JSON file at `path`.
fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Writes `value` as JSON to `path`.
fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string(value).unwrap()).unwrap();
}

/// The texts of an SVG document, trimmed, with their `y` attribute.
fn svg_texts(svg: &str) -> Vec<(String, String)> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            (
                n.attribute("y").unwrap_or("").to_string(),
                n.text().unwrap_or("").trim().to_string(),
            )
        })
        .collect()
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
