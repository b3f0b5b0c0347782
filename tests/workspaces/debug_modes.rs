//! `NDMEM_WORKSPACES` debug modes (semantics §2.5). The variable is read once per process,
//! so the test runs itself again as a child process for each value.

use std::alloc::Layout;

use ndmem::workspace::{allocate_in_current, ENV_WORKSPACES};
use ndmem::{workspaces, DType, Error, SpillPolicy, Tensor, WorkspaceConfig};

use crate::common::{child::Rerun, test_name};

/// Set in the child: which scenario to check.
const CHILD: &str = "NDMEM_TEST_WORKSPACE_MODE_CHILD";

fn child(scenario: &str) {
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1 << 20)
        .build()
        .unwrap();
    let layout = Layout::from_size_align(1000, 16).unwrap();
    match scenario {
        "spill_everything" => {
            for _ in 0..3 {
                let g = ws.get_and_activate(&cfg, "DEBUG").unwrap();
                g.alloc(layout).unwrap();
                let m = allocate_in_current(layout)
                    .expect("workspaces are on")
                    .unwrap();
                m.stamp.check("add", "X").unwrap();
                let s = g.stats();
                assert_eq!((s.size, s.used, s.spilled_bytes), (0, 0, 2016), "{s:?}");
            }
            assert_eq!(
                ws.workspace("DEBUG").unwrap().size,
                0,
                "never learns either"
            );
            fail_policy_still_allocates(&ws);
        }
        "bypass" => {
            let g = ws.get_and_activate(&cfg, "DEBUG").unwrap();
            assert_eq!(ws.current().as_deref(), Some("DEBUG"));
            assert!(
                allocate_in_current(layout).is_none(),
                "allocations go to the pool"
            );
            g.alloc(layout).unwrap(); // the guard's allocator still works, by spilling
            assert_eq!(g.stats().size, 0);
            // Tensors never land in a workspace, leverage_to's copies included (ND4J's
            // bypass hands out a dummy workspace): the copy outlives the cycle.
            let src = Tensor::ones(DType::F32, &[4]).unwrap();
            let kept = src.leverage_to("DEBUG").unwrap();
            assert_eq!(kept.workspace(), None);
            assert!(matches!(
                src.leverage_to("NO_SUCH"),
                Err(Error::NoSuchWorkspace { .. })
            ));
            drop(g);
            assert_eq!(kept.to_vec::<f32>().unwrap(), vec![1.0; 4]);
            // A workspace not open refuses it as in the normal mode.
            assert!(matches!(
                src.leverage_to("DEBUG"),
                Err(Error::WorkspaceNotOpen { .. })
            ));
            fail_policy_still_allocates(&ws);
        }
        "garbage" => match ws.get_and_activate(&cfg, "DEBUG") {
            Err(Error::Config(e)) => {
                let message = e.to_string();
                assert!(
                    message.contains(ENV_WORKSPACES) && message.contains("\"spill_all\""),
                    "{message}"
                );
            }
            other => panic!("expected a configuration error, got {other:?}"),
        },
        other => panic!("unknown scenario {other}"),
    }
}

/// A debug mode has no buffer to fill, so even a `SpillPolicy::Fail` workspace allocates
/// (from the pool) instead of reporting itself full.
fn fail_policy_still_allocates(ws: &ndmem::workspace::Workspaces) {
    let cfg = WorkspaceConfig::builder()
        .initial_size(1 << 20)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&cfg, "DEBUG_FAIL").unwrap();
    let layout = Layout::from_size_align(1000, 16).unwrap();
    g.alloc(layout)
        .expect("a Fail workspace allocates in a debug mode");
}

#[test]
fn debug_modes_from_the_environment() {
    if let Ok(scenario) = std::env::var(CHILD) {
        child(&scenario);
        return;
    }
    for (scenario, value) in [
        ("spill_everything", "spill_everything"),
        ("bypass", "BYPASS"),
        ("garbage", "spill_all"),
    ] {
        Rerun::test(test_name!(debug_modes_from_the_environment))
            .env(CHILD, scenario)
            .env(ENV_WORKSPACES, value)
            .passes();
    }
}
