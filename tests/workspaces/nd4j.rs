//! Scenarios ported from ND4J's own workspace test suites
//! (`nd4j-tests/src/test/java/org/nd4j/linalg/workspace/`: `BasicWorkspaceTests`,
//! `WorkspaceProviderTests`, `SpecialWorkspaceTests`, `CyclicWorkspaceTests`,
//! `DebugModeTests`). Each test names the ND4J test it comes from.
//!
//! The figures are ND4J's where ndmem's contract says the same. Where it deliberately
//! differs, the test asserts ndmem's contract and says so:
//! - buffer sizes are the pool block's capacity (its size class), hence `capacity(..)`;
//! - `OverTime` with `cycles_before_initialization` 0 learns after the first cycle
//!   (semantics §2.3 Decision); ND4J's explicit `initializeWorkspace()` has no equivalent,
//!   so those tests set `cycles_before_initialization` to the cycle where ND4J calls it;
//! - stale memory is an error (`LeakedWorkspacePointer`, `OutdatedWorkspacePointer`,
//!   semantics §3), never undefined behaviour; ND4J's `isAttached()`/`isInScope()` are
//!   `Tensor::workspace()` and `Tensor::is_valid()`;
//! - ND4J's `notifyScopeBorrowed()` is re-entering a workspace that is open on this thread
//!   (semantics §2.2: only nests, makes it current again), and `toggleWorkspaceUse(false)`
//!   is `scope_out()`.
//!
//! Skipped, having no meaning here: CUDA tests, serialization (`testWorkspacesSerde*`),
//! shape-info caching (`testNoShape1`), benchmarks (`testNoOpExecution_1`), garbage-
//! collector loops (`EndlessWorkspaceTests`, `testGc`), and the process-wide default
//! workspace (`testNewWorkspace1`).

use ndmem::workspace::parent_of_current;
use ndmem::{
    workspaces, AllocationPolicy, DType, Error, LearningPolicy, MemorySource, ResetPolicy,
    SpillPolicy, Tensor, WorkspaceConfig,
};

use crate::{capacity, layout};

const MIB: usize = 1024 * 1024;

/// ND4J's `BasicWorkspaceTests.basicConfig`: a fixed 10 MiB buffer, Strict, FirstLoop.
fn basic() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .max_size(10 * MIB)
        .overallocation_limit(0.1)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_spill(SpillPolicy::External)
        .build()
        .unwrap()
}

/// ND4J's `loopFirstConfig`: learned in the first loop, Strict.
fn loop_first() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .max_size(10 * MIB)
        .overallocation_limit(0.1)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::FirstLoop)
        .build()
        .unwrap()
}

/// ND4J's `loopOverTimeConfig`: learned over time, Strict.
fn loop_over_time(cycles_before_initialization: u64) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .max_size(10 * MIB)
        .overallocation_limit(0.1)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(cycles_before_initialization)
        .build()
        .unwrap()
}

fn doubles(values: &[f64]) -> Tensor {
    Tensor::from_slice(values, &[values.len()]).unwrap()
}

fn sum(t: &Tensor) -> f64 {
    t.sum().unwrap().scalar().unwrap()
}

fn used(id: &str) -> usize {
    workspaces().workspace(id).unwrap().used
}

fn size(id: &str) -> usize {
    workspaces().workspace(id).unwrap().size
}

const FIVE: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

// ---- BasicWorkspaceTests ----------------------------------------------------------------

#[test]
fn a_tensor_outside_any_workspace_lives_in_the_pool() {
    // ND4J BasicWorkspaceTests.testCold.
    assert_eq!(workspaces().current(), None);
    let array = Tensor::zeros(DType::F64, &[10])
        .unwrap()
        .add_scalar(1.0)
        .unwrap();
    assert_eq!(array.workspace(), None);
    assert_eq!(sum(&array), 10.0);
}

