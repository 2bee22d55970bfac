#!/usr/bin/env bash
# `make docs`: checks the book's links and anchors, then builds it with mdBook
# (installed once per machine, scripts/stack.sh `cargo_tool`) into target/book/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
MDBOOK_VERSION="0.5.4"
python3 scripts/check-docs.py
# Without the live-reload server and the file watcher: only `build` is used.
mdbook=$(cargo_tool mdbook "$MDBOOK_VERSION" --no-default-features --features search)
# mdBook only warns about markup it cannot close (a `<name>` in a table
# cell swallows the rest of the page): here a warning fails the build.
log=$("$mdbook" build docs 2>&1) || { echo "$log" >&2; exit 1; }
echo "$log" >&2
if grep -q " WARN " <<<"$log"; then
  echo "[docs] mdBook warned (above): fix the markup." >&2
  exit 1
fi
echo "[docs] The book is in target/book/index.html." >&2
