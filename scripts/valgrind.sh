#!/usr/bin/env bash
# Runs tests under valgrind's memcheck: the check for the `unsafe` blocks of the tracking
# allocator, the pool, workspace buffers and tensor storage. Any memory error fails the run,
# and so does a leak (`--leak-check=full`; a definitely lost block is an error, and the
# indirectly lost blocks it points to are reported with it). Tests that run their test
# binary again in a child process run the child under memcheck too
# (`--trace-children=yes`).
#
# Suppressions (scripts/valgrind.supp) cover process-wide state only, each with its reason.
#
# With no arguments: the suites that touch unsafe code (the allocator crate's unit and
# integration tests; ndmem's unit tests and its alloc, tensors, workspaces, device, stats, stress
# and heap_tracking binaries): about 3 minutes on 2 cores. Extra arguments go to
# `cargo test` instead (e.g. `-p ndmem --test workspaces`).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
# --num-callers=40: a suppression names a frame (`MemorySource::new`, a test's name) that
# can sit deeper than memcheck's default 12 callers, past which it could not match.
runner="valgrind --error-exitcode=1 --quiet --leak-check=full --num-callers=40"
runner+=" --show-leak-kinds=definite --errors-for-leak-kinds=definite"
runner+=" --trace-children=yes --suppressions=$PWD/scripts/valgrind.supp"
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$runner"
# Limit tests bound their loops by time, so they finish under valgrind too; the stress test
# is bounded by iterations, fewer here.
export NDMEM_STRESS_ITERATIONS="${NDMEM_STRESS_ITERATIONS:-250}"
if [ $# -gt 0 ]; then
    cargo test "$@"
else
    cargo test -p ndmem-alloc --lib --tests
    # The four-thread limit tests assert that their threads met the limit, the
    # statistics-while-churning tests read figures while other threads allocate, and the
    # eight threads pinning (or churning) for a moment race each other at a limit, which needs
    # them to run side by side; memcheck runs one thread at a time (a reader got one
    # reading in a second), so they are left to the plain runs (their memory accesses are
    # checked by the other pool tests here).
    cargo test -p ndmem --lib --test alloc --test tensors --test workspaces --test device --test stats \
        --test stress --test heap_tracking -- \
        --skip threads::the_limit_holds_exactly_with_four_threads_caching \
        --skip limits::limit_holds_under_four_threads \
        --skip accounting::stats_read_while_ \
        --skip reclaim::threads_that_pin_for_a_moment \
        --skip threads::at_the_limit_threads_churning_are_refused_only_for_live_bytes
fi
