#!/usr/bin/env bash
# `make docs`: checks the book's links and anchors, then builds it with mdBook
# (installed into .stack/tools on first use) into target/book/.
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION="0.5.4"
TOOLS=".stack/tools"
python3 scripts/check-docs.py
if ! "$TOOLS/bin/mdbook" --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
  echo "[docs] Installing mdBook $MDBOOK_VERSION into $TOOLS (first run only)." >&2
  # Without the live-reload server and the file watcher: only `build` is used.
  cargo install --quiet --locked --root "$TOOLS" mdbook --version "$MDBOOK_VERSION" \
    --no-default-features --features search
fi
"$TOOLS/bin/mdbook" build docs
echo "[docs] The book is in target/book/index.html." >&2
