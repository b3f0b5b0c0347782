//! The memory source: a workspace draws its buffer and spills from a pool of its own, within
//! its limit.

use ndmem::alloc::{AllocError, Limits, Pool};
use ndmem::{workspaces, Error, MemorySource, WorkspaceConfig};

use crate::{capacity, fill, layout};

#[test]
fn a_workspace_draws_from_its_own_source_within_its_limit() {
    // The buffer and the spills come from the configured source's pool, whose limit
    // applies; the global pool is checked in `pool_counters`.
    let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(64 << 10).build()));
    let cfg = WorkspaceConfig::builder().source(source).build().unwrap();
    assert_eq!(cfg.source(), source);
    assert_eq!(WorkspaceConfig::default().source(), MemorySource::global());
    let ws = workspaces();
    {
        let g = ws.get_and_activate(&cfg, "OWN_SOURCE").unwrap();
        fill(&g, 4, 1000);
        let spills = source.pool().stats();
        assert_eq!(
            spills.live_bytes,
            4 * capacity(1000),
            "the first cycle spills into it"
        );
        assert_eq!(spills.workspace_bytes, spills.live_bytes);
    }
    let size = ws.workspace("OWN_SOURCE").unwrap().size;
    assert_eq!(size, capacity(5248), "learned: 4,032 x 1.3, rounded to 16");
    assert_eq!(
        source.pool().stats().live_bytes,
        size,
        "the learned buffer is its block"
    );
    let g = ws.get_and_activate(&cfg, "OWN_SOURCE").unwrap();
    fill(&g, 4, 1000);
    assert_eq!(g.stats().spilled_bytes, 0);
    match g.alloc(layout(100 << 10)) {
        Err(e @ Error::Alloc(AllocError::OutOfMemory { .. })) => {
            let Some(AllocError::OutOfMemory { requested, .. }) = e.alloc_error() else {
                panic!("{e:?}")
            };
            assert_eq!(*requested, 100 << 10);
            assert!(e.to_string().contains("102400 bytes"), "{e}");
        }
        other => panic!("a spill over the source's limit must fail, got {other:?}"),
    }
    drop(g);
    // The configuration of the first creation wins, as for every other setting.
    let other = MemorySource::new(Pool::new(Limits::unlimited()));
    let again = cfg.to_builder().source(other).build().unwrap();
    let before = source.pool().stats().total_allocated_bytes;
    {
        let g = ws.get_and_activate(&again, "OWN_SOURCE").unwrap();
        fill(&g, 2, 10_000);
        assert!(g.stats().spilled_bytes > 0);
    }
    assert_eq!(other.pool().stats().total_allocated_bytes, 0);
    assert!(source.pool().stats().total_allocated_bytes > before);
    ws.destroy("OWN_SOURCE").unwrap();
    assert_eq!(
        source.pool().stats().live_bytes,
        0,
        "destroy gives the buffer back"
    );
}
