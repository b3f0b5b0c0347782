//! Mapped files and configurations that must fail cleanly (semantics §2.1, §2.4): a file is
//! claimed by its identity, not its name, for as long as any tensor or view reaches its
//! bytes; temporary files have no name; a ring's slot count is bounded when the
//! configuration is built.

use std::path::PathBuf;

use ndmem::workspace::MAX_RING_SLOTS;

use crate::common::{child::run_alone, test_name};
use ndmem::{
    workspaces, AllocationPolicy, Error, LearningPolicy, LocationPolicy, ResetPolicy, SpillPolicy,
    Tensor, WorkspaceConfig,
};

/// A path in the temporary directory, unique to this process and `name`, removed first.
fn scratch(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ndmem-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn mapped(path: &std::path::Path) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .policy_allocation(AllocationPolicy::Strict)
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.to_path_buf()),
        })
        .build()
        .unwrap()
}

#[test]
fn a_hard_link_to_a_mapped_file_is_refused() {
    // Semantics §2.1: a file is mapped by one workspace at a time, whatever its name.
    let first = scratch("link-a");
    let second = scratch("link-b");
    std::fs::write(&first, [0u8; 16]).unwrap();
    std::fs::hard_link(&first, &second).unwrap();
    let ws = workspaces();
    {
        let _a = ws.get_and_activate(&mapped(&first), "LINK_A").unwrap();
        match ws.get_and_activate(&mapped(&second), "LINK_B") {
            Err(Error::WorkspaceFile { message, .. }) => {
                assert!(message.contains("LINK_A"), "names the owner: {message}")
            }
            other => panic!("a hard link to a mapped file must be refused, got {other:?}"),
        }
    }
    ws.destroy("LINK_A").unwrap();
    // Released with the workspace: the other name maps it now.
    drop(ws.get_and_activate(&mapped(&second), "LINK_B").unwrap());
    ws.destroy("LINK_B").unwrap();
    std::fs::remove_file(&first).unwrap();
    std::fs::remove_file(&second).unwrap();
}

#[test]
fn a_destroyed_circular_workspace_keeps_its_file_while_a_view_lives() {
    // Semantics §2.1, §2.4: circular memory outlives its workspace while referenced, and
    // so does the claim on its file.
    let path = scratch("ring");
    let cfg = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::None)
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.clone()),
        })
        .build()
        .unwrap();
    let ws = workspaces();
    let data: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let tensor = {
        let _g = ws.get_and_activate(&cfg, "RING_FILE").unwrap();
        Tensor::from_slice(&data, &[64]).unwrap()
    };
    let view = tensor.view::<f32>().unwrap();
    // The view may or may not hold back the destroy; either way the bytes must stay.
    let destroyed = ws.destroy("RING_FILE").is_ok();
    match ws.get_and_activate(&cfg, "RING_FILE_2") {
        Ok(g) => {
            let ones = Tensor::from_slice(&[1.0f32; 1024], &[1024]).unwrap();
            drop(ones);
            drop(g);
            ws.destroy("RING_FILE_2").unwrap();
        }
        Err(Error::WorkspaceFile { message, .. }) => {
            assert!(message.contains("RING_FILE"), "{message}")
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        view.iter().copied().collect::<Vec<f32>>(),
        data,
        "the live view's 64 elements are unchanged"
    );
    drop(view);
    drop(tensor);
    if !destroyed {
        ws.destroy("RING_FILE").unwrap();
    }
    // Once nothing reaches the bytes, the file is free again.
    drop(ws.get_and_activate(&cfg, "RING_FILE_3").unwrap());
    ws.destroy("RING_FILE_3").unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn temporary_files_have_no_name() {
    // Semantics §2.1: no path names a temporary mapped file, so nothing can map it twice.
    let pid = format!("ndmem-workspace-{}-", std::process::id());
    let named = || {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&pid))
            })
            .count()
    };
    let cfg = WorkspaceConfig::builder()
        .initial_size(8192)
        .policy_location(LocationPolicy::Mmap { path: None })
        .build()
        .unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "TMP_NAMELESS").unwrap();
    assert_eq!(g.stats().spilled_bytes, 0);
    assert_eq!(named(), 0, "the mapped temporary file has no name");
    drop(g);
    ws.destroy("TMP_NAMELESS").unwrap();
}

