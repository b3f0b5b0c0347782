//! The timeline recorder (semantics §7): a bounded ring of memory events (allocations,
//! frees, spills, cycle ends, learning, reallocations, refusals, transfers), each with its
//! time, bytes, thread and the interned name of its pool, workspace or scope.
//!
//! Off by default: every recording site first asks [`is_on`], one relaxed load. Switched
//! on by [`start`] (a ring of a fixed number of events, allocated then) and off by
//! [`stop`]; `NDMEM_TRACE=path` ([`ENV_TRACE`]) starts it when the global pool is first
//! used and writes the ring to `path` as JSON when the process exits ([`dump`] writes it
//! on demand).
//!
//! Invariant: recording allocates nothing and takes no lock. An event claims the next
//! sequence number with one `fetch_add` and writes its slot (`sequence % capacity`) under
//! a per-slot sequence word (odd while written, `2 x sequence + 2` once written), which it
//! claims with a compare-exchange from an older, fully written event only (the ring is
//! `trace::ring`, modelled under loom by `loom-tests/tests/trace_ring.rs`), so the ring
//! never holds more than its capacity, an older event never overwrites a newer one, two
//! writers never write one slot at once, and a reader takes only slots whose word says
//! they hold the event it expects, fully written. (An event whose slot is still being
//! written with an older one, by a writer preempted for a whole lap of the ring, gives way
//! and is counted as dropped.) Names are interned once ([`intern`],
//! which does allocate, when a workspace or pool is made), and events carry the index.
//! Rings are never freed (a reader or a late writer may still hold one): a [`start`] with
//! a new capacity allocates a new ring, one with the same capacity restarts and reuses it
//! (its sequence numbers go on, so a writer still finishing an event of the last
//! recording can neither block nor pass for an event of the new one).

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};
use std::time::Instant;

use crate::error::{AllocError, ConfigError};

#[cfg(ndmem_loom)]
#[doc(hidden)]
pub mod ring;
#[cfg(not(ndmem_loom))]
#[allow(unreachable_pub)]
mod ring;

/// The variable that switches the recorder on at start-up and names the file written at
/// exit: `NDMEM_TRACE=trace.json`.
pub const ENV_TRACE: &str = "NDMEM_TRACE";

/// Events the ring started by `NDMEM_TRACE` holds.
pub const DEFAULT_CAPACITY: usize = 1 << 16;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum EventKind {
    /// A pool block handed out (bytes: its capacity), or a bump in a workspace (bytes: the
    /// request).
    Alloc,
    /// A pool block given back.
    Free,
    /// A workspace request served from the pool because it did not fit (semantics §2.2).
    Spill,
    /// A workspace cycle ended (bytes: the cycle's bumped and spilled bytes).
    CycleEnd,
    /// A workspace got its first buffer (bytes: its size; semantics §2.3).
    Learn,
    /// A workspace replaced its buffer by a larger one (bytes: the new size).
    Reallocate,
    /// An allocation was refused at a limit (bytes: the request).
    Oom,
    /// A copy between host and device, or on a device (bytes: the copy's).
    Transfer,
}

impl EventKind {
    const ALL: [EventKind; 8] = [
        EventKind::Alloc,
        EventKind::Free,
        EventKind::Spill,
        EventKind::CycleEnd,
        EventKind::Learn,
        EventKind::Reallocate,
        EventKind::Oom,
        EventKind::Transfer,
    ];

    /// The name used in the JSON file (`alloc`, `cycle_end`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Spill => "spill",
            EventKind::CycleEnd => "cycle_end",
            EventKind::Learn => "learn",
            EventKind::Reallocate => "reallocate",
            EventKind::Oom => "oom",
            EventKind::Transfer => "transfer",
        }
    }
}

/// What an event's name is the name of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Space {
    /// A native pool (its figure is the bytes it holds against its limit).
    Pool,
    /// A workspace.
    Workspace,
    /// A scope.
    Scope,
    /// A device.
    Device,
}

impl Space {
    const ALL: [Space; 4] = [Space::Pool, Space::Workspace, Space::Scope, Space::Device];

