//! Four threads of random work against tight pools of their own (semantics §1, §2, §4, §6):
//! allocations and frees, workspace cycles (block-left and circular), tensor ops, scopes
//! that close, and, at every sample, the invariants: each pool's bytes at or under its
//! limit, its books balanced (nothing lost), every kept tensor's contents intact; at the
//! end every byte back. Bounded by iterations, not time, so a run is repeatable.

use std::sync::atomic::{AtomicUsize, Ordering};

use ndmem::alloc::{AllocError, Limits, Pool};
use ndmem::{
    reclaim, workspaces, Error, MemorySource, ResetPolicy, Scope, Tensor, WorkspaceConfig,
};

/// Iterations per thread; `NDMEM_STRESS_ITERATIONS` overrides it (scripts/valgrind.sh runs
/// fewer under memcheck).
fn iterations() -> usize {
    std::env::var("NDMEM_STRESS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}
/// Each thread's pool limit.
const LIMIT: usize = 1 << 20;
/// Most elements (f32) of one tensor: 64 KiB.
const MAX_LEN: usize = 16 << 10;

/// A small deterministic generator (xorshift64*), so each thread's run is repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The elements of a tensor made from `seed`: small integers, exact in f32.
fn data(seed: u64, len: usize) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((seed.wrapping_mul(31).wrapping_add(i * 7)) % 1000) as f32)
        .collect()
}

/// A tensor this thread keeps, with what it must contain.
struct Kept {
    tensor: Tensor,
    expected: Vec<f32>,
}

impl Kept {
    fn check(&self) {
        assert_eq!(
            self.tensor.to_vec::<f32>().unwrap(),
            self.expected,
            "a kept tensor's contents changed"
        );
    }
}

/// Refusals at a pool's limit, all threads together.
static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// Whether `result` is a refusal at the pool's limit (expected under a tight limit).
fn at_limit<T: std::fmt::Debug>(result: &Result<T, Error>) -> bool {
    let refused = matches!(
        result,
        Err(Error::Alloc(
            AllocError::OutOfMemory { .. } | AllocError::PhysicalLimit { .. },
        ))
    );
    if refused {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    refused
}

fn check_pool(pool: &Pool) {
    let stats = pool.stats();
    assert!(
        stats.used_bytes <= LIMIT && stats.live_bytes <= LIMIT,
        "over the limit: {stats:?}"
    );
    // Other threads' collections free this pool's blocks too (deferred frees run on
    // whichever thread collects), so a reading here may catch a free in flight: the
    // live bytes are then bounded by the used bytes, never above the books; the books
    // balance exactly at rest, which the test checks once every thread is done.
    assert!(
        stats.live_bytes as u64 <= stats.total_allocated_bytes - stats.total_freed_bytes,
        "live bytes above the books: {stats:?}"
    );
}

fn worker(thread: usize) -> MemorySource {
    let source = MemorySource::new(Pool::new(Limits::builder().max_bytes(LIMIT).build()));
    let pool = source.pool();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1));
    let ws = workspaces();
    let block_left = WorkspaceConfig::builder()
        .source(source)
        .initial_size(128 << 10)
        .build()
        .unwrap();
    let circular = WorkspaceConfig::builder()
        .source(source)
        .policy_reset(ResetPolicy::EndOfBuffer)
        .initial_size(64 << 10)
        .overallocation_limit(2.0)
        .build()
        .unwrap();
    let mut kept: Vec<Kept> = Vec::new();
    for iteration in 0..iterations() {
        match rng.below(6) {
            // Allocate a tensor owned by its handle.
            0 | 1 => {
                let len = 1 + rng.below(MAX_LEN);
                let expected = data(rng.next(), len);
                let made = Tensor::from_slice_in(&source, &expected, &[len]);
                if !at_limit(&made) {
                    kept.push(Kept {
                        tensor: made.unwrap(),
                        expected,
                    });
                }
            }
            // Free one.
            2 => {
                if !kept.is_empty() {
                    let i = rng.below(kept.len());
                    kept.swap_remove(i).check();
                }
            }
            // A workspace cycle: tensors and an op inside, one result detached out.
            3 => {
                let (cfg, id) = if rng.below(2) == 0 {
                    (&block_left, "STRESS_LOOP")
                } else {
                    (&circular, "STRESS_RING")
                };
                let guard = ws.get_and_activate(cfg, id).unwrap();
                let len = 1 + rng.below(4096);
                let expected = data(rng.next(), len);
                let a = Tensor::from_slice(&expected, &[len]);
                if at_limit(&a) {
                    continue;
                }
                let a = a.unwrap();
                let doubled = a.add(&a);
                if at_limit(&doubled) {
                    continue;
                }
                let doubled = doubled.unwrap();
                let twice: Vec<f32> = expected.iter().map(|v| v * 2.0).collect();
                assert_eq!(doubled.to_vec::<f32>().unwrap(), twice);
                let out = doubled.detach();
                drop(guard);
                if let Ok(out) = out {
                    kept.push(Kept {
                        tensor: out,
                        expected: twice,
                    });
                }
            }
            // A scope: tensors it owns, one handed out, then closed.
            4 => {
                let scope = Scope::new_base_in("STRESS", source);
                let len = 1 + rng.below(4096);
                let expected = data(rng.next(), len);
                if let Ok(t) = scope.from_slice(&expected, &[len]) {
                    let plus = t.add_scalar(1.0);
                    if let Ok(plus) = plus {
                        let want: Vec<f32> = expected.iter().map(|v| v + 1.0).collect();
                        assert_eq!(plus.to_vec::<f32>().unwrap(), want);
                        if scope.detach(&plus).is_ok() {
                            kept.push(Kept {
                                tensor: plus,
                                expected: want,
                            });
                        }
                    }
                    scope.close().unwrap();
                    assert!(!t.is_valid(), "a closed scope's tensor is invalid");
                }
            }
            // An op on a kept tensor.
            _ => {
                if !kept.is_empty() {
                    let i = rng.below(kept.len());
                    let made = kept[i].tensor.mul_scalar(3.0);
                    if !at_limit(&made) {
                        let expected = kept[i].expected.iter().map(|v| v * 3.0).collect();
                        let tensor = made.unwrap();
                        if tensor.source() == source {
                            kept.push(Kept { tensor, expected });
                        } else {
                            Kept { tensor, expected }.check();
                        }
                    }
                }
            }
        }
        if iteration % 16 == 0 {
            check_pool(pool);
            kept.iter().for_each(Kept::check);
        }
        if kept.len() > 48 {
            kept.swap_remove(0).check();
        }
    }
    kept.iter().for_each(Kept::check);
    drop(kept);
    ws.destroy_all_for_current_thread();
    check_pool(pool);
    source
}

#[test]
fn four_threads_of_random_work_keep_every_invariant() {
    let handles: Vec<_> = (0..4)
        .map(|t| std::thread::spawn(move || worker(t)))
        .collect();
    let sources: Vec<MemorySource> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        REFUSED.load(Ordering::Relaxed) > 0,
        "the limits are tight enough to refuse some requests"
    );
    // Every byte back once the deferred frees run.
    for _ in 0..100 {
        reclaim::collect();
        if sources.iter().all(|s| s.pool().stats().live_bytes == 0) {
            break;
        }
        std::thread::yield_now();
    }
    for source in &sources {
        let stats = source.pool().stats();
        assert_eq!(stats.live_bytes, 0, "every byte back: {stats:?}");
        assert_eq!(
            stats.total_allocated_bytes, stats.total_freed_bytes,
            "the books balance at rest: {stats:?}"
        );
    }
}