#[test]
fn min_size_bounds_the_first_learned_buffer() {
    // ND4J BasicWorkspaceTests.testMinSize1: FirstLoop, Overallocate 1.0, min 10 MiB: the
    // first cycle has no buffer, the second has min_size (semantics §2.3 clamping).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .min_size(10 * MIB)
        .overallocation_limit(1.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_learning(LearningPolicy::FirstLoop)
        .build()
        .unwrap();
    {
        let g = ws.get_and_activate(&cfg, "ND4J_MIN_SIZE").unwrap();
        let _a = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert_eq!(g.stats().size, 0);
    }
    let g = ws.get_and_activate(&cfg, "ND4J_MIN_SIZE").unwrap();
    let _a = Tensor::zeros(DType::F64, &[100]).unwrap();
    assert_eq!(g.stats().size, capacity(10 * MIB));
    assert_eq!((g.stats().used, g.stats().spilled_bytes), (800, 0));
}

fn leave_by_error() -> Result<Tensor, Error> {
    let _g = workspaces().get_and_activate(&basic(), "ND4J_BREAKOUT")?;
    Tensor::from_slice(&[1.0f64, 2.0], &[3])
}

#[test]
fn leaving_by_error_or_panic_restores_no_current_workspace() {
    // ND4J BasicWorkspaceTests.testBreakout2: an exception inside the workspace's scope
    // still leaves it; here an error returned by `?`, and a panic unwinding through the guard.
    let ws = workspaces();
    assert_eq!(ws.current(), None);
    assert!(matches!(leave_by_error(), Err(Error::Shape { .. })));
    assert_eq!(ws.current(), None);
    assert!(!ws.workspace("ND4J_BREAKOUT").unwrap().open);
    let unwound = std::panic::catch_unwind(|| {
        let _g = workspaces()
            .get_and_activate(&basic(), "ND4J_BREAKOUT")
            .unwrap();
        panic!("inside the workspace");
    });
    assert!(unwound.is_err());
    assert_eq!(ws.current(), None);
    assert!(!ws.workspace("ND4J_BREAKOUT").unwrap().open);
}

fn out_scope() -> Tensor {
    let _g = workspaces()
        .get_and_activate(&basic(), "ND4J_BREAKOUT1")
        .unwrap();
    Tensor::zeros(DType::F64, &[10]).unwrap()
}

#[test]
fn a_tensor_returned_out_of_its_workspace_is_attached_but_leaked() {
    // ND4J BasicWorkspaceTests.testBreakout1: the returned array is still attached. ndmem
    // contract (semantics §3): using it is LeakedWorkspacePointer instead of reading memory
    // the next cycle reuses.
    let scoped = out_scope();
    assert_eq!(scoped.workspace(), Some("ND4J_BREAKOUT1"));
    assert_eq!(workspaces().current(), None);
    assert!(!scoped.is_valid());
    assert!(matches!(
        scoped.to_vec::<f64>(),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
}

#[test]
fn leverage_to_copies_a_view_into_the_outer_workspace() {
    // ND4J BasicWorkspaceTests.testLeverage3: a view of a matrix in INT, leveraged to EXT,
    // outlives INT's cycle. (ndmem writes only through the sole handle, so the ones are
    // written when the matrix is made, and the view is a reshape sharing its storage.)
    let ws = workspaces();
    let _ext = ws.get_and_activate(&basic(), "ND4J_LEV3_EXT").unwrap();
    let array = {
        let _int = ws.get_and_activate(&basic(), "ND4J_LEV3_INT").unwrap();
        let mut data = vec![0.0f32; 32 * 40];
        data[..40].fill(1.0);
        let matrix = Tensor::from_slice(&data, &[32, 1, 40]).unwrap();
        let view = matrix.reshape(&[32, 40]).unwrap();
        assert!(view.shares_storage(&matrix));
        assert_eq!(sum(&matrix), 40.0);
        assert_eq!(sum(&view), 40.0);
        let array = view.leverage_to("ND4J_LEV3_EXT").unwrap();
        assert_eq!(array.workspace(), Some("ND4J_LEV3_EXT"));
        assert!(!array.shares_storage(&matrix));
        array
    };
    assert_eq!(sum(&array), 40.0);
}

#[test]
fn leverage_to_a_workspace_without_a_buffer_spills_and_survives_inner_cycles() {
    // ND4J BasicWorkspaceTests.testLeverageTo2: EXT learns over time, so it has no buffer
    // yet: the leveraged copy spills there (size stays 0) and outlives INT's next cycle.
    // The learning is delayed past this test's only cycle of EXT (ND4J never initialises
    // OVER_TIME by itself).
    let ws = workspaces();
    let ext_cfg = loop_over_time(5);
    let _ext = ws.get_and_activate(&ext_cfg, "ND4J_LEVTO2_EXT").unwrap();
    let _array1 = doubles(&FIVE);
    let array3 = {
        let _int = ws.get_and_activate(&basic(), "ND4J_LEVTO2_INT").unwrap();
        let array2 = doubles(&FIVE);
        let array3 = array2.leverage_to("ND4J_LEVTO2_EXT").unwrap();
        assert_eq!(size("ND4J_LEVTO2_EXT"), 0);
        assert_eq!(sum(&array3), 15.0);
        array3
    };
    {
        let _int = ws.get_and_activate(&basic(), "ND4J_LEVTO2_INT").unwrap();
        let _array2 = Tensor::zeros(DType::F64, &[100]).unwrap();
    }
    assert_eq!(sum(&array3), 15.0);
    assert_eq!(array3.workspace(), Some("ND4J_LEVTO2_EXT"));
}

#[test]
fn leverage_to_bumps_the_target_workspace_offset() {
    // ND4J BasicWorkspaceTests.testLeverageTo1: EXT's offset is one array, then two after
    // the leverage (40 bytes each, rounded to 16 as ND4J rounds them: 48, then 2 * 48).
    let ws = workspaces();
    let _ext = ws.get_and_activate(&basic(), "ND4J_LEVTO1_EXT").unwrap();
    let _array1 = Tensor::zeros(DType::F64, &[5]).unwrap();
    let _int = ws.get_and_activate(&basic(), "ND4J_LEVTO1_INT").unwrap();
    let array2 = doubles(&FIVE);
    assert_eq!(used("ND4J_LEVTO1_EXT"), 48);
    let copy = array2.leverage_to("ND4J_LEVTO1_EXT").unwrap();
    assert_eq!(used("ND4J_LEVTO1_EXT"), 2 * 48);
    assert_eq!(used("ND4J_LEVTO1_INT"), 48);
    assert_eq!(copy.to_vec::<f64>().unwrap(), FIVE);
}

#[test]
fn scope_out_allocates_outside_and_restores_the_workspace() {
    // ND4J BasicWorkspaceTests.testOutOfScope1 (and WorkspaceProviderTests
    // .testWorkspacesSerde3): inside scopeOutOfWorkspaces() arrays are detached and the
    // workspace offset does not move; afterwards the workspace is current again.
    let ws = workspaces();
    let _g = ws.get_and_activate(&basic(), "ND4J_OUT1").unwrap();
    let array1 = doubles(&FIVE);
    assert_eq!(used("ND4J_OUT1"), 48);
    let array2 = {
        let _out = ws.scope_out();
        assert_eq!(ws.current(), None);
        doubles(&FIVE)
    };
    assert_eq!(array2.workspace(), None);
    assert_eq!(used("ND4J_OUT1"), 48);
    assert_eq!(ws.current().as_deref(), Some("ND4J_OUT1"));
    let _array3 = doubles(&FIVE);
    assert_eq!(used("ND4J_OUT1"), 2 * 48);
    let result = array1.add(&array2).unwrap();
    assert_eq!(result.workspace(), Some("ND4J_OUT1"));
    assert_eq!(sum(&result), 30.0);
}

#[test]
fn leverage_copies_into_the_parent_workspace() {
    // ND4J BasicWorkspaceTests.testLeverage1: leverage() from INT lands in EXT (its
    // parent): INT's offset unchanged, EXT's grows by the array.
    let ws = workspaces();
    let _ext = ws.get_and_activate(&basic(), "ND4J_LEV1_EXT").unwrap();
    assert_eq!(used("ND4J_LEV1_EXT"), 0);
    let _int = ws.get_and_activate(&basic(), "ND4J_LEV1_INT").unwrap();
    assert_eq!(parent_of_current().as_deref(), Some("ND4J_LEV1_EXT"));
    let array = doubles(&FIVE);
    assert_eq!(used("ND4J_LEV1_EXT"), 0);
    assert_eq!(used("ND4J_LEV1_INT"), 48);
    let copy = array.leverage().unwrap();
    assert_eq!(used("ND4J_LEV1_INT"), 48);
    assert_eq!(used("ND4J_LEV1_EXT"), 48);
    assert_eq!(copy.workspace(), Some("ND4J_LEV1_EXT"));
    assert_eq!(sum(&copy), 15.0);
    // Leveraging what already lives in the parent returns it unchanged.
    let again = copy.leverage().unwrap();
    assert!(again.shares_storage(&copy));
    assert_eq!(used("ND4J_LEV1_EXT"), 48);
}

#[test]
fn a_detached_creation_inside_a_workspace_takes_no_workspace_bytes() {
    // ND4J BasicWorkspaceTests.testCreateDetached1: createUninitializedDetached inside a
    // workspace is pool memory; assigning into it leaves the workspace offset alone.
    let ws = workspaces();
    let _g = ws.get_and_activate(&basic(), "ND4J_DETACHED").unwrap();
    let array1 = doubles(&FIVE);
    let mut array2 = Tensor::zeros_in(&MemorySource::global(), DType::F64, &[5]).unwrap();
    array2.assign(&array1).unwrap();
    assert_eq!(used("ND4J_DETACHED"), 48);
    assert_eq!(array2.workspace(), None);
    assert_eq!(
        array2.to_vec::<f64>().unwrap(),
        array1.to_vec::<f64>().unwrap()
    );
}

#[test]
fn detach_copies_to_the_pool_and_the_copy_outlives_the_cycle() {
    // ND4J BasicWorkspaceTests.testDetach1.
    let ws = workspaces();
    let (array, copy) = {
        let _g = ws.get_and_activate(&basic(), "ND4J_DETACH1").unwrap();
        let array = doubles(&FIVE);
        assert!(array.is_valid());
        assert_eq!(array.workspace(), Some("ND4J_DETACH1"));
        assert_eq!(used("ND4J_DETACH1"), 48);
        let copy = array.detach().unwrap();
        assert!(array.is_valid());
        assert_eq!(used("ND4J_DETACH1"), 48, "detach takes no workspace bytes");
        assert_eq!(copy.workspace(), None);
        assert!(copy.is_valid());
        (array, copy)
    };
    assert_eq!(sum(&copy), 15.0);
    assert!(!array.shares_storage(&copy));
    assert!(!array.is_valid());
}

#[test]
fn first_loop_spills_then_bumps_and_cycle_memory_goes_out_of_scope() {
    // ND4J BasicWorkspaceTests.testScope2: the first cycle has no buffer (its array is in
    // scope, spilled); the second bumps 800 bytes; out of the cycle the array is out of
    // scope (ndmem: invalid, semantics §3).
    let ws = workspaces();
    let cfg = loop_first();
    {
        let g = ws.get_and_activate(&cfg, "ND4J_SCOPE2").unwrap();
        let array = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert!(array.is_valid());
        assert_eq!(g.stats().size, 0);
        assert_eq!(g.stats().spilled_bytes, 800);
    }
    let array = {
        let g = ws.get_and_activate(&cfg, "ND4J_SCOPE2").unwrap();
        let array = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert!(array.is_valid());
        assert_eq!(g.stats().used, 800);
        array
    };
    assert!(!array.is_valid());
}

#[test]
fn workspace_memory_is_in_scope_only_during_its_cycle() {
    // ND4J BasicWorkspaceTests.testScope1.
    let ws = workspaces();
    let array = {
        let _g = ws.get_and_activate(&basic(), "ND4J_SCOPE1").unwrap();
        let array = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert!(array.is_valid());
        array
    };
    assert!(!array.is_valid());
}

#[test]
fn leverage_to_the_current_workspace_copies_a_pool_tensor_in() {
    // ND4J BasicWorkspaceTests.testIsAttached3 / testIsAttached2: ND4J's leverageTo returns
    // a detached array itself. ndmem contract (semantics §3): leverage_to copies into the
    // named open workspace; the original stays a pool tensor, and tensors made after the
    // cycle are not attached.
    let ws = workspaces();
    for (cfg, id) in [
        (basic(), "ND4J_ATTACHED3"),
        (loop_first(), "ND4J_ATTACHED2"),
    ] {
        let array = Tensor::zeros(DType::F64, &[100]).unwrap();
        {
            let _g = ws.get_and_activate(&cfg, id).unwrap();
            let leveraged = array.leverage_to(id).unwrap();
            assert_eq!(array.workspace(), None);
            assert_eq!(leveraged.workspace(), Some(id));
            assert!(!leveraged.shares_storage(&array));
        }
        let array2 = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert_eq!(array.workspace(), None);
        assert_eq!(array2.workspace(), None);
        assert!(array.is_valid());
    }
}

#[test]
fn a_spilled_tensor_is_still_attached_to_its_workspace() {
    // ND4J BasicWorkspaceTests.testIsAttached1: in a first loop (no buffer) the array is
    // attached though spilled; outside, arrays are not attached.
    let ws = workspaces();
    {
        let g = ws
            .get_and_activate(&loop_first(), "ND4J_ATTACHED1")
            .unwrap();
        let array = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert_eq!(array.workspace(), Some("ND4J_ATTACHED1"));
        assert_eq!(g.stats().spilled_bytes, 800);
    }
    assert_eq!(Tensor::zeros(DType::F64, &[100]).unwrap().workspace(), None);
}

#[test]
fn over_time_overallocate_learns_twice_the_largest_cycle() {
    // ND4J BasicWorkspaceTests.testOverallocation3: OverTime, Overallocate 1.0, cycles of
    // 10..100 doubles; ND4J then calls initializeWorkspace(): 2 x 800 bytes. Here the
    // learning runs after the 10th cycle (cycles_before_initialization 10).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .max_size(10 * MIB)
        .overallocation_limit(1.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(10)
        .build()
        .unwrap();
    for x in (10..=100).step_by(10) {
        assert_eq!(ws.workspace("ND4J_OVER3").map_or(0, |s| s.size), 0);
        let _g = ws.get_and_activate(&cfg, "ND4J_OVER3").unwrap();
        let _array = Tensor::zeros(DType::F64, &[x]).unwrap();
    }
    assert_eq!(size("ND4J_OVER3"), capacity(200 * 8));
    // Semantics §2.3 Decision: with the default 0, OverTime learns after the first cycle
    // (ND4J's `==` test never fired at 0).
    let zero = cfg
        .to_builder()
        .cycles_before_initialization(0)
        .build()
        .unwrap();
    {
        let _g = ws.get_and_activate(&zero, "ND4J_OVER3_ZERO").unwrap();
        let _array = Tensor::zeros(DType::F64, &[10]).unwrap();
    }
    assert_eq!(size("ND4J_OVER3_ZERO"), capacity(2 * 80));
}

#[test]
fn first_loop_overallocate_learns_twice_the_first_cycle() {
    // ND4J BasicWorkspaceTests.testOverallocation2: 100 doubles x 2.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .max_size(10 * MIB)
        .overallocation_limit(1.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_learning(LearningPolicy::FirstLoop)
        .build()
        .unwrap();
    assert!(ws.workspace("ND4J_OVER2").is_none());
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_OVER2").unwrap();
        let _array = Tensor::zeros(DType::F64, &[100]).unwrap();
    }
    assert_eq!(size("ND4J_OVER2"), capacity(200 * 8));
}

#[test]
fn an_initial_size_is_overallocated_once() {
    // ND4J BasicWorkspaceTests.testOverallocation1: initial 1024, Overallocate 1.0,
    // learning NONE: 2048 from the start.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1024)
        .max_size(10 * MIB)
        .overallocation_limit(1.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&cfg, "ND4J_OVER1").unwrap();
    assert_eq!(g.stats().size, capacity(2048));
}

#[test]
fn scope_out_in_a_cycle_is_not_counted_toward_its_size() {
    // ND4J BasicWorkspaceTests.testToggle1: toggleWorkspaceUse(false) is scope_out(): the
    // detached array does not count toward the learned size (200 doubles, not 300), and in
    // the next cycle it does not move the offset.
    let ws = workspaces();
    let cfg = loop_first();
    for cycle in 0..2 {
        let g = ws.get_and_activate(&cfg, "ND4J_TOGGLE").unwrap();
        let _array1 = Tensor::zeros(DType::F64, &[100]).unwrap();
        {
            let _out = ws.scope_out();
            let detached = Tensor::full(DType::F64, &[100], 1.0).unwrap();
            assert_eq!(detached.workspace(), None);
            assert_eq!(sum(&detached), 100.0);
        }
        if cycle == 1 {
            assert_eq!(g.stats().used, 800);
        }
        let _array2 = Tensor::zeros(DType::F64, &[100]).unwrap();
        if cycle == 1 {
            assert_eq!(g.stats().used, 1600);
        }
        drop(g);
        assert_eq!(used("ND4J_TOGGLE"), 0);
        assert_eq!(size("ND4J_TOGGLE"), capacity(1600));
    }
}

#[test]
fn first_loop_learns_both_arrays_and_later_cycles_rewind() {
    // ND4J BasicWorkspaceTests.testLoop4.
    let ws = workspaces();
    let cfg = loop_first();
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_LOOP4").unwrap();
        let _a = Tensor::zeros(DType::F64, &[100]).unwrap();
        let _b = Tensor::zeros(DType::F64, &[100]).unwrap();
    }
    assert_eq!(used("ND4J_LOOP4"), 0);
    assert_eq!(size("ND4J_LOOP4"), capacity(1600));
    {
        let g = ws.get_and_activate(&cfg, "ND4J_LOOP4").unwrap();
        let _a = Tensor::zeros(DType::F64, &[100]).unwrap();
        assert_eq!(g.stats().used, 800);
    }
    assert_eq!(used("ND4J_LOOP4"), 0);
}

#[test]
fn a_cold_first_loop_spills_and_learns_the_sum_of_its_arrays() {
    // ND4J BasicWorkspaceTests.testLoops3: 100 + 10 doubles in the cold cycle: offset and
    // size 0 meanwhile, then a buffer of 880 bytes.
    let ws = workspaces();
    {
        let g = ws.get_and_activate(&loop_first(), "ND4J_LOOPS3").unwrap();
        let _cold1 = Tensor::zeros(DType::F64, &[100]).unwrap();
        let _cold2 = Tensor::zeros(DType::F64, &[10]).unwrap();
        assert_eq!((g.stats().used, g.stats().size), (0, 0));
    }
    let s = workspaces().workspace("ND4J_LOOPS3").unwrap();
    assert_eq!((s.used, s.max_cycle), (0, 880));
    assert_eq!(s.size, capacity(880));
}

#[test]
fn over_time_spills_every_cycle_until_it_learns_the_largest() {
    // ND4J BasicWorkspaceTests.testLoops2: 100 cold cycles of 1..=100 doubles (offset and
    // size 0 throughout), then initializeWorkspace() (here: after the 100th cycle), then a
    // hot cycle bumps.
    let ws = workspaces();
    let cfg = loop_over_time(100);
    for x in 1..=100 {
        let g = ws.get_and_activate(&cfg, "ND4J_LOOPS2").unwrap();
        let _cold = Tensor::zeros(DType::F64, &[x]).unwrap();
        assert_eq!((g.stats().used, g.stats().size), (0, 0), "cycle {x}");
    }
    assert_eq!(size("ND4J_LOOPS2"), capacity(800));
    assert_eq!(used("ND4J_LOOPS2"), 0);
    let g = ws.get_and_activate(&cfg, "ND4J_LOOPS2").unwrap();
    let _hot = Tensor::zeros(DType::F64, &[10]).unwrap();
    assert_eq!((g.stats().used, g.stats().spilled_bytes), (80, 0));
}

#[test]
fn over_time_learns_the_cold_cycle_and_hot_cycles_fit() {
    // ND4J BasicWorkspaceTests.testLoops1: the cold cycle spills an array and its sum
    // (ND4J: an extra scalar); once learned, ten hot cycles bump the array and the sum's
    // scalar and rewind to 0. (ndmem's op writes a new array where ND4J's addi wrote in
    // place; the learned size is the cold cycle's, 80 + 16 bytes.)
    let ws = workspaces();
    let cfg = loop_over_time(0);
    {
        let g = ws.get_and_activate(&cfg, "ND4J_LOOPS1").unwrap();
        let cold = Tensor::ones(DType::F64, &[10]).unwrap();
        assert_eq!((g.stats().used, g.stats().size), (0, 0));
        assert_eq!(sum(&cold), 10.0);
    }
    assert_eq!(size("ND4J_LOOPS1"), capacity(96));
    for x in 0..10 {
        assert_eq!(used("ND4J_LOOPS1"), 0);
        let g = ws.get_and_activate(&cfg, "ND4J_LOOPS1").unwrap();
        let array = Tensor::ones(DType::F64, &[10]).unwrap();
        assert_eq!(g.stats().used, 80);
        let total = array.sum().unwrap();
        assert_eq!(g.stats().used, 80 + 16);
        assert_eq!(total.scalar().unwrap(), 10.0, "iteration {x}");
        assert_eq!(g.stats().spilled_bytes, 0);
        drop(g);
        assert_eq!(used("ND4J_LOOPS1"), 0);
    }
}

#[test]
fn allocations_and_copies_bump_the_offset() {
    // ND4J BasicWorkspaceTests.testAllocation6 / testAllocation5: a random 100x10 array
    // bumps 1000 doubles and its dup another 1000; a 1x5 array bumps 40 bytes rounded to
    // 48 (ND4J: reqMemory + reqMemory % 16), its dup 48 more, and reads 5.
    let ws = workspaces();
    {
        let g = ws.get_and_activate(&basic(), "ND4J_ALLOC6").unwrap();
        assert_eq!(g.stats().used, 0);
        let array = Tensor::rand(DType::F64, &[100, 10], 6).unwrap();
        assert_eq!(g.stats().used, 8000);
        let dup = array.copy().unwrap();
        assert_eq!(g.stats().used, 16_000);
        assert_eq!(dup.workspace(), Some("ND4J_ALLOC6"));
        assert_eq!(dup.to_vec::<f64>().unwrap(), array.to_vec::<f64>().unwrap());
    }
    let g = ws.get_and_activate(&basic(), "ND4J_ALLOC5").unwrap();
    let array = Tensor::full(DType::F64, &[1, 5], 1.0).unwrap();
    assert_eq!(g.stats().used, 48);
    let dup = array.copy().unwrap();
    assert_eq!(g.stats().used, 2 * 48);
    assert_eq!(sum(&dup), 5.0);
}

#[test]
fn a_fail_workspace_refuses_a_too_large_array_and_keeps_its_offset() {
    // ND4J BasicWorkspaceTests.testAllocation4: SpillPolicy FAIL with a 1 MiB buffer: 10^7
    // doubles are refused (ND4JIllegalStateException; here Error::WorkspaceFull), the
    // offset stays, and the next small array still bumps.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(MIB)
        .max_size(MIB)
        .overallocation_limit(0.1)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_spill(SpillPolicy::Fail)
        .build()
        .unwrap();
    let g = ws.get_and_activate(&cfg, "ND4J_ALLOC4").unwrap();
    assert_eq!(g.stats().used, 0);
    let _array = Tensor::zeros(DType::F64, &[1, 5]).unwrap();
    assert_eq!(g.stats().used, 48);
    match Tensor::zeros(DType::F64, &[10_000_000]) {
        Err(Error::WorkspaceFull {
            workspace,
            requested,
            ..
        }) => {
            assert_eq!(workspace, "ND4J_ALLOC4");
            assert!(requested >= 80_000_000);
        }
        other => panic!("expected WorkspaceFull, got {other:?}"),
    }
    assert_eq!(g.stats().used, 48);
    let _array2 = Tensor::zeros(DType::F64, &[1, 5]).unwrap();
    assert_eq!(g.stats().used, 2 * 48);
}

#[test]
fn arrays_in_a_workspace_hold_their_values_through_ops() {
    // ND4J BasicWorkspaceTests.testAllocation1 / 2 / 3.
    let ws = workspaces();
    let _g = ws.get_and_activate(&basic(), "ND4J_ALLOC1").unwrap();
    assert_eq!(used("ND4J_ALLOC1"), 0);
    let array = doubles(&FIVE);
    assert_eq!(used("ND4J_ALLOC1"), 48);
    assert_eq!(array.to_vec::<f64>().unwrap(), FIVE);
    assert_eq!(sum(&array), 15.0);
    let array2 = doubles(&[5.0, 4.0, 3.0, 2.0, 1.0]);
    assert_eq!(sum(&array2), 15.0);
    let added = array.add(&array2).unwrap();
    assert_eq!(sum(&added), 30.0);
    assert_eq!(added.to_vec::<f64>().unwrap(), [6.0; 5]);
    let ones = Tensor::full(DType::F64, &[5], 1.0).unwrap();
    assert_eq!(sum(&ones), 5.0);
    assert_eq!(added.workspace(), Some("ND4J_ALLOC1"));
}

#[test]
fn stale_arrays_cannot_be_leveraged_migrated_detached_or_copied() {
    // ND4J BasicWorkspaceTests.testInvalidLeverageMigrateDetach: an array from a cycle
    // that has ended (ND4JWorkspaceException; here LeakedWorkspacePointer) is refused by
    // leverage, leverage_to, detach, migrate and dup, inside another workspace or not.
    let ws = workspaces();
    let mut invalid = None;
    for _ in 0..10 {
        let _g = ws.get_and_activate(&basic(), "ND4J_INVALID").unwrap();
        invalid = Some(Tensor::from_slice(&[1.0f64; 10], &[10]).unwrap());
    }
    let invalid = invalid.unwrap();
    assert_eq!(invalid.workspace(), Some("ND4J_INVALID"));
    let leaked = |r: Result<Tensor, Error>| {
        assert!(
            matches!(r, Err(Error::LeakedWorkspacePointer { .. })),
            "{r:?}"
        )
    };
    {
        let _g2 = ws.get_and_activate(&basic(), "ND4J_INVALID2").unwrap();
        leaked(invalid.leverage());
        leaked(invalid.leverage_to("ND4J_INVALID2"));
        leaked(invalid.migrate());
        leaked(invalid.detach());
        leaked(invalid.copy());
    }
    leaked(invalid.leverage_to("ND4J_INVALID2"));
    leaked(invalid.detach());
    leaked(invalid.migrate());
    leaked(invalid.copy());
    ws.destroy_all_for_current_thread();
}

#[test]
fn arrays_of_an_earlier_generation_cannot_be_leveraged_migrated_detached_or_copied() {
    // ND4J BasicWorkspaceTests.testBadGenerationLeverageMigrateDetach: an array of
    // generation 3 used in generation 4 of the same (open) workspace is outdated.
    let ws = workspaces();
    let mut gen = None;
    for i in 0..4 {
        let outer = ws.get_and_activate(&basic(), "ND4J_BADGEN").unwrap();
        let arr = Tensor::from_slice(&[1.0f64; 10], &[10]).unwrap();
        if i == 2 {
            gen = Some(arr);
        } else if i == 3 {
            let _inner = ws.get_and_activate(&basic(), "ND4J_BADGEN2").unwrap();
            let stale = gen.as_ref().unwrap();
            let outdated = |r: Result<Tensor, Error>| match r {
                Err(Error::OutdatedWorkspacePointer {
                    allocated_in,
                    current,
                    ..
                }) => assert_eq!((allocated_in, current), (3, 4)),
                other => panic!("expected OutdatedWorkspacePointer, got {other:?}"),
            };
            outdated(stale.leverage());
            outdated(stale.leverage_to("ND4J_BADGEN2"));
            outdated(stale.detach());
            outdated(stale.migrate());
            outdated(stale.copy());
            assert_eq!(outer.generation(), 4);
        }
    }
}

#[test]
fn a_mapped_workspace_reads_back_its_data_in_the_next_cycle() {
    // ND4J BasicWorkspaceTests.testMmap1: 100 doubles of 10 in a memory-mapped workspace;
    // the next cycle's uninitialised allocation at the same offset reads the same bytes.
    // (ndmem creates only initialised tensors, so the read-back goes through the guard's
    // raw allocation.)
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1_000_000)
        .policy_location(ndmem::LocationPolicy::Mmap { path: None })
        .build()
        .unwrap();
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_MMAP1").unwrap();
        let array = Tensor::full(DType::F64, &[100], 10.0).unwrap();
        assert_eq!(array.workspace(), Some("ND4J_MMAP1"));
        assert_eq!(sum(&array), 1000.0);
    }
    let g = ws.get_and_activate(&cfg, "ND4J_MMAP1").unwrap();
    let again = g.alloc_memory(layout(800)).unwrap();
    again.stamp.check("sum", "X").unwrap();
    let bytes = crate::read(&again);
    let total: f64 = bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
        .sum();
    assert_eq!(total, 1000.0);
}

// ---- WorkspaceProviderTests -------------------------------------------------------------

/// ND4J's `WorkspaceProviderTests.basicConfiguration`: 81920 bytes x 1.1, learning NONE.
fn provider_basic() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(81_920)
        .overallocation_limit(0.1)
        .policy_spill(SpillPolicy::External)
        .policy_learning(LearningPolicy::None)
        .policy_allocation(AllocationPolicy::Overallocate)
        .build()
        .unwrap()
}