    /// The name used in the JSON file.
    pub fn as_str(self) -> &'static str {
        match self {
            Space::Pool => "pool",
            Space::Workspace => "workspace",
            Space::Scope => "scope",
            Space::Device => "device",
        }
    }
}

/// An interned name: an index into the recorder's table ([`intern`], [`name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NameId(pub u32);

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Event {
    /// Position in the recording since the last [`start`] (gaps: overwritten events).
    pub seq: u64,
    /// Nanoseconds since the last [`start`].
    pub time_ns: u64,
    /// What happened.
    pub kind: EventKind,
    /// Whose name [`Event::name`] is.
    pub space: Space,
    /// The pool, workspace or scope.
    pub name: NameId,
    /// The recorder's small id of the thread (1, 2, ... in order of first event; 24 bits,
    /// so ids repeat only after 16,777,215 recording threads).
    pub thread: u32,
    /// Bytes of the event (see [`EventKind`]).
    pub bytes: u64,
    /// The figure after the event: a pool's bytes held against its limit, a workspace's
    /// buffer size (0 when not known at the recording site).
    pub value: u64,
}

impl std::fmt::Display for Event {
    /// `12.345678 ms alloc pool [global pool] 4.00 KiB -> 8.00 KiB (thread 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.6} ms {} {} [{}] {} -> {} (thread {})",
            self.time_ns as f64 / 1e6,
            self.kind.as_str(),
            self.space.as_str(),
            name(self.name),
            crate::ByteSize(self.bytes as usize),
            crate::ByteSize(self.value as usize),
            self.thread
        )
    }
}

static ON: AtomicBool = AtomicBool::new(false);
/// Bumped whenever [`start`] installs a ring, so threads refresh their cached reference.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static RING: Mutex<Option<&'static Ring>> = Mutex::new(None);
/// Every ring ever made (see [`start`]).
static RINGS_MADE: Mutex<Vec<&'static Ring>> = Mutex::new(Vec::new());
static NAMES: RwLock<Vec<(Space, String)>> = RwLock::new(Vec::new());
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
/// Pools seen by the recorder, by address; the index is the pool's name id.
static POOLS: Mutex<Vec<(usize, NameId)>> = Mutex::new(Vec::new());

thread_local! {
    /// (generation, ring, thread id) as of this thread's last event.
    static LOCAL: Cell<(u64, Option<&'static Ring>, u32)> = const { Cell::new((u64::MAX, None, 0)) };
}

/// A ring of events with the clock's reading when it was (re)started.
struct Ring {
    events: ring::Ring,
    /// The clock's tick and the instant when the ring was (re)started.
    base_tick: AtomicU64,
    base: Mutex<Instant>,
}

impl Ring {
    /// A ring of `capacity` (a power of two) events; `None` if the heap refuses them.
    fn new(capacity: usize) -> Option<Ring> {
        Some(Ring {
            events: ring::Ring::new(capacity)?,
            base_tick: AtomicU64::new(ticks()),
            base: Mutex::new(Instant::now()),
        })
    }

    fn capacity(&self) -> usize {
        self.events.capacity()
    }

    fn restart(&self) {
        self.events.restart();
        *self.base.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.base_tick.store(ticks(), Ordering::Release);
    }

    #[inline]
    fn push(&self, meta: u64, bytes: u64, value: u64) {
        self.events.push((ticks(), bytes, value, meta));
    }

    /// Nanoseconds per tick, measured from the ring's start to now.
    fn ns_per_tick(&self) -> f64 {
        if !cfg!(all(target_arch = "x86_64", not(miri))) {
            return 1.0;
        }
        let elapsed = self
            .base
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
            .as_nanos() as f64;
        let ticks = ticks().saturating_sub(self.base_tick.load(Ordering::Acquire)) as f64;
        if ticks > 0.0 && elapsed > 0.0 {
            elapsed / ticks
        } else {
            1.0
        }
    }
}

/// A cheap monotonic clock: the time-stamp counter on x86-64 (converted to nanoseconds
/// when the ring is read), nanoseconds since the first call elsewhere (and under Miri,
/// which cannot run `rdtsc`).
#[inline]
fn ticks() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: `rdtsc` exists on every x86-64 processor and only reads the time-stamp
        // counter; it touches no memory.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Whether the recorder is on: one relaxed load, all a recording site costs when it is off.
#[inline(always)]
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The heap refused the ring [`start`] asked for; the recorder was left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "trace::start: the heap refused {bytes} bytes for a ring of {capacity} events; \
     ask for fewer events, or free heap memory (or raise NDMEM_MAX_HEAP)"
)]
pub struct RingRefused {
    /// Events asked for, rounded up to a power of two.
    pub capacity: usize,
    /// Bytes the ring needs.
    pub bytes: usize,
}

