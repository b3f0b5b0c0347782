//! Location (semantics §2.1): mapped-file workspaces round-trip data and clean up after
//! themselves.

#![allow(unsafe_code)]

use ndmem::{workspaces, Error, LocationPolicy};

use crate::{layout, read, strict, write};

#[test]
fn mmap_workspace_round_trips_data_in_a_nameless_temp_file() {
    // Semantics §2.1: policy_location Mmap; data written in a cycle reads back intact.
    let ws = workspaces();
    let cfg = strict()
        .initial_size(64 << 10)
        .policy_location(LocationPolicy::Mmap { path: None })
        .build()
        .unwrap();
    let ours = |dir: &std::path::Path| -> usize {
        let pid = format!("ndmem-workspace-{}-", std::process::id());
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&pid))
            })
            .count()
    };
    {
        let g = ws.get_and_activate(&cfg, "MMAP").unwrap();
        assert_eq!(g.stats().size, 64 << 10);
        let m = g.alloc_memory(layout(60 << 10)).unwrap();
        let pattern: Vec<u8> = (0..m.len).map(|i| (i * 7 % 251) as u8).collect();
        m.stamp.check("write", "X").unwrap();
        // SAFETY: fresh workspace memory of `m.len` bytes, checked just before.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), m.ptr.as_ptr(), m.len) };
        assert_eq!(read(&m), pattern);
        assert_eq!(g.stats().spilled_bytes, 0);
    }
    // The temporary file has no name while mapped, nor after (see files.rs).
    let dir = std::env::temp_dir();
    assert_eq!(ours(&dir), 0);
    ws.destroy("MMAP").unwrap();
    drop(ws.get_and_activate(&cfg, "MMAP2").unwrap());
    ws.destroy("MMAP2").unwrap();
    assert_eq!(ours(&dir), 0);
}

#[test]
fn mmap_workspace_with_a_user_path_keeps_the_file_and_claims_it() {
    let path = std::env::temp_dir().join(format!("ndmem-test-user-{}.bin", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let ws = workspaces();
    let cfg = strict()
        .initial_size(4096)
        .policy_location(LocationPolicy::Mmap {
            path: Some(path.clone()),
        })
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "MMAP_USER").unwrap();
        write(&g.alloc_memory(layout(100)).unwrap(), 0xAB);
        // A second workspace may not map the same file.
        match ws.get_and_activate(&cfg, "MMAP_USER2") {
            Err(Error::WorkspaceFile { message, .. }) => {
                assert!(message.contains("MMAP_USER"), "{message}")
            }
            other => panic!("expected the file to be claimed, got {other:?}"),
        }
    }
    ws.destroy("MMAP_USER").unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        bytes.len(),
        4096usize.next_multiple_of(ndmem::alloc::page_size())
    );
    assert_eq!(&bytes[..100], &[0xAB; 100][..]);
    // Released on destroy: another workspace may map it now.
    drop(ws.get_and_activate(&cfg, "MMAP_USER2").unwrap());
    ws.destroy("MMAP_USER2").unwrap();
    std::fs::remove_file(&path).unwrap();
}
