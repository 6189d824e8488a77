#!/usr/bin/env bash
# Serving drill on the real binaries (see scripts/serve_drill.py): traffic through a real
# HAProxy that `tessera lb haproxy` keeps equal to a service's healthy endpoints, through
# a rolling deployment, a scale-in, a host drain and a bad revision rolled back. Builds
# `tessera` (as the console's build does) and `tessera-agent` unless TESSERA_BIN_DIR
# already names a folder holding them. Needs HAProxy (2.6 or later).
#   scripts/serve_drill.sh                 the drill (about 2 minutes)
#   scripts/serve_drill.sh --changes 20    and the endpoint-change benchmark
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -z "${TESSERA_BIN_DIR:-}" ]; then
  source scripts/env.sh
  cargo leptos build --split >/dev/null
  cargo build --quiet -p tessera-agent --bin tessera-agent
  export TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug"
fi
exec python3 scripts/serve_drill.py "$@"
