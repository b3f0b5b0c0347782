//! Output paths, checked before any work: `train` creates a missing `--out-dir` (and
//! removes what it created if the run then stops before writing its reports) and refuses a
//! report file it could not write or two reports naming one file; `report` refuses to
//! write its SVG over the JSON it reads. The files themselves are written at the end by
//! [`write_files`]: each to a temporary file beside it, renamed into place once all of
//! them are written, so a failed run leaves the old files whole and never half a set of
//! new ones.
//!
//! Invariant: a run either fails here, before training, or has somewhere to write both
//! files: each output is probed (an existing file opened for writing, never truncated;
//! a probe file created in its directory and removed; a device written zero bytes);
//! nothing is left by these checks except the directory asked for.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ndmem::trace::ENV_TRACE;

/// Directories [`ensure_dir`] created, outermost first, to remove with [`remove_created`]
/// when the run stops before it starts.
#[derive(Debug, Default)]
pub struct Created(Vec<PathBuf>);

/// Creates `dir` (and its parents) if it is missing; refuses a path that exists but is not
/// a directory. Returns the directories it created.
pub fn ensure_dir(dir: &Path, option: &str) -> Result<Created, String> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(Created::default());
    }
    if dir.exists() {
        return Err(format!(
            "{option} {}: exists and is not a directory",
            dir.display()
        ));
    }
    // The missing ancestors, outermost first.
    let mut missing: Vec<PathBuf> = dir
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .take_while(|a| fs::symlink_metadata(a).is_err())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    // Level by level, recording only what this call made: a level another process made
    // meanwhile is theirs, and stays.
    let mut created = Created::default();
    for level in missing {
        match fs::create_dir(&level) {
            Ok(()) => created.0.push(level),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && level.is_dir() => {}
            Err(e) => {
                remove_created(&created);
                return Err(format!(
                    "{option} {}: cannot create the directory: {e}",
                    dir.display()
                ));
            }
        }
    }
    Ok(created)
}

/// Removes the directories of `created`, innermost first, as long as they are empty.
pub fn remove_created(created: &Created) {
    for dir in created.0.iter().rev() {
        if fs::remove_dir(dir).is_err() {
            return;
        }
    }
}

/// Refuses an output file whose directory is missing, that names a directory, or that
/// cannot be written (see [`probe`]); `option` is the flag that named it.
pub fn check_output(path: &Path, option: &str) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!(
            "{option} {}: is a directory, not a file",
            path.display()
        ));
    }
    let parent = parent(path);
    if !parent.is_dir() {
        let why = if parent.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        return Err(format!(
            "{option} {}: the directory {} {why}",
            path.display(),
            parent.display()
        ));
    }
    probe(path).map_err(|e| format!("{option} {}: {e}", path.display()))
}

/// Whether `path` can be written the way [`write_files`] writes it, without changing it:
/// an existing file is opened for writing (not truncated) and a probe file is created
/// beside it and removed, since the new content is renamed over it; a device or a pipe is
/// opened and written zero bytes (`/dev/full` refuses even that). The error is the
/// reason, in the OS's words.
pub fn probe(path: &Path) -> Result<(), String> {
    let target = target(path);
    match fs::metadata(&target) {
        Ok(meta) if !meta.is_file() => {
            // Not blocking: a pipe no one reads is refused (ENXIO), not waited on.
            let mut file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&target)
                .map_err(|e| format!("cannot open it for writing: {e}"))?;
            file.write(&[])
                .map_err(|e| format!("cannot write to it: {e}"))?;
            Ok(())
        }
        Ok(_) => {
            OpenOptions::new()
                .write(true)
                .open(&target)
                .map_err(|e| format!("cannot open it for writing: {e}"))?;
            probe_dir(&target)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => probe_dir(&target),
        Err(e) => Err(format!("cannot read what it is: {e}")),
    }
}

/// Creates a file beside `target` (the temporary file of a write), writes it zero bytes
/// and removes it.
fn probe_dir(target: &Path) -> Result<(), String> {
    let temp = temp_path(target, "probe");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(|e| format!("cannot create a file there: {e}"))?;
    let written = file.write(&[]);
    drop(file);
    let removed = fs::remove_file(&temp);
    written.map_err(|e| format!("cannot write a file there: {e}"))?;
    removed.map_err(|e| format!("cannot remove the probe file {}: {e}", temp.display()))
}

