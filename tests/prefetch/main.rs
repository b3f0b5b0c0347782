//! Prefetching iterators (semantics §6, over the circular workspaces of §2.4): batches
//! arrive intact and in order whichever side is slower, the producer's ring stops
//! allocating once learned (also for batches of varying size), producer panics and errors
//! reach the consumer, dropping the iterator mid-stream gives every byte back and leaves no
//! thread, a batch kept past its window is refused rather than read, and `shield` is the
//! same interface without a thread.
//!
//! Byte and allocation counts read a pool of the test's own, so the tests run in parallel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ndmem::alloc::{Limits, Pool};
use ndmem::prefetch::{Prefetch, PrefetchBuilder, MAX_CAPACITY};
use ndmem::{reclaim, shield, DType, Error, MemorySource, Tensor, WorkspaceConfig};

/// A pool of this test's own.
fn private() -> MemorySource {
    MemorySource::new(Pool::new(Limits::builder().build()))
}

/// A prefetching iterator named `name`, `capacity` ahead, drawing from `source`.
fn builder(name: &str, capacity: usize, source: &MemorySource) -> PrefetchBuilder {
    Prefetch::builder().name(name).capacity(capacity).workspace(
        WorkspaceConfig::builder()
            .source(*source)
            .policy_spill(ndmem::SpillPolicy::Reallocate)
            .build()
            .unwrap(),
    )
}

/// Element `j` of batch `i`.
fn value(i: u64, j: usize) -> f32 {
    (i as f32) * 1000.0 + j as f32
}

/// An order-sensitive checksum of a batch's elements.
fn checksum(values: impl Iterator<Item = f32>) -> u64 {
    values.enumerate().fold(0u64, |acc, (j, v)| {
        acc.wrapping_mul(31)
            .wrapping_add(u64::from(v.to_bits()) ^ j as u64)
    })
}

/// Batch `i` of `len` elements and the checksum it was built with.
fn make(i: u64, len: usize) -> ndmem::Result<(Tensor, u64)> {
    let data: Vec<f32> = (0..len).map(|j| value(i, j)).collect();
    let sum = checksum(data.iter().copied());
    Ok((Tensor::from_slice(&data, &[len])?, sum))
}

/// Reads a batch back and checks it against its checksum and its place in the stream.
fn verify(expected_index: u64, batch: &ndmem::Batch<(Tensor, u64)>) -> usize {
    assert_eq!(batch.index(), expected_index, "batches arrive in order");
    let (tensor, sum) = batch.get().unwrap();
    let view = tensor.view::<f32>().unwrap();
    assert_eq!(
        view.get(&[0]).copied(),
        Some(value(expected_index, 0)),
        "batch {expected_index} is the one built for its item"
    );
    assert_eq!(
        checksum(view.iter().copied()),
        *sum,
        "batch {expected_index} intact"
    );
    tensor.len()
}

/// The threads of this process with the name `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Threads named `name` once a joined thread of that name has left `/proc/self/task`:
/// `join` returns when the thread has cleared its id, a moment before the kernel removes
/// its task, so this waits up to 2 s for the count to reach 0.
fn threads_named_after_join(name: &str) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let n = threads_named(name);
        if n == 0 || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn batches_arrive_intact_and_in_order_with_a_slow_consumer() {
    let source = private();
    let batches = builder("SLOWCONS", 3, &source)
        .spawn(0..60u64, |i| make(i, 4096))
        .unwrap();
    let mut seen = 0;
    for (i, batch) in batches.enumerate() {
        let batch = batch.unwrap();
        std::thread::sleep(Duration::from_micros(300));
        verify(i as u64, &batch);
        seen += 1;
    }
    assert_eq!(seen, 60);
}

#[test]
fn batches_arrive_intact_and_in_order_with_a_slow_producer() {
    let source = private();
    let batches = builder("SLOWPROD", 2, &source)
        .spawn(0..40u64, |i| {
            std::thread::sleep(Duration::from_micros(300));
            make(i, 1000 + i as usize)
        })
        .unwrap();
    let lens: Vec<usize> = batches
        .enumerate()
        .map(|(i, b)| verify(i as u64, &b.unwrap()))
        .collect();
    assert_eq!(lens, (0..40).map(|i| 1000 + i).collect::<Vec<_>>());
}

