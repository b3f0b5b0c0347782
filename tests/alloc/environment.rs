//! The environment: the global pool's `NDMEM_MAX_BYTES` and the heap's `NDMEM_MAX_HEAP`.
//! Each is read once per process, so each case runs in a child process with the variable
//! set.

use ndmem_alloc::{AllocError, Pool};

use crate::common::{child::Rerun, test_name};
use crate::MIB;

#[test]
fn global_pool_names_the_environment_variables() {
    Rerun::test(test_name!(child_global_pool_over_limit))
        .env("NDMEM_MAX_BYTES", "1M")
        .passes();
    Rerun::test(test_name!(child_global_pool_garbage))
        .env("NDMEM_MAX_BYTES", "lots")
        .passes();
}

/// `heap::stats()` reports `NDMEM_MAX_HEAP` before the tracking allocator has counted
/// anything (here it never does: this binary's global allocator is not `Tracking`).
#[test]
fn heap_stats_report_the_environment_limit_before_any_allocation() {
    Rerun::test(test_name!(child_heap_limit_from_env))
        .env("NDMEM_MAX_HEAP", "64M")
        .passes();
}

#[test]
#[ignore = "run by heap_stats_report_the_environment_limit_before_any_allocation"]
fn child_heap_limit_from_env() {
    assert!(!ndmem_alloc::heap::is_tracking());
    assert_eq!(ndmem_alloc::heap::stats().limit, Some(64 * MIB));
}

#[test]
#[ignore = "run by global_pool_names_the_environment_variables with the variable set"]
fn child_global_pool_over_limit() {
    let pool = Pool::try_global().unwrap();
    assert_eq!(pool.limits().0, Some(MIB));
    let err = pool.allocate(2 * MIB, 64).unwrap_err();
    assert!(err.to_string().contains("raise NDMEM_MAX_BYTES"), "{err}");
}

#[test]
#[ignore = "run by global_pool_names_the_environment_variables with the variable set"]
fn child_global_pool_garbage() {
    let err = Pool::try_global().unwrap_err();
    assert!(
        err.to_string().contains("NDMEM_MAX_BYTES=\"lots\""),
        "{err}"
    );
    let err = Pool::global().allocate(64, 8).unwrap_err();
    assert!(matches!(err, AllocError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("NDMEM_MAX_BYTES"), "{err}");
}
