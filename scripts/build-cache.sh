# shellcheck shell=bash
# Compiled dependencies kept once per machine for fresh clones (.ci/run), as
# CI caches of target directories do: `restore_build NAME DIR` starts an
# absent DIR (target, fuzz/target) from the last saved copy, `save_build NAME
# DIR` saves one after a green run. Cargo reuses what it finds for the
# dependencies (keyed by version, features and profile) and rebuilds this
# clone's own crates: its sources are touched first, so they are newer than
# anything in the copy, whichever clone built it.

BUILD_CACHE="${HOURGLASS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hourglass}/builds"

restore_build() {
  local name=$1 dir=$2
  [[ -e "$dir" || ! -d "$BUILD_CACHE/$name" ]] && return 0
  (
    flock -s 9
    git ls-files -z | xargs -0 touch
    mkdir -p "$dir"
    # A partial copy would hand cargo truncated artifacts: none, then.
    if ! tar -C "$BUILD_CACHE/$name" -cf - . | tar -C "$dir" -xf -; then
      rm -rf "$dir"
      echo "[build-cache] Restoring $dir failed (above); it is built from scratch." >&2
    fi
  ) 9>"$BUILD_CACHE/$name.lock"
  [[ -d "$dir" ]] || return 0
  echo "[build-cache] $dir starts from the machine's saved build ($(du -sh "$dir" | cut -f1))." >&2
}

save_build() {
  local name=$1 dir=$2
  [[ -d "$dir" ]] || return 0
  mkdir -p "$BUILD_CACHE"
  (
    flock 9
    rm -rf "$BUILD_CACHE/$name.new" "$BUILD_CACHE/$name.old"
    mkdir -p "$BUILD_CACHE/$name.new"
    # Incremental state is per clone and the largest part: not kept. A copy
    # that did not complete (a full disk) is thrown away and the previous one
    # kept: truncated artifacts would fail the next clone's link, not just
    # slow it. (`phase` runs this where `set -e` does not reach.)
    if ! tar -C "$dir" --exclude='./debug/incremental' --exclude='./*/debug/incremental' \
      --exclude='./*/release/incremental' -cf - . | tar -C "$BUILD_CACHE/$name.new" -xf -; then
      rm -rf "$BUILD_CACHE/$name.new"
      echo "[build-cache] Saving $dir failed (above); the machine keeps its previous copy." >&2
      exit 0
    fi
    if [[ -d "$BUILD_CACHE/$name" ]]; then
      mv "$BUILD_CACHE/$name" "$BUILD_CACHE/$name.old"
    fi
    mv "$BUILD_CACHE/$name.new" "$BUILD_CACHE/$name"
    rm -rf "$BUILD_CACHE/$name.old"
  ) 9>"$BUILD_CACHE/$name.lock"
}
