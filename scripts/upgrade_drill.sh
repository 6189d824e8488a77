#!/usr/bin/env bash
# The rolling-upgrade drill (scripts/upgrade_drill.py) between two revisions:
#
#     scripts/upgrade_drill.sh [A] [B] [--postgres]
#
# A defaults to a1e51eb (0.1.0, the last revision before agents and servers said their
# versions), B to the current commit. Each is checked out in a worktree of its own and its
# `tessera` and `tessera-agent` built (debug, as the tests build them); then a fleet on A
# (two servers, three agents, six tasks) is upgraded to B server by server, then agent by
# agent, and each step is printed. With --postgres the servers share a throwaway
# PostgreSQL database (scripts/with-postgres.sh) instead of an SQLite file.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
revs=()
postgres=0
for a in "$@"; do
    if [ "$a" = "--postgres" ]; then postgres=1; else revs+=("$a"); fi
done
A=${revs[0]:-a1e51eb}
B=${revs[1]:-$(git rev-parse --short HEAD)}
work=$(mktemp -d /tmp/tessera-upgrade.XXXXXX)
cleanup() {
    for rev in "$A" "$B"; do
        git worktree remove --force "$work/src-$rev" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

build() {
    local rev=$1 src="$work/src-$1" bin="$work/bin-$1"
    git worktree add --detach "$src" "$rev" >/dev/null
    mkdir -p "$bin"
    (
        cd "$src"
        TESSERA_BUILD=$(git rev-parse --short HEAD) cargo build --locked \
            -p tessera-server --bin tessera -p tessera-agent --bin tessera-agent
    ) 2>&1 | grep -E '^error' -A5 || true
    # One target directory for both (the dependencies are built once): each revision's
    # binaries are copied out before the other's overwrite them.
    for b in tessera tessera-agent; do
        cp "$CARGO_TARGET_DIR/debug/$b" "$bin/$b"
    done
    echo "built $rev"
}

build "$A"
build "$B"
if [ "$postgres" = 1 ]; then
    scripts/with-postgres.sh bash -c 'python3 scripts/upgrade_drill.py --postgres "$TESSERA_TEST_POSTGRES" --from "$1" --to "$2"' \
        drill "$work/bin-$A" "$work/bin-$B"
else
    python3 scripts/upgrade_drill.py --from "$work/bin-$A" --to "$work/bin-$B"
fi
