#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration and doc tests, the benchmarks once
# each in test mode (so they are known to run), and the loom models. The loom package is
# left out of the plain runs: without `--cfg ndmem_loom` its models compile to nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --exclude ndmem-loom-tests
cargo test --workspace --exclude ndmem-loom-tests --benches
bash scripts/loom.sh