/// ND4J's `loopConfiguration` (cycles_before_initialization 0) and
/// `delayedConfiguration` (3): OverTime, Strict, External.
fn provider_loop(cycles_before_initialization: u64) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .overallocation_limit(0.1)
        .policy_spill(SpillPolicy::External)
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(cycles_before_initialization)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .unwrap()
}

/// ND4J's `circularConfiguration`: min 10 MiB, limit 1.0, Strict, circular.
fn provider_circular() -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .min_size(10 * MIB)
        .overallocation_limit(1.0)
        .policy_spill(SpillPolicy::External)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap()
}

fn floats(n: usize) -> Tensor {
    Tensor::zeros(DType::F32, &[n]).unwrap()
}

#[test]
fn a_circular_over_time_workspace_learns_after_its_delay() {
    // ND4J WorkspaceProviderTests.testUnboundedLoop2: circular, OverTime after 5 cycles,
    // Overallocate 4.0, cycles of 100 floats: no buffer before the 5th cycle ends, then
    // a block of 400 x 1.3 (ND4J: 528 with its padding; round16(520) = 528 here) and a
    // buffer of 5 blocks.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_allocation(AllocationPolicy::Overallocate)
        .overallocation_limit(4.0)
        .policy_learning(LearningPolicy::OverTime)
        .cycles_before_initialization(5)
        .build()
        .unwrap();
    for x in 0..100 {
        {
            let _g = ws.get_and_activate(&cfg, "ND4J_UNBOUNDED2").unwrap();
            let _array = floats(100);
        }
        let s = ws.workspace("ND4J_UNBOUNDED2").unwrap();
        if x > 4 {
            assert_eq!((s.size, s.slots), (capacity(5 * 528), 5), "iteration {x}");
            assert_eq!(s.spilled_bytes, 0);
        } else if x < 4 {
            assert_eq!(s.size, 0, "iteration {x}: not initialised early");
        }
    }
    assert_eq!(ws.current(), None);
}

