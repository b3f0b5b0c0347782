//! Allocator benchmarks against the anchors (ARCHITECTURE "Hot paths ... are benchmarked").
//!
//! - `alloc_free_1t/<allocator>/<size>` and `alloc_free_2t/<allocator>/<size>`: one
//!   `GlobalAlloc::alloc`, a write to the first and the last byte, `black_box`, one
//!   `dealloc`, for 64 B, 4 KiB and 1 MiB, called directly on a static instance of System,
//!   `Tracking<System>`, mimalloc, `Tracking<MiMalloc>` and `cap::Cap<System>` (limit
//!   `usize::MAX / 2`, as users set one), and `checked_system`: System behind a wrapper
//!   that only tests the returned pointer for null, the least any wrapper keeping exact
//!   books does (the floor under `Tracking`'s overhead), and `counted_system`: that wrapper
//!   plus one thread-local byte counter raised on alloc and lowered on free, the least a
//!   per-thread count adds (the second floor). The bench binary keeps the default global
//!   allocator: only the direct calls go through the allocators measured. Tracking's
//!   statistics are process-wide statics and count these calls all the same. At 2 threads
//!   both threads run the same loop at once (started by a barrier); the figure is the
//!   slower thread's time divided by its iterations, i.e. the time per alloc+free pair a
//!   thread sees while the other one allocates too (equal to the 1-thread figure if the
//!   allocator scales perfectly).
//! - `pool_reuse/<impl>/<size>`: a block of 64 KiB .. 16 MiB (and 64 MiB) obtained, a byte
//!   written in every 4 KiB page (first touch when the pages are fresh), and given back, in
//!   a loop: `Pool::allocate(size, 64)` + drop, against System (glibc `malloc` + `free`).
//!   glibc mmaps a block above its mmap threshold (128 KiB at start) and unmaps it at
//!   `free`, but that free also raises the threshold to the block's size (up to 32 MiB), so
//!   from the second round on one block of up to 32 MiB stays on the heap, resident; the
//!   64 MiB block is above that ceiling and is mapped and faulted in every round.
//! - `pool_cycle8/<impl>/<size>`: 8 blocks of 64 KiB .. 16 MiB live at once (a step of a
//!   training loop: allocate 8 tensors, touch them, free them all); time per block. Here
//!   glibc's freed heap top passes its trim threshold (twice the mmap threshold) and glibc
//!   hands the pages back to the OS every round.
//! - Before criterion runs, minor page faults per block of each pool benchmark are
//!   printed, read from /proc/self/stat (the figure getrusage's ru_minflt reports).
//! - `pool_pair_1t/<impl>/<size>` and `pool_pair_2t/...`: one `Pool::allocate(size, 16)`,
//!   a write to the first and the last byte, drop, for 64 B, 4 KiB, 64 KiB and 1 MiB,
//!   beside System (glibc) and mimalloc doing the same through `GlobalAlloc`; at 2 threads
//!   both threads share one pool and the figure is the slower thread's, as above.
//! - `pool_cycle1000_1t/<impl>/<size>` and `pool_cycle1000_2t/...`: 1,000 blocks
//!   allocated (first and last byte written), then all freed; time per block. Minor page
//!   faults per allocation of these cycles after one warm-up cycle are printed first. At 2
//!   threads every sample starts two new threads, so the pool's figure includes their
//!   first cycle (each takes over a list the last sample's threads left in the pool's
//!   depot when they exited). Both variants store their handles in an uninitialised array
//!   and free them where they lie (the pool's 24-byte `Block`s, the anchors' 8-byte
//!   pointers): an array of `Option<Block>` would make the pool's side alone fill 24 KB
//!   first and drop the `None` each slot held, an out-of-line call per block (0.8 ns of
//!   the 6 ns a 64-byte block took in a scratch harness).
//!
//! Run: `cargo bench --bench alloc -- --warm-up-time 1 --measurement-time 3`.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use cap::Cap;
use criterion::{BenchmarkId, Criterion};
use mimalloc::MiMalloc;
use ndmem_alloc::{Block, Limits, Pool, Tracking};

static SYSTEM: System = System;
static TRACKING_SYSTEM: Tracking<System> = Tracking::new(System);
static MIMALLOC: MiMalloc = MiMalloc;
static TRACKING_MIMALLOC: Tracking<MiMalloc> = Tracking::new(MiMalloc);
static CAP: Cap<System> = Cap::new(System, usize::MAX);
static CHECKED_SYSTEM: NullChecked = NullChecked;

