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
"$mdbook" build docs
echo "[docs] The book is in target/book/index.html." >&2
