#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: FUZZ_SECONDS each (default 10;
# `make fuzz` runs 300), starting from its committed seeds (fuzz/seeds/<target>,
# every crash ever found among them) and from what the test suite sent
# (HOURGLASS_FUZZ_SEEDS/<target>, which `make test` fills). Every seed is run
# first, whatever the time. A crash, a panic, a timeout or an overflow fails
# the run; its input is left in fuzz/artifacts/<target>/. Needs cargo-fuzz
# (installed once per machine if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stack.sh
source scripts/phases.sh
seconds="${FUZZ_SECONDS:-10}"
cargo_fuzz=$(cargo_tool cargo-fuzz 0.13.2)
cd fuzz
# Stable toolchain: cargo-fuzz's coverage flags need RUSTC_BOOTSTRAP; no
# sanitizer (the code under test is safe Rust; ASan would only slow it).
export RUSTC_BOOTSTRAP=1
fuzz_build() {
  # CI once saw this build fail with nothing but cargo-fuzz's one-line summary
  # kept: say what the disk held, and try once more before failing the run.
  if ! "$cargo_fuzz" fuzz build -O -s none; then
    echo "[fuzz] The fuzz build failed (disk: $(df -h . | tail -1)); trying once more." >&2
    "$cargo_fuzz" fuzz build -O -s none
  fi
}
phase "fuzz: build" fuzz_build
fuzz_run() {
  local corpora="../.stack/fuzz" target
  for target in $("$cargo_fuzz" fuzz list); do
    mkdir -p "$corpora/$target"
    local dirs=("$corpora/$target")
    [[ -d "seeds/$target" ]] && dirs+=("seeds/$target")
    if [[ -n "${HOURGLASS_FUZZ_SEEDS:-}" && -d "$HOURGLASS_FUZZ_SEEDS/$target" ]]; then
      dirs+=("$HOURGLASS_FUZZ_SEEDS/$target")
    fi
    # A dictionary (fuzz/dicts/<target>.dict) gives the mutator whole
    # tokens: function names and nestings a byte at a time would not reach.
    local dict=()
    [[ -f "dicts/$target.dict" ]] && dict=(-dict="dicts/$target.dict")
    echo "[fuzz] $target for ${seconds} s from ${dirs[*]}" >&2
    "$cargo_fuzz" fuzz run -O -s none "$target" "${dirs[@]}" -- \
      "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      2>&1 | grep -E "^(Done|stat::number_of_executed_units|==|SUMMARY|thread|panicked|Crash|Test unit)" || true
    if [[ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]]; then
      echo "[fuzz] $target failed; inputs in fuzz/artifacts/$target/" >&2
      return 1
    fi
  done
}
phase "fuzz: run ($seconds s a target)" fuzz_run
