//! # ndmem
//!
//! A memory-accounting runtime for tensor workloads: every byte is counted, every limit is
//! exact, and using memory that was reused or freed behind a tensor's back is an error, never
//! undefined behaviour.
//!
//! It brings the memory model of ND4J's workspaces and DJL's `NDManager` to Rust: a loop runs
//! each step in a *workspace* that learns its size, then allocates by bumping a pointer;
//! *scopes* own groups of tensors and free them together; tensors shared between threads are
//! freed by epoch-based reclamation.
//!
//! # Layers
//!
//! From the bottom up, each layer calling only the ones below it:
//!
//! 1. **Allocator** ([`alloc`], the `ndmem-alloc` crate): a tracking `#[global_allocator]`
//!    ([`alloc::heap`]) and the native [`alloc::Pool`], with exact limits.
//! 2. **Memory source** ([`MemorySource`]): the pool memory is drawn from (the global one
//!    unless a program makes its own).
//! 3. **Workspaces** ([`workspaces`]): per-thread cyclic bump arenas.
//! 4. **Devices** ([`device`]): GPUs (CUDA through cudarc, or a simulated device) with a
//!    pool and an exact limit each, pinned staging, mirrored buffers and device workspaces.
//! 5. **Homes and owners** (internal): where a tensor's bytes live, and who owns them.
//! 6. **Tensors** ([`Tensor`]): n-dimensional arrays, `Send` and `Sync`, checked on every use.
//! 7. **Scopes** ([`Scope`]): ownership trees in the style of DJL's `NDManager`.
//! 8. **Prefetch** ([`Prefetch`], [`shield`]): batches built ahead by a producer thread in a
//!    circular workspace, in the style of ND4J's `AsyncDataSetIterator`.
//! 9. **Statistics** ([`stats`]): one snapshot of every figure (with PyTorch's key names),
//!    the memory summary, the timeline recorder ([`trace`]) and the out-of-memory report.
//!
//! Without a workspace or a scope, a tensor's memory is a pool block owned by its handles:
//!
//! ```rust
//! use ndmem::{DType, Tensor};
//!
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = a.matmul(&a.transpose()?)?.add_scalar(1.0)?;
//! assert_eq!(b.to_vec::<f32>()?, vec![6.0, 12.0, 12.0, 26.0]);
//! assert_eq!(b.workspace(), None);
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! # Workspaces
//!
//! A workspace is entered once per iteration of a loop with `get_and_activate` on this
//! thread's [`workspaces`]; the guard it returns ends the iteration, a *cycle*, when it drops. While a workspace is current, every new tensor is
//! bumped into its buffer. The first cycle has no buffer yet: it *spills* to the pool and
//! measures itself, and at its end the buffer is allocated at that size (times 1.3 by
//! default). From then on a cycle touches neither the pool nor the OS, and the next cycle
//! reuses the same memory.
//!
//! ```rust
//! use ndmem::{workspaces, DType, Tensor, WorkspaceConfig};
//!
//! let ws = workspaces(); // this thread's workspaces
//! let cfg = WorkspaceConfig::default(); // learn in the first cycle, spill to the pool
//! let w = Tensor::ones(DType::F32, &[64, 64])?; // no workspace current: a pool block
//! for step in 0..3 {
//!     let _cycle = ws.get_and_activate(&cfg, "STEP")?;
//!     let x = Tensor::full(DType::F32, &[16, 64], step as f64)?;
//!     let y = x.matmul(&w)?.relu()?;
//!     assert_eq!(y.workspace(), Some("STEP"));
//!     assert_eq!(ws.workspace("STEP").unwrap().spilled_bytes > 0, step == 0); // first only
//! }
//! let stats = ws.workspace("STEP").unwrap();
//! assert_eq!(stats.cycles, 3);
//! assert!(stats.size >= stats.max_cycle); // learned: the largest cycle x 1.3
//! ws.destroy("STEP")?;
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! [`WorkspaceConfig`] holds ND4J's policies (learning; spill to the pool, grow at the cycle's
//! end, or fail; RAM or a mapped file); combinations that cannot work are refused by `build`:
//!
//! ```rust
//! use ndmem::{workspaces, DType, Error, SpillPolicy, Tensor, WorkspaceConfig};
//!
//! // A Fail workspace needs an initial buffer: it would refuse everything before learning.
//! assert!(WorkspaceConfig::builder().policy_spill(SpillPolicy::Fail).build().is_err());
//! let cfg = WorkspaceConfig::builder()
//!     .initial_size(1024)
//!     .policy_spill(SpillPolicy::Fail)
//!     .build()?;
//! let _cycle = workspaces().get_and_activate(&cfg, "SMALL")?;
//! let err = Tensor::zeros(DType::U8, &[1 << 20]).unwrap_err();
//! assert!(matches!(err, Error::WorkspaceFull { .. }));
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! A *circular* workspace ([`ResetPolicy::EndOfBuffer`]) is a ring of slots, one per cycle.
//! Its memory stays valid after the cycle, on any thread, for as long as something refers to
//! it: the ring never starts a cycle in a slot still in use (it spills instead). This is how a
//! producer hands batches to a consumer thread:
//!
//! ```rust
//! use ndmem::{workspaces, DType, ResetPolicy, Tensor, WorkspaceConfig};
//!
//! let ring = WorkspaceConfig::builder()
//!     .initial_size(4096)
//!     .policy_reset(ResetPolicy::EndOfBuffer)
//!     .overallocation_limit(2.0) // three slots
//!     .build()?;
//! let (batches, received) = std::sync::mpsc::sync_channel::<Tensor>(2);
//! let consumer = std::thread::spawn(move || {
//!     received.iter().map(|batch| batch.sum()?.scalar()).sum::<Result<f64, ndmem::Error>>()
//! });
//! let ws = workspaces();
//! for i in 0..10 {
//!     let _cycle = ws.get_and_activate(&ring, "BATCHES")?;
//!     batches.send(Tensor::full(DType::F32, &[256], i as f64)?).unwrap();
//! }
//! drop(batches);
//! assert_eq!(consumer.join().unwrap()?, 256.0 * 45.0);
//! ws.destroy("BATCHES")?;
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! # Validity
//!
//! Every tensor in workspace memory carries a *stamp*: its workspace and the cycle (the
//! *generation*) it was allocated in, compared with the workspace's state (one atomic load)
//! before any read or write. A tensor of a left or destroyed workspace is *leaked*, one of an
//! earlier cycle *outdated*, one used off the workspace's thread on the *wrong thread*: each
//! is an [`Error`] naming the operation, the argument and the workspace, never undefined
//! behaviour. To keep a result, copy it out: [`Tensor::detach`] (pool memory, valid forever),
//! [`Tensor::leverage`] (into the parent workspace), [`Tensor::leverage_to`], [`Tensor::migrate`].
//!
//! ```rust
//! use ndmem::{workspaces, DType, Error, Tensor, WorkspaceConfig};
//!
//! let ws = workspaces();
//! let cfg = WorkspaceConfig::default();
//! let (leaked, kept) = {
//!     let _cycle = ws.get_and_activate(&cfg, "LOOP")?;
//!     let x = Tensor::ones(DType::F32, &[4])?;
//!     (x.clone(), x.detach()?)
//! };
//! let err = leaked.add_scalar(1.0).unwrap_err().to_string();
//! assert_eq!(err, "Op [add_scalar] X argument uses leaked workspace pointer from workspace [LOOP]");
//! assert_eq!(kept.to_vec::<f32>()?, vec![1.0; 4]); // detached: valid forever
//!
//! let second = ws.get_and_activate(&cfg, "LOOP")?;
//! let old = Tensor::ones(DType::F32, &[4])?;
//! drop(second);
//! let third = ws.get_and_activate(&cfg, "LOOP")?;
//! assert!(matches!(
//!     old.to_vec::<f32>(),
//!     Err(Error::OutdatedWorkspacePointer { allocated_in: 2, current: 3, .. })
//! ));
//! let mine = Tensor::ones(DType::F32, &[4])?;
//! let there = std::thread::scope(|s| s.spawn(|| mine.to_vec::<f32>()).join().unwrap());
//! assert!(matches!(there, Err(Error::WrongThread { .. })));
//! drop(third);
//! // Nested workspaces: leverage() copies into the workspace that was current before.
//! let _epoch = ws.get_and_activate(&cfg, "EPOCH")?;
//! let total = {
//!     let _batch = ws.get_and_activate(&cfg, "BATCH")?;
//!     Tensor::ones(DType::F32, &[4])?.leverage()?
//! };
//! assert_eq!(total.workspace(), Some("EPOCH"));
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! # Scopes
//!
//! A [`Scope`] owns tensors and frees them all when it closes or its handle drops; scopes form
//! a tree under a root that never closes. An operation's result belongs to the scope of its
//! first input (when no workspace is current); [`Scope::ret`] hands a tensor to the parent,
//! [`Scope::attach`] and [`Scope::detach`] move ownership, [`Scope::cap`] makes any later
//! attachment an error (a leak tripwire). A tensor of a closed scope fails every use.
//!
//! ```rust
//! use ndmem::{DType, Error, Scope, Tensor};
//!
//! let model = Scope::new_base("model");
//! let w = model.full(DType::F32, &[3], 2.0)?;
//! let kept = {
//!     let batch = model.child("batch")?;
//!     let x = batch.from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//!     let y = x.mul(&w)?; // owned by `batch`, the scope of its first input
//!     let kept = batch.ret(&y)?; // now owned by `model`
//!     drop(batch); // closes it
//!     assert!(matches!(x.to_vec::<f32>(), Err(Error::ScopeClosed { .. })));
//!     kept
//! };
//! assert_eq!(kept.to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! assert!(model.debug_dump().contains("[model]: 2 tensors"));
//! model.cap();
//! let stray = Tensor::ones(DType::F32, &[1])?;
//! assert!(matches!(model.attach(&stray), Err(Error::ScopeCapped { .. })));
//! model.close()?;
//! assert!(w.to_vec::<f32>().is_err());
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! # Reclamation
//!
//! Several threads may read a pool tensor at once, so its last handle (or its closing scope)
//! does not free it on the spot: the block is *deferred* through epoch-based reclamation
//! (crossbeam-epoch) and freed once no thread that was reading can still be; an operation
//! pins the epoch only while it runs. [`reclaim::pending_bytes`] says what is waiting; past
//! 64 MiB the dropping thread collects, the pool collects before it refuses an allocation,
//! and [`reclaim::collect`] forces it (what ND4J users reach for `System.gc()` for).
//!
//! ```rust
//! use ndmem::{reclaim, DType, Tensor};
//!
//! let t = Tensor::zeros(DType::F64, &[1024])?; // a pool block owned by its handles
//! drop(t.clone()); // another handle is alive: nothing happens
//! drop(t); // the last one: the block waits for the epoch to move on
//! assert!(reclaim::pending_bytes() >= 8 * 1024);
//! assert!(reclaim::collect() >= 8 * 1024);
//! assert_eq!(reclaim::pending_bytes(), 0);
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! # Limits and errors
//!
//! Limits come from the environment: `NDMEM_MAX_HEAP` (the tracking allocator's live bytes;
//! unlimited by default), `NDMEM_MAX_BYTES` (what the pool holds, workspaces included; half of
//! RAM), `NDMEM_MAX_PHYSICAL_BYTES` (the resident set size) and `NDMEM_MAX_DEVICE_BYTES` (what
//! each device's pool holds). Sizes read `64K`, `1.5G`, `50%` (of RAM, or of the device's
//! memory for a device); `0` means no
//! limit; garbage is an error naming the variable. `NDMEM_WORKSPACES=spill_everything` or
//! `bypass` makes workspaces a debugging aid. Limits hold exactly under any number of threads;
//! at a limit the pool flushes deferred frees and its cache, then fails with a value whose
//! message says what holds the memory:
//!
//! ```rust
//! use ndmem::alloc::{Limits, Pool};
//! use ndmem::MemorySource;
//!
//! let pool = MemorySource::new(Pool::new(Limits::builder().max_bytes(64 << 10).build())).pool();
//! let held = pool.allocate(48 << 10, 64)?;
//! let err = pool.allocate(32 << 10, 64).unwrap_err().to_string();
//! assert!(err.starts_with("Can't allocate [HOST] memory: 32768 bytes; threadId: "));
//! assert!(err.contains("off-heap 48.0 KiB of 64.0 KiB limit in use"));
//! drop(held);
//! let _from_env = Limits::from_env()?; // every NDMEM_* limit, each checked
//! # Ok::<(), ndmem::Error>(())
//! ```
//!
//! A refusal at the pool's limit is `Error::Alloc(AllocError::OutOfMemory { .. })` with a
//! report attached ([`Error::oom_report`]), which names the largest
//! holders and the knob to turn; [`stats::snapshot`], [`stats::memory_summary`] and
//! `NDMEM_TRACE=trace.json` (a timeline written at exit, drawn by `ndmem report`) show
//! where memory went before it came to that.
//!
//! The heap is counted once [`alloc::Tracking`] is the program's global allocator:
//!
//! ```rust
//! #[global_allocator]
//! static GLOBAL: ndmem::alloc::Tracking<std::alloc::System> =
//!     ndmem::alloc::Tracking::new(std::alloc::System);
//!
//! fn main() {
//!     let v = vec![0u8; 1 << 20];
//!     assert!(ndmem::alloc::heap::stats().live_bytes >= v.len());
//! }
//! ```
//!
//! The behaviour contract, section by section with every deliberate difference from ND4J and
//! DJL, is `docs/semantics.md` in the repository; the layers, the memory seam and the module
//! graph are `docs/design.md`.

