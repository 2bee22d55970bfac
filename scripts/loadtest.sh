#!/usr/bin/env bash
# `make loadtest`: the full run of hourglass-loadtest against a local stack.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
start_mongo
start_mosquitto
ensure_peers
cargo build --release --workspace --bins
./target/release/hourglass-loadtest --hourglass-bin target/release/hourglass --name "${NAME:-full}" all "$@"
