#!/usr/bin/env bash
# Runs the loom models of ndmem-alloc's lock-free pieces (loom-tests/tests/*.rs).
# A separate target dir keeps the loom build (cfg ndmem_loom) from invalidating the main
# one. LOOM_MAX_PREEMPTIONS (default 3) and loom's other LOOM_* variables are honoured;
# extra arguments go to the test binaries (e.g. `-- --ignored`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg ndmem_loom" cargo test -p ndmem-loom-tests --release --target-dir target-loom "$@"