/// The file `path` names: through symbolic links, so a link is written through rather
/// than replaced, also when what it points to does not exist yet (the file a write through
/// it creates; at most 40 links are followed, Linux's own bound).
fn target(path: &Path) -> PathBuf {
    if let Ok(full) = fs::canonicalize(path) {
        return full;
    }
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match fs::read_link(&at) {
            // A relative target is relative to the link's directory.
            Ok(next) => at = parent(&at).join(next),
            Err(_) => break,
        }
    }
    at
}

/// A name beside `target` no other write of this process uses: `.NAME.ndmem-PID-N.KIND`.
fn temp_path(target: &Path, kind: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = target
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    parent(target).join(format!(
        ".{name}.ndmem-{}-{}.{kind}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// One file to write: what named it (`--json r.json`), where, and its content.
#[derive(Debug)]
pub struct OutputFile<'a> {
    /// The flag or variable and the path, as errors name it.
    pub label: String,
    /// The path given.
    pub path: &'a Path,
    /// The bytes to write.
    pub content: &'a [u8],
}

/// Writes every file of `files`, all or none: each regular file goes to a temporary file
/// in its directory, and only once all of them are written are they renamed into place
/// (a device or a pipe is written in place, after that). On a failure every temporary
/// file is removed and the old files stay as they were; the error names the file's label.
pub fn write_files(files: &[OutputFile<'_>]) -> Result<(), String> {
    let mut staged: Vec<(PathBuf, PathBuf, &str)> = Vec::new();
    let mut in_place = Vec::new();
    let discard = |staged: &[(PathBuf, PathBuf, &str)]| {
        for (temp, _, _) in staged {
            let _ = fs::remove_file(temp);
        }
    };
    for file in files {
        let target = target(file.path);
        if fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
            in_place.push((target, file));
            continue;
        }
        let temp = temp_path(&target, "tmp");
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .and_then(|mut f| {
                // The new file keeps the old one's permissions.
                if let Ok(meta) = fs::metadata(&target) {
                    f.set_permissions(meta.permissions())?;
                }
                f.write_all(file.content)?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            discard(&staged);
            return Err(format!("{}: cannot write: {e}", file.label));
        }
        staged.push((temp, target, &file.label));
    }
    for (target, file) in in_place {
        let written = OpenOptions::new()
            .write(true)
            .open(&target)
            .and_then(|mut f| f.write_all(file.content));
        if let Err(e) = written {
            discard(&staged);
            return Err(format!("{}: cannot write: {e}", file.label));
        }
    }
    for (i, (temp, target, label)) in staged.iter().enumerate() {
        if let Err(e) = fs::rename(temp, target) {
            discard(&staged[i..]);
            return Err(format!("{label}: cannot write: {e}"));
        }
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

/// `path` made absolute through its existing parent directory, through symbolic links,
/// also one whose target does not exist yet ([`target`]).
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let path = target(path);
    if let Ok(full) = fs::canonicalize(&path) {
        return Ok(full);
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    Ok(fs::canonicalize(parent(&path))?.join(name))
}

/// The directory `path` lives in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The checks of `ndmem train`: `--out-dir` exists or is created, the reports are two
/// different files, the trace `NDMEM_TRACE` names (`trace`) is neither, and both can be
/// written. `json_option` and `svg_option` name the flag
/// each path came from (`--json`, or `--out-dir` for the default). Returns the directories
/// it created, for [`remove_created`] if the run stops before it starts; on a refusal it
/// removes them itself.
pub fn check_train_paths(
    out_dir: &Path,
    (json, json_option): (&Path, &str),
    (svg, svg_option): (&Path, &str),
    trace: Option<&Path>,
) -> Result<Created, String> {
    let created = ensure_dir(out_dir, "--out-dir")?;
    let overwritten = trace.and_then(|trace| {
        [(json, "JSON report", json_option), (svg, "SVG", svg_option)]
            .into_iter()
            .find(|(report, ..)| same_file(trace, report))
    });
    let checked = if same_file(json, svg) {
        Err(format!(
            "--json and --svg both name {}: the SVG would overwrite the JSON report",
            json.display()
        ))
    } else if let Some((report, what, option)) = overwritten {
        Err(format!(
            "{ENV_TRACE} names {}, the {what} ({option}): the trace, written at exit, would overwrite it",
            report.display()
        ))
    } else {
        check_output(json, json_option).and_then(|()| check_output(svg, svg_option))
    };
    match checked {
        Ok(()) => Ok(created),
        Err(e) => {
            remove_created(&created);
            Err(e)
        }
    }
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
        // A file where the directory should be: not "does not exist".
        let err = check_output(&a.join("r.svg"), "--svg").unwrap_err();
        assert!(err.contains("is not a directory"), "{err}");
        let created = ensure_dir(&dir.join("new/deeper"), "--out-dir").unwrap();
        assert!(dir.join("new/deeper").is_dir());
        remove_created(&created);
        assert!(!dir.join("new").exists(), "what it created is removed");
        ensure_dir(&dir.join("new/deeper"), "--out-dir").unwrap();
        assert!(ensure_dir(&a, "--out-dir")
            .unwrap_err()
            .contains("not a directory"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn same_file_follows_a_link_whose_target_does_not_exist_yet() {
        let dir = std::env::temp_dir().join(format!("ndmem-links-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        let report = dir.join("out.json");
        // A relative target (relative to the link's directory), and a link to a link.
        std::os::unix::fs::symlink("out.json", dir.join("dangling.json")).unwrap();
        std::os::unix::fs::symlink("../dangling.json", dir.join("sub/chain.json")).unwrap();
        std::os::unix::fs::symlink("loop.json", dir.join("loop.json")).unwrap();
        assert!(same_file(&dir.join("dangling.json"), &report));
        assert!(same_file(&dir.join("sub/chain.json"), &report));
        assert!(!same_file(&dir.join("dangling.json"), &dir.join("out.svg")));
        assert!(
            !same_file(&dir.join("loop.json"), &report),
            "a loop names no file"
        );
        // Probed and written through: the link stays a link, its target gets the content.
        std::os::unix::fs::symlink(dir.join("missing/x.json"), dir.join("nowhere.json")).unwrap();
        assert!(
            probe(&dir.join("nowhere.json")).is_err(),
            "its directory is missing"
        );
        probe(&dir.join("sub/chain.json")).unwrap();
        let file = OutputFile {
            label: "--json".into(),
            path: &dir.join("sub/chain.json"),
            content: b"{}",
        };
        write_files(&[file]).unwrap();
        assert_eq!(fs::read_to_string(&report).unwrap(), "{}");
        let link = fs::symlink_metadata(dir.join("sub/chain.json")).unwrap();
        assert!(link.file_type().is_symlink(), "not replaced by a file");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_probed_without_being_changed_and_written_all_or_none() {
        let dir = std::env::temp_dir().join(format!("ndmem-probe-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let old = dir.join("old.json");
        fs::write(&old, "old").unwrap();
        check_output(&old, "--json").unwrap();
        check_output(&dir.join("new.svg"), "--svg").unwrap();
        assert_eq!(fs::read_to_string(&old).unwrap(), "old", "not truncated");
        let listing = || {
            let mut names: Vec<_> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        assert_eq!(listing(), ["old.json"], "no probe file is left");
        for (path, reason) in [
            ("/dev/full", "cannot write to it: No space left on device"),
            ("/proc/r.svg", "cannot create a file there"),
        ] {
            let error = check_output(Path::new(path), "--svg").unwrap_err();
            assert!(
                error.starts_with(&format!("--svg {path}: {reason}")),
                "{error}"
            );
        }
        check_output(Path::new("/dev/null"), "--svg").unwrap();
        // A write that fails leaves the old file whole and no temporary file.
        let file = |label: &str, path: &'static str, content: &'static [u8]| OutputFile {
            label: label.to_string(),
            path: Path::new(path),
            content,
        };
        let old_file = OutputFile {
            label: "--json".into(),
            path: &old,
            content: b"new",
        };
        let error =
            write_files(&[old_file, file("--svg /dev/full", "/dev/full", b"x")]).unwrap_err();
        assert!(
            error.starts_with("--svg /dev/full: cannot write"),
            "{error}"
        );
        assert_eq!(fs::read_to_string(&old).unwrap(), "old");
        assert_eq!(listing(), ["old.json"]);
        let old_file = OutputFile {
            label: "--json".into(),
            path: &old,
            content: b"new",
        };
        write_files(&[old_file, file("--svg /dev/null", "/dev/null", b"x")]).unwrap();
        assert_eq!(fs::read_to_string(&old).unwrap(), "new");
        assert_eq!(listing(), ["old.json"]);
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
