#!/usr/bin/env bash
# `make test`: starts a throw-away stack on free ports, runs every test, stops it.
# Point MONGODB_URI at a real MongoDB to run the same suite against it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
source scripts/phases.sh
# The suite mostly waits on the stand-in, one Python thread per server:
# several servers, and more tests at once than cores (.config/nextest.toml).
export HOURGLASS_STANDINS="${HOURGLASS_STANDINS:-2}"
install_stack() {
  start_mongo
  start_mosquitto
  ensure_peers
  ensure_influx_clients
  ensure_browser
  ensure_sparkplug_clients
  ensure_js_clients
  ensure_mqtt311_broker
}
phase "test: install and start the stack" install_stack
# What the tests send to the PromQL API seeds its fuzz target.
export HOURGLASS_FUZZ_SEEDS="$STACK_ROOT/.stack/fuzz-seeds"
rm -rf "$HOURGLASS_FUZZ_SEEDS"
# A failing test's message, not the runtime's frames, is what a CI log's
# excerpt keeps: no backtraces (HOURGLASS_TEST_BACKTRACE=1 make test brings them back).
export RUST_BACKTRACE="${HOURGLASS_TEST_BACKTRACE:-0}"
if cargo nextest --version >/dev/null 2>&1; then
  # Built before the run (the loadtest smoke tests spawn target/debug/hourglass,
  # which --all-targets builds), so the table shows compile and run apart.
  phase "test: build" cargo nextest run --workspace --all-targets --no-run
  if [[ $# == 0 ]]; then
    # A cargo check of the Docker image's context: minutes while its
    # dependencies are unchecked, so alone, with both cores, before the rest.
    # (The same targets as the build above: nothing is compiled again.)
    phase "test: the image's build context" cargo nextest run --workspace --all-targets \
      --profile hourglass --run-ignored only -E 'test(/the_dockerfiles_build_command/)' || status=$?
  fi
  phase "test: run (nextest)" cargo nextest run --workspace --all-targets --profile hourglass "$@" || status=$?
  python3 scripts/slowest-tests.py target/nextest/hourglass/junit.xml 10 || true
else
  phase "test: build" cargo build --workspace --bins
  phase "test: run (cargo test)" cargo test --workspace --all-targets "$@" || status=$?
fi
if [[ "${status:-0}" == 0 && $# == 0 && "${FUZZ_SECONDS:-10}" != 0 ]]; then
  # Every fuzz target for a bounded time (FUZZ_SECONDS=0 skips this).
  FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh || status=$?
fi
# The documentation's links and anchors, and the README's length.
phase "test: docs check" python3 scripts/check-docs.py || status=$?
exit "${status:-0}"