#[test]
fn a_rendezvous_queue_hands_every_batch_over_in_order() {
    let source = private();
    let batches = builder("RENDEZVOUS", 0, &source)
        .spawn(0..20u64, |i| make(i, 64))
        .unwrap();
    assert_eq!(batches.capacity(), Some(0));
    let elements: usize = batches
        .enumerate()
        .map(|(i, b)| verify(i as u64, &b.unwrap()))
        .sum();
    assert_eq!(elements, 20 * 64);
}

/// A capacity the producer's ring cannot hold is refused up front, naming the capacity and
/// the largest allowed ([`MAX_CAPACITY`]), not a workspace setting the user never touched;
/// the largest allowed works.
#[test]
fn a_capacity_past_the_largest_is_refused_naming_the_capacity() {
    assert_eq!(MAX_CAPACITY, ndmem::workspace::MAX_RING_SLOTS - 2);
    for capacity in [MAX_CAPACITY + 1, 5000, usize::MAX] {
        let e = match Prefetch::new(capacity, 0..1u64, |i| make(i, 4)) {
            Err(Error::Config(e)) => e.to_string(),
            Err(other) => panic!("{capacity}: expected a configuration error, got {other}"),
            Ok(_) => panic!("{capacity}: expected a configuration error, got an iterator"),
        };
        assert!(
            e.contains(&format!("capacity {capacity}"))
                && e.contains(&MAX_CAPACITY.to_string())
                && !e.contains("overallocation_limit"),
            "{e}"
        );
    }
    let source = private();
    let batches = builder("MAXCAP", MAX_CAPACITY, &source)
        .spawn(0..3u64, |i| make(i, 64))
        .unwrap();
    assert_eq!(batches.capacity(), Some(MAX_CAPACITY));
    let seen: Vec<usize> = batches
        .enumerate()
        .map(|(i, b)| verify(i as u64, &b.unwrap()))
        .collect();
    assert_eq!(seen, [64; 3]);
}

/// Pool allocations of `source` made while the consumer took batch `from` to the end.
fn allocations_after(
    source: &MemorySource,
    batches: Prefetch<(Tensor, u64)>,
    from: u64,
) -> (u64, u64) {
    let pool = source.pool();
    let mut at_from = None;
    let mut taken = 0;
    for (i, batch) in batches.enumerate() {
        let batch = batch.unwrap();
        verify(i as u64, &batch);
        if i as u64 == from {
            at_from = Some(pool.stats().allocations);
        }
        taken += 1;
    }
    let after = pool.stats().allocations - at_from.expect("the stream reached `from`");
    (after, taken)
}

#[test]
fn after_learning_a_batch_takes_nothing_from_the_pool() {
    // Semantics §2.4: the ring learns from the first batch; with the consumer holding one
    // batch and the queue full, the producer still finds a free slot among capacity + 2.
    let source = private();
    let batches = builder("STEADY", 2, &source)
        .spawn(0..80u64, |i| make(i, 2048))
        .unwrap();
    let (allocations, taken) = allocations_after(&source, batches, 6);
    assert_eq!(taken, 80);
    assert_eq!(allocations, 0, "no pool allocation per batch once learned");
}

#[test]
fn batches_of_varying_size_settle_to_zero_allocations() {
    // Semantics §2.4 Reallocate: a batch larger than the slot spills, the ring is rebuilt
    // larger, and once the largest size has been seen nothing is allocated any more.
    let source = private();
    // Lengths of a time series: 100 to 1999 elements, and one of 2000 (batch 20).
    let size = |i: u64| {
        if i == 20 {
            2000
        } else {
            100 + ((i * 7919) % 1900) as usize
        }
    };
    let largest = (0..200).map(size).max().unwrap();
    let first_largest = (0..200).position(|i| size(i) == largest).unwrap();
    let batches = builder("VARYING", 2, &source)
        .spawn(0..200u64, move |i| make(i, size(i)))
        .unwrap();
    let pool = source.pool();
    let mut allocations = Vec::new();
    for (i, batch) in batches.enumerate() {
        let before = pool.stats().allocations;
        assert_eq!(verify(i as u64, &batch.unwrap()), size(i as u64));
        allocations.push(pool.stats().allocations - before);
    }
    assert!(
        first_largest < 60,
        "the largest batch comes early: {first_largest}"
    );
    let late: u64 = allocations[100..].iter().sum();
    assert_eq!(
        late, 0,
        "allocations after batch 100 (per batch: {allocations:?})"
    );
    let total = pool.stats().allocations;
    assert!(total > 2, "the ring learned and grew ({total} allocations)");
}

