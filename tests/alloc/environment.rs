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

/// The global pool reads only its own variables (semantics §1): garbage in
/// `NDMEM_MAX_HEAP` (the heap's, which only warns) or in `NDMEM_MAX_DEVICE_BYTES` (each
/// device's, judged when a device is opened) leaves it usable, and a device percentage of
/// less than one byte of host RAM is not the host's to refuse. `Limits::from_env()`, which
/// reads all four, still reports the garbage.
#[test]
fn global_pool_ignores_the_heap_and_device_variables() {
    for (variable, value) in [
        ("NDMEM_MAX_HEAP", "abc"),
        ("NDMEM_MAX_DEVICE_BYTES", "lots"),
        ("NDMEM_MAX_DEVICE_BYTES", "0.0000000001%"),
    ] {
        Rerun::test(test_name!(child_global_pool_usable))
            .env(variable, value)
            .env("NDMEM_TEST_VARIABLE", variable)
            .passes();
    }
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
    // It serves nothing, and its figures say so rather than show a default limit.
    assert_eq!(Pool::global().stats().limit_bytes, Some(0));
    assert_eq!(Pool::global().limits().0, Some(0));
}

#[test]
#[ignore = "run by global_pool_ignores_the_heap_and_device_variables with a variable set"]
fn child_global_pool_usable() {
    let variable = std::env::var("NDMEM_TEST_VARIABLE").unwrap();
    let value = std::env::var(&variable).unwrap();
    let pool = Pool::try_global().unwrap();
    pool.allocate(64, 8).unwrap();
    ndmem::Tensor::zeros(ndmem::DType::F32, &[16]).unwrap();
    match ndmem_alloc::Limits::from_env() {
        // A device percentage is a share of each device's memory: no host figure.
        Ok(limits) => {
            assert!(
                value.ends_with('%'),
                "{variable}={value:?} read as {limits:?}"
            );
            assert_eq!(limits.max_device_bytes, None);
            assert_eq!(
                limits.sources.max_device_bytes,
                ndmem_alloc::LimitSource::Environment
            );
        }
        Err(err) => {
            let msg = err.to_string();
            assert!(!value.ends_with('%'), "{msg}");
            assert!(msg.contains(&format!("{variable}={value:?}")), "{msg}");
        }
    }
}
