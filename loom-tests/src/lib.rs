//! Shared set-up for the loom models in `tests/`.
//!
//! The models explore every interleaving (up to a preemption bound) of the lock-free code
//! that ships in `ndmem-alloc`: built with `--cfg ndmem_loom`, that crate's atomics are
//! loom's (see `allocator/src/sync.rs`). Without the cfg this crate and its tests compile
//! to nothing, so a plain `cargo test` does not pay for them. Run them with
//! `scripts/loom.sh`.

/// The preemption bound when `LOOM_MAX_PREEMPTIONS` is not set: enough to find every
/// two-thread race these models target, small enough to finish in seconds per model.
pub const DEFAULT_MAX_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with `LOOM_MAX_PREEMPTIONS` honoured (default
/// [`DEFAULT_MAX_PREEMPTIONS`]); the other `LOOM_*` variables keep loom's own meaning.
#[cfg(ndmem_loom)]
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    builder().check(f);
}

/// loom's builder with `LOOM_MAX_PREEMPTIONS` honoured (default
/// [`DEFAULT_MAX_PREEMPTIONS`]), for models that need other settings too.
#[cfg(ndmem_loom)]
pub fn builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_MAX_PREEMPTIONS);
    }
    builder
}
