#!/usr/bin/env bash
# Installs what building, running and testing Tessera needs on a fresh Debian machine,
# and skips whatever is already there. Safe to run again.
#
#   scripts/setup.sh          toolchain pieces for building and running the console
#   scripts/setup.sh --test   also Chromium and the end2end npm packages
set -euo pipefail

CARGO_LEPTOS_VERSION=0.3.11
WASM_BINDGEN_VERSION=0.2.130

root=$(cd "$(dirname "$0")/.." && pwd)
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

log() { printf '[setup] %s\n' "$*"; }
export PATH="$HOME/.cargo/bin:$PATH"

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  log "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

# Build a crate from its published source with one dependency pinned back, because the
# crate's own lock file needs a newer compiler (see BUILD-NOTES in shared/).
install_from_source() {
  local crate=$1 version=$2 pin=$3 pin_version=$4
  local src
  src=$(ls -d "$HOME"/.cargo/registry/src/*/"$crate-$version" 2>/dev/null | head -n 1 || true)
  if [ -z "$src" ]; then
    # A throwaway manifest makes cargo download and unpack the source without building it.
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$tmp/src" && touch "$tmp/src/lib.rs"
    printf '[package]\nname = "fetch-%s"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\n%s = "=%s"\n' \
      "$crate" "$crate" "$version" >"$tmp/Cargo.toml"
    (cd "$tmp" && cargo fetch --quiet)
    rm -rf "$tmp"
    src=$(ls -d "$HOME"/.cargo/registry/src/*/"$crate-$version" | head -n 1)
  fi
  local work
  work=$(mktemp -d)
  cp -r "$src/." "$work/"
  (cd "$work" && cargo update --quiet -p "$pin" --precise "$pin_version" && cargo install --path . --locked)
  rm -rf "$work"
}

if ! cargo leptos --version 2>/dev/null | grep -q "$CARGO_LEPTOS_VERSION"; then
  log "installing cargo-leptos $CARGO_LEPTOS_VERSION (about 12 minutes, once)"
  install_from_source cargo-leptos "$CARGO_LEPTOS_VERSION" cargo-util-schemas 0.14.1
fi

if ! wasm-bindgen --version 2>/dev/null | grep -q "$WASM_BINDGEN_VERSION"; then
  log "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (about 2 minutes, once)"
  install_from_source wasm-bindgen-cli "$WASM_BINDGEN_VERSION" webpki-roots 1.0.10
fi

# npm packages of end2end/: Playwright for the browser tests, and binaryen's wasm-opt, which
# release builds need (Debian's binaryen 108 emits WASM that never hydrates).
if [ ! -x "$root/end2end/node_modules/.bin/wasm-opt" ] || [ ! -d "$root/end2end/node_modules/@playwright/test" ]; then
  log "installing end2end npm packages"
  (cd "$root/end2end" && npm ci --no-audit --no-fund)
fi

# HAProxy for the serving tests: a real load balancer that `tessera lb haproxy` drives.
if [ "$want_test" = 1 ] && [ ! -x /usr/sbin/haproxy ]; then
  log "installing HAProxy from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq haproxy
fi

# promtool (Debian's prometheus package) checks and tests the shipped alert rules.
if [ "$want_test" = 1 ] && ! command -v promtool >/dev/null 2>&1; then
  log "installing promtool (prometheus) from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus
fi

# systemd-analyze (Debian's systemd package) verifies the shipped service units.
if [ "$want_test" = 1 ] && ! command -v systemd-analyze >/dev/null 2>&1; then
  log "installing systemd-analyze (systemd) from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends systemd
fi

# Alertmanager (Debian's package): the notifications drill posts alerts to it.
if [ "$want_test" = 1 ] && ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  log "installing prometheus-alertmanager from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus-alertmanager
fi

# moto's server: a local AWS-compatible endpoint the aws-asg provider's tests and the
# capacity drill talk to (never a real account).
if [ "$want_test" = 1 ] && ! command -v moto_server >/dev/null 2>&1; then
  log "installing moto[server] from PyPI"
  python3 -m pip install --quiet 'moto[server]' || python3 -m pip install --quiet --break-system-packages 'moto[server]'
fi

if [ "$want_test" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  log "installing Chromium from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium
fi
log "ready"