#[test]
fn a_strict_circular_workspace_reuses_its_one_slot_when_nothing_holds_it() {
    // ND4J WorkspaceProviderTests.testUnboundedLoop1: circular Strict with 100 x 100
    // floats; ND4J walks the buffer 400 bytes per cycle. ndmem contract (semantics §2.4):
    // Strict gives one slot, every cycle starts at a slot boundary and, nothing referring
    // to the previous cycle's memory, reuses the same slot without spilling.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(100 * 100 * 4)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .unwrap();
    let mut first = None;
    for x in 0..100 {
        let g = ws.get_and_activate(&cfg, "ND4J_UNBOUNDED1").unwrap();
        let m = g.alloc_memory(layout(400)).unwrap();
        assert_eq!(*first.get_or_insert(m.ptr), m.ptr, "cycle {x}");
        assert_eq!(g.stats().spilled_bytes, 0);
        let array = floats(100);
        assert_eq!(array.workspace(), Some("ND4J_UNBOUNDED1"));
        assert_eq!(g.stats().used, 800);
    }
    let s = ws.workspace("ND4J_UNBOUNDED1").unwrap();
    assert_eq!((s.slots, s.size), (1, capacity(40_000)));
    assert_eq!(s.total_spilled_bytes, 0);
    assert_eq!(ws.current(), None);
}

#[test]
fn each_thread_gets_its_own_workspace_under_one_id() {
    // ND4J WorkspaceProviderTests.testMultithreading1: 20 threads asking for the same
    // workspace get 20 different workspaces (semantics §2.5: per thread).
    let ws = workspaces();
    let _mine = ws.get_and_activate(&provider_basic(), "ND4J_MT").unwrap();
    let here = ws.workspace("ND4J_MT").unwrap();
    // Every thread keeps its workspace until all have made theirs, so none is freed (and
    // its memory reused) before the addresses are compared.
    let all_made = std::sync::Arc::new(std::sync::Barrier::new(20));
    let threads: Vec<_> = (0..20)
        .map(|_| {
            let all_made = std::sync::Arc::clone(&all_made);
            std::thread::spawn(move || {
                let ws = workspaces();
                assert!(!ws.exists("ND4J_MT"), "a new thread has none yet");
                let g = ws.get_and_activate(&provider_basic(), "ND4J_MT").unwrap();
                assert_eq!(g.generation(), 1);
                let base = g.alloc_memory(layout(64)).unwrap().ptr.as_ptr() as usize;
                all_made.wait();
                base
            })
        })
        .collect();
    let mut bases: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    bases.sort_unstable();
    bases.dedup();
    assert_eq!(bases.len(), 20, "20 distinct buffers");
    assert_eq!(ws.workspace("ND4J_MT").unwrap().generation, here.generation);
    assert_eq!(ws.current().as_deref(), Some("ND4J_MT"));
}

#[test]
fn borrowing_an_open_outer_workspace_allocates_there_and_restores_the_inner() {
    // ND4J WorkspaceProviderTests.testNestedWorkspacesOverlap2 / Overlap1: with WS2 current,
    // WS1 (open) is borrowed: allocations and copies land in WS1, WS2's offset stays; once
    // the borrow ends WS2 is current again and the copy is still readable. Borrowing is
    // re-entry here: no new generation, no rewind (semantics §2.2).
    let ws = workspaces();
    let ws1 = ws
        .get_and_activate(&provider_basic(), "ND4J_OVERLAP1")
        .unwrap();
    let _array = doubles(&[6.0, 3.0, 1.0, 9.0, 21.0]);
    assert_eq!(ws1.stats().used, 48);
    let array3 = {
        let ws2 = ws
            .get_and_activate(&provider_basic(), "ND4J_OVERLAP2")
            .unwrap();
        let array2 = doubles(&FIVE);
        assert_eq!((ws1.stats().used, ws2.stats().used), (48, 48));
        let array3 = {
            let ws3 = ws
                .get_and_activate(&provider_basic(), "ND4J_OVERLAP1")
                .unwrap();
            assert_eq!(ws.current().as_deref(), Some("ND4J_OVERLAP1"));
            assert_eq!(ws3.generation(), ws1.generation());
            let array3 = array2.copy().unwrap();
            assert_eq!(array3.workspace(), Some("ND4J_OVERLAP1"));
            assert_eq!(ws2.stats().used, 48);
            assert_eq!(ws1.stats().used, 2 * 48);
            // Floats (testNestedWorkspacesOverlap1): 20 bytes, padded to 32 as in ND4J.
            let _f = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5]).unwrap();
            assert_eq!(ws1.stats().used, 96 + 32);
            assert_eq!(ws2.stats().used, 48);
            array3
        };
        assert_eq!(ws.current().as_deref(), Some("ND4J_OVERLAP2"));
        assert_eq!((ws1.stats().used, ws2.stats().used), (128, 48));
        assert_eq!(sum(&array3), 15.0);
        array3
    };
    assert_eq!(ws.current().as_deref(), Some("ND4J_OVERLAP1"));
    assert_eq!(sum(&array3), 15.0, "WS1's cycle still runs");
    drop(ws1);
    assert_eq!(ws.current(), None);
    assert!(!array3.is_valid());
}

#[test]
fn a_circular_workspace_learns_min_size_and_releases_its_first_spill() {
    // ND4J WorkspaceProviderTests.testCircularBufferReset1: the first cycle spills 10000
    // floats (size 0, one external allocation); then the buffer is min_size (10 MiB) and
    // after cycles covering 11 MiB no spill is left.
    let ws = workspaces();
    {
        let g = ws
            .get_and_activate(&provider_circular(), "ND4J_WSR1")
            .unwrap();
        let _a = floats(10_000);
        assert_eq!(g.stats().size, 0);
        assert_eq!(g.stats().spilled_bytes, 40_000);
    }
    let s = ws.workspace("ND4J_WSR1").unwrap();
    assert_eq!(s.size, capacity(10 * MIB));
    assert_eq!(s.used, 0);
    assert_eq!(
        s.pinned_bytes,
        capacity(40_000),
        "the first cycle's spill is pinned"
    );
    // Slots of 40,000 x 1.3 bytes, as many as min_size holds (semantics §2.4).
    assert_eq!(s.slots, 10 * MIB / 52_000);
    for _ in (0..11 * MIB).step_by(40_000) {
        let g = ws
            .get_and_activate(&provider_circular(), "ND4J_WSR1")
            .unwrap();
        let _a = floats(10_000);
        assert_eq!(g.stats().spilled_bytes, 0);
    }
    let s = ws.workspace("ND4J_WSR1").unwrap();
    assert_eq!((s.pinned_bytes, s.spilled_bytes), (0, 0));
    assert_eq!(s.total_spilled_bytes, 40_000);
}

#[test]
fn a_circular_reallocate_workspace_grows_after_a_larger_input() {
    // ND4J WorkspaceProviderTests.testVariableInput1: circular, Overallocate 3.0,
    // Reallocate. The first cycle of 8x128x100 doubles learns block = 819,200 x 1.3 and
    // 4 blocks; the second cycle starts one block in; a larger cycle (8x128x200) spills
    // (pinned) and leaves the offsets; the ring is rebuilt for it afterwards (ND4J: when
    // the ring comes round; ndmem: two cycles after the spill, slots of max_cycle, the
    // same slot count), and the larger input then fits.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .overallocation_limit(3.0)
        .policy_spill(SpillPolicy::Reallocate)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap();
    let small = 8 * 128 * 100 * 8;
    let block = 1_064_960; // 819,200 x 1.3, a multiple of 16
    {
        let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
        g.alloc_memory(layout(small)).unwrap(); // spills: no ring yet
    }
    let s = ws.workspace("ND4J_ADSI").unwrap();
    assert_eq!((s.size, s.slots, s.cycles), (capacity(4 * block), 4, 1));
    let slot0 = {
        let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
        let m0 = g.alloc_memory(layout(small)).unwrap();
        assert_eq!(g.stats().spilled_bytes, 0);
        m0.ptr.as_ptr() as usize
    };
    let next = {
        let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
        let m = g.alloc_memory(layout(small)).unwrap();
        m.ptr.as_ptr() as usize
    };
    assert_eq!(next - slot0, block, "each cycle starts one block further");
    {
        let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
        let _big = g.alloc_memory(layout(2 * small)).unwrap();
        assert_eq!((g.stats().used, g.stats().spilled_bytes), (0, 2 * small));
    }
    let s = ws.workspace("ND4J_ADSI").unwrap();
    assert_eq!((s.size, s.cycles), (capacity(4 * block), 4));
    assert_eq!(s.pinned_bytes, capacity(2 * small), "the spill is pinned");
    for _ in 0..12 {
        let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
        let _m = g.alloc_memory(layout(small)).unwrap();
    }
    let s = ws.workspace("ND4J_ADSI").unwrap();
    assert_eq!((s.max_cycle, s.slots), (2 * small, 4));
    assert_eq!(s.size, capacity(4 * 2 * small));
    assert_eq!(s.pinned_bytes, 0);
    let g = ws.get_and_activate(&cfg, "ND4J_ADSI").unwrap();
    let _big = g.alloc_memory(layout(2 * small)).unwrap();
    assert_eq!(g.stats().spilled_bytes, 0, "the larger input fits now");
}

