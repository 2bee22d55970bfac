#!/usr/bin/env bash
# `make test`: starts a throw-away stack on free ports, runs every test, stops it.
# Point MONGODB_URI at a real MongoDB to run the same suite against it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
start_mongo
start_mosquitto
ensure_peers
ensure_influx_clients
ensure_browser
ensure_sparkplug_clients
# Bins first: the loadtest smoke tests spawn target/debug/hourglass.
cargo build --workspace --bins
# What the tests send to the PromQL API seeds its fuzz target.
export HOURGLASS_FUZZ_SEEDS="$STACK_ROOT/.stack/fuzz-seeds"
rm -rf "$HOURGLASS_FUZZ_SEEDS"
# A failing test's message, not the runtime's frames, is what a CI log's
# excerpt keeps: no backtraces (HOURGLASS_TEST_BACKTRACE=1 make test brings them back).
export RUST_BACKTRACE="${HOURGLASS_TEST_BACKTRACE:-0}"
cargo test --workspace --all-targets "$@" || status=$?
if [[ "${status:-0}" == 0 && $# == 0 && "${FUZZ_SECONDS:-20}" != 0 ]]; then
  # Every fuzz target for a bounded time (FUZZ_SECONDS=0 skips this).
  scripts/fuzz.sh || status=$?
fi
# The documentation's links and anchors, and the README's length.
python3 scripts/check-docs.py || status=$?
exit "${status:-0}"
