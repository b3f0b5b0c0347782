#!/usr/bin/env bash
# Runs the loom models of the lock-free pieces (every test file of loom-tests/tests/, for
# ndmem-alloc and ndmem alike), and only those: the loom package's library has no tests
# of its own, so its unit and doc tests are not run (no empty "running 0 tests" blocks).
#
# The build goes to $CARGO_TARGET_DIR when it is set, else to target-loom/: a separate
# directory keeps the loom build (cfg ndmem_loom) from invalidating the main one.
# RUSTFLAGS from the environment are kept (the cfg is added to them).
# LOOM_MAX_PREEMPTIONS (default 3) and loom's other LOOM_* variables are honoured. Extra
# arguments go to cargo test: `--test pool` runs one file instead of all, and what follows
# `--` goes to the test binaries (`-- --ignored`, a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="${CARGO_TARGET_DIR:-target-loom}"
which=(--test '*')
for arg in "$@"; do
    case "$arg" in
        --) break ;;
        --test | --test=*) which=() ;;
    esac
done
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg ndmem_loom" \
    cargo test -p ndmem-loom-tests --release --target-dir "$target_dir" "${which[@]}" "$@"
