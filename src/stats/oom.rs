//! The out-of-memory report (semantics §7): what held the memory when a pool refused an
//! allocation, how much of it was held but unusable for the request, and which knob to
//! turn; and the hook ([`on_oom`]) that lets a program act when it happens.
//!
//! Invariant: a report is built from one [`super::snapshot`]-style reading taken when the
//! refusal is reported, on the refused thread, with no pool lock held; building it never
//! allocates from a pool, so it cannot fail in turn. Hooks run at most once per refusal
//! and never re-enter themselves on their thread.

use std::cell::Cell;
use std::sync::{Arc, PoisonError, RwLock};

use ndmem_alloc::{
    AllocError, ByteSize, LimitSource, Limits, MemoryKind, Pool, ENV_MAX_BYTES,
    ENV_MAX_DEVICE_BYTES,
};

use super::{scopes_with_source, trace, ScopeEntry};
use crate::error::{Error, Holder, HolderKind, OomReport};
use crate::memory::MemorySource;
use crate::workspace::{all_workspaces_with_source, WorkspaceEntry};

impl OomReport {
    /// The report for `error` as things stand now; the holders are those of the pool
    /// that last refused an allocation on this thread (all of them if none did).
    pub fn new(error: AllocError) -> OomReport {
        build(error)
    }
}

