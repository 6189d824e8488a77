#!/usr/bin/env bash
# The GPU check in one command: see scripts/gpu_check.py (or --help).
#   scripts/gpu-check.sh [--bin-dir DIR] [--out DIR] [--time-limit SECONDS] [--fake]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/gpu_check.py "$@"