#![warn(missing_docs)]

#[cfg(not(ndmem_loom))]
pub mod device;
#[cfg(not(ndmem_loom))]
mod error;
#[cfg(not(ndmem_loom))]
pub mod memory;
#[cfg(not(ndmem_loom))]
pub mod prefetch;
#[cfg(not(ndmem_loom))]
pub mod reclaim;
#[cfg(not(ndmem_loom))]
pub mod scope;
#[cfg(not(ndmem_loom))]
pub mod stats;
mod sync;
#[cfg(not(ndmem_loom))]
pub mod tensor;
#[cfg(not(ndmem_loom))]
pub mod workspace;

// Under `--cfg ndmem_loom` only the pieces the loom models in `loom-tests/` check are
// built, as public modules.
#[cfg(ndmem_loom)]
#[path = "memory/handoff.rs"]
pub mod handoff;
#[cfg(ndmem_loom)]
#[path = "workspace/slots.rs"]
pub mod workspace_slots;
#[cfg(ndmem_loom)]
#[path = "workspace/state.rs"]
pub mod workspace_state;

#[cfg(not(ndmem_loom))]
pub use device::Device;
#[cfg(not(ndmem_loom))]
pub use error::{Error, Result};
#[cfg(not(ndmem_loom))]
pub use memory::MemorySource;
#[cfg(not(ndmem_loom))]
pub use ndmem_alloc as alloc;
#[cfg(not(ndmem_loom))]
pub use prefetch::{shield, Batch, Prefetch};
#[cfg(not(ndmem_loom))]
pub use scope::Scope;
#[cfg(not(ndmem_loom))]
pub use stats::trace;
#[cfg(not(ndmem_loom))]
pub use tensor::{DType, Element, Tensor, TensorView};
#[cfg(not(ndmem_loom))]
pub use workspace::{
    workspaces, AllocationPolicy, LearningPolicy, LocationPolicy, MirroringPolicy, ResetPolicy,
    SpillPolicy, WorkspaceConfig, WorkspaceGuard, WorkspaceStats,
};

/// The README's examples are compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
