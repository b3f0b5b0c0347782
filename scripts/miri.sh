#!/usr/bin/env bash
# Runs the allocator crate's unit tests and a chosen subset of ndmem's unit and integration
# tests under Miri (undefined behaviour, data races, leaks), sized for CI: about 10 minutes
# on 2 cores, most of it building the sysroot and the crates. Installs the Miri component
# of the nightly toolchain itself.
#
# Tree borrows (`-Zmiri-tree-borrows`): under the default stacked borrows, crossbeam-epoch
# 0.9 itself reports a retag error in its own code (internal.rs), which is upstream's and
# not ours; tree borrows checks our code with the aliasing model Rust is heading for.
#
# Left out, because Miri cannot run them or runs them too slowly for CI:
# - tests of the OS: an impossible mmap request, the RSS (procfs) (the code has `cfg(miri)`
#   paths for `sysconf(_SC_PHYS_PAGES)` and procfs, see allocator/src/physical.rs);
# - mapped files (`mmap` of a file is not supported by Miri) and tests that run a child
#   process (tensors' reclaim module);
# - long loops: the size-class sweeps, zero-checking blocks of up to 512 KiB byte by byte,
#   and the 4-thread counter hammering (each minutes under Miri; covered natively, under
#   memcheck and by the loom models).
# Extra arguments replace the default selection and go to `cargo miri test`.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup +nightly component add miri rust-src
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-tree-borrows}"
cargo +nightly miri setup
if [ $# -gt 0 ]; then
    cargo +nightly miri test "$@"
    exit
fi
cargo +nightly miri test -p ndmem-alloc --lib -- \
    --skip concurrent_ --skip an_impossible_request --skip classes_round_up \
    --skip rounded_requests_land --skip a_fit_carries --skip blocks_from_both_sources --skip rss_grows
# The integration tests' process-wide state outlives them, and Miri's leak check has no
# narrow suppression: pools made by `MemorySource::new` are leaked on purpose (a source is
# `'static`), with the blocks they cache and the reclaimers registered with them, and
# crossbeam-epoch's global collector still holds the frees deferred last when the process
# exits. So that binary alone runs with `-Zmiri-ignore-leaks`; the unit tests above keep
# the leak check, and scripts/valgrind.sh checks the same binary for leaks with narrow
# suppressions.
cargo +nightly miri test -p ndmem --lib
# debug_modes and pool_counters run the test binary again as a child process (one per
# environment), which miri's isolation refuses; their code paths are those of the rest.
# nd4j holds the scenarios ported from ND4J's suites (behaviour, mapped files and a child
# process among them): the plain and valgrind runs cover it.
MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" cargo +nightly miri test -p ndmem --test workspaces -- \
    --skip mmap --skip files:: --skip hashbrown --skip debug_modes:: --skip pool_counters:: \
    --skip nd4j::
# Tensor storage, views and scopes: the single-threaded cases (the racing ones take minutes
# each under Miri; transcendental ops differ by Miri's deliberate float imprecision).
MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" cargo +nightly miri test -p ndmem --test tensors -- \
    scopes::a_view scopes::attach_and_detach scopes::cap_trips scopes::closed_scopes \
    scopes::closing_a_parent scopes::detach_from_a_workspace scopes::in_place_updates \
    scopes::outputs_belong scopes::ret_moves ops::views_reshape ops::in_place_updates \
    ops::matmul_matches