/// System behind the least a wrapper that keeps exact books must do: test the pointer the
/// inner allocator returned (a refused allocation must be taken off the books), which
/// makes the inner `alloc` a call instead of a tail jump. The floor under `Tracking`'s
/// overhead in `alloc_free_*`, measured in the same run.
struct NullChecked;

#[cold]
#[inline(never)]
fn refused_by_system() {
    black_box(());
}

// SAFETY: forwards to System with the caller's arguments and returns its result.
unsafe impl GlobalAlloc for NullChecked {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, forwarded unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if ptr.is_null() {
            refused_by_system();
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's pointer and layout, forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// System behind the least a wrapper that counts live bytes per thread must add to
/// `NullChecked`: one thread-local counter, raised after a served allocation and lowered
/// before a free (a load, an add and a store each; no limit, no peak, no publication). The
/// second floor under `Tracking`'s overhead in `alloc_free_*`: what `Tracking` adds above
/// it is its exact limit, peak and batched publication.
struct Counted;

static COUNTED_SYSTEM: Counted = Counted;

thread_local! {
    static COUNTED_BYTES: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to System with the caller's arguments and returns its result.
unsafe impl GlobalAlloc for Counted {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, forwarded unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if ptr.is_null() {
            refused_by_system();
        } else {
            COUNTED_BYTES.with(|b| b.set(b.get().wrapping_add(layout.size())));
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        COUNTED_BYTES.with(|b| b.set(b.get().wrapping_sub(layout.size())));
        // SAFETY: the caller's pointer and layout, forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

const PAGE: usize = 4096;
const ALLOC_SIZES: [usize; 3] = [64, 4 << 10, 1 << 20];
const POOL_SIZES: [usize; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
/// A block above glibc's largest dynamic mmap threshold (32 MiB): `pool_reuse` only.
const BEYOND_THRESHOLD: usize = 64 << 20;
/// Blocks live at once in `pool_cycle8`.
const CYCLE_BLOCKS: usize = 8;
/// Sizes of the pool's pair and 1,000-block cycle benchmarks.
const PAIR_SIZES: [usize; 4] = [64, 4 << 10, 64 << 10, 1 << 20];
/// Blocks live at once in `pool_cycle1000`.
const CYCLE1000: usize = 1000;

/// One alloc + write + free through `alloc`.
#[inline(always)]
fn alloc_write_free(alloc: &dyn GlobalAlloc, layout: Layout) {
    // SAFETY: `layout` has a non-zero size; the pointer is checked before use and freed
    // with the same layout by the allocator that returned it.
    unsafe {
        let ptr = alloc.alloc(layout);
        assert!(
            !ptr.is_null(),
            "allocation of {} bytes failed",
            layout.size()
        );
        ptr.write_volatile(1);
        ptr.add(layout.size() - 1).write_volatile(2);
        alloc.dealloc(black_box(ptr), layout);
    }
}

/// Runs `op` `iters` times on each of `threads` threads started together; returns the
/// slowest thread's time.
fn run_threads(threads: usize, iters: u64, op: impl Fn() + Sync) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        for _ in 0..iters {
            op();
        }
        return start.elapsed();
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        op();
                    }
                    start.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("benchmark thread panicked"))
            .max()
            .unwrap_or_default()
    })
}

fn allocators() -> [(&'static str, &'static (dyn GlobalAlloc + Sync)); 7] {
    [
        ("system", &SYSTEM),
        ("checked_system", &CHECKED_SYSTEM),
        ("counted_system", &COUNTED_SYSTEM),
        ("tracking_system", &TRACKING_SYSTEM),
        ("mimalloc", &MIMALLOC),
        ("tracking_mimalloc", &TRACKING_MIMALLOC),
        ("cap_system", &CAP),
    ]
}

fn alloc_free(c: &mut Criterion) {
    CAP.set_limit(usize::MAX / 2)
        .expect("nothing is allocated through cap yet");
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("alloc_free_{threads}t"));
        for size in ALLOC_SIZES {
            let layout = Layout::from_size_align(size, 16).expect("a valid layout");
            for (name, alloc) in allocators() {
                group.bench_with_input(BenchmarkId::new(name, size), &layout, |b, &layout| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, || alloc_write_free(alloc, layout))
                    })
                });
            }
        }
        group.finish();
    }
}

