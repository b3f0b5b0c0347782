//! Prefetching iterators (semantics §6): a producer thread builds the next batches inside a
//! circular workspace while the consumer works on the current one, as ND4J's
//! `AsyncDataSetIterator` does; [`shield`] is the same interface with no thread
//! (`AsyncShieldDataSetIterator`).
//!
//! Invariant: the producer builds batch `n` in a cycle of its own circular workspace (a
//! ring of at least `capacity + 2` slots, semantics §2.4), and the consumer reaches the
//! batch's tensors only through [`Batch::get`] or [`Batch::detach`], which first compare
//! `n` with the number of batches the consumer has taken: past `n + 1 + capacity` the call
//! is [`Error::PrefetchWindow`], naming the iterator and the batch. The memory itself is
//! never overwritten while anything refers to it (the ring skips held slots and spills),
//! so the window is a usage contract, not a safety net: nothing can read stale data. The
//! workspace lives on the producer thread and is destroyed there, after the consumer has
//! dropped the iterator, never while batches may still be waiting in the queue.

#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::workspace::{workspaces, AllocationPolicy, ResetPolicy, SpillPolicy, WorkspaceConfig};

/// The name a prefetching iterator gets unless [`PrefetchBuilder::name`] sets one.
pub const DEFAULT_NAME: &str = "PREFETCH";

/// The queue capacity [`Prefetch::builder`] starts from.
pub const DEFAULT_CAPACITY: usize = 2;

/// The largest queue capacity (1022): the producer's ring has `capacity + 2` slots, at most
/// [`MAX_RING_SLOTS`](crate::workspace::MAX_RING_SLOTS). A larger one is refused when the
/// iterator is started, with [`Error::Config`] naming the capacity.
pub const MAX_CAPACITY: usize = crate::workspace::MAX_RING_SLOTS - 2;

/// A set of tensors that can be copied out of workspace memory ([`Batch::detach`]) or to a
/// device ([`PrefetchBuilder::device`]). Implemented for [`Tensor`], `Vec`s and tuples of
/// up to four of them, and for plain values that hold no tensor (numbers, `bool`,
/// `String`), which are cloned.
pub trait Tensors: Sized {
    /// The same set with every tensor replaced by its `detach()` copy (semantics §3).
    fn detach(&self) -> Result<Self>;

    /// The same set with every tensor replaced by its copy on `device` (semantics §5).
    fn to_device(&self, device: &Device) -> Result<Self>;
}

impl Tensors for Tensor {
    fn detach(&self) -> Result<Self> {
        Tensor::detach(self)
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        Tensor::to_device(self, device)
    }
}

impl<T: Tensors> Tensors for Vec<T> {
    fn detach(&self) -> Result<Self> {
        self.iter().map(Tensors::detach).collect()
    }

    fn to_device(&self, device: &Device) -> Result<Self> {
        self.iter().map(|t| t.to_device(device)).collect()
    }
}

macro_rules! plain_tensors {
    ($($plain:ty),+) => {
        $(impl Tensors for $plain {
            fn detach(&self) -> Result<Self> {
                Ok(self.clone())
            }

            fn to_device(&self, _device: &Device) -> Result<Self> {
                Ok(self.clone())
            }
        })+
    };
}
plain_tensors!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64, bool, String);

macro_rules! tuple_tensors {
    ($($name:ident $index:tt),+) => {
        impl<$($name: Tensors),+> Tensors for ($($name,)+) {
            fn detach(&self) -> Result<Self> {
                Ok(($(self.$index.detach()?,)+))
            }

            fn to_device(&self, device: &Device) -> Result<Self> {
                Ok(($(self.$index.to_device(device)?,)+))
            }
        }
    };
}
tuple_tensors!(A 0);
tuple_tensors!(A 0, B 1);
tuple_tensors!(A 0, B 1, C 2);
tuple_tensors!(A 0, B 1, C 2, D 3);

/// What a consumer and its batches share: how many batches the consumer has taken.
#[derive(Debug)]
struct Window {
    /// The iterator's name (and its producer's workspace id).
    name: String,
    /// Batches a batch stays valid for after it was taken; `None`: forever ([`shield`]).
    span: Option<u64>,
    /// Batches the consumer has taken.
    taken: AtomicU64,
    /// The iterator was dropped and its workspace destroyed.
    closed: AtomicBool,
}