#[test]
fn a_producer_panic_surfaces_as_an_error_on_the_next_call() {
    let source = private();
    let mut batches = builder("PANICKY", 2, &source)
        .spawn(0..10u64, |i| {
            assert!(i != 3, "no batch number three");
            make(i, 16)
        })
        .unwrap();
    for i in 0..3 {
        verify(i, &batches.next().unwrap().unwrap());
    }
    let err = batches.next().unwrap().unwrap_err();
    assert!(matches!(err, Error::Prefetch { ref iterator, .. } if iterator == "PANICKY"));
    assert_eq!(
        err.to_string(),
        "prefetch iterator [PANICKY]: the producer panicked at batch 3: no batch number three"
    );
    assert!(batches.next().is_none(), "the stream ends after the error");
}

#[test]
fn a_build_error_reaches_the_consumer_as_it_is() {
    let source = private();
    let mut batches = builder("FAILING", 1, &source)
        .spawn(0..10u64, |i| {
            if i == 2 {
                Tensor::zeros(DType::F32, &[2])?.add(&Tensor::zeros(DType::F32, &[3])?)?;
            }
            make(i, 16)
        })
        .unwrap();
    verify(0, &batches.next().unwrap().unwrap());
    verify(1, &batches.next().unwrap().unwrap());
    assert!(matches!(
        batches.next().unwrap(),
        Err(Error::Shape { ref op, .. }) if op == "add"
    ));
    assert!(batches.next().is_none());
}

/// Sets its flag when dropped: the build closure holds one, so the flag says the producer
/// thread has finished with it.
struct Joined(Arc<AtomicBool>);