/// Writes a byte in every page of the block, so fresh pages fault as a tensor's would.
#[inline(always)]
fn touch(ptr: *mut u8, size: usize) {
    let mut at = 0;
    while at < size {
        // SAFETY: `at < size` and the block holds `size` writable bytes.
        unsafe { ptr.add(at).write_volatile(at as u8) };
        at += PAGE;
    }
    black_box(ptr);
}

/// The pool variant of a round of `blocks` blocks of `size` bytes.
fn pool_round(pool: &Pool, size: usize, blocks: usize) {
    let mut live = [const { None }; CYCLE_BLOCKS];
    for slot in live.iter_mut().take(blocks) {
        let block = pool.allocate(size, 64).expect("an unlimited pool");
        touch(block.ptr().as_ptr(), size);
        *slot = Some(block);
    }
    drop(black_box(live));
}

/// The glibc variant of a round of `blocks` blocks of `size` bytes (malloc: alignment 16).
fn system_round(size: usize, blocks: usize) {
    let layout = Layout::from_size_align(size, 16).expect("a valid layout");
    let mut live = [std::ptr::null_mut::<u8>(); CYCLE_BLOCKS];
    for slot in live.iter_mut().take(blocks) {
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { System.alloc(layout) };
        assert!(!ptr.is_null(), "malloc of {size} bytes failed");
        touch(ptr, size);
        *slot = ptr;
    }
    for ptr in black_box(live).into_iter().take(blocks) {
        // SAFETY: `ptr` came from `System.alloc(layout)` above and is freed once.
        unsafe { System.dealloc(ptr, layout) };
    }
}

/// Minor page faults of this process so far (field 10 of /proc/self/stat).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; fields after it follow its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(7)?.parse().ok()
}

/// Minor faults per block over `rounds` rounds of `round`, after one warm-up round.
fn faults_per_block(rounds: u64, blocks: usize, round: impl Fn()) -> Option<f64> {
    round();
    let before = minor_faults()?;
    for _ in 0..rounds {
        round();
    }
    Some((minor_faults()? - before) as f64 / (rounds * blocks as u64) as f64)
}

fn print_page_faults() {
    println!("minor page faults per block (after one warm-up round):");
    println!(
        "{:>10} {:>14} {:>14} {:>14} {:>14}",
        "size", "pool reuse", "glibc reuse", "pool cycle8", "glibc cycle8"
    );
    let pool = Pool::new(Limits::unlimited());
    let show = |f: Option<f64>| f.map_or("-".to_string(), |f| format!("{f:.1}"));
    for size in POOL_SIZES.into_iter().chain([BEYOND_THRESHOLD]) {
        let cycle = |round: &dyn Fn()| {
            (size != BEYOND_THRESHOLD)
                .then(|| faults_per_block(5, CYCLE_BLOCKS, round))
                .flatten()
        };
        println!(
            "{:>10} {:>14} {:>14} {:>14} {:>14}",
            size,
            show(faults_per_block(20, 1, || pool_round(&pool, size, 1))),
            show(faults_per_block(20, 1, || system_round(size, 1))),
            show(cycle(&|| pool_round(&pool, size, CYCLE_BLOCKS))),
            show(cycle(&|| system_round(size, CYCLE_BLOCKS))),
        );
    }
}

fn pool_vs_system(c: &mut Criterion) {
    print_page_faults();
    for (group_name, blocks) in [("pool_reuse", 1), ("pool_cycle8", CYCLE_BLOCKS)] {
        let mut group = c.benchmark_group(group_name);
        let beyond = (blocks == 1).then_some(BEYOND_THRESHOLD);
        for size in POOL_SIZES.into_iter().chain(beyond) {
            let pool = Pool::new(Limits::unlimited());
            group.bench_with_input(BenchmarkId::new("pool", size), &size, |b, &size| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        pool_round(&pool, size, blocks);
                    }
                    start.elapsed() / blocks as u32
                })
            });
            group.bench_with_input(BenchmarkId::new("system", size), &size, |b, &size| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        system_round(size, blocks);
                    }
                    start.elapsed() / blocks as u32
                })
            });
        }
        group.finish();
    }
}

/// The pool's alloc + write + free, as `alloc_write_free` does it through `GlobalAlloc`.
#[inline(always)]
fn pool_write_free(pool: &Pool, size: usize) {
    let block = pool.allocate(size, 16).expect("an unlimited pool");
    let ptr = block.ptr().as_ptr();
    // SAFETY: the block holds `size` writable bytes.
    unsafe {
        ptr.write_volatile(1);
        ptr.add(size - 1).write_volatile(2);
    }
    drop(black_box(block));
}