/// Switches the recorder on with a ring of `capacity` events, rounded up to a power of two
/// (at least 1, at most 2^30; [`capacity`] says what it is), discarding what an earlier
/// recording held. The ring is allocated here (40 bytes an event), once per capacity;
/// recording allocates nothing. If the heap refuses the ring, nothing changes (an earlier
/// recording is kept, on or off as it was) and the error says how much was asked for.
pub fn start(capacity: usize) -> Result<(), RingRefused> {
    let capacity = capacity.clamp(1, 1 << 30).next_power_of_two();
    let mut ring = RING.lock().unwrap_or_else(PoisonError::into_inner);
    match *ring {
        Some(r) if r.capacity() == capacity => {
            ON.store(false, Ordering::Relaxed);
            r.restart();
        }
        _ => {
            // A thread may still hold the ring it last wrote to, so no ring is ever freed:
            // each one made stays listed, and a later start of the same capacity reuses it
            // (at most one ring per power of two).
            let mut made = RINGS_MADE.lock().unwrap_or_else(PoisonError::into_inner);
            let r = match made.iter().find(|r| r.capacity() == capacity) {
                Some(r) => *r,
                None => {
                    let refused = RingRefused {
                        capacity,
                        bytes: capacity.saturating_mul(ring::SLOT_BYTES),
                    };
                    made.try_reserve(1).map_err(|_| refused.clone())?;
                    let new = Ring::new(capacity).ok_or(refused)?;
                    let r: &'static Ring = Box::leak(Box::new(new));
                    made.push(r);
                    r
                }
            };
            ON.store(false, Ordering::Relaxed);
            r.restart();
            *ring = Some(r);
        }
    }
    GENERATION.fetch_add(1, Ordering::Release);
    ON.store(true, Ordering::Release);
    // The pools' thread caches test nothing of the recorder on their hit paths: they are
    // sent to the slow paths, which record (after the switch, so that they see it on).
    crate::pool::recorder_started();
    Ok(())
}

/// Switches the recorder off; what it recorded stays readable ([`events`], [`dump`]).
pub fn stop() {
    ON.store(false, Ordering::Relaxed);
}

/// Records an event (when the recorder is on). `value` is the figure after the event
/// (see [`Event::value`]).
#[inline]
pub fn record(kind: EventKind, space: Space, name: NameId, bytes: u64, value: u64) {
    if is_on() {
        record_on(kind, space, name, bytes, value);
    }
}

#[inline(never)]
fn record_on(kind: EventKind, space: Space, name: NameId, bytes: u64, value: u64) {
    let generation = GENERATION.load(Ordering::Acquire);
    let Ok((ring, thread)) = LOCAL.try_with(|local| {
        let (seen, mut ring, mut thread) = local.get();
        if seen != generation || ring.is_none() || thread == 0 {
            if thread == 0 {
                thread = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            }
            ring = *RING.lock().unwrap_or_else(PoisonError::into_inner);
            local.set((generation, ring, thread));
        }
        (ring, thread)
    }) else {
        return;
    };
    if let Some(ring) = ring {
        ring.push(pack(kind, space, thread, name), bytes, value);
    }
}

/// An event keeps 24 bits of its thread's id, beside 4 of its kind, 4 of its space and 32
/// of its name, in one word.
const THREAD_MASK: u32 = (1 << 24) - 1;

