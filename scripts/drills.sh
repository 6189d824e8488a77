#!/usr/bin/env bash
# Fault drills on the real binaries (see scripts/drills.py): builds `tessera` (as the
# console's build does) and `tessera-agent`, then runs the drills and prints their table.
#   scripts/drills.sh            every drill (about 2 minutes)
#   scripts/drills.sh --short    the ones CI runs
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/env.sh
cargo leptos build --split >/dev/null
cargo build --quiet -p tessera-agent --bin tessera-agent
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" exec python3 scripts/drills.py "$@"
