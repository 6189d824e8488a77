#!/usr/bin/env bash
# The benchmarks of two revisions, side by side in one run:
#
#     scripts/bench-compare.sh [BASE] [HEAD]
#
# BASE defaults to 82371eb (the last commit before issue #27 split Control into owned parts
# and made reconcile passes incremental); HEAD to the current commit. Each revision is
# checked out in a worktree of its own and built in release mode; then scale-bench,
# sync-bench and replay run for each, in turns (base, head, base, head), so both sides
# see the same machine. What it prints is each run's own summary lines, labelled.
#
# Needs ../shared/data/openb (the Alibaba trace) for replay; skips replay without it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
BASE=${1:-82371eb}
HEAD=${2:-$(git rev-parse --short HEAD)}
OPENB=${OPENB:-$(cd .. && pwd)/shared/data/openb}
work=$(mktemp -d /tmp/tessera-bench.XXXXXX)
cleanup() {
    for rev in "$BASE" "$HEAD"; do
        git worktree remove --force "$work/src-$rev" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

build() {
    local rev=$1 src="$work/src-$1" bin="$work/bin-$1"
    git worktree add --detach "$src" "$rev" >/dev/null
    mkdir -p "$bin"
    # The placement lab had no crate of its own before #27: replay lived in the engine's.
    local lab=tessera-placement-lab
    [ -d "$src/placement-lab" ] || lab=tessera-placement
    (
        cd "$src"
        cargo build --release --locked -p tessera-control --features bench --bin scale-bench
        cargo build --release --locked -p tessera-server --features bench --bin sync-bench
        cargo build --release --locked -p "$lab" --bin replay
    ) 2>&1 | grep -E '^(error|warning: unused)' || true
    # Same target directory for both (the dependencies are built once): copy each
    # revision's binaries out before the other's overwrite them.
    for b in scale-bench sync-bench replay; do
        cp "$CARGO_TARGET_DIR/release/$b" "$bin/$b"
    done
    echo "built $rev"
}

build "$BASE"
build "$HEAD"

run() {
    local what=$1
    shift
    for round in 1 2; do
        for rev in "$BASE" "$HEAD"; do
            echo "--- $what, $rev (round $round)"
            "$work/bin-$rev/$what" "$@" 2>&1 | grep -vE '^\s*$' | tail -n "${TAIL:-12}"
        done
    done
}

echo "=== scale-bench (1,000 hosts x 8 GPUs, 0 -> 10,000 tasks)"
run scale-bench
echo "=== sync-bench (10,000 hosts x 8 GPUs, 20,000 tasks, every 5 s, 30 s measured)"
TAIL=6 run sync-bench --hosts 10000 --tasks 20000 --interval 5 --seconds 30
if [ -f "$OPENB/openb_pod_list_default.csv" ]; then
    echo "=== replay (openb default trace, seeds 42..44)"
    TAIL=20 run replay --nodes "$OPENB/openb_node_list_gpu_node.csv" \
        --tasks "$OPENB/openb_pod_list_default.csv" --policy default,fgd-sim --seeds 42..44
else
    echo "=== replay skipped: no trace at $OPENB"
fi
