#!/usr/bin/env bash
# `make run`: starts what the service needs (unless configured) and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
start_mongo persistent
if [[ "${HOURGLASS__MQTT__ENABLED:-true}" != false ]]; then start_mosquitto; fi
export HOURGLASS__HTTP__LISTEN="${HOURGLASS__HTTP__LISTEN:-127.0.0.1:8080}"
# Acknowledged readings wait here for their bucket writes; kept across runs.
export HOURGLASS__JOURNAL__DIR="${HOURGLASS__JOURNAL__DIR:-.stack/journal}"
log "Hourglass will listen on http://$HOURGLASS__HTTP__LISTEN (Ctrl-C stops everything)."
cargo build --release --bin hourglass
# Not exec: the trap must stop the database after the service has drained.
./target/release/hourglass --config "${HOURGLASS_CONFIG:-config/default.toml}" || status=$?
exit "${status:-0}"
