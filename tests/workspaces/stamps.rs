//! The validity stamps (semantics §3): leaked, outdated, destroyed and foreign memory is
//! refused; circular stamps are exempt from the generation check.

use ndmem::workspace::{allocate_in, allocate_in_current};
use ndmem::{workspaces, Error, ResetPolicy, WorkspaceConfig};

use crate::{layout, read, strict, write};

#[test]
fn stamps_refuse_leaked_outdated_destroyed_and_foreign_memory() {
    // Semantics §3
    let ws = workspaces();
    let cfg = strict().initial_size(4096).build().unwrap();
    let old = {
        let g = ws.get_and_activate(&cfg, "STAMP").unwrap();
        let m = allocate_in_current(layout(8)).unwrap().unwrap();
        m.stamp.check("add", "X").unwrap();
        assert_eq!((m.stamp.workspace_id(), m.stamp.generation()), ("STAMP", 1));
        assert!(!m.stamp.is_circular() && m.stamp.is_in("STAMP"));
        // Another thread may not use it.
        let foreign = m.clone();
        let err = std::thread::spawn(move || foreign.stamp.check("mul", "Y"))
            .join()
            .unwrap();
        assert!(
            matches!(err, Err(Error::WrongThread { ref workspace, .. }) if workspace == "STAMP")
        );
        drop(g);
        m
    };
    assert_eq!(
        old.stamp.check("add", "X"),
        Err(Error::LeakedWorkspacePointer {
            op: "add".into(),
            arg: "X".into(),
            workspace: "STAMP".into()
        })
    );
    let g = ws.get_and_activate(&cfg, "STAMP").unwrap();
    let err = old.stamp.check("add", "Y").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Op [add] Y argument uses outdated workspace pointer from workspace [STAMP] (allocated in generation 1, now 2)"
    );
    let fresh = allocate_in("STAMP", layout(8)).unwrap();
    drop(g);
    ws.destroy("STAMP").unwrap();
    for m in [&old, &fresh] {
        assert!(matches!(
            m.stamp.check("add", "X"),
            Err(Error::LeakedWorkspacePointer { .. })
        ));
    }
}

#[test]
fn circular_stamps_are_exempt_but_destroyed_is_an_error_and_memory_stays_alive() {
    // Semantics §3: circular workspaces are exempt from the generation (and thread) check.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(4096)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .overallocation_limit(3.0)
        .build()
        .unwrap();
    let batch = {
        let _g = ws.get_and_activate(&cfg, "CIRC_STAMP").unwrap();
        let m = allocate_in_current(layout(256)).unwrap().unwrap();
        write(&m, 42);
        m
    };
    drop(ws.get_and_activate(&cfg, "CIRC_STAMP").unwrap());
    assert!(batch.stamp.is_circular());
    batch.stamp.check("read", "X").unwrap();
    let sent = batch.clone();
    let on_consumer = std::thread::spawn(move || {
        sent.stamp.check("read", "X")?;
        Ok::<_, Error>(read(&sent))
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(on_consumer, vec![42; 256]);
    ws.destroy("CIRC_STAMP").unwrap();
    assert!(matches!(
        batch.stamp.check("read", "X"),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
    // The stamp keeps the ring alive: reading after destroy is not a use-after-free
    // (valgrind checks this), though the check says the data is no longer valid.
    assert_eq!(read(&batch), vec![42; 256]);
}
