//! Output paths, checked before any work: `train` creates a missing `--out-dir` and
//! refuses a report file it could not write or two reports naming one file; `report`
//! refuses to write its SVG over the JSON it reads.
//!
//! Invariant: a run either fails here, before training, or has somewhere to write both
//! files; nothing is written by these checks except the directory asked for.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Creates `dir` (and its parents) if it is missing; refuses a path that exists but is not
/// a directory.
pub fn ensure_dir(dir: &Path, option: &str) -> Result<(), String> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        return Err(format!(
            "{option} {}: exists and is not a directory",
            dir.display()
        ));
    }
    fs::create_dir_all(dir).map_err(|e| {
        format!(
            "{option} {}: cannot create the directory: {e}",
            dir.display()
        )
    })
}

/// Refuses an output file whose directory is missing or that names a directory.
pub fn check_output(path: &Path, option: &str) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!(
            "{option} {}: is a directory, not a file",
            path.display()
        ));
    }
    let parent = parent(path);
    if !parent.is_dir() {
        return Err(format!(
            "{option} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        ));
    }
    Ok(())
}

/// Whether `a` and `b` name the same file (through `.`, `..`, symbolic links or, for
/// existing files, hard links), whether or not the files exist yet.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(ma), Ok(mb)) = (fs::metadata(a), fs::metadata(b)) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
        #[cfg(not(unix))]
        {
            let _ = (ma, mb);
        }
    }
    match (resolve(a), resolve(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `path` made absolute through its existing parent directory.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    if let Ok(full) = fs::canonicalize(path) {
        return Ok(full);
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    Ok(fs::canonicalize(parent(path))?.join(name))
}

/// The directory `path` lives in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The checks of `ndmem train`: `--out-dir` exists or is created, both reports can be
/// written, and they are two different files.
pub fn check_train_paths(out_dir: &Path, json: &Path, svg: &Path) -> Result<(), String> {
    ensure_dir(out_dir, "--out-dir")?;
    check_output(json, "--json")?;
    check_output(svg, "--svg")?;
    if same_file(json, svg) {
        return Err(format!(
            "--json and --svg both name {}: the SVG would overwrite the JSON report",
            json.display()
        ));
    }
    Ok(())
}

/// The SVG `ndmem report` writes without `-o`: `json` with its extension replaced by
/// `.svg` (`ndmem-report.json` -> `ndmem-report.svg`, `trace.json` -> `trace.svg`), or
/// with `.svg` appended when it has none.
pub fn default_svg(json: &Path) -> PathBuf {
    json.with_extension("svg")
}

/// The checks of `ndmem report`: the SVG can be written and is not the JSON read.
pub fn check_report_paths(json: &Path, svg: &Path) -> Result<(), String> {
    if same_file(json, svg) {
        return Err(format!(
            "the SVG {} names the JSON report being read: choose another file with -o",
            svg.display()
        ));
    }
    check_output(svg, "-o")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_file_sees_through_dots_and_missing_files() {
        let dir = std::env::temp_dir().join(format!("ndmem-paths-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        let a = dir.join("r.json");
        assert!(same_file(&a, &dir.join("sub/../r.json")));
        assert!(!same_file(&a, &dir.join("r.svg")));
        fs::write(&a, "{}").unwrap();
        assert!(same_file(&a, &dir.join("./r.json")));
        assert!(check_output(&dir.join("missing/r.svg"), "--svg")
            .unwrap_err()
            .contains("does not exist"));
        assert!(check_output(&dir.join("sub"), "--svg")
            .unwrap_err()
            .contains("is a directory"));
        ensure_dir(&dir.join("new/deeper"), "--out-dir").unwrap();
        assert!(dir.join("new/deeper").is_dir());
        assert!(ensure_dir(&a, "--out-dir")
            .unwrap_err()
            .contains("not a directory"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_default_svg_replaces_the_extension() {
        for (json, svg) in [
            ("ndmem-report.json", "ndmem-report.svg"),
            ("out/trace.json", "out/trace.svg"),
            ("trace", "trace.svg"),
            ("run.1.json", "run.1.svg"),
        ] {
            assert_eq!(default_svg(Path::new(json)), Path::new(svg), "{json}");
        }
        // An input that already ends in .svg would be overwritten: refused.
        let error =
            check_report_paths(Path::new("x.svg"), &default_svg(Path::new("x.svg"))).unwrap_err();
        assert!(
            error.contains("names the JSON report being read"),
            "{error}"
        );
    }
}
