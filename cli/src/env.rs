//! The command's `NDMEM_*` environment, read and checked once before any work: the four
//! limits, the workspace debug mode, and how a percentage in `NDMEM_MAX_DEVICE_BYTES`
//! reads.
//!
//! Invariant: a value that does not parse is an error naming the variable and its value,
//! with an "(expected e.g. ...)" hint, before anything runs (semantics §1: garbage is never
//! a silent default).

use ndmem::alloc::{heap, Limits, ENV_MAX_DEVICE_BYTES};

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
    let workspaces = WorkspaceDebug::from_env().map_err(|e| Failure::config(e.to_string()))?;
    let device_percent = std::env::var(ENV_MAX_DEVICE_BYTES)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| v.ends_with('%'));
    Ok(Environment {
        limits,
        workspaces,
        device_percent,
    })
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