/// A thread's id as its events carry it: ids repeat only after 16,777,215 recording
/// threads.
fn shown_thread(thread: u32) -> u32 {
    thread & THREAD_MASK
}

/// An event's kind, space, thread and name in one word.
fn pack(kind: EventKind, space: Space, thread: u32, name: NameId) -> u64 {
    kind as u64
        | (space as u64) << 4
        | u64::from(shown_thread(thread)) << 8
        | u64::from(name.0) << 32
}

/// What [`pack`] packed (the thread's id as shown).
fn unpack(meta: u64) -> (EventKind, Space, u32, NameId) {
    (
        EventKind::ALL[(meta & 0xf) as usize % EventKind::ALL.len()],
        Space::ALL[((meta >> 4) & 0xf) as usize % Space::ALL.len()],
        ((meta >> 8) as u32) & THREAD_MASK,
        NameId((meta >> 32) as u32),
    )
}

/// The recorder's small id of the calling thread ([`Event::thread`]), assigned on first
/// use; the id its events carry.
pub fn thread_id() -> u32 {
    LOCAL
        .try_with(|local| {
            let (generation, ring, mut thread) = local.get();
            if thread == 0 {
                thread = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
                local.set((generation, ring, thread));
            }
            shown_thread(thread)
        })
        .unwrap_or(0)
}

/// Records a pool event; the pool's name is its place among the pools seen (the global
/// pool reads `global pool`, others `pool #n`).
#[inline]
pub fn record_pool(kind: EventKind, pool: usize, bytes: usize, held: usize) {
    if is_on() {
        let name = pool_name(pool);
        record_on(kind, Space::Pool, name, bytes as u64, held as u64);
    }
}

/// Pools the lock-free table below names; later ones are named under the lock.
const POOL_SLOTS: usize = 64;
/// An address no pool has: the entry of a pool that was dropped (its events keep their
/// name; a new pool at its address gets a new one).
const RETIRED: usize = usize::MAX;
/// Addresses of the pools seen, in order (0: free, [`RETIRED`]: dropped);
/// `POOL_IDS[i]` names `POOL_ADDRESSES[i]`.
static POOL_ADDRESSES: [AtomicUsize; POOL_SLOTS] = [const { AtomicUsize::new(0) }; POOL_SLOTS];
static POOL_IDS: [AtomicU32; POOL_SLOTS] = [const { AtomicU32::new(0) }; POOL_SLOTS];

/// The name id of the pool at `address`: a scan of a few atomics once the pool was seen
/// (no lock), interned under the lock on first sight.
#[inline]
fn pool_name(address: usize) -> NameId {
    for (slot, id) in POOL_ADDRESSES.iter().zip(&POOL_IDS) {
        match slot.load(Ordering::Acquire) {
            0 => break,
            a if a == address => return NameId(id.load(Ordering::Relaxed)),
            _ => {}
        }
    }
    new_pool_name(address)
}

/// Names the pool whose [`crate::Pool::id`] is `pool` in the timeline: its events read
/// `name` from now on, those recorded already included (names are looked up when events
/// are read). ndmem's `stats::register` calls it, so the timeline and the summary name a
/// pool alike. The global pool keeps reading `global pool`.
pub fn name_pool(pool: usize, name: &str) {
    let id = pool_name(pool);
    let mut names = NAMES.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(entry) = names.get_mut(id.0 as usize) {
        entry.1 = name.to_string();
    }
}

/// The pool at `address` is gone: its entries retire, so that a pool made later at the
/// same address is named anew (pool names are `pool #n` in order of first event, and the
/// global pool's `global pool`), while the events recorded already keep the old name.
pub(crate) fn forget_pool(address: usize) {
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    for entry in pools.iter_mut().filter(|(a, _)| *a == address) {
        entry.0 = RETIRED;
    }
    for slot in POOL_ADDRESSES.iter() {
        // Under the lock: no `new_pool_name` fills a slot meanwhile.
        let _ = slot.compare_exchange(address, RETIRED, Ordering::Release, Ordering::Relaxed);
    }
}

