#!/usr/bin/env bash
# Fault drills on the real binaries (see scripts/drills.py): builds `tessera` (as the
# console's build does) and `tessera-agent`, then runs the drills and prints their table.
#   scripts/drills.sh                      every drill (about 2 minutes)
#   scripts/drills.sh --short              the ones CI runs
#   scripts/drills.sh --postgres [...]     on a throwaway PostgreSQL server, with the
#                                          drills only several servers have
#   scripts/drills.sh --postgres --failover-trials 10
#                                          and the failover benchmark
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/env.sh
cargo leptos build --split >/dev/null
cargo build --quiet -p tessera-agent --bin tessera-agent
export TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug"
args=()
postgres=0
for a in "$@"; do
  if [ "$a" = "--postgres" ]; then postgres=1; else args+=("$a"); fi
done
if [ "$postgres" = 1 ]; then
  # Durable settings: the restart drill kills PostgreSQL as a crash would.
  exec scripts/with-postgres.sh --durable bash -c \
    'python3 scripts/drills.py --postgres "$TESSERA_TEST_POSTGRES" "$@"' drills "${args[@]}"
fi
exec python3 scripts/drills.py "${args[@]}"
