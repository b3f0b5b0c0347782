#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration and doc tests, the benchmarks once
# each in test mode (so they are known to run), and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
cargo test --workspace --benches
if [ -f scripts/loom.sh ]; then
    bash scripts/loom.sh
fi