#[test]
fn reallocate_grows_with_each_larger_cycle_and_never_shrinks() {
    // ND4J WorkspaceProviderTests.testReallocate3: Reallocate, OverTime, Overallocate 0.0;
    // cycles of 100 x i floats for i = 1..10, then back down. ND4J initialises explicitly
    // at i = 3; here learning runs after the first cycle (semantics §2.3 Decision), and
    // every larger cycle that spills reallocates the buffer to max_cycle: after the loop up
    // it holds 4000 bytes, and the loop down neither spills nor shrinks it.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .overallocation_limit(0.0)
        .policy_spill(SpillPolicy::Reallocate)
        .policy_learning(LearningPolicy::OverTime)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_reset(ResetPolicy::BlockLeft)
        .build()
        .unwrap();
    for i in 1..=10 {
        {
            let _g = ws.get_and_activate(&cfg, "ND4J_REALLOC3").unwrap();
            let _array = floats(100 * i);
        }
        let s = ws.workspace("ND4J_REALLOC3").unwrap();
        assert_eq!(s.max_cycle, 400 * i);
        assert!(
            (400 * i..=capacity(400 * i)).contains(&s.size),
            "iteration {i}: {s:?}"
        );
    }
    let learned = size("ND4J_REALLOC3");
    for i in (1..=10).rev() {
        let g = ws.get_and_activate(&cfg, "ND4J_REALLOC3").unwrap();
        let _array = floats(100 * i);
        assert_eq!(g.stats().spilled_bytes, 0);
    }
    assert_eq!(size("ND4J_REALLOC3"), learned);
    assert!(learned >= 4000);
}

#[test]
fn delayed_reallocate_starts_at_its_delay_then_follows_each_cycle() {
    // ND4J WorkspaceProviderTests.testReallocate2: OverTime after 3 cycles, Reallocate,
    // Strict: no buffer for cycles 1 and 2, then a buffer holding cycle i's 100 x i
    // floats after every cycle i >= 3.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .overallocation_limit(0.1)
        .policy_spill(SpillPolicy::Reallocate)
        .cycles_before_initialization(3)
        .policy_learning(LearningPolicy::OverTime)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .unwrap();
    for i in 1..=10 {
        {
            let _g = ws.get_and_activate(&cfg, "ND4J_REALLOC2").unwrap();
            let _array = floats(100 * i);
        }
        let s = size("ND4J_REALLOC2");
        if i >= 3 {
            assert!(
                (400 * i..=capacity(400 * i)).contains(&s),
                "iteration {i}: {s}"
            );
        } else {
            assert_eq!(s, 0, "iteration {i}");
        }
    }
}

#[test]
fn a_circular_workspace_starts_each_cycle_in_the_next_block() {
    // ND4J WorkspaceProviderTests.testCircularLearning1: circular with min_size 10 MiB:
    // the buffer is 10 MiB after the first cycle, and the second cycle starts one block
    // after the first.
    let ws = workspaces();
    let mut starts = Vec::new();
    for _ in 0..3 {
        let g = ws
            .get_and_activate(&provider_circular(), "ND4J_WSX")
            .unwrap();
        let m = g.alloc_memory(layout(40)).unwrap();
        starts.push(m.ptr.as_ptr() as usize);
        drop(g);
        assert_eq!(size("ND4J_WSX"), capacity(10 * MIB));
    }
    let s = ws.workspace("ND4J_WSX").unwrap();
    let block = 64; // round16(40 x 1.3)
    assert!(s.slots > 1);
    assert_eq!(starts[2] - starts[1], block);
}

#[test]
fn reallocate_over_time_follows_the_larger_cycle() {
    // ND4J WorkspaceProviderTests.testReallocate1: OverTime, Reallocate, Strict: 100 floats
    // learn 400 bytes; a cycle of 1000 floats makes max_cycle 4000 and the buffer 4000;
    // then 500 floats of 1.0 fit and read back a mean of 1.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .overallocation_limit(0.1)
        .policy_spill(SpillPolicy::Reallocate)
        .policy_learning(LearningPolicy::OverTime)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .unwrap();
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_REALLOC1").unwrap();
        let _array = floats(100);
    }
    assert_eq!(size("ND4J_REALLOC1"), capacity(400));
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_REALLOC1").unwrap();
        let _array = floats(1000);
    }
    let s = ws.workspace("ND4J_REALLOC1").unwrap();
    assert_eq!(s.max_cycle, 4000);
    assert_eq!(s.size, capacity(4000));
    let g = ws.get_and_activate(&cfg, "ND4J_REALLOC1").unwrap();
    let array = Tensor::full(DType::F32, &[500], 1.0).unwrap();
    assert_eq!(array.mean().unwrap().scalar().unwrap(), 1.0);
    assert_eq!(g.stats().spilled_bytes, 0);
}

#[test]
fn re_entering_an_open_workspace_twice_keeps_one_cycle() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces10: WS_1 entered, re-entered and
    // borrowed inside itself: every allocation goes to the one running cycle, and the
    // cycle ends with the outermost guard.
    let ws = workspaces();
    for x in 1..10 {
        let ws1 = ws
            .get_and_activate(&provider_basic(), "ND4J_NESTED10")
            .unwrap();
        let generation = ws1.generation();
        let _a1 = floats(100 * x);
        {
            let ws2 = ws
                .get_and_activate(&provider_basic(), "ND4J_NESTED10")
                .unwrap();
            let _a2 = floats(100 * x);
            {
                let ws3 = ws
                    .get_and_activate(&provider_basic(), "ND4J_NESTED10")
                    .unwrap();
                let _a3 = floats(100 * x);
                assert_eq!(ws3.generation(), generation);
                assert_eq!(ws3.stats().used, 3 * 400 * x);
            }
            assert_eq!(ws2.stats().used, 3 * 400 * x);
        }
        assert!(ws1.stats().open);
        drop(ws1);
        let s = ws.workspace("ND4J_NESTED10").unwrap();
        assert_eq!((s.cycles, s.used), (x as u64, 0));
    }
}

#[test]
fn over_time_with_a_delay_learns_the_largest_of_its_first_cycles() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces9: OverTime after 3 cycles, Strict,
    // cycles of 100 x x floats for x = 1..9: 300 floats, the largest of the first three
    // (External never grows it afterwards).
    let ws = workspaces();
    for x in 1..10 {
        let _g = ws
            .get_and_activate(&provider_loop(3), "ND4J_NESTED9")
            .unwrap();
        let _array = floats(100 * x);
    }
    assert_eq!(size("ND4J_NESTED9"), capacity(300 * 4));
}

#[test]
fn over_time_learns_once_and_external_spills_never_grow_it() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces8: 100 floats learn 400 bytes; a
    // cycle of 1000 floats spills and leaves the size at 400.
    let ws = workspaces();
    {
        let _g = ws
            .get_and_activate(&provider_loop(0), "ND4J_NESTED8")
            .unwrap();
        let _array = floats(100);
    }
    assert_eq!(size("ND4J_NESTED8"), capacity(400));
    {
        let g = ws
            .get_and_activate(&provider_loop(0), "ND4J_NESTED8")
            .unwrap();
        let _array = floats(1000);
        assert_eq!(g.stats().spilled_bytes, 4000);
    }
    assert_eq!(size("ND4J_NESTED8"), capacity(400));
}

fn nested_borrow_and_scope_out(cfg: &WorkspaceConfig, external: &str, feed_forward: &str) {
    let ws = workspaces();
    let _ext = ws.get_and_activate(cfg, external).unwrap();
    let _array1 = floats(10);
    let _ff = ws.get_and_activate(cfg, feed_forward).unwrap();
    let array2 = floats(10);
    assert_eq!(array2.workspace(), Some(feed_forward));
    let (array3, array4, array5) = {
        let _borrowed = ws.get_and_activate(cfg, external).unwrap();
        let array3 = floats(10);
        assert_eq!(array3.workspace(), Some(external));
        let array4 = {
            let _out = ws.scope_out();
            floats(10)
        };
        let array5 = floats(10);
        assert_eq!(array4.workspace(), None);
        assert_eq!(array5.workspace(), Some(external));
        (array3, array4, array5)
    };
    assert_eq!(ws.current().as_deref(), Some(feed_forward));
    assert!(array3.is_valid() && array5.is_valid());
    assert_eq!(array3.workspace(), Some(external));
    assert_eq!(array4.workspace(), None);
    assert_eq!(array5.workspace(), Some(external));
}

#[test]
fn a_borrowed_outer_workspace_and_scope_out_place_arrays_where_asked() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces7 (fixed buffers) and
    // testNestedWorkspaces6 (first loop, so "External" still has no buffer at the end of
    // its first cycle).
    nested_borrow_and_scope_out(&provider_basic(), "ND4J_NESTED7_EXT", "ND4J_NESTED7_FF");
    let first = WorkspaceConfig::builder()
        .overallocation_limit(0.1)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_allocation(AllocationPolicy::Strict)
        .build()
        .unwrap();
    let ws = workspaces();
    {
        let _outer = ws.get_and_activate(&first, "ND4J_NESTED6_EXT").unwrap();
        nested_borrow_and_scope_out(&first, "ND4J_NESTED6_EXT", "ND4J_NESTED6_FF");
        assert_eq!(size("ND4J_NESTED6_EXT"), 0);
    }
    assert_eq!(size("ND4J_NESTED6_EXT"), capacity(3 * 48));
}

#[test]
fn re_entering_the_same_workspace_does_not_rewind_it() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces5: 100 floats, re-entry, 100 more:
    // 800 bytes after the inner leave, 1200 after a third array.
    let ws = workspaces();
    let ws1 = ws
        .get_and_activate(&provider_basic(), "ND4J_NESTED5")
        .unwrap();
    let _a1 = floats(100);
    {
        let _ws2 = ws
            .get_and_activate(&provider_basic(), "ND4J_NESTED5")
            .unwrap();
        let _a2 = floats(100);
    }
    assert_eq!(ws1.stats().used, 800);
    let _a3 = floats(100);
    assert_eq!(ws1.stats().used, 1200);
    drop(ws1);
    assert_eq!(ws.current(), None);
}