/// 1,000 pool blocks of `size` bytes allocated (first and last byte written), then freed.
/// The handles go into an uninitialised array and are dropped where they lie, as the
/// anchors' pointers are stored and freed: neither side fills the array first or drops
/// what a slot held before.
fn pool_cycle1000(pool: &Pool, size: usize) {
    let mut live = [const { MaybeUninit::<Block<'_>>::uninit() }; CYCLE1000];
    for slot in live.iter_mut() {
        let block = pool.allocate(size, 16).expect("an unlimited pool");
        let ptr = block.ptr().as_ptr();
        // SAFETY: the block holds `size` writable bytes.
        unsafe {
            ptr.write_volatile(1);
            ptr.add(size - 1).write_volatile(2);
        }
        slot.write(block);
    }
    black_box(&mut live);
    for slot in &mut live {
        // SAFETY: every slot was written above, and each is dropped once.
        unsafe { slot.assume_init_drop() };
    }
}

/// 1,000 blocks of `size` bytes from `alloc` (first and last byte written), then freed.
fn alloc_cycle1000(alloc: &dyn GlobalAlloc, size: usize) {
    let layout = Layout::from_size_align(size, 16).expect("a valid layout");
    let mut live = [MaybeUninit::<*mut u8>::uninit(); CYCLE1000];
    for slot in live.iter_mut() {
        // SAFETY: `layout` has a non-zero size; the pointer is checked before use.
        unsafe {
            let ptr = alloc.alloc(layout);
            assert!(!ptr.is_null(), "allocation of {size} bytes failed");
            ptr.write_volatile(1);
            ptr.add(size - 1).write_volatile(2);
            slot.write(ptr);
        }
    }
    black_box(&mut live);
    for slot in &live {
        // SAFETY: every slot was written above with a pointer from `alloc.alloc(layout)`,
        // freed once here.
        unsafe { alloc.dealloc(slot.assume_init(), layout) };
    }
}

fn print_cycle1000_page_faults() {
    println!("minor page faults per allocation of a 1,000-block cycle (after one warm-up cycle):");
    println!(
        "{:>10} {:>10} {:>10} {:>10}",
        "size", "pool", "glibc", "mimalloc"
    );
    let pool = Pool::new(Limits::unlimited());
    let show = |f: Option<f64>| f.map_or("-".to_string(), |f| format!("{f:.3}"));
    for size in PAIR_SIZES {
        println!(
            "{:>10} {:>10} {:>10} {:>10}",
            size,
            show(faults_per_block(5, CYCLE1000, || pool_cycle1000(
                &pool, size
            ))),
            show(faults_per_block(5, CYCLE1000, || alloc_cycle1000(
                &SYSTEM, size
            ))),
            show(faults_per_block(5, CYCLE1000, || alloc_cycle1000(
                &MIMALLOC, size
            ))),
        );
    }
}

fn pool_pairs_and_cycles(c: &mut Criterion) {
    print_cycle1000_page_faults();
    let anchors: [(&str, &'static (dyn GlobalAlloc + Sync)); 2] =
        [("system", &SYSTEM), ("mimalloc", &MIMALLOC)];
    for threads in [1, 2] {
        let pool = Pool::new(Limits::unlimited());
        let mut group = c.benchmark_group(format!("pool_pair_{threads}t"));
        for size in PAIR_SIZES {
            group.bench_with_input(BenchmarkId::new("pool", size), &size, |b, &size| {
                b.iter_custom(|iters| run_threads(threads, iters, || pool_write_free(&pool, size)))
            });
            let layout = Layout::from_size_align(size, 16).expect("a valid layout");
            for (name, alloc) in anchors {
                group.bench_with_input(BenchmarkId::new(name, size), &layout, |b, &layout| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, || alloc_write_free(alloc, layout))
                    })
                });
            }
        }
        group.finish();
        let mut group = c.benchmark_group(format!("pool_cycle1000_{threads}t"));
        for size in PAIR_SIZES {
            group.bench_with_input(BenchmarkId::new("pool", size), &size, |b, &size| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, || pool_cycle1000(&pool, size)) / CYCLE1000 as u32
                })
            });
            for (name, alloc) in anchors {
                group.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, || alloc_cycle1000(alloc, size))
                            / CYCLE1000 as u32
                    })
                });
            }
        }
        group.finish();
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    alloc_free(&mut criterion);
    pool_vs_system(&mut criterion);
    pool_pairs_and_cycles(&mut criterion);
    criterion.final_summary();
}
