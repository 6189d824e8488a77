#!/usr/bin/env bash
# Completed work on a real GPU in one command: see scripts/gpu_work.py (or --help).
#   scripts/gpu-work.sh [--bin-dir DIR] [--out DIR] [--counts 1,2,4,8] [--seconds 60] [--fake]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/gpu_work.py "$@"