/// One batch handed out by a [`Prefetch`] iterator: its data, and its place in the stream.
///
/// The data is reachable through [`get`](Batch::get) while the batch is inside its window
/// (semantics §6): until the consumer has taken `capacity + 1` more batches from the
/// iterator, and while the iterator lives. After that, `get` and `detach` return
/// [`Error::PrefetchWindow`] instead of the data; [`detach`](Batch::detach) it in time to
/// keep it. Batches of [`shield`] never expire.
///
/// The check is made at each call: call `get` where the data is used rather than keeping
/// the reference across `next` calls. A tensor cloned out of the batch is not checked
/// against the window, but it is never stale either: its memory stays intact while it
/// lives (semantics §2.4), until the iterator is dropped (then it is a leaked workspace
/// pointer, semantics §3).
#[derive(Debug)]
pub struct Batch<B> {
    data: B,
    index: u64,
    window: Arc<Window>,
}

impl<B> Batch<B> {
    /// The batch's number in the stream, from 0.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The name of the iterator it came from.
    pub fn iterator(&self) -> &str {
        &self.window.name
    }

    /// Whether [`get`](Batch::get) would succeed.
    pub fn is_valid(&self) -> bool {
        self.check().is_ok()
    }

    /// The batch's data, if the batch is inside its window; otherwise
    /// [`Error::PrefetchWindow`], and the data is not touched.
    pub fn get(&self) -> Result<&B> {
        self.check()?;
        Ok(&self.data)
    }

    /// A copy of the data in pool memory (every tensor `detach()`ed), valid on any thread
    /// forever; fails like [`get`](Batch::get) once the window has ended.
    pub fn detach(&self) -> Result<B>
    where
        B: Tensors,
    {
        self.get()?.detach()
    }

    fn check(&self) -> Result<()> {
        let window = &self.window;
        let Some(span) = window.span else {
            return Ok(());
        };
        let since = window
            .taken
            .load(Ordering::Acquire)
            .saturating_sub(self.index + 1);
        let reason = if window.closed.load(Ordering::Acquire) {
            "the iterator was dropped and its workspace destroyed".to_string()
        } else if since > span {
            format!(
                "{since} batches were taken after it, and a batch stays valid for the next {span}"
            )
        } else {
            return Ok(());
        };
        Err(Error::PrefetchWindow {
            iterator: window.name.clone(),
            batch: self.index,
            reason,
        })
    }
}

/// A message from the producer: a batch, or why the stream stopped.
type Message<B> = Result<B>;

/// How batches reach the consumer.
enum Source<B> {
    /// A producer thread and its bounded queue.
    Thread {
        queue: Option<Receiver<Message<B>>>,
        /// Dropped to tell a finished producer to destroy its workspace and exit.
        stop: Option<SyncSender<()>>,
        stopping: Arc<AtomicBool>,
        producer: Option<JoinHandle<()>>,
    },
    /// Built on the consumer's thread at each `next` ([`shield`]).
    Inline(Box<dyn FnMut() -> Option<Result<B>> + Send>),
}

/// An iterator of batches built ahead of the consumer by a producer thread (semantics §6),
/// or, from [`shield`], on the consumer's own thread.
///
/// Each item is a [`Batch`] or the error that ended the stream (the build closure's error,
/// or [`Error::Prefetch`] for a panic); after an error the iterator ends. Dropping it
/// stops the producer (after the batch it is building), joins it, and destroys its
/// workspace; batches still held then fail [`Batch::get`].
///
/// ```rust
/// use ndmem::prefetch::Prefetch;
/// use ndmem::{DType, Tensor};
///
/// let batches = Prefetch::new(2, 0..10, |i| Tensor::full(DType::F32, &[256], i as f64))?;
/// let mut total = 0.0;
/// for batch in batches {
///     let batch = batch?;
///     total += batch.get()?.sum()?.scalar()?;
/// }
/// assert_eq!(total, 256.0 * 45.0);
/// # Ok::<(), ndmem::Error>(())
/// ```
pub struct Prefetch<B> {
    source: Source<B>,
    window: Arc<Window>,
    finished: bool,
}