#[test]
fn nested_workspaces_each_take_their_own_arrays() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces4 / 3 / 1: three levels each bump
    // 400 bytes; after an inner one closes, the next array goes to the enclosing one;
    // siblings start at 0; everything rewinds when closed.
    let ws = workspaces();
    let cfg = provider_basic();
    {
        let ws1 = ws.get_and_activate(&cfg, "ND4J_N4_WS1").unwrap();
        let _a1 = floats(100);
        {
            let ws2 = ws.get_and_activate(&cfg, "ND4J_N4_WS2").unwrap();
            assert_eq!(ws2.stats().used, 0);
            let _a2 = floats(100);
            {
                let ws3 = ws.get_and_activate(&cfg, "ND4J_N4_WS3").unwrap();
                let _a3 = floats(100);
                assert_eq!(parent_of_current().as_deref(), Some("ND4J_N4_WS2"));
                assert_eq!(ws1.stats().used, 400);
                assert_eq!(ws2.stats().used, 400);
                assert_eq!(ws3.stats().used, 400);
            }
            let _a2b = floats(100);
            assert_eq!(ws2.stats().used, 800);
        }
        {
            let ws3 = ws.get_and_activate(&cfg, "ND4J_N4_WS3").unwrap();
            assert_eq!(ws3.stats().used, 0, "a sibling starts at 0");
            let _a = floats(100);
            assert_eq!((ws1.stats().used, ws3.stats().used), (400, 400));
            assert_eq!(parent_of_current().as_deref(), Some("ND4J_N4_WS1"));
        }
        let _a1b = floats(100);
        assert_eq!(ws1.stats().used, 800);
    }
    for id in ["ND4J_N4_WS1", "ND4J_N4_WS2", "ND4J_N4_WS3"] {
        assert_eq!(used(id), 0);
    }
    assert_eq!(ws.current(), None);
    let count = ws.statistics().len();
    assert_eq!(ws.destroy_all_for_current_thread(), count);
    assert!(ws.statistics().is_empty());
}

#[test]
fn an_inner_loop_workspace_counts_each_cycle_and_learns_the_largest() {
    // ND4J WorkspaceProviderTests.testNestedWorkspaces2: inside WS1, an OverTime WS2 runs
    // 100 cycles of x floats; each cycle counts x x 4 bytes padded to 16 (ND4J's
    // lastCycleAllocations), and the largest, 400 bytes, is max_cycle. ND4J initialises
    // explicitly at the end (400 bytes); with the default delay ndmem learned from the
    // first cycle (semantics §2.3 Decision), with 100 cycles of delay from the largest.
    let ws = workspaces();
    let _ws1 = ws
        .get_and_activate(&provider_basic(), "ND4J_N2_WS1")
        .unwrap();
    let _a1 = floats(100);
    assert_eq!(used("ND4J_N2_WS1"), 400);
    for (cfg, id) in [
        (provider_loop(0), "ND4J_N2_WS2"),
        (provider_loop(100), "ND4J_N2_WS2_DELAYED"),
    ] {
        for x in 1..=100 {
            let g = ws.get_and_activate(&cfg, id).unwrap();
            assert_eq!(parent_of_current().as_deref(), Some("ND4J_N2_WS1"));
            let _a2 = floats(x);
            let s = g.stats();
            // A bump and a spill both count the size rounded to 16.
            assert_eq!(
                s.used + s.spilled_bytes,
                (4 * x).next_multiple_of(16),
                "{x}"
            );
        }
        assert_eq!(ws.workspace(id).unwrap().max_cycle, 400);
    }
    assert_eq!(size("ND4J_N2_WS2"), capacity(16));
    assert_eq!(size("ND4J_N2_WS2_DELAYED"), capacity(400));
    assert_eq!(used("ND4J_N2_WS1"), 400);
}

#[test]
fn a_thread_s_workspaces_are_freed_when_it_exits() {
    // ND4J WorkspaceProviderTests.testWorkspaceGc_1: ten threads each create a 1 MB
    // workspace and exit without destroying it; ND4J relies on the garbage collector.
    // ndmem contract (semantics §2.2 Decision): the thread's exit frees it, so the pool
    // they drew from holds nothing afterwards.
    use ndmem::alloc::{Limits, Pool};
    let source = MemorySource::new(Pool::new(Limits::unlimited()));
    for e in 0..10 {
        std::thread::spawn(move || {
            let cfg = WorkspaceConfig::builder()
                .initial_size(1_000_000)
                .source(source)
                .build()
                .unwrap();
            let _g = workspaces()
                .get_and_activate(&cfg, &format!("ND4J_GC_{e}"))
                .unwrap();
            let array = Tensor::zeros(DType::F32, &[2, 2]).unwrap();
            assert_eq!(array.workspace(), Some(format!("ND4J_GC_{e}").as_str()));
            assert!(source.pool().stats().live_bytes >= 1_300_000);
        })
        .join()
        .unwrap();
        assert_eq!(source.pool().stats().live_bytes, 0, "thread {e}");
    }
}

// ---- SpecialWorkspaceTests --------------------------------------------------------------

/// ND4J's variable-time-series configuration: circular, learned in the first loop,
/// Overallocate 3.0 (4 slots).
fn time_series(spill: SpillPolicy) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .overallocation_limit(3.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_spill(spill)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .build()
        .unwrap()
}

/// `b - a` on a ring of `ring` bytes.
fn ring_distance(a: usize, b: usize, ring: usize) -> usize {
    (b + ring - a) % ring
}

#[test]
fn a_circular_external_workspace_pins_oversized_cycles_and_walks_its_slots() {
    // ND4J SpecialWorkspaceTests.testVariableTimeSeries1: the first cycle (2 x 500 floats)
    // learns block = 4000 x 1.3 = 5200 and 4 blocks; a cycle of 2000 floats does not fit
    // a block and is pinned; every cycle of 2 x 500 floats then starts one block further;
    // a cycle of 3 x 500 floats spills its third array, counted in the cycle (1500 floats),
    // and pinned spills are gone once cycles that fit have run. ndmem contract (semantics
    // §2.4): spills stay pinned for two cycles (ND4J: until the ring comes round), and
    // External never grows the ring.
    let ws = workspaces();
    let cfg = time_series(SpillPolicy::External);
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_VTS1").unwrap();
        let _a = floats(500);
        let _b = floats(500);
    }
    let block = 5200;
    let s = ws.workspace("ND4J_VTS1").unwrap();
    assert_eq!((s.max_cycle, s.total_spilled_bytes), (4000, 4000));
    assert_eq!((s.size, s.slots), (capacity(4 * block), 4));
    assert_eq!(s.pinned_bytes, 2 * capacity(2000));
    {
        let g = ws.get_and_activate(&cfg, "ND4J_VTS1").unwrap();
        let _big = floats(2000);
        assert_eq!((g.stats().used, g.stats().spilled_bytes), (0, 8000));
    }
    let s = ws.workspace("ND4J_VTS1").unwrap();
    assert_eq!((s.used, s.spilled_bytes), (0, 0));
    assert!(s.pinned_bytes >= capacity(8000));
    let mut last = None;
    for e in 0..4 {
        for i in 0..4 {
            let g = ws.get_and_activate(&cfg, "ND4J_VTS1").unwrap();
            let m = g.alloc_memory(layout(2000)).unwrap();
            let _b = floats(500);
            assert_eq!(g.stats().spilled_bytes, 0);
            let at = m.ptr.as_ptr() as usize;
            if let Some(prev) = last {
                assert_eq!(ring_distance(prev, at, 4 * block), block, "{e}/{i}");
            }
            last = Some(at);
        }
        assert_eq!(ws.workspace("ND4J_VTS1").unwrap().pinned_bytes, 0, "{e}");
    }
    for _ in 0..100 {
        let g = ws.get_and_activate(&cfg, "ND4J_VTS1").unwrap();
        let _a = floats(500);
        let _b = floats(500);
        let _c = floats(500);
        let s = g.stats();
        assert_eq!(s.used.next_multiple_of(16) + s.spilled_bytes, 6000);
        assert_eq!(s.spilled_bytes, 2000);
    }
    let s = ws.workspace("ND4J_VTS1").unwrap();
    assert_eq!(s.spilled_bytes, 0);
    assert_ne!(s.pinned_bytes, 0);
    assert_eq!(s.size, capacity(4 * block), "External never grows the ring");
    for _ in 0..100 {
        let _g = ws.get_and_activate(&cfg, "ND4J_VTS1").unwrap();
        let _a = floats(500);
        let _b = floats(500);
    }
    let s = ws.workspace("ND4J_VTS1").unwrap();
    assert_eq!((s.spilled_bytes, s.pinned_bytes), (0, 0));
}

#[test]
fn a_circular_reallocate_workspace_rebuilds_for_longer_series() {
    // ND4J SpecialWorkspaceTests.testVariableTimeSeries2: as above with Reallocate: after
    // 100 cycles of 3 x 500 floats the ring has 4 blocks of the larger cycle (ND4J: 4 x its
    // new initial block; ndmem: slots of max_cycle, the same count) and nothing is pinned
    // or spilled.
    let ws = workspaces();
    let cfg = time_series(SpillPolicy::Reallocate);
    {
        let _g = ws.get_and_activate(&cfg, "ND4J_VTS2").unwrap();
        let _a = floats(500);
        let _b = floats(500);
    }
    let s = ws.workspace("ND4J_VTS2").unwrap();
    assert_eq!(
        (s.size, s.slots, s.total_spilled_bytes),
        (capacity(4 * 5200), 4, 4000)
    );
    let mut spills = Vec::new();
    for _ in 0..100 {
        let g = ws.get_and_activate(&cfg, "ND4J_VTS2").unwrap();
        let _a = floats(500);
        let _b = floats(500);
        let _c = floats(500);
        spills.push(g.stats().spilled_bytes);
    }
    assert!(spills[3..].iter().all(|&s| s == 0), "{spills:?}");
    let s = ws.workspace("ND4J_VTS2").unwrap();
    assert_eq!((s.max_cycle, s.slots), (6000, 4));
    assert_eq!(s.size, capacity(4 * 6000));
    assert_eq!((s.spilled_bytes, s.pinned_bytes), (0, 0));
}

#[test]
fn detaching_a_view_makes_a_contiguous_pool_copy() {
    // ND4J SpecialWorkspaceTests.testViewDetach_1: a column view of a 10x10 matrix whose
    // rows are 1..=10 is attached; its detached copy is not a view, not attached, and
    // holds 2.0 ten times. (ndmem has no column slicing: the matrix is a broadcast of the
    // row, its transpose a view whose row 1 is the column; the buffer is 10 KB instead of
    // ND4J's 10 MB.)
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10_000)
        .overallocation_limit(3.0)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_spill(SpillPolicy::Reallocate)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_reset(ResetPolicy::BlockLeft)
        .build()
        .unwrap();
    let linspace: Vec<f32> = (1..=10).map(|v| v as f32).collect();
    let result = {
        let _g = ws.get_and_activate(&cfg, "ND4J_WS109").unwrap();
        let row = Tensor::from_slice(&linspace, &[1, 10]).unwrap();
        let matrix = row.broadcast_to(&[10, 10]).unwrap();
        let columns = matrix.transpose().unwrap();
        assert!(columns.shares_storage(&row), "a view");
        assert_eq!(columns.workspace(), Some("ND4J_WS109"));
        let result = columns.detach().unwrap();
        assert!(!result.shares_storage(&row));
        result
    };
    assert_eq!(result.workspace(), None);
    let values = result.to_vec::<f32>().unwrap();
    assert_eq!(&values[10..20], &[2.0f32; 10]);
    assert_eq!(values.len(), 100, "a contiguous copy of all 10 columns");
}

