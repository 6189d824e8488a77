#!/usr/bin/env bash
# Sets up what is missing, then runs every check: formatting, clippy, the Rust tests
# (unit, store, HTTP, hostile input), the control plane's tests again on a throwaway
# PostgreSQL server, the browser tests in headless Chromium against a fresh demo server,
# the short fault drills on the real binaries, the serving drill (HAProxy under load), the
# work drill (autoscaling and a latency alarm on what the application reports), the
# security drill (a compromised task and a leaked token), the production walkthrough
# (docs/production.md, every step on this machine), the capacity drill (an Auto
# Scaling group on a local AWS endpoint, grown, repaired and shrunk) and the notifications
# drill (webhooks and Alertmanager). This is what CI runs.
#
#   scripts/test.sh           everything (15-30 minutes warm on 2 cores)
#   scripts/test.sh --quick   formatting, clippy, every crate's unit tests and the store
#                             tests on SQLite (a few minutes warm): the check before a commit
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
scripts/prune-target.sh
if [ "$quick" = 1 ]; then scripts/setup.sh; else scripts/setup.sh --test; fi
source scripts/env.sh

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== no import circle between the files of a crate (these crates have none left)"
python3 scripts/import_circles.py model/src placement/src placement-lab/src control/src agent/src cli/src server/src app/src aws/src
echo "== every crate's root documentation names each of its modules"
python3 scripts/layout_check.py model/src/lib.rs placement/src/lib.rs placement-lab/src/lib.rs control/src/lib.rs agent/src/lib.rs cli/src/lib.rs server/src/lib.rs app/src/lib.rs aws/src/lib.rs
echo "== the control plane's components: private state, a store bundle each, no circle of calls"
python3 scripts/components.py control/src
echo "== no function over 100 lines in the control plane (long ones are split into named steps)"
python3 scripts/long_functions.py control/src
if [ "$quick" = 1 ]; then
  echo "== cargo test: unit tests of every crate, and the store tests on SQLite"
  cargo test --workspace --locked --lib --bins
  cargo test -p tessera-control --locked --test store
  echo "== quick checks passed (the full run, scripts/test.sh, is what CI runs)"
  exit 0
fi
echo "== the shipped alert rules: valid, and each fires on what should raise it (promtool)"
promtool check rules server/prometheus/tessera-rules.yml
(cd server/prometheus && promtool test rules tessera-rules.test.yml)
echo "== cargo test"
cargo test --workspace --locked
echo "== the shipped systemd units: verified against the binaries, the server's confined"
scripts/units_check.sh "$CARGO_TARGET_DIR/debug"
echo "== cargo test, control plane on PostgreSQL"
scripts/with-postgres.sh env TESSERA_TEST_STORE=postgres cargo test -p tessera-control --locked
echo "== browser tests"
# Pages are lazy routes: their code must be split out of the bundle, in debug too.
cargo leptos build --split
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
TESSERA_BIN="$CARGO_TARGET_DIR/debug/tessera" TESSERA_DATA_DIR="$data" npm --prefix end2end test
echo "== the Debian packages: installed here, their services started from the installed files, upgraded in place"
scripts/package_check.sh "$CARGO_TARGET_DIR/debug" target/site
echo "== the production walkthrough (docs/production.md): PostgreSQL, TLS, two servers behind HAProxy, 20 hosts, a service behind HAProxy, Prometheus"
scripts/walkthrough.sh --bin "$CARGO_TARGET_DIR/debug"
echo "== fault drills (short)"
scripts/drills.sh --short
echo "== fault drills on PostgreSQL, several servers (short)"
scripts/drills.sh --short --postgres
echo "== serving drill: traffic through HAProxy during a deployment, a scale-in and a drain"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" scripts/serve_drill.sh --changes 10
echo "== work drill: application metrics, autoscaling and a latency alarm on the real binaries"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/work_drill.py
echo "== security drill: a compromised task and a leaked token against the real binaries"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/security_drill.py
echo "== capacity drill: an Auto Scaling group (moto_server) grown, repaired and shrunk by the scheduler"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/capacity_drill.py
echo "== notifications drill: webhooks signed and on time, a receiver down 30 s loses nothing, Alertmanager alerted"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/notify_drill.py
echo "== the GPU check's parts that need no GPU (stand-in nvidia-smi, simulated agent)"
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/gpu_check_test.py
TESSERA_BIN_DIR="$CARGO_TARGET_DIR/debug" python3 scripts/gpu_work_test.py