impl<B> std::fmt::Debug for Prefetch<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch")
            .field("name", &self.window.name)
            .field("window", &self.window.span)
            .field("taken", &self.window.taken.load(Ordering::Relaxed))
            .field("threaded", &matches!(self.source, Source::Thread { .. }))
            .finish()
    }
}

/// Settings of a [`Prefetch`] iterator: its name, queue capacity and workspace.
#[derive(Debug, Clone)]
pub struct PrefetchBuilder {
    name: String,
    capacity: usize,
    config: Option<WorkspaceConfig>,
}

/// Settings of a prefetching iterator that hands its batches over on a device; see
/// [`PrefetchBuilder::device`].
#[derive(Debug, Clone)]
pub struct DevicePrefetchBuilder {
    host: PrefetchBuilder,
    device: Device,
}

impl DevicePrefetchBuilder {
    /// Starts the producer thread: each batch is built in the producer's workspace as with
    /// [`PrefetchBuilder::spawn`], then copied to the device there, and the device copy is
    /// what the consumer receives. The host copy's ring slot is free again once the copy
    /// is made.
    pub fn spawn<I, B, It, F>(self, items: It, mut build: F) -> Result<Prefetch<B>>
    where
        It: IntoIterator<Item = I>,
        It::IntoIter: Send + 'static,
        F: FnMut(I) -> Result<B> + Send + 'static,
        B: Tensors + Send + 'static,
    {
        let device = self.device;
        self.host
            .spawn(items, move |item| build(item)?.to_device(&device))
    }
}

