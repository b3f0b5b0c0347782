//! Bad input and the out-of-memory error: refusals that change nothing and say why.

use std::sync::atomic::{AtomicUsize, Ordering};

use ndmem_alloc::{AllocError, ByteSize, Usage};

use crate::{pool_with, stats_without_rss, this_thread_os_id, MIB};

#[test]
fn bad_requests_are_errors_that_change_nothing() {
    let pool = pool_with(64 * MIB);
    let keep = pool.allocate(1000, 16).unwrap();
    drop(pool.allocate(4 * MIB, 64).unwrap());
    let before = stats_without_rss(&pool);
    assert_eq!(before.cached_bytes, 4 * MIB, "a block is cached");
    let cases: [(usize, usize, &str); 7] = [
        (0, 16, "zero-size"),
        (64, 0, "power of two"),
        (64, 3, "power of two"),
        (64, 8192, "above 4096"),
        (usize::MAX, 16, "overflows"),
        (isize::MAX as usize, 4096, "more than any pool can hold"),
        ((1 << 62) + 1, 16, "more than any pool can hold"),
    ];
    for (size, align, expected) in cases {
        let err = pool.allocate(size, align).unwrap_err();
        assert!(matches!(err, AllocError::InvalidLayout { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(expected) && msg.contains(&size.to_string()),
            "{msg}"
        );
    }
    let err = pool.reserve(0, Usage::Other).unwrap_err();
    assert!(err.to_string().contains("zero"), "{err}");
    let err = pool.reserve(isize::MAX as usize, Usage::Other).unwrap_err();
    assert!(err.to_string().contains("more than any pool"), "{err}");
    // A limit below the live block is refused before the cache is touched.
    let err = pool.set_max_bytes(Some(512)).unwrap_err();
    assert!(matches!(err, AllocError::LimitBelowUse { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&keep.capacity().to_string()),
        "{err}"
    );
    // Every figure, the cache and the OS calls included, is as it was.
    assert_eq!(stats_without_rss(&pool), before);
    assert_eq!(pool.limits().0, Some(64 * MIB));
    assert_eq!(keep.len(), 1000);
    // From 16 PiB a block cannot hold the request: a limited pool refuses it at its limit
    // first, as any request too large for it; an unlimited one says why.
    for size in [(1 << 54) - 4096, 1 << 54] {
        let err = pool.allocate(size, 16).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err:?}");
    }
    let unlimited = ndmem_alloc::Pool::new(ndmem_alloc::Limits::unlimited());
    for size in [1 << 54, (1 << 54) - 1, 1 << 60] {
        let err = unlimited.allocate(size, 16).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, AllocError::InvalidLayout { .. }), "{err:?}");
        assert!(
            msg.contains("more than one block can hold (16 PiB"),
            "{msg}"
        );
    }
    assert_eq!(unlimited.stats().used_bytes, 0, "nothing kept reserved");
    // Near the 4 EiB budget an unlimited pool counts against: refused as above, before
    // the budget (whose refusal would run the relief: reclaimers, trims, a retry), and a
    // reservation cannot drain it (after which every request was refused at a limit the
    // pool does not have).
    static RECLAIMED: AtomicUsize = AtomicUsize::new(0);
    unlimited.register_reclaimer(|| {
        RECLAIMED.fetch_add(1, Ordering::Relaxed);
        0
    });
    drop(unlimited.allocate(64 << 10, 64).unwrap());
    let cached = unlimited.stats().cached_bytes;
    assert!(cached > 0);
    for size in [1 << 62, (1 << 62) - 4096] {
        let err = unlimited.allocate(size, 1).unwrap_err();
        assert!(matches!(err, AllocError::InvalidLayout { .. }), "{err:?}");
        let err = unlimited.reserve(size, Usage::Other).unwrap_err();
        assert!(matches!(err, AllocError::InvalidLayout { .. }), "{err:?}");
    }
    assert_eq!(RECLAIMED.load(Ordering::Relaxed), 0, "no relief ran");
    assert_eq!(
        unlimited.stats().cached_bytes,
        cached,
        "no cache was trimmed"
    );
    assert_eq!(unlimited.stats().alloc_retries, 0);
    unlimited.allocate(64, 8).expect("still unlimited");
    // Nor can many smaller reservations: the one that would pass the 4 EiB is refused as
    // more than any pool can hold, without relief, and the pool still serves.
    let held: Vec<_> = std::iter::from_fn(|| unlimited.reserve(1 << 53, Usage::Other).ok())
        .take(1024)
        .collect();
    assert!(held.len() < 512, "{} reservations of 8 PiB", held.len());
    let err = unlimited.reserve(1 << 53, Usage::Other).unwrap_err();
    assert!(
        err.to_string().contains("more than any pool can hold"),
        "{err}"
    );
    assert_eq!(RECLAIMED.load(Ordering::Relaxed), 0, "no relief ran");
    unlimited.allocate(64, 8).expect("still serves");
    drop(held);
}

#[test]
fn a_refusal_names_the_block_a_rounded_request_needed() {
    // Semantics §1: the request fits the limit but its block (its size class) does not;
    // the message says so, not only "1000000 bytes ... 0 B of 976.6 KiB in use".
    let pool = ndmem_alloc::Pool::new(ndmem_alloc::Limits::builder().max_bytes(1_000_000).build());
    let err = pool.allocate(1_000_000, 16).unwrap_err();
    let AllocError::OutOfMemory {
        requested,
        needed,
        used,
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert_eq!((requested, used), (1_000_000, 0));
    assert!(needed > 1_000_000, "the block is larger: {needed}");
    let msg = err.to_string();
    let block = format!("1000000 bytes (a block of {});", ByteSize(needed));
    assert!(msg.contains(&block), "{msg}");
    // A request its block fits exactly says nothing more.
    let err = pool_with(MIB).allocate(2 * MIB, 64).unwrap_err();
    assert!(err.to_string().contains("2097152 bytes; threadId"), "{err}");
}

#[test]
fn a_request_too_large_for_the_limit_is_refused_with_a_useful_message() {
    let pool = pool_with(8 * MIB);
    let _ws = pool.allocate_for(5 * MIB, 64, Usage::Workspace).unwrap();
    let _t = pool.allocate_for(2 * MIB, 64, Usage::Tensor).unwrap();
    let before = pool.stats();
    let err = pool.allocate(4 * MIB, 64).unwrap_err();
    let AllocError::OutOfMemory {
        requested,
        used,
        limit,
        thread,
        ..
    } = err.clone()
    else {
        panic!("{err:?}");
    };
    assert_eq!(requested, 4 * MIB);
    assert_eq!(limit, 8 * MIB);
    assert_eq!(used, before.used_bytes);
    let tid = this_thread_os_id();
    assert_eq!(thread, tid);
    let msg = err.to_string();
    for part in [
        "Can't allocate [HOST] memory: 4194304 bytes".to_string(),
        format!("threadId: {tid}"),
        format!(
            "off-heap {} of {} limit in use",
            ByteSize(used),
            ByteSize(8 * MIB)
        ),
        format!("workspaces {}", ByteSize(5 * MIB)),
        format!("tensors {}", ByteSize(2 * MIB)),
        "raise Limits::max_bytes of this pool".to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} lacks {part:?}");
    }
    let after = pool.stats();
    assert_eq!(
        after.used_bytes, before.used_bytes,
        "a failed request reserves nothing"
    );
    assert_eq!(after.failed_allocations, before.failed_allocations + 1);
}
