#!/usr/bin/env bash
# Runs the unit and integration tests of the workspace under valgrind's memcheck: the check
# for the allocator, pool and arena code's `unsafe` blocks. Any memory error fails the run.
# Extra arguments go to `cargo test` (e.g. `--test workspaces`).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind --error-exitcode=1 --quiet"
# Limit tests bound their loops by time, so they finish under valgrind too.
if [ $# -gt 0 ]; then cargo test "$@"; else cargo test --workspace --lib --bins --tests; fi
