#!/usr/bin/env bash
# Sets up what is missing, builds the console (release) and serves it with the simulated
# demo fleet on 127.0.0.1:3000 (embedded SQLite in ./data). Extra arguments go to
# `tessera serve`, e.g. `scripts/run.sh --bind 0.0.0.0:3000 --allowed-hosts gpu-box.lan`.
# Sign in as `admin`: the server prints the password as it starts (a new one each start),
# or set TESSERA_ADMIN_PASSWORD to choose it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/prune-target.sh
scripts/setup.sh
source scripts/env.sh
cargo leptos build --release --split
if [ -n "${TESSERA_ADMIN_PASSWORD:-}" ]; then
  echo "Console: http://127.0.0.1:3000 (or your --bind); sign in as admin with the password in TESSERA_ADMIN_PASSWORD"
else
  echo "Console: http://127.0.0.1:3000 (or your --bind); sign in as admin with the password the server prints below"
fi
exec "$CARGO_TARGET_DIR/release/tessera" serve --demo "$@"