#[cold]
fn new_pool_name(address: usize) -> NameId {
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, id)) = pools.iter().find(|(a, _)| *a == address) {
        return *id;
    }
    let id = intern(Space::Pool, &format!("pool #{}", pools.len() + 1));
    pools.push((address, id));
    if let Some(i) = POOL_ADDRESSES
        .iter()
        .position(|slot| slot.load(Ordering::Relaxed) == 0)
    {
        // The id first, published by the address's release store.
        POOL_IDS[i].store(id.0, Ordering::Relaxed);
        POOL_ADDRESSES[i].store(address, Ordering::Release);
    }
    id
}

/// Name ids of devices by ordinal (`id + 1`; 0: not yet interned).
static DEVICE_IDS: [AtomicU32; POOL_SLOTS] = [const { AtomicU32::new(0) }; POOL_SLOTS];

/// Records an event of device `ordinal` (named `device n`): a transfer, a refusal. The
/// name is interned on the device's first event (ordinals from 64 share one name).
#[inline]
pub fn record_device(kind: EventKind, ordinal: u32, bytes: usize, value: usize) {
    if is_on() {
        let slot = &DEVICE_IDS[(ordinal as usize).min(POOL_SLOTS - 1)];
        let name = match slot.load(Ordering::Relaxed) {
            0 => {
                let id = intern(Space::Device, &format!("device {ordinal}"));
                slot.store(id.0 + 1, Ordering::Relaxed);
                id
            }
            id => NameId(id - 1),
        };
        record_on(kind, Space::Device, name, bytes as u64, value as u64);
    }
}

/// Interns `name` for `space` (once: the same pair gives the same id). Allocates: call it
/// where a workspace, scope or pool is made, not per event.
pub fn intern(space: Space, name: &str) -> NameId {
    let mut names = NAMES.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(i) = names.iter().position(|(s, n)| *s == space && n == name) {
        return NameId(i as u32);
    }
    names.push((space, name.to_string()));
    NameId((names.len() - 1) as u32)
}

/// The name interned as `id` (`?` for an unknown id); a pool's is `global pool` for
/// [`crate::Pool::global`].
pub fn name(id: NameId) -> String {
    let entry = NAMES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(id.0 as usize)
        .cloned();
    let Some((space, name)) = entry else {
        return "?".into();
    };
    if space == Space::Pool {
        #[cfg(not(ndmem_loom))]
        {
            let global = crate::Pool::global().id();
            let pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
            if pools.iter().any(|(a, i)| *a == global && *i == id) {
                return "global pool".into();
            }
        }
    }
    name
}

/// The events the ring holds, oldest first (at most its capacity; events overwritten or
/// being written as it is read are left out).
pub fn events() -> Vec<Event> {
    let Some(ring) = *RING.lock().unwrap_or_else(PoisonError::into_inner) else {
        return Vec::new();
    };
    let window = ring.events.window();
    let first = ring.events.start();
    let base = ring.base_tick.load(Ordering::Acquire);
    let scale = ring.ns_per_tick();
    let mut out = Vec::with_capacity((window.end - window.start) as usize);
    for seq in window {
        let Some((time, bytes, value, meta)) = ring.events.read(seq) else {
            continue;
        };
        let (kind, space, thread, name) = unpack(meta);
        out.push(Event {
            seq: seq - first,
            time_ns: (time.saturating_sub(base) as f64 * scale) as u64,
            kind,
            space,
            name,
            thread,
            bytes,
            value,
        });
    }
    out
}

/// Events recorded since the last [`start`] that the ring no longer holds.
pub fn dropped() -> u64 {
    RING.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .map_or(0, |r| r.events.dropped())
}

/// The ring's capacity (0 before the first [`start`]).
pub fn capacity() -> usize {
    RING.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .map_or(0, Ring::capacity)
}

