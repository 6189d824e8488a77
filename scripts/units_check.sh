#!/usr/bin/env bash
# Verifies the shipped systemd units (packaging/systemd) with systemd-analyze, against the
# binaries just built: any warning fails the check (an unknown key is only a warning to
# systemd). The server's unit must stay confined: its exposure (systemd-analyze security,
# offline) at most 2.0 (`--threshold` counts tenths: 20).
#
#   scripts/units_check.sh BIN_DIR     (the directory holding tessera and tessera-agent)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: scripts/units_check.sh BIN_DIR}
for b in tessera tessera-agent; do
  [ -x "$bin/$b" ] || { echo "units_check: no $bin/$b: build it first" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The units name /usr/bin/…: here, the binaries just built.
for unit in "$root"/packaging/systemd/*.service; do
  sed -e "s|/usr/bin/tessera-agent|$bin/tessera-agent|" -e "s|/usr/bin/tessera |$bin/tessera |" \
    "$unit" > "$work/$(basename "$unit")"
done
cp "$work/tessera-lb-haproxy@.service" "$work/tessera-lb-haproxy@web.service"
units=(tessera.service tessera-agent.service tessera-lb-haproxy@web.service)
said=$(cd "$work" && systemd-analyze verify --man=no "${units[@]}" 2>&1) || {
  echo "$said" >&2
  echo "units_check: systemd-analyze verify failed" >&2
  exit 1
}
if [ -n "$said" ]; then
  echo "$said" >&2
  echo "units_check: systemd-analyze verify warned (above)" >&2
  exit 1
fi
echo "verified: ${units[*]}"
(cd "$work" && systemd-analyze security --offline=yes --threshold=20 tessera.service | tail -1)
