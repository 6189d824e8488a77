#!/usr/bin/env bash
# Sets up what is missing, builds the console (release) and serves it with the simulated
# demo fleet on 127.0.0.1:3000 (embedded SQLite in ./data). Extra arguments go to
# `tessera serve`, e.g. `scripts/run.sh --bind 0.0.0.0:3000`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
source scripts/env.sh
cargo leptos build --release --split
exec "$CARGO_TARGET_DIR/release/tessera" serve --demo "$@"