/// The recording as JSON: `{"format": "ndmem-trace", "version": 1, "capacity", "dropped",
/// "names": [{"space", "name"}], "events": [{"seq", "time_ns", "kind", "space", "name",
/// "thread", "bytes", "value"}]}` (`name` indexes `names`). `ndmem report` renders it.
pub fn to_json() -> String {
    let events = events();
    let count = NAMES.read().unwrap_or_else(PoisonError::into_inner).len();
    let mut out = String::with_capacity(256 + events.len() * 120);
    let _ = write!(
        out,
        "{{\"format\":\"ndmem-trace\",\"version\":1,\"capacity\":{},\"dropped\":{},\"names\":[",
        capacity(),
        dropped()
    );
    for i in 0..count {
        let space = NAMES.read().unwrap_or_else(PoisonError::into_inner)[i].0;
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"space\":\"{}\",\"name\":\"{}\"}}",
            space.as_str(),
            escape(&name(NameId(i as u32)))
        );
    }
    out.push_str("],\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "\n{{\"seq\":{},\"time_ns\":{},\"kind\":\"{}\",\"space\":\"{}\",\"name\":{},\"thread\":{},\"bytes\":{},\"value\":{}}}",
            e.seq,
            e.time_ns,
            e.kind.as_str(),
            e.space.as_str(),
            e.name.0,
            e.thread,
            e.bytes,
            e.value
        );
    }
    out.push_str("\n]}\n");
    out
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Writes [`to_json`] to `path`. An error keeps the system's kind and names the path
/// (`cannot write the timeline to PATH: ...`).
pub fn dump(path: impl AsRef<Path>) -> std::io::Result<()> {
    let path = path.as_ref();
    std::fs::write(path, to_json()).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot write the timeline to {}: {e}", path.display()),
        )
    })
}

// ---- NDMEM_TRACE ------------------------------------------------------------------------

static ENV_PATH: OnceLock<Result<Option<PathBuf>, ConfigError>> = OnceLock::new();
static EXIT_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Reads `NDMEM_TRACE` once: unset or empty-free valid path starts the recorder with
/// [`DEFAULT_CAPACITY`] events and arranges for [`dump`] to that path at exit. Called when
/// the global pool is made; calling it again does nothing. Returns the path, or the error
/// of a value that cannot name a file to write (also printed once on stderr, since the
/// pool cannot return it).
pub fn init_from_env() -> Result<Option<PathBuf>, ConfigError> {
    ENV_PATH
        .get_or_init(|| {
            let result = env_path();
            match &result {
                Ok(Some(_)) => match start(DEFAULT_CAPACITY) {
                    Ok(()) => register_exit_hook(),
                    Err(e) => eprintln!("ndmem: NDMEM_TRACE: {e}; no trace is recorded"),
                },
                Ok(None) => {}
                Err(e) => eprintln!("ndmem: {e}; no trace is recorded"),
            }
            result
        })
        .clone()
}

/// The error in `NDMEM_TRACE`, if its value cannot name a file to write (checked without
/// starting anything; the `ndmem` command refuses such a value up front).
pub fn env_error() -> Option<ConfigError> {
    env_path().err()
}

fn env_path() -> Result<Option<PathBuf>, ConfigError> {
    let Some(value) = std::env::var_os(ENV_TRACE) else {
        return Ok(None);
    };
    let invalid = |message: &str| {
        ConfigError::Invalid {
        variable: ENV_TRACE.into(),
        message: format!(
            "{:?} {message} (expected the path of a JSON file to write at exit, e.g. NDMEM_TRACE=trace.json)",
            value.to_string_lossy()
        ),
    }
    };
    if value.is_empty() {
        return Err(invalid("is empty"));
    }
    let path = PathBuf::from(&value);
    if path.is_dir() {
        return Err(invalid("is a directory"));
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        if !parent.is_dir() {
            return Err(invalid("is in a directory that does not exist"));
        }
    }
    Ok(Some(path))
}

extern "C" fn write_at_exit() {
    if let Some(Ok(Some(path))) = ENV_PATH.get() {
        stop();
        if let Err(e) = std::fs::write(path, to_json()) {
            eprintln!("ndmem: cannot write {ENV_TRACE}={}: {e}", path.display());
        }
    }
}