impl PrefetchBuilder {
    /// The iterator's name: the producer's workspace id, and what errors call it.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Batches the queue holds ahead of the consumer (0: each hand-over waits for the
    /// other side), at most [`MAX_CAPACITY`]. A batch stays valid until the consumer has
    /// taken `capacity + 1` more.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The producer's workspace settings (its memory source, learning, sizes, spill
    /// policy). The reset policy is made circular and the ring given at least
    /// `capacity + 2` slots (`Overallocate` with a limit of at least `capacity + 1`).
    /// Without it: learned from the first batch, from the global pool, `Reallocate`, so a
    /// larger batch grows the ring instead of spilling every time.
    pub fn workspace(mut self, config: WorkspaceConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// The circular configuration the producer's workspace gets.
    fn ring(&self) -> Result<WorkspaceConfig> {
        if self.capacity > MAX_CAPACITY {
            // Refused here, naming what the user set, before the ring's limit derived from
            // it would be refused naming `overallocation_limit`.
            return Err(Error::Config(ndmem_alloc::ConfigError::Invalid {
                variable: "prefetch capacity".to_string(),
                message: format!(
                    "capacity {} of iterator [{}] is more than the largest allowed, \
                     {MAX_CAPACITY} (prefetch::MAX_CAPACITY: the producer's ring has capacity + 2 \
                     slots, at most {})",
                    self.capacity,
                    self.name,
                    crate::workspace::MAX_RING_SLOTS
                ),
            }));
        }
        let base = match &self.config {
            Some(config) => config.to_builder(),
            None => WorkspaceConfig::builder().policy_spill(SpillPolicy::Reallocate),
        };
        let at_least = self.capacity as f64 + 1.0;
        let limit = self
            .config
            .as_ref()
            .map_or(at_least, |c| c.overallocation_limit().max(at_least));
        base.policy_reset(ResetPolicy::EndOfBuffer)
            .policy_allocation(AllocationPolicy::Overallocate)
            .overallocation_limit(limit)
            .build()
    }

    /// The same interface with no prefetching (ND4J's `AsyncShieldDataSetIterator`): each
    /// `next` builds the batch on the calling thread, in pool memory (no workspace is
    /// current meanwhile), so its batches never expire. The capacity and the workspace are
    /// not used. For debugging a pipeline without a second thread.
    pub fn shield<I, B, It, F>(self, items: It, mut build: F) -> Prefetch<B>
    where
        It: IntoIterator<Item = I>,
        It::IntoIter: Send + 'static,
        F: FnMut(I) -> Result<B> + Send + 'static,
        B: Send + 'static,
    {
        let mut items = items.into_iter();
        Prefetch {
            source: Source::Inline(Box::new(move || items.next().map(&mut build))),
            window: Arc::new(Window {
                name: self.name,
                span: None,
                taken: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
            finished: false,
        }
    }

    /// Batches are copied to `device` on the producer thread, after they are built, so the
    /// copies overlap the consumer's work (semantics §6). The copy reads the producer's
    /// ring and goes through the device's pinned staging buffer (semantics §5).
    pub fn device(self, device: &Device) -> DevicePrefetchBuilder {
        DevicePrefetchBuilder {
            host: self,
            device: device.clone(),
        }
    }

    /// Starts the producer thread over `items`, building each batch with `build` inside
    /// the producer's workspace.
    pub fn spawn<I, B, It, F>(self, items: It, mut build: F) -> Result<Prefetch<B>>
    where
        It: IntoIterator<Item = I>,
        It::IntoIter: Send + 'static,
        F: FnMut(I) -> Result<B> + Send + 'static,
        B: Send + 'static,
    {
        let config = self.ring()?;
        let capacity = self.capacity;
        // The batches' tensor headers cross to the consumer and come back to the producer
        // through the depot: make its room now, not in the first steps.
        crate::memory::owner::prepare_depot();
        let window = Arc::new(Window {
            name: self.name.clone(),
            span: Some(capacity as u64),
            taken: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let (to_consumer, queue) = sync_channel::<Message<B>>(capacity);
        let (stop, stopped) = sync_channel::<()>(0);
        let stopping = Arc::new(AtomicBool::new(false));
        let mut items = items.into_iter();
        let name = self.name;
        let producer = {
            let stopping = Arc::clone(&stopping);
            std::thread::Builder::new()
                .name(format!("prefetch-{name}"))
                .spawn(move || {
                    produce(
                        &name,
                        &config,
                        &mut items,
                        &mut build,
                        &to_consumer,
                        &stopping,
                    );
                    // What the items and the build hold goes now, not at the drop; the
                    // consumer sees the end of the stream after the queued batches.
                    drop((items, build, to_consumer));
                    // Wait until the iterator is dropped: then the batches are gone or in
                    // the consumer's hands, and the ring ends here, on its own thread
                    // (held batches then fail, semantics §2.2).
                    let _ = stopped.recv();
                    let _ = workspaces().destroy(&name);
                })
                .map_err(|e| Error::Prefetch {
                    iterator: window.name.clone(),
                    message: format!("cannot start the producer thread: {e}"),
                })?
        };
        Ok(Prefetch {
            source: Source::Thread {
                queue: Some(queue),
                stop: Some(stop),
                stopping,
                producer: Some(producer),
            },
            window,
            finished: false,
        })
    }
}

/// The producer's loop: one workspace cycle per batch, then the hand-over (which blocks
/// while the queue is full). Returns when the items end, the build fails or panics (sent
/// to the consumer), or the consumer is gone.
fn produce<I, B>(
    name: &str,
    config: &WorkspaceConfig,
    items: &mut dyn Iterator<Item = I>,
    build: &mut dyn FnMut(I) -> Result<B>,
    to_consumer: &SyncSender<Message<B>>,
    stopping: &AtomicBool,
) {
    let ws = workspaces();
    for index in 0u64.. {
        if stopping.load(Ordering::Acquire) {
            return;
        }
        let built = catch_unwind(AssertUnwindSafe(|| {
            let item = items.next()?;
            Some(
                ws.get_and_activate(config, name)
                    .and_then(|_cycle| build(item)),
            )
        }));
        let message = match built {
            Ok(None) => return,
            Ok(Some(batch)) => batch,
            Err(payload) => Err(Error::Prefetch {
                iterator: name.to_string(),
                message: format!(
                    "the producer panicked at batch {index}: {}",
                    panic_text(&*payload)
                ),
            }),
        };
        let failed = message.is_err();
        if to_consumer.send(message).is_err() || failed {
            return;
        }
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-text panic payload".to_string()
    }
}

impl Prefetch<()> {
    /// Settings to start from: named [`DEFAULT_NAME`], [`DEFAULT_CAPACITY`] batches ahead,
    /// the default workspace of [`PrefetchBuilder::workspace`].
    pub fn builder() -> PrefetchBuilder {
        PrefetchBuilder {
            name: DEFAULT_NAME.to_string(),
            capacity: DEFAULT_CAPACITY,
            config: None,
        }
    }
}

impl<B: Send + 'static> Prefetch<B> {
    /// Prefetches `capacity` batches ahead (at most [`MAX_CAPACITY`], else
    /// [`Error::Config`] naming it): a producer thread builds `build(item)` for each
    /// of `items`, in order, inside its circular workspace (semantics §6). See
    /// [`Prefetch::builder`] for the name and the workspace.
    pub fn new<I, It, F>(capacity: usize, items: It, build: F) -> Result<Prefetch<B>>
    where
        It: IntoIterator<Item = I>,
        It::IntoIter: Send + 'static,
        F: FnMut(I) -> Result<B> + Send + 'static,
    {
        Prefetch::builder().capacity(capacity).spawn(items, build)
    }

    /// The iterator's name.
    pub fn name(&self) -> &str {
        &self.window.name
    }

    /// Batches the queue holds ahead of the consumer; `None` for [`shield`].
    pub fn capacity(&self) -> Option<usize> {
        self.window.span.map(|span| span as usize)
    }

    /// Batches taken so far.
    pub fn taken(&self) -> u64 {
        self.window.taken.load(Ordering::Relaxed)
    }

    fn hand_out(&mut self, next: Option<Result<B>>) -> Option<Result<Batch<B>>> {
        match next {
            Some(Ok(data)) => {
                let index = self.window.taken.fetch_add(1, Ordering::AcqRel);
                Some(Ok(Batch {
                    data,
                    index,
                    window: Arc::clone(&self.window),
                }))
            }
            Some(Err(e)) => {
                self.finished = true;
                Some(Err(e))
            }
            None => {
                self.finished = true;
                None
            }
        }
    }
}

impl<B: Send + 'static> Iterator for Prefetch<B> {
    type Item = Result<Batch<B>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        let next = match &mut self.source {
            Source::Thread { queue, .. } => queue.as_ref().and_then(|q| q.recv().ok()),
            Source::Inline(next) => {
                // Shielded batches are the consumer's own pool tensors, whatever workspace
                // the consumer has open.
                let _out = workspaces().scope_out();
                catch_unwind(AssertUnwindSafe(next)).unwrap_or_else(|payload| {
                    Some(Err(Error::Prefetch {
                        iterator: self.window.name.clone(),
                        message: format!(
                            "the build panicked at batch {}: {}",
                            self.window.taken.load(Ordering::Relaxed),
                            panic_text(&*payload)
                        ),
                    }))
                })
            }
        };
        self.hand_out(next)
    }
}

impl<B> Drop for Prefetch<B> {
    fn drop(&mut self) {
        if let Source::Thread {
            queue,
            stop,
            stopping,
            producer,
        } = &mut self.source
        {
            stopping.store(true, Ordering::Release);
            self.window.closed.store(true, Ordering::Release);
            drop(queue.take()); // a producer blocked on a full queue wakes up
            drop(stop.take()); // a finished producer destroys its workspace
            if let Some(producer) = producer.take() {
                // The producer catches the panics of the items and of the build and
                // sends them as errors, so the join itself has nothing left to report.
                let _ = producer.join();
            }
        }
    }
}

/// The same interface as [`Prefetch`] with no prefetching (ND4J's
/// `AsyncShieldDataSetIterator`), named [`DEFAULT_NAME`]: see [`PrefetchBuilder::shield`].
pub fn shield<I, B, It, F>(items: It, build: F) -> Prefetch<B>
where
    It: IntoIterator<Item = I>,
    It::IntoIter: Send + 'static,
    F: FnMut(I) -> Result<B> + Send + 'static,
    B: Send + 'static,
{
    Prefetch::builder().shield(items, build)
}