/// The offset after bumping `sizes` from 0 (each start rounded to 16).
fn bumped(sizes: &[usize]) -> usize {
    sizes.iter().map(|size| size.next_multiple_of(16)).sum()
}

#[test]
fn odd_sized_byte_arrays_keep_later_allocations_aligned() {
    // ND4J SpecialWorkspaceTests.testAlignment_1: 100 cycles of 10 rounds of a 1x10 double
    // linspace, its sum along axis 1 and a bool array of x + 1 bytes (which crashed ND4J
    // through misalignment). Every allocation is aligned (semantics §2.1), nothing spills,
    // and the sums read back 55.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    let linspace: Vec<f64> = (1..=10).map(f64::from).collect();
    for _ in 0..100 {
        let g = ws.get_and_activate(&cfg, "ND4J_ALIGN1").unwrap();
        let mut sizes = Vec::new();
        for x in 0..10 {
            let arr = Tensor::from_slice(&linspace, &[10])
                .unwrap()
                .reshape(&[1, 10])
                .unwrap();
            let total = arr.sum_axis(1).unwrap();
            let flags = Tensor::zeros(DType::U8, &[x + 1]).unwrap();
            assert_eq!(total.to_vec::<f64>().unwrap(), [55.0]);
            assert_eq!(flags.to_vec::<u8>().unwrap(), vec![0; x + 1]);
            sizes.extend([80, 8, x + 1]);
            assert_eq!(g.stats().used, bumped(&sizes));
        }
        assert_eq!(g.stats().spilled_bytes, 0);
    }
}

#[test]
fn borrowing_and_scoping_out_restore_the_current_workspace_in_order() {
    // ND4J SpecialWorkspaceTests.testWorkspaceOrder_1: outer, inner, outer borrowed,
    // scoped out; the current workspace read at each step is
    // outer, none, outer, inner, outer, none.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(1_000_000)
        .overallocation_limit(0.05)
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    let mut res = Vec::new();
    {
        let _outer = ws.get_and_activate(&cfg, "outer").unwrap();
        {
            let _inner = ws.get_and_activate(&cfg, "inner").unwrap();
            {
                let _borrowed = ws.get_and_activate(&cfg, "outer").unwrap();
                res.push(ws.current());
                {
                    let _out = ws.scope_out();
                    res.push(ws.current());
                }
                res.push(ws.current());
            }
            res.push(ws.current());
        }
        res.push(ws.current());
    }
    res.push(ws.current());
    let exp = [
        Some("outer"),
        None,
        Some("outer"),
        Some("inner"),
        Some("outer"),
        None,
    ];
    assert_eq!(res, exp.map(|id| id.map(String::from)));
    // Semantics §2.5: guards may be dropped in any order; the remaining one stays current.
    let outer = ws.get_and_activate(&cfg, "outer").unwrap();
    let inner = ws.get_and_activate(&cfg, "inner").unwrap();
    drop(outer);
    assert_eq!(ws.current().as_deref(), Some("inner"));
    assert!(!ws.workspace("outer").unwrap().open);
    drop(inner);
    assert_eq!(ws.current(), None);
}

#[test]
fn migrate_copies_into_the_current_workspace_keeping_the_type() {
    // ND4J SpecialWorkspaceTests.testMigrateToWorkspace: a long array migrated into the
    // entered workspace keeps its data type and values.
    let src = Tensor::from_slice(&[1i64, 2], &[2]).unwrap();
    let ws = workspaces();
    let migrated = {
        let _g = ws
            .get_and_activate(&WorkspaceConfig::default(), "ND4J_MIGRATE")
            .unwrap();
        let migrated = src.migrate().unwrap();
        assert_eq!(migrated.dtype(), src.dtype());
        assert_eq!(migrated.to_vec::<i64>().unwrap(), [1, 2]);
        assert_eq!(migrated.workspace(), Some("ND4J_MIGRATE"));
        migrated
    };
    assert!(!migrated.is_valid());
    // With no workspace current, migrate detaches (semantics §3).
    let detached = src.migrate().unwrap();
    assert_eq!((detached.workspace(), detached.dtype()), (None, DType::I64));
}