#[test]
fn a_mapped_workspace_without_a_buffer_neither_creates_nor_claims_its_file() {
    // Semantics §2.1: without an initial size (LearningPolicy::None) a mapped workspace
    // has no buffer and every allocation spills: its file is not made, and another
    // workspace may map it.
    let path = scratch("unmapped.bin");
    let spilling = WorkspaceConfig::builder()
        .policy_learning(LearningPolicy::None)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.clone()),
        })
        .build()
        .unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&spilling, "UNMAPPED").unwrap();
    g.alloc(std::alloc::Layout::from_size_align(100, 16).unwrap())
        .unwrap();
    assert_eq!((g.stats().size, g.stats().spilled_bytes), (0, 112));
    assert!(!path.exists(), "no file made");
    let mapping = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.clone()),
        })
        .build()
        .unwrap();
    let other = ws.get_and_activate(&mapping, "MAPS_IT").unwrap();
    assert!(other.stats().size >= 4096, "mapped");
    drop((g, other));
    ws.destroy("UNMAPPED").unwrap();
    ws.destroy("MAPS_IT").unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_temporary_file_passes_over_names_left_by_an_earlier_process() {
    // Semantics §2.1: `Mmap { path: None }` maps a temporary file; files an earlier process
    // of the same pid (pids are reused) left under the names it would take are passed
    // over, not an error. Alone in a fresh process, whose names start from the first.
    if run_alone(test_name!(
        a_temporary_file_passes_over_names_left_by_an_earlier_process
    )) {
        return;
    }
    let stale: Vec<_> = (0..5)
        .map(|n| {
            let path = std::env::temp_dir()
                .join(format!("ndmem-workspace-{}-{n}.bin", std::process::id()));
            std::fs::write(&path, b"left behind").unwrap();
            path
        })
        .collect();
    let cfg = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap { path: None })
        .build()
        .unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "TMP_STALE").unwrap();
    g.alloc(std::alloc::Layout::from_size_align(4000, 16).unwrap())
        .unwrap();
    assert_eq!(g.stats().spilled_bytes, 0, "mapped");
    drop(g);
    ws.destroy("TMP_STALE").unwrap();
    for path in stale {
        assert_eq!(std::fs::read(&path).unwrap(), b"left behind", "untouched");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_ring_of_millions_of_slots_is_refused_when_built() {
    // Semantics §2.1: a circular Overallocate workspace has floor(1 + limit) slots, at most
    // MAX_RING_SLOTS; more is a configuration error naming the value.
    let result = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .alignment(1)
        .initial_size(1)
        .overallocation_limit(16e6)
        .build();
    match result {
        Err(Error::Config(e)) => {
            let e = e.to_string();
            assert!(
                e.contains("overallocation_limit") && e.contains("16000000"),
                "{e}"
            );
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
    let most = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit((MAX_RING_SLOTS - 1) as f64)
        .build();
    assert!(most.is_ok(), "{most:?}");
}

#[test]
fn min_size_cannot_make_a_ring_of_millions_of_slots() {
    // Semantics §2.4: slots = buffer / slot, bounded by MAX_RING_SLOTS whatever min_size.
    let cfg = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_spill(SpillPolicy::External)
        .alignment(1)
        .initial_size(1)
        .min_size(16 << 20)
        .build()
        .unwrap();
    let ws = workspaces();
    let g = ws.get_and_activate(&cfg, "MANY_SLOTS").unwrap();
    let slots = g.stats().slots;
    assert!((1..=MAX_RING_SLOTS).contains(&slots), "{slots} slots");
    drop(g);
    ws.destroy("MANY_SLOTS").unwrap();
}

#[test]
fn a_mapped_path_that_names_no_file_is_refused_at_build() {
    // An empty path can never be mapped: build() says so, naming the setting, before any
    // workspace exists. A directory is refused when the workspace is created, naming it.
    let mapped_at = |path: PathBuf| {
        WorkspaceConfig::builder()
            .initial_size(4096)
            .policy_location(LocationPolicy::Mmap { path: Some(path) })
            .build()
    };
    match mapped_at(PathBuf::new()) {
        Err(Error::Config(e)) => assert_eq!(
            e.to_string(),
            "WorkspaceConfig::policy_location: policy_location Mmap with an empty path: it \
             names no file (path None maps a temporary file)"
        ),
        other => panic!("{other:?}"),
    }
    let dir = std::env::temp_dir();
    let cfg = mapped_at(dir.clone()).unwrap();
    match workspaces().get_and_activate(&cfg, "MAPPED_DIR") {
        Err(Error::WorkspaceFile {
            workspace, path, ..
        }) => assert_eq!(
            (workspace.as_str(), path),
            ("MAPPED_DIR", dir.display().to_string())
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