impl ndmem_alloc::OomDetail for OomReport {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl From<AllocError> for Error {
    /// An allocation error as [`Error::Alloc`]; a refusal at a limit gets its report,
    /// built now (semantics §7), unless one is attached already.
    fn from(mut error: AllocError) -> Error {
        if let AllocError::OutOfMemory { report: None, .. } = &error {
            let built = ndmem_alloc::AttachedReport::new(OomReport::new(error.clone()));
            if let AllocError::OutOfMemory { report, .. } = &mut error {
                *report = Some(built);
            }
        }
        Error::Alloc(error)
    }
}

fn build(error: AllocError) -> OomReport {
    if let AllocError::OutOfMemory {
        kind: MemoryKind::Device(n),
        holders,
        ..
    } = &error
    {
        return device_report(*n, *holders, error.clone());
    }
    let workspaces = all_workspaces_with_source();
    let scopes = scopes_with_source();
    let (refused, pool) = refusing_pool(&error, &workspaces, &scopes);
    // The physical limit is the whole process's resident memory: every pool's holders
    // count, not only the refusing pool's.
    let refused = refused.filter(|_| !matches!(error, AllocError::PhysicalLimit { .. }));
    // Holders of the refusing pool only (a private pool no workspace or scope draws on
    // has none), unless no pool refused on this thread.
    let of_pool = |source: &MemorySource| refused.map_or(true, |id| source.pool().id() == id);
    let mut holders = Vec::new();
    let mut idle_buffers = 0;
    let mut best_idle: Option<(String, usize)> = None;
    for entry in workspaces.iter().filter(|w| of_pool(&w.source)) {
        let (thread, w) = (&entry.thread, &entry.stats);
        let held = w.size + w.spilled_bytes + w.pinned_bytes;
        // Another thread's running cycle publishes its bump offset only at its end: its
        // buffer counts as in use, not as idle. A ring's slots may be held by tensors kept
        // from earlier cycles (a prefetcher's batches), which its figures do not tell:
        // neither idle, nor freed by destroying it, is claimed for a circular workspace.
        if (!w.open || entry.mine) && !w.circular {
            idle_buffers += w.size.saturating_sub(w.used);
        }
        if !w.open && !w.circular && held > best_idle.as_ref().map_or(0, |b| b.1) {
            best_idle = Some((format!("[{}] of thread {thread}", w.id), held));
        }
        if held > 0 {
            holders.push(Holder {
                kind: HolderKind::Workspace,
                name: format!("[{}] on thread {thread}", w.id),
                bytes: held,
                detail: format!(
                    "buffer {}, spilled {}, pinned {}{}{}",
                    ByteSize(w.size),
                    ByteSize(w.spilled_bytes),
                    ByteSize(w.pinned_bytes),
                    if w.open { ", open" } else { ", not open" },
                    if w.circular {
                        ", circular: its slots are freed when the tensors kept from them drop"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    let mut best_scope: Option<(String, usize, usize)> = None;
    for entry in &scopes {
        let s = &entry.scope;
        // Held bytes (block capacities) of the refusing pool, as the pool in the header
        // counts them: a scope may hold tensors of other pools, which closing it would not
        // give back to this one.
        let (held, tensors) = entry
            .held_by_pool
            .iter()
            .filter(|share| of_pool(&share.source))
            .fold((0, 0), |(b, t), share| (b + share.bytes, t + share.tensors));
        if held > 0 {
            if !s.closed && s.depth > 0 && held > best_scope.as_ref().map_or(0, |b| b.1) {
                best_scope = Some((s.name.clone(), held, tensors));
            }
            // A borrowed tensor is held here until this scope closes (then it goes back).
            let detail = if refused.is_some() && tensors != s.tensors + s.borrowed {
                format!(
                    "{tensors} of its {} tensors (the others are not this pool's)",
                    s.tensors + s.borrowed
                )
            } else if s.borrowed > 0 {
                format!(
                    "{} tensors, {} borrowed ({})",
                    s.tensors,
                    s.borrowed,
                    ByteSize(s.borrowed_bytes)
                )
            } else {
                format!("{} tensors", s.tensors)
            };
            holders.push(Holder {
                kind: HolderKind::Scope,
                name: format!("[{}]", s.name),
                bytes: held,
                detail,
            });
        }
    }
    let cached = pool.map_or(0, |p| p.stats().cached_bytes);
    if cached > 0 {
        holders.push(Holder {
            kind: HolderKind::PoolCache,
            name: "pool cache".into(),
            bytes: cached,
            detail: "freed blocks kept for reuse".into(),
        });
    }
    let pending = crate::reclaim::pending_bytes();
    if pending > 0 {
        holders.push(Holder {
            kind: HolderKind::PendingReclamation,
            name: "pending reclamation".into(),
            bytes: pending,
            detail: "deferred frees waiting for the epoch".into(),
        });
    }
    holders.sort_by_key(|h| std::cmp::Reverse(h.bytes));
    holders.truncate(8);

    let mut advice = vec![limit_advice(&error, pool)];
    if cached > 0 {
        advice.push(format!(
            "call pool.trim() to give the {} of cached blocks back to the OS",
            ByteSize(cached)
        ));
    }
    if let Some((name, bytes)) = best_idle {
        advice.push(format!(
            "destroy workspace {name} (workspaces().destroy(..) on that thread) to free {}",
            ByteSize(bytes)
        ));
    }
    if let Some((name, bytes, tensors)) = best_scope {
        advice.push(format!(
            "close scope [{name}] or detach fewer of its {tensors} tensors ({})",
            ByteSize(bytes)
        ));
    }
    advice.extend(pending_advice(pending));
    OomReport {
        error,
        holders,
        fragmentation_bytes: cached + idle_buffers,
        advice,
    }
}

/// The report of a device's refusal: its own holders, by purpose (semantics §5, §7).
fn device_report(ordinal: u32, by_use: ndmem_alloc::Holders, error: AllocError) -> OomReport {
    let mut holders: Vec<Holder> = [
        ("tensors", by_use.tensors),
        ("workspaces", by_use.workspaces),
        ("mirrors", by_use.mirrors),
        ("other", by_use.other),
        ("cache", by_use.cached),
    ]
    .into_iter()
    .filter(|(_, bytes)| *bytes > 0)
    .map(|(what, bytes)| Holder {
        kind: HolderKind::Device,
        name: format!("device {ordinal} {what}"),
        bytes,
        detail: if what == "cache" {
            "freed device buffers kept for reuse".into()
        } else {
            format!("live device {what}")
        },
    })
    .collect();
    holders.sort_by_key(|h| std::cmp::Reverse(h.bytes));
    let mut advice = vec![limit_advice(&error, None)];
    if by_use.cached > 0 {
        advice.push(format!(
            "call trim() on the device to give the {} of cached buffers back to the driver",
            ByteSize(by_use.cached)
        ));
    }
    let pending = crate::reclaim::pending_bytes();
    advice.extend(pending_advice(pending));
    OomReport {
        error,
        holders,
        fragmentation_bytes: by_use.cached,
        advice,
    }
}

/// The id of the pool that refused (`None` if none did), and the pool itself when it can
/// be found: the global pool when the error names its variable, else the pool that last
/// refused on this thread, found among the registered pools and the sources of the
/// workspaces and scopes.
fn refusing_pool(
    error: &AllocError,
    workspaces: &[WorkspaceEntry],
    scopes: &[ScopeEntry],
) -> (Option<usize>, Option<&'static Pool>) {
    if let AllocError::OutOfMemory { variable, .. } = error {
        if *variable == ENV_MAX_BYTES {
            let global = Pool::global();
            return (Some(global.id()), Some(global));
        }
    }
    let address = trace::last_refused_pool();
    if address == 0 {
        return (None, None);
    }
    let registered: Vec<MemorySource> = super::REGISTERED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(_, s)| *s)
        .collect();
    let pool = registered
        .into_iter()
        .chain(workspaces.iter().map(|w| w.source))
        .chain(scopes.iter().map(|e| e.source))
        .chain(
            scopes
                .iter()
                .flat_map(|e| e.held_by_pool.iter().map(|h| h.source)),
        )
        .map(|s| s.pool())
        .find(|p| p.id() == address);
    (Some(address), pool)
}

/// Whether `pool` is the global pool.
fn is_global(pool: &Pool) -> bool {
    std::ptr::eq(pool, Pool::global())
}

/// The knob that raises the refused limit: the variable when the limit came from the
/// environment, the call when it was set in code (semantics §1).
fn limit_advice(error: &AllocError, pool: Option<&'static Pool>) -> String {
    let (kind, limit) = match error {
        AllocError::OutOfMemory {
            kind: MemoryKind::Device(_),
            limit,
            variable: ndmem_alloc::DRIVER_REFUSED,
            ..
        } => {
            return format!(
                "the driver had no device memory left ({} in all, held by this process's pool \
                 and whatever else uses the device: other processes, libraries): free device \
                 memory",
                ByteSize(*limit)
            )
        }
        AllocError::OutOfMemory { kind, limit, .. } => (*kind, *limit),
        AllocError::PhysicalLimit {
            rss,
            limit,
            variable,
            ..
        } => {
            return format!(
                "raise {variable} (now {}; the process's resident memory is {}, heap and mappings included), or free memory the process holds",
                ByteSize(*limit),
                ByteSize(*rss)
            )
        }
        _ => return "free memory or raise the limit".into(),
    };
    if let MemoryKind::Device(ordinal) = kind {
        // The refusing device knows how its limit was given (ordinals are unique for CUDA;
        // simulated devices may share one, and then the limit tells them apart).
        return crate::device::refusing_device(ordinal, limit).map_or_else(
            || format!("raise {ENV_MAX_DEVICE_BYTES} (now {})", ByteSize(limit)),
            |device| device.limit_advice(limit),
        );
    }
    if let Some(knob) = pool.and_then(Pool::max_bytes_knob) {
        return format!("raise {knob} (now {})", ByteSize(limit));
    }
    if !pool.is_some_and(is_global) {
        return format!(
            "this pool's limit ({}) was set in code: raise Limits::builder().max_bytes(..) where the pool is made, or call Pool::set_max_bytes on it",
            ByteSize(limit)
        );
    }
    let from_env = Limits::from_env().ok();
    let source = from_env.map(|l| (l.sources.max_bytes, l.max_bytes));
    match source {
        Some((LimitSource::Environment, Some(env))) if env == limit => format!(
            "raise {ENV_MAX_BYTES} (now {}, set in the environment)",
            ByteSize(limit)
        ),
        Some((LimitSource::Default, Some(default))) if default == limit => format!(
            "the limit is the default, half of RAM ({}): set {ENV_MAX_BYTES} or call Pool::global().set_max_bytes(..)",
            ByteSize(limit)
        ),
        _ => format!(
            "the global pool's limit ({}) was set in code: raise it where Pool::set_max_bytes is called",
            ByteSize(limit)
        ),
    }
}

type Hook = Arc<dyn Fn(&OomReport) + Send + Sync>;

static HOOKS: RwLock<Vec<Hook>> = RwLock::new(Vec::new());

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Calls `hook` with the report of every allocation a pool refuses at a limit, on the
/// refused thread, before the error is returned: the place to dump the snapshot
/// ([`super::snapshot`]) and the timeline ([`trace::dump`]), as PyTorch's OOM observers
/// do. Hooks accumulate; an allocation refused inside a hook does not call the hooks
/// again.
pub fn on_oom(hook: impl Fn(&OomReport) + Send + Sync + 'static) {
    HOOKS
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Arc::new(hook));
    trace::set_oom_observer(Some(observe));
}

/// The pool's observer: builds the report and runs the hooks.
fn observe(error: &AllocError) {
    if error.refused_at_limit().is_none() || IN_HOOK.with(Cell::get) {
        return;
    }
    let hooks: Vec<Hook> = HOOKS.read().unwrap_or_else(PoisonError::into_inner).clone();
    if hooks.is_empty() {
        return;
    }
    /// Clears the re-entry flag even if a hook panics.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_HOOK.with(|f| f.set(false));
        }
    }
    IN_HOOK.with(|f| f.set(true));
    let _reset = Reset;
    let report = build(error.clone());
    for hook in &hooks {
        hook(&report);
    }
}

/// The advice for `pending` bytes of deferred frees, if any.
fn pending_advice(pending: usize) -> Option<String> {
    (pending > 0).then(|| {
        format!(
            "reclaim::collect() frees the {} waiting (a thread pinned too long holds it back)",
            ByteSize(pending)
        )
    })
}