fn scratch(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ndmem-nd4j-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn mapped_at(path: &std::path::Path, initial_size: usize) -> WorkspaceConfig {
    WorkspaceConfig::builder()
        .initial_size(initial_size)
        .policy_location(ndmem::LocationPolicy::Mmap {
            path: Some(path.to_path_buf()),
        })
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap()
}

#[test]
fn a_mapped_workspace_spills_what_its_file_cannot_hold() {
    // ND4J SpecialWorkspaceTests.testMmapedWorkspaceLimits_1: an array larger than the
    // mapped file (ND4J: 200 MB + 1000 floats; here 1 MiB, x 1.3 overallocated, and
    // 2 MiB of floats) spills to the pool instead of failing.
    let path = scratch("limits");
    let ws = workspaces();
    {
        let g = ws
            .get_and_activate(&mapped_at(&path, MIB), "ND4J_MMAP_LIMITS")
            .unwrap();
        let x = Tensor::rand(DType::F32, &[MIB / 2 + 1000], 1).unwrap();
        assert_eq!(x.workspace(), Some("ND4J_MMAP_LIMITS"));
        assert_eq!(g.stats().spilled_bytes, 2 * MIB + 4000);
        assert!(x.mean().unwrap().scalar().unwrap() > 0.0);
        let small = Tensor::rand(DType::F32, &[1024], 2).unwrap();
        // The mean's scalar and the small array fit in the mapped buffer.
        assert_eq!(g.stats().used, bumped(&[4, 4096]), "what fits is mapped");
        drop(small);
    }
    ws.destroy("ND4J_MMAP_LIMITS").unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_mapped_file_with_a_long_name_works_and_can_be_deleted_after_destroy() {
    // ND4J SpecialWorkspaceTests.testMmapedWorkspace_Path_Limits_1 (a 115-character file
    // name) and testDeleteMappedFile_1 (destroy, then delete the file).
    let path = scratch(&format!("long_file_name_{}", "9".repeat(100)));
    let ws = workspaces();
    for _ in 0..2 {
        {
            let _g = ws
                .get_and_activate(&mapped_at(&path, 64 * 1024), "ND4J_MMAP_PATH")
                .unwrap();
            let x = Tensor::full(DType::F32, &[1024], 0.5).unwrap();
            assert_eq!(x.workspace(), Some("ND4J_MMAP_PATH"));
            assert_eq!(sum(&x), 512.0);
        }
        assert_eq!(ws.destroy_all_for_current_thread(), 1);
        assert!(path.exists(), "a user file is kept");
        std::fs::remove_file(&path).unwrap();
    }
}

// ---- CyclicWorkspaceTests ---------------------------------------------------------------

#[test]
fn a_prefetch_sized_ring_keeps_every_batch_it_still_holds() {
    // ND4J CyclicWorkspaceTests.testBasicMechanics_1: a ring for 24 prefetched batches
    // (limit 25, min 10 MiB, Reallocate) runs 100 cycles of a 128x784 and a 128x10 float
    // array assigned the cycle number. Here the ring has 26 slots, learned from the first
    // cycle; later cycles take nothing from the pool, and the last 20 batches, still held,
    // keep their values (semantics §2.4: valid while referenced).
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .min_size(10 * MIB)
        .overallocation_limit(25.0)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_learning(LearningPolicy::FirstLoop)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_spill(SpillPolicy::Reallocate)
        .build()
        .unwrap();
    let id = format!("randomNameHere{}", 119);
    let mut held = std::collections::VecDeque::new();
    for e in 0..100u8 {
        let g = ws.get_and_activate(&cfg, &id).unwrap();
        let f = Tensor::full(DType::F32, &[128, 784], f64::from(e)).unwrap();
        let l = Tensor::full(DType::F32, &[128, 10], f64::from(e)).unwrap();
        if e > 0 {
            assert_eq!(g.stats().spilled_bytes, 0, "cycle {e}");
        }
        held.push_back((e, f, l));
        if held.len() > 20 {
            held.pop_front();
        }
    }
    let s = ws.workspace(&id).unwrap();
    assert_eq!(s.slots, 26);
    assert_eq!(s.max_cycle, 128 * 784 * 4 + 128 * 10 * 4);
    for (e, f, l) in &held {
        assert!(f.is_valid() && l.is_valid());
        assert_eq!(sum(f), 128.0 * 784.0 * f64::from(*e));
        assert_eq!(sum(l), 1280.0 * f64::from(*e));
    }
}

// ---- DebugModeTests ---------------------------------------------------------------------

/// Set in the child: which ND4J debug-mode scenario to run.
const DEBUG_CHILD: &str = "NDMEM_TEST_ND4J_DEBUG_MODE_CHILD";

fn debug_mode_child(scenario: &str) {
    use ndmem::workspace::DebugMode;
    let ws = workspaces();
    let with_initial = |initial_size| {
        WorkspaceConfig::builder()
            .initial_size(initial_size)
            .max_size(10 * MIB)
            .overallocation_limit(0.1)
            .policy_allocation(AllocationPolicy::Strict)
            .policy_learning(LearningPolicy::FirstLoop)
            .policy_spill(SpillPolicy::External)
            .build()
            .unwrap()
    };
    match scenario {
        "spill_everything" => {
            // testDebugMode_1: the mode set is the mode read.
            assert_eq!(DebugMode::from_env().unwrap(), DebugMode::SpillEverything);
            // testSpillMode_1: ND4J still allocates the 10 MiB buffer and leaves it
            // unused; ndmem contract (semantics §2.5): no buffer at all. The array is
            // attached, nothing is bumped, its 800 bytes are spilled.
            {
                let g = ws
                    .get_and_activate(&with_initial(10 * MIB), "R_119_1993")
                    .unwrap();
                assert_eq!((g.stats().size, g.stats().used), (0, 0));
                let array = Tensor::full(DType::F64, &[10, 10], 1.0).unwrap();
                assert_eq!(array.workspace(), Some("R_119_1993"));
                assert!(array.is_valid());
                assert_eq!((g.stats().used, g.stats().spilled_bytes), (0, 800));
            }
            // testSpillMode_2: learning from the first loop learns nothing either; the
            // next cycle starts with no buffer and no spills.
            {
                let g = ws.get_and_activate(&with_initial(0), "R_119_1992").unwrap();
                let _array = Tensor::full(DType::F64, &[10, 10], 1.0).unwrap();
                assert_eq!((g.stats().size, g.stats().used), (0, 0));
                assert_eq!(g.stats().spilled_bytes, 800);
            }
            let g = ws.get_and_activate(&with_initial(0), "R_119_1992").unwrap();
            let s = g.stats();
            assert_eq!((s.size, s.used, s.spilled_bytes), (0, 0, 0));
        }
        "bypass" => {
            // testBypassMode_1: with workspaces bypassed, arrays are not attached.
            assert_eq!(DebugMode::from_env().unwrap(), DebugMode::Bypass);
            let g = ws.get_and_activate(&with_initial(0), "R_119_1994").unwrap();
            let array = Tensor::full(DType::F64, &[10, 10], 1.0).unwrap();
            assert_eq!(array.workspace(), None);
            assert_eq!(sum(&array), 100.0);
            assert_eq!(g.stats().spilled_bytes, 0);
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn debug_modes_spill_everything_or_bypass_the_workspace() {
    // ND4J DebugModeTests (testDebugMode_1, testSpillMode_1, testSpillMode_2,
    // testBypassMode_1). NDMEM_WORKSPACES is read once per process, so each mode runs in a
    // child process of its own.
    use crate::common::{child::Rerun, test_name};
    if let Ok(scenario) = std::env::var(DEBUG_CHILD) {
        debug_mode_child(&scenario);
        return;
    }
    for mode in ["spill_everything", "bypass"] {
        Rerun::test(test_name!(
            debug_modes_spill_everything_or_bypass_the_workspace
        ))
        .env(DEBUG_CHILD, mode)
        .env(ndmem::workspace::ENV_WORKSPACES, mode)
        .passes();
    }
}

// ---- BasicWorkspaceTests (later versions) -----------------------------------------------

#[test]
fn leverage_to_and_detach_keep_the_element_type() {
    // ND4J BasicWorkspaceTests.testDtypeLeverage: for every array type, the copy leveraged
    // to the outer workspace is attached and keeps its type, and so does its detached copy.
    // (ND4J's HALF has no ndmem type; the integer types stand in.)
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .policy_allocation(AllocationPolicy::Overallocate)
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    for dtype in [DType::F64, DType::F32, DType::I64, DType::I32, DType::U8] {
        let _outer = ws.get_and_activate(&cfg, "ws").unwrap();
        let arr = Tensor::full(dtype, &[3, 4], 7.0).unwrap();
        let _inner = ws.get_and_activate(&cfg, "wsInner").unwrap();
        let leveraged = arr.leverage_to("ws").unwrap();
        assert_eq!(leveraged.workspace(), Some("ws"));
        assert_eq!(leveraged.dtype(), dtype);
        let detached = leveraged.detach().unwrap();
        assert_eq!(detached.workspace(), None);
        assert_eq!(detached.dtype(), dtype);
        assert_eq!(sum(&detached.mul_scalar(1.0).unwrap()), 84.0);
    }
    assert_eq!(ws.destroy_all_for_current_thread(), 2);
}

#[test]
fn a_strict_fail_circular_workspace_with_a_fixed_buffer_serves_reads() {
    // ND4J BasicWorkspaceTests.testCircularWorkspaceAsymmetry_1 (a device test in ND4J; its
    // host part): a circular, Strict, Fail workspace of 10 MiB serves a 10x10 float array
    // that reads back, and is destroyed with the thread's workspaces.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .policy_allocation(AllocationPolicy::Strict)
        .policy_spill(SpillPolicy::Fail)
        .policy_learning(LearningPolicy::None)
        .build()
        .unwrap();
    let array = {
        let g = ws.get_and_activate(&cfg, "circular_ws").unwrap();
        let array = Tensor::full(DType::F32, &[10, 10], 3.0).unwrap();
        assert_eq!(array.view::<f32>().unwrap()[[0, 3]], 3.0);
        assert_eq!((g.stats().used, g.stats().slots), (400, 1));
        array
    };
    assert_eq!(
        array.to_vec::<f32>().unwrap()[3],
        3.0,
        "circular memory outlives its cycle"
    );
    assert_eq!(ws.destroy_all_for_current_thread(), 1);
    assert!(matches!(
        array.to_vec::<f32>(),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
}

#[test]
fn leverage_without_a_parent_detaches_and_leverage_to_needs_an_open_workspace() {
    // ND4J BasicWorkspaceTests.testLeverage1 / testLeverageTo* edge cases: with no parent
    // workspace leverage() detaches; leverage_to a workspace that does not exist, or is not
    // open, is an error here (semantics §3; ND4J's leverageTo warned and returned the
    // array unchanged).
    let ws = workspaces();
    let _g = ws.get_and_activate(&basic(), "ND4J_LEV_ALONE").unwrap();
    let array = doubles(&FIVE);
    let copy = array.leverage().unwrap();
    assert_eq!(copy.workspace(), None);
    assert_eq!(used("ND4J_LEV_ALONE"), 48);
    assert_eq!(copy.to_vec::<f64>().unwrap(), FIVE);
    assert!(matches!(
        array.leverage_to("ND4J_LEV_NOWHERE"),
        Err(Error::NoSuchWorkspace { .. })
    ));
    drop(ws.get_and_activate(&basic(), "ND4J_LEV_CLOSED").unwrap());
    assert!(matches!(
        array.leverage_to("ND4J_LEV_CLOSED"),
        Err(Error::WorkspaceNotOpen { .. })
    ));
}

// ---- EndlessWorkspaceTests, bounded -----------------------------------------------------

fn private_source() -> MemorySource {
    use ndmem::alloc::{Limits, Pool};
    MemorySource::new(Pool::new(Limits::unlimited()))
}

#[test]
fn a_steady_loop_takes_nothing_from_the_pool_once_sized() {
    // ND4J EndlessWorkspaceTests.endlessTest1 / endlessTest6 (endless there, 1000 cycles
    // here): once the buffer exists, cycles allocate nothing from the pool and hold their
    // values.
    let source = private_source();
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(16 * MIB)
        .source(source)
        .build()
        .unwrap();
    // The buffer is allocated when the workspace is created.
    drop(ws.get_and_activate(&cfg, "ND4J_ENDLESS1").unwrap());
    let before = source.pool().stats();
    for i in 0..1000 {
        let g = ws.get_and_activate(&cfg, "ND4J_ENDLESS1").unwrap();
        let array = Tensor::zeros(DType::F32, &[if i % 100 == 0 { 1 << 16 } else { 5 }])
            .unwrap()
            .add_scalar(1.0)
            .unwrap();
        assert_eq!(array.mean().unwrap().scalar().unwrap(), 1.0);
        assert_eq!(g.stats().spilled_bytes, 0);
    }
    let after = source.pool().stats();
    assert_eq!(after.allocations, before.allocations);
    assert_eq!(after.live_bytes, before.live_bytes);
}

#[test]
fn spills_of_every_cycle_are_given_back_at_its_end() {
    // ND4J EndlessWorkspaceTests.endlessTest2: a 10 MiB workspace whose cycles fit one
    // 8 MiB array and spill a 12 MiB one: the pool holds only the buffer between cycles.
    let source = private_source();
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .source(source)
        .build()
        .unwrap();
    let buffer = ws
        .get_and_activate(&cfg, "ND4J_ENDLESS2")
        .unwrap()
        .stats()
        .size;
    for _ in 0..5 {
        let g = ws.get_and_activate(&cfg, "ND4J_ENDLESS2").unwrap();
        let array = Tensor::full(DType::F32, &[2 * MIB], 1.0).unwrap();
        assert_eq!(array.mean().unwrap().scalar().unwrap(), 1.0);
        let _array2 = Tensor::zeros(DType::F32, &[3 * MIB]).unwrap();
        assert_eq!(g.stats().spilled_bytes, 12 * MIB);
        drop(g);
        assert_eq!(source.pool().stats().live_bytes, buffer);
    }
}

#[test]
fn nested_workspaces_share_arrays_within_their_cycles() {
    // ND4J EndlessWorkspaceTests.endlessTest3: WS_1 holds ones, WS_2 holds ones; their sum
    // (made in WS_2) has mean 2, cycle after cycle.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(10 * MIB)
        .build()
        .unwrap();
    for _ in 0..5 {
        let _ws1 = ws.get_and_activate(&cfg, "ND4J_E3_WS1").unwrap();
        let array1 = Tensor::full(DType::F32, &[MIB / 8], 1.0).unwrap();
        let _ws2 = ws.get_and_activate(&cfg, "ND4J_E3_WS2").unwrap();
        let array2 = Tensor::full(DType::F32, &[MIB / 8], 1.0).unwrap();
        let total = array1.add(&array2).unwrap();
        assert_eq!(total.workspace(), Some("ND4J_E3_WS2"));
        assert_eq!(total.mean().unwrap().scalar().unwrap(), 2.0);
    }
}

#[test]
fn many_small_reductions_in_one_cycle_stay_in_the_buffer() {
    // ND4J EndlessWorkspaceTests.endlessTest4: 1000 arrays of varying shapes and their
    // reductions along an axis in one cycle, then 1000 vectors and their total.
    let ws = workspaces();
    let cfg = WorkspaceConfig::builder()
        .initial_size(100 * MIB)
        .build()
        .unwrap();
    let _g = ws.get_and_activate(&cfg, "ND4J_E4").unwrap();
    for i in 0..1000usize {
        let (rows, cols) = (1 + i % 49, 1 + (i * 7) % 49);
        let array = Tensor::rand(DType::F32, &[rows, cols], i as u64).unwrap();
        let reduced = array.sum_axis(1).unwrap();
        assert_eq!(reduced.shape(), &[rows]);
    }
    for i in 0..1000usize {
        let array = Tensor::full(DType::F64, &[1 + i % 99], 1.0).unwrap();
        assert_eq!(sum(&array), (1 + i % 99) as f64);
    }
    assert_eq!(ws.workspace("ND4J_E4").unwrap().spilled_bytes, 0);
}

#[test]
fn short_lived_threads_leave_no_workspace_memory_behind() {
    // ND4J EndlessWorkspaceTests.endlessTest5: a thread per workspace, joined, over and
    // over; with ndmem nothing waits for a garbage collector (semantics §2.2 Decision).
    let source = private_source();
    for _ in 0..50 {
        std::thread::spawn(move || {
            let cfg = WorkspaceConfig::builder()
                .initial_size(10 * MIB)
                .policy_learning(LearningPolicy::None)
                .source(source)
                .build()
                .unwrap();
            let _g = workspaces().get_and_activate(&cfg, "PEW-PEW").unwrap();
            let array = Tensor::zeros(DType::F32, &[10]).unwrap();
            assert_eq!(array.workspace(), Some("PEW-PEW"));
        })
        .join()
        .unwrap();
        assert_eq!(source.pool().stats().live_bytes, 0);
    }
}

#[test]
fn leverage_after_the_parent_was_left_out_of_order_detaches() {
    // ND4J BasicWorkspaceTests.testLeverage1 with the guards of
    // SpecialWorkspaceTests.testWorkspaceOrder_1 dropped out of order (semantics §2.5: in
    // any order). Once EXT's cycle has ended, INT has no parent any more: leverage()
    // detaches (semantics §3: "or detached if there is none") instead of failing on a
    // workspace that is no longer open.
    let ws = workspaces();
    let ext = ws.get_and_activate(&basic(), "ND4J_ORDER_EXT").unwrap();
    let int = ws.get_and_activate(&basic(), "ND4J_ORDER_INT").unwrap();
    assert_eq!(parent_of_current().as_deref(), Some("ND4J_ORDER_EXT"));
    drop(ext);
    assert_eq!(ws.current().as_deref(), Some("ND4J_ORDER_INT"));
    assert_eq!(parent_of_current(), None);
    let array = doubles(&FIVE);
    let copy = array.leverage().unwrap();
    assert_eq!(copy.workspace(), None);
    assert_eq!(copy.to_vec::<f64>().unwrap(), FIVE);
    drop(int);
    assert_eq!(sum(&copy), 15.0);
}
