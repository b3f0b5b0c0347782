//! The command's `NDMEM_*` environment, read and checked once before any work: the four
//! limits, the workspace debug mode, and how a percentage in `NDMEM_MAX_DEVICE_BYTES`
//! reads.
//!
//! Invariant: a value that does not parse is an error naming the variable and its value,
//! with an "(expected e.g. ...)" hint, before anything runs (semantics §1: garbage is never
//! a silent default). `NDMEM_TRACE` is the command's own: checked here (a file it can
//! write, probed as the reports are), recorded by [`start_trace`] and written by
//! [`write_trace`], whose failure is the command's (exit 1), not a line at exit.

use std::ffi::OsString;
use std::path::PathBuf;

use ndmem::alloc::{
    heap, physical_bytes, ByteSize, LimitSource, Limits, ENV_MAX_DEVICE_BYTES,
    ENV_MAX_PHYSICAL_BYTES,
};
use ndmem::trace::ENV_TRACE;

use crate::Failure;

pub use ndmem::workspace::{DebugMode as WorkspaceDebug, ENV_WORKSPACES};

/// One line for the run's header about the workspace debug mode, `None` in normal mode.
pub fn describe_workspaces(mode: WorkspaceDebug) -> Option<&'static str> {
    match mode {
        WorkspaceDebug::Normal => None,
        WorkspaceDebug::SpillEverything => {
            Some("NDMEM_WORKSPACES=spill_everything: every workspace allocation spills")
        }
        WorkspaceDebug::Bypass => {
            Some("NDMEM_WORKSPACES=bypass: workspaces are off, their tensors are pool blocks")
        }
    }
}

/// The checked environment.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The four limits.
    pub limits: Limits,
    /// The workspace debug mode.
    pub workspaces: WorkspaceDebug,
    /// `NDMEM_MAX_DEVICE_BYTES` when it is a percentage (`"50%"`): a share of each device's
    /// memory, which only a device layer can resolve.
    pub device_percent: Option<String>,
    /// `NDMEM_TRACE`: the timeline file to write, and the value as given (for messages).
    pub trace: Option<(PathBuf, OsString)>,
}

/// Reads and checks every `NDMEM_*` variable the command uses (exit 2 on garbage).
pub fn check() -> Result<Environment, Failure> {
    if let Some(error) = heap::env_error() {
        return Err(Failure::config(error.to_string()));
    }
    let limits = Limits::from_env().map_err(|e| Failure::config(e.to_string()))?;
    if let Some(error) = ndmem::trace::env_error() {
        return Err(Failure::config(error.to_string()));
    }
    let trace = check_trace()?;
    let workspaces = WorkspaceDebug::from_env().map_err(|e| Failure::config(e.to_string()))?;
    let device_percent = std::env::var(ENV_MAX_DEVICE_BYTES)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| v.ends_with('%'));
    Ok(Environment {
        limits,
        workspaces,
        device_percent,
        trace,
    })
}

/// A physical limit from `NDMEM_MAX_PHYSICAL_BYTES` below what the process has resident
/// already is refused before a training run starts, as
/// [`ndmem::alloc::Pool::set_max_physical_bytes`] refuses it: every pool allocation would
/// fail at it. (`ndmem limits` reports under any limit, this one included.)
pub fn check_physical(limits: &Limits) -> Result<(), Failure> {
    let Some(limit) = limits.max_physical_bytes else {
        return Ok(());
    };
    let resident = physical_bytes();
    if limits.sources.max_physical_bytes != LimitSource::Environment || limit >= resident {
        return Ok(());
    }
    let value = std::env::var(ENV_MAX_PHYSICAL_BYTES).unwrap_or_default();
    Err(Failure::config(format!(
        "{ENV_MAX_PHYSICAL_BYTES}={value:?}: {} is below the {} the process has resident \
         already (every pool allocation would fail); set it higher, or unset it for the \
         default",
        ByteSize(limit),
        ByteSize(resident)
    )))
}

/// `NDMEM_TRACE` as the library's check leaves it, checked further: a value that is only
/// whitespace (it would name a file called " ") is refused, and the file is probed as the
/// reports are ([`crate::paths::probe`]: created or opened without truncating, never
/// left behind). A value that passes is taken off the environment, so the library neither
/// records nor writes it at exit: the command records it ([`start_trace`]) and writes it
/// at the end of the run ([`write_trace`]), where a failure is an exit status.
fn check_trace() -> Result<Option<(PathBuf, OsString)>, Failure> {
    let Some(value) = std::env::var_os(ENV_TRACE) else {
        return Ok(None);
    };
    let shown = value.to_string_lossy().into_owned();
    let refuse = |why: &str| {
        Failure::config(format!(
            "{ENV_TRACE}={shown:?}{why} (expected the path of a JSON file to write at exit, e.g. {ENV_TRACE}=trace.json)"
        ))
    };
    if shown.trim().is_empty() {
        return Err(refuse(" is only whitespace"));
    }
    let path = PathBuf::from(&value);
    crate::paths::probe(&path).map_err(|e| refuse(&format!(": {e}")))?;
    // Before any pool exists (the library reads the variable when the global pool is
    // made) and before any thread is started.
    std::env::remove_var(ENV_TRACE);
    Ok(Some((path, value)))
}

/// Starts the timeline recorder for `NDMEM_TRACE`, if it is set, as the library would when
/// the global pool is made (a ring of `trace::DEFAULT_CAPACITY` events).
pub fn start_trace(environment: &Environment) -> Result<(), Failure> {
    if environment.trace.is_none() {
        return Ok(());
    }
    ndmem::trace::start(ndmem::trace::DEFAULT_CAPACITY)
        .map_err(|e| Failure::runtime(format!("{ENV_TRACE}: {e}; no trace is recorded")))
}

/// Stops the recorder and writes the timeline to `NDMEM_TRACE`'s file (to a temporary
/// file beside it, then renamed over it): a failure names the variable and the value.
pub fn write_trace(environment: &Environment) -> Result<(), Failure> {
    let Some((path, value)) = &environment.trace else {
        return Ok(());
    };
    ndmem::trace::stop();
    let json = ndmem::trace::to_json();
    crate::paths::write_files(&[crate::paths::OutputFile {
        label: format!("{ENV_TRACE}={:?}", value.to_string_lossy()),
        path,
        content: json.as_bytes(),
    }])
    .map_err(Failure::runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_debug_modes_parse_and_garbage_names_the_variable() {
        assert_eq!(WorkspaceDebug::parse(None), Ok(WorkspaceDebug::Normal));
        assert_eq!(WorkspaceDebug::parse(Some(" ")), Ok(WorkspaceDebug::Normal));
        assert_eq!(
            WorkspaceDebug::parse(Some("Bypass")),
            Ok(WorkspaceDebug::Bypass)
        );
        assert_eq!(
            WorkspaceDebug::parse(Some("spill_everything ")),
            Ok(WorkspaceDebug::SpillEverything)
        );
        let error = WorkspaceDebug::parse(Some("garbage"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("NDMEM_WORKSPACES: \"garbage\"") && error.contains("(expected e.g."),
            "{error}"
        );
        assert!(describe_workspaces(WorkspaceDebug::Normal).is_none());
        assert!(describe_workspaces(WorkspaceDebug::Bypass).unwrap().len() <= 80);
    }
}
