#!/usr/bin/env bash
# Keeps the build directory from filling the disk. The target directory outside the clone
# (scripts/env.sh) survives fresh clones, so it only grows: every session and CI run adds
# incremental caches and artifacts of changed crates. When the filesystem under it has less
# than TESSERA_MIN_FREE_GIB (default 20) free, the incremental caches go first (a rebuild
# of the workspace's own crates follows); if that is not enough and the debug build is
# itself that large, the whole debug build (a cold build follows). Run before a build starts, never beside one.
set -euo pipefail
source "$(dirname "$0")/env.sh"
min_gib=${TESSERA_MIN_FREE_GIB:-20}
free_gib() {
  local dir=$CARGO_TARGET_DIR
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  df -Pk "$dir" | awk 'NR==2 { print int($4 / 1048576) }'
}
[ -d "$CARGO_TARGET_DIR" ] || exit 0
free=$(free_gib)
if [ "$free" -lt "$min_gib" ]; then
  echo "prune-target: ${free} GiB free (< ${min_gib}): removing incremental caches in $CARGO_TARGET_DIR"
  rm -rf "$CARGO_TARGET_DIR"/debug/incremental "$CARGO_TARGET_DIR"/release/incremental \
    "$CARGO_TARGET_DIR"/*/debug/incremental "$CARGO_TARGET_DIR"/*/release/incremental
  free=$(free_gib)
fi
debug_gib() {
  local gib
  gib=$(du -sk "$CARGO_TARGET_DIR"/debug 2>/dev/null | awk '{ print int($1 / 1048576) }')
  echo "${gib:-0}"
}
# Only when the debug build is itself a large part of the problem: on a disk that is short
# for other reasons, removing it every run would make every build cold.
if [ "$free" -lt "$min_gib" ] && [ "$(debug_gib)" -ge "$min_gib" ]; then
  echo "prune-target: still ${free} GiB free: removing the debug build in $CARGO_TARGET_DIR (a cold build follows)"
  rm -rf "$CARGO_TARGET_DIR"/debug
  echo "prune-target: ${free} GiB free before, $(free_gib) GiB now"
fi