impl Drop for Joined {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn dropping_mid_stream_joins_the_producer_and_gives_every_byte_back() {
    let source = private();
    let pool = source.pool();
    let baseline = pool.stats().live_bytes;
    let joined = Arc::new(AtomicBool::new(false));
    let flag = Joined(Arc::clone(&joined));
    let mut batches = builder("DROPMID", 2, &source)
        .spawn(0..u64::MAX, move |i| {
            let _held = &flag;
            make(i, 8192)
        })
        .unwrap();
    for i in 0..5 {
        verify(i, &batches.next().unwrap().unwrap());
    }
    let kept = batches.next().unwrap().unwrap();
    let escaped = kept.get().unwrap().0.clone(); // a tensor taken out of its batch
    std::thread::sleep(Duration::from_millis(20)); // the producer fills the queue and blocks
    assert_eq!(threads_named("prefetch-DROPMI"), 1, "the producer runs");
    assert!(pool.stats().live_bytes > baseline);
    drop(batches);
    assert!(joined.load(Ordering::SeqCst), "the producer was joined");
    assert_eq!(
        threads_named_after_join("prefetch-DROPMI"),
        0,
        "no thread left"
    );
    // A batch held across the drop is refused (its workspace was destroyed), not read.
    let err = kept.get().unwrap_err();
    assert_eq!(
        err.to_string(),
        "prefetch iterator [DROPMID]: batch 5 was used after its window: the iterator was dropped and its workspace destroyed; detach() a batch to keep it longer"
    );
    assert!(matches!(
        escaped.to_vec::<f32>(),
        Err(Error::LeakedWorkspacePointer { .. })
    ));
    drop((kept, escaped));
    reclaim::collect();
    assert_eq!(pool.stats().live_bytes, baseline, "every byte given back");
}

#[test]
fn dropping_after_the_end_gives_every_byte_back() {
    let source = private();
    let pool = source.pool();
    let baseline = pool.stats().live_bytes;
    let batches = builder("DROPEND", 2, &source)
        .spawn(0..10u64, |i| make(i, 1024))
        .unwrap();
    let elements: usize = batches
        .enumerate()
        .map(|(i, b)| verify(i as u64, &b.unwrap()))
        .sum();
    assert_eq!(elements, 10 * 1024);
    reclaim::collect();
    assert_eq!(pool.stats().live_bytes, baseline);
    assert_eq!(threads_named_after_join("prefetch-DROPEN"), 0);
}

#[test]
fn a_batch_kept_past_its_window_is_refused_not_read() {
    // Semantics §6: a batch stays valid until the consumer has taken capacity + 1 more.
    let source = private();
    let mut batches = builder("WINDOW", 2, &source)
        .spawn(0..20u64, |i| make(i, 256))
        .unwrap();
    let first = batches.next().unwrap().unwrap();
    let detached = first.detach().unwrap();
    for taken in 1..=2 {
        verify(taken, &batches.next().unwrap().unwrap());
        assert!(first.is_valid(), "inside its window after {taken} more");
        verify(0, &first);
    }
    verify(3, &batches.next().unwrap().unwrap());
    assert!(!first.is_valid());
    let err = first.get().unwrap_err();
    assert_eq!(
        err,
        Error::PrefetchWindow {
            iterator: "WINDOW".into(),
            batch: 0,
            reason: "3 batches were taken after it, and a batch stays valid for the next 2".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "prefetch iterator [WINDOW]: batch 0 was used after its window: 3 batches were taken after it, and a batch stays valid for the next 2; detach() a batch to keep it longer"
    );
    assert!(matches!(
        first.detach(),
        Err(Error::PrefetchWindow { batch: 0, .. })
    ));
    // The copy taken in time stays valid, after the iterator too.
    drop(batches);
    let values = detached.0.to_vec::<f32>().unwrap();
    assert_eq!(checksum(values.into_iter()), detached.1);
    assert_eq!(detached.0.workspace(), None);
}

#[test]
fn shield_is_the_same_interface_without_a_thread() {
    let consumer = std::thread::current().id();
    let mut shielded = shield(0..12u64, move |i| {
        assert_eq!(std::thread::current().id(), consumer, "built on the caller");
        make(i, 100)
    });
    assert_eq!(shielded.capacity(), None);
    let first = shielded.next().unwrap().unwrap();
    assert_eq!(first.get().unwrap().0.workspace(), None, "pool memory");
    let rest: Vec<u64> = shielded
        .by_ref()
        .map(|b| {
            let b = b.unwrap();
            verify(b.index(), &b);
            b.index()
        })
        .collect();
    assert_eq!(rest, (1..12).collect::<Vec<_>>());
    assert!(shielded.next().is_none());
    drop(shielded);
    verify(0, &first); // never expires
}

#[test]
fn shield_reports_a_panic_as_an_error() {
    let mut shielded = Prefetch::builder().name("SHIELDED").shield(0..3u64, |i| {
        assert!(i != 1, "bad item");
        make(i, 4)
    });
    verify(0, &shielded.next().unwrap().unwrap());
    assert_eq!(
        shielded.next().unwrap().unwrap_err().to_string(),
        "prefetch iterator [SHIELDED]: the build panicked at batch 1: bad item"
    );
    assert!(shielded.next().is_none());
}

#[test]
fn a_prefetched_stream_equals_the_shielded_one() {
    let source = private();
    let sums = |it: Prefetch<(Tensor, u64)>| -> Vec<u64> {
        it.map(|b| b.unwrap().get().unwrap().1).collect()
    };
    let prefetched = sums(
        builder("EQUAL", 4, &source)
            .spawn(0..30u64, |i| make(i, 50))
            .unwrap(),
    );
    let shielded = sums(shield(0..30u64, |i| make(i, 50)));
    assert_eq!(prefetched, shielded);
}

#[test]
fn with_a_device_the_producer_hands_over_device_copies_in_order() {
    // Semantics §6 and §5: the copy to the device happens on the producer thread, through
    // the device's pinned staging buffer, so the consumer receives device tensors.
    use ndmem::device::{sim, SimConfig};
    let gpu = sim(SimConfig::new(0)).unwrap();
    let source = private();
    let before = gpu.stats();
    // Room for every batch inside its window, so the copies can be counted before any is
    // read back.
    let mut stream = builder("DEVICE", 12, &source)
        .device(&gpu)
        .spawn(0..12u64, |i| make(i, 512))
        .unwrap();
    let batches: Vec<_> = stream.by_ref().map(Result::unwrap).collect();
    let copies = gpu.stats().since(&before);
    assert_eq!(copies.htod_transfers, 12, "one upload per batch");
    assert_eq!(copies.htod_bytes, 12 * 512 * 4);
    assert_eq!(
        copies.staged_bytes, copies.htod_bytes,
        "through the pinned staging buffer"
    );
    for (i, batch) in batches.iter().enumerate() {
        let (tensor, sum) = batch.get().unwrap();
        assert!(tensor.is_on_device(), "batch {i} is on the device");
        assert_eq!(tensor.device().as_ref(), Some(&gpu));
        let values = tensor.to_host().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(values[0], value(i as u64, 0));
        assert_eq!(checksum(values.into_iter()), *sum, "batch {i} intact");
    }
}
