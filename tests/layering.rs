//! The module graph of `docs/design.md`, kept true: every `crate::` path a module of the
//! `ndmem` crate names (in code, not in comments) must point at a module of a lower layer,
//! or of its own layer where the design allows it, and inside `workspace/` every `super::`
//! import must point at a module listed before it.

use std::fs;
use std::path::{Path, PathBuf};

/// The layers of `src/`, bottom first. A module may use modules of lower layers; modules
/// sharing a layer may not use each other, except inside `workspace/`, whose internal
/// order is `WORKSPACE_ORDER`.
const LAYERS: &[&[&str]] = &[
    &["sync", "error"],
    &["reclaim"],
    &["memory::source", "memory::handoff"],
    &["workspace"],
    &["device"],
    &["memory::home"],
    &["memory::owner"],
    &["tensor"],
    &["scope", "prefetch"],
    &["stats"],
];

/// Inside `workspace/`: each module may use only those before it (and `mod` re-exports all).
const WORKSPACE_ORDER: &[&str] = &[
    "slots",
    "state",
    "sizing",
    "config",
    "stats",
    "stamp",
    "buffer",
    "bump",
    "spill",
    "ring",
    "arena",
    "manager",
    "alloc_api",
];

/// The module a file of `src/` is, as a path (`memory::home`, `workspace::arena`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The layer of a module path: the longest entry of `LAYERS` it starts with.
fn layer_of(module: &str) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (layer, names) in LAYERS.iter().enumerate() {
        for name in *names {
            let matches = module == *name || module.starts_with(&format!("{name}::"));
            if matches && best.map_or(true, |(_, len)| name.len() > len) {
                best = Some((layer, name.len()));
            }
        }
    }
    best.map(|(layer, _)| layer)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments), so a doc link
/// to a higher module is not an import. Unit-test modules are cut off: tests may use anything.
fn code_of(text: &str) -> String {
    let body = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    body.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module path named after `prefix` (`crate::` or `super::`), as far as it goes
/// through lower-case segments (`crate::memory::home::Home` gives `memory::home`).
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let segment = &tail[..end];
            if segment.is_empty() || !segment.starts_with(|c: char| c.is_ascii_lowercase()) {
                break;
            }
            segments.push(segment.to_string());
            tail = &tail[end..];
            match tail.strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        if !segments.is_empty() {
            found.push(segments.join("::"));
        }
    }
    found
}

#[test]
fn no_module_of_the_ndmem_crate_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" || module == "memory" {
            continue; // the crate root and the seam's mod.rs only declare and re-export
        }
        let Some(own) = layer_of(&module) else {
            violations.push(format!("{module}: not in any layer of docs/design.md"));
            continue;
        };
        let code = code_of(&fs::read_to_string(file).unwrap());
        for used in paths_after(&code, "crate::") {
            let Some(target) = layer_of(&used) else {
                continue; // a crate-root re-export such as `crate::Tensor` is caught by type paths below
            };
            let same_group =
                used.split("::").next() == module.split("::").next() && !used.starts_with("memory");
            if target > own || (target == own && !same_group && used != module) {
                violations.push(format!(
                    "{module} uses crate::{used} (layer {target} >= {own})"
                ));
            }
            checked += 1;
        }
        if let Some(inner) = module.strip_prefix("workspace::") {
            let rank = WORKSPACE_ORDER.iter().position(|m| *m == inner);
            for used in paths_after(&code, "super::") {
                let first = used.split("::").next().unwrap();
                let target = WORKSPACE_ORDER.iter().position(|m| *m == first);
                match (rank, target) {
                    (Some(rank), Some(target)) if target >= rank => violations.push(format!(
                        "workspace::{inner} uses workspace::{first}, listed after it"
                    )),
                    (None, _) => violations.push(format!("workspace::{inner}: not in the order")),
                    _ => {}
                }
                checked += 1;
            }
        }
    }
    assert!(
        checked > 30,
        "the scan found only {checked} paths: is it reading the sources?"
    );
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_scan_sees_an_upward_import() {
    // The checker itself: a `use crate::tensor` in the workspace layer is found.
    let code = code_of("use crate::tensor::Tensor;\n// use crate::scope::Scope;\n");
    assert_eq!(paths_after(&code, "crate::"), vec!["tensor".to_string()]);
    assert!(layer_of("tensor").unwrap() > layer_of("workspace::arena").unwrap());
    assert_eq!(layer_of("memory::home"), Some(5));
    assert_eq!(layer_of("memory::source"), Some(2));
}
