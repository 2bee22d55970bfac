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
cargo test --workspace --all-targets "$@" || status=$?
exit "${status:-0}"