fn register_exit_hook() {
    if EXIT_HOOK.swap(1, Ordering::Relaxed) == 0 {
        // SAFETY: `atexit` stores a plain `extern "C" fn()` to be called once at normal
        // exit; `write_at_exit` neither unwinds (it handles every error) nor calls `exit`.
        unsafe {
            libc::atexit(write_at_exit);
        }
    }
}

// ---- retries ------------------------------------------------------------------------

static RETRIES: AtomicU64 = AtomicU64::new(0);

/// A pool at a limit relieved pressure (reclaimers, cache release) and retries once.
#[cold]
pub fn count_retry() {
    RETRIES.fetch_add(1, Ordering::Relaxed);
}

/// Allocations every pool of the process retried after relieving pressure at a limit
/// (PyTorch's `num_alloc_retries`).
pub fn retries() -> u64 {
    RETRIES.load(Ordering::Relaxed)
}

// ---- out-of-memory observer ----------------------------------------------------------

thread_local! {
    /// The address of the pool that last refused an allocation on this thread.
    static LAST_REFUSED: Cell<usize> = const { Cell::new(0) };
}

/// The address of the pool that last refused an allocation on the calling thread (0:
/// none), so a report can tell which pool an error came from.
pub fn last_refused_pool() -> usize {
    LAST_REFUSED.try_with(Cell::get).unwrap_or(0)
}

static OOM_OBSERVER: RwLock<Option<fn(&AllocError)>> = RwLock::new(None);

/// Sets the function a pool calls when it refuses an allocation at a limit, with the
/// error it is about to return (ndmem's `stats::on_oom` is built on it). It runs on the
/// refused thread, outside every pool lock; it may allocate.
pub fn set_oom_observer(observer: Option<fn(&AllocError)>) {
    *OOM_OBSERVER.write().unwrap_or_else(PoisonError::into_inner) = observer;
}

/// A pool refused an allocation: records an [`EventKind::Oom`] event and calls the
/// observer. Cold: only on a refusal.
#[cold]
pub fn refused(pool: usize, held: usize, error: &AllocError) {
    let requested = error.refused_at_limit().unwrap_or(0);
    record_pool(EventKind::Oom, pool, requested, held);
    let _ = LAST_REFUSED.try_with(|last| last.set(pool));
    let observer = *OOM_OBSERVER.read().unwrap_or_else(PoisonError::into_inner);
    if let Some(observer) = observer {
        observer(error);
        // A refusal inside the observer (a hook that allocates) named its own pool: the
        // error about to be returned is still this pool's.
        let _ = LAST_REFUSED.try_with(|last| last.set(pool));
    }
}

/// A device pool refused an allocation at its limit: records an [`EventKind::Oom`] event
/// (space [`Space::Device`], named `device n`) and calls the observer. Cold.
#[cold]
pub fn refused_device(ordinal: u32, held: usize, error: &AllocError) {
    let requested = match error {
        AllocError::OutOfMemory { requested, .. } => *requested,
        _ => 0,
    };
    record_device(EventKind::Oom, ordinal, requested, held);
    let observer = *OOM_OBSERVER.read().unwrap_or_else(PoisonError::into_inner);
    if let Some(observer) = observer {
        observer(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_word_keeps_kind_space_name_and_24_bits_of_thread() {
        for (thread, shown) in [(1, 1), (65_545, 65_545), (THREAD_MASK, THREAD_MASK)] {
            for kind in EventKind::ALL {
                for space in Space::ALL {
                    let name = NameId(u32::MAX - thread);
                    assert_eq!(
                        unpack(pack(kind, space, thread, name)),
                        (kind, space, shown, name)
                    );
                }
            }
        }
        // Past 24 bits the id repeats, as documented on `Event::thread`.
        assert_eq!(
            unpack(pack(EventKind::Free, Space::Scope, 1 << 24 | 9, NameId(3))).2,
            9
        );
    }

    #[test]
    fn kinds_and_spaces_round_trip_through_their_index() {
        for (i, k) in EventKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, s) in Space::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }
}
