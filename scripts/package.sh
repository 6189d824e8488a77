#!/usr/bin/env bash
# Release artifacts: a versioned tarball and Debian packages for the server and the agent.
#
#     scripts/package.sh [--bin DIR --site DIR] [--version V] [--out DIR]
#
# Without --bin it builds them: the console and the server (`cargo leptos build --release
# --split`) and the agent (`cargo build --release`), with TESSERA_BUILD set to the commit,
# so `--version` names it. --bin (a folder holding tessera and tessera-agent) and --site
# (the console's assets, target/site) package binaries built already: the tests package
# their debug build so. --version defaults to the workspace's; --out to target/dist.
#
# It writes, in --out:
#   tessera-V-linux-ARCH.tar.gz   bin/tessera, bin/tessera-agent, share/tessera/site (the
#                                 console; found beside the binary), the systemd units,
#                                 example configuration, the docs
#   tessera_V_ARCH.deb            /usr/bin/tessera, its console, tessera.service and
#                                 tessera-lb-haproxy@.service, /etc/tessera/tessera.env
#   tessera-agent_V_ARCH.deb      /usr/bin/tessera-agent, tessera-agent.service,
#                                 /etc/tessera/agent.env
# The /etc files are conffiles: an upgrade keeps what the operator changed. Installing
# makes the `tessera` system user and /var/lib/tessera (0700); an upgrade restarts the
# running services (the agent's unit keeps its tasks running); removing leaves the data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin="" site="" version="" out="$root/target/dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --site) site=$2; shift 2 ;;
        --version) version=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "package.sh: unknown argument $1 (see the comment at its top)" >&2; exit 2 ;;
    esac
done
if [ -z "$version" ]; then
    version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
fi
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
if [ -z "$bin" ]; then
    source scripts/env.sh
    export TESSERA_BUILD
    TESSERA_BUILD=$(git rev-parse --short HEAD 2>/dev/null || echo dev)
    cargo leptos build --release --split
    cargo build --release --locked -p tessera-agent --bin tessera-agent
    bin="$CARGO_TARGET_DIR/release"
    site="$root/target/site"
fi
site=${site:-$root/target/site}
for f in "$bin/tessera" "$bin/tessera-agent" "$site/pkg/tessera.js"; do
    [ -f "$f" ] || { echo "package.sh: $f is missing: build it first (or leave out --bin)" >&2; exit 2; }
done
command -v dpkg-deb >/dev/null || { echo "package.sh: dpkg-deb is missing (apt-get install dpkg)" >&2; exit 2; }
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
docs=(README.md docs/operations.md docs/production.md docs/serving.md docs/architecture.md)

# What a fleet's monitoring and first service start from (docs/production.md): the alert
# rules, the Grafana dashboard and the example inference service.
extras() {
  install -d "$1/prometheus" "$1/grafana" "$1/examples"
  install -m 0644 server/prometheus/tessera-rules.yml "$1/prometheus/"
  install -m 0644 server/grafana/tessera-dashboard.json "$1/grafana/"
  install -m 0644 examples/production/embeddings.yaml "$1/examples/"
}

# The tarball: one folder, the binaries finding their console beside them.
name="tessera-$version"
t="$stage/tar/$name"
install -d "$t/bin" "$t/share/tessera" "$t/share/doc/tessera" "$t/lib/systemd/system" "$t/etc/tessera"
install -m 0755 "$bin/tessera" "$bin/tessera-agent" "$t/bin/"
cp -r "$site" "$t/share/tessera/site"
extras "$t/share/tessera"
install -m 0644 "${docs[@]}" "$t/share/doc/tessera/"
install -m 0644 packaging/systemd/*.service "$t/lib/systemd/system/"
install -m 0600 packaging/etc/tessera.env "$t/etc/tessera/tessera.env.example"
install -m 0600 packaging/etc/agent.env "$t/etc/tessera/agent.env.example"
tar -C "$stage/tar" -czf "$out/$name-linux-$arch.tar.gz" "$name"

# A Debian package from a staged root: control fields, conffiles and maintainer scripts.
deb() {
    local pkg=$1 summary=$2 description=$3 r="$stage/deb-$1"
    install -d "$r/DEBIAN"
    local size
    size=$(du -sk --exclude=DEBIAN "$r" | cut -f1)
    cat > "$r/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: $arch
Maintainer: Tessera <tessera@localhost>
Installed-Size: $size
Depends: libc6, adduser | passwd
Section: admin
Priority: optional
Homepage: https://github.com/tessera-gpu/tessera
Description: $summary
$(echo "$description" | fold -s -w 78 | sed 's/^/ /')
EOF
    (cd "$r" && find etc -type f 2>/dev/null | sed 's|^|/|') > "$r/DEBIAN/conffiles"
    [ -s "$r/DEBIAN/conffiles" ] || rm "$r/DEBIAN/conffiles"
    for s in postinst prerm postrm; do
        if [ -f "packaging/debian/$pkg.$s" ]; then
            install -m 0755 "packaging/debian/$pkg.$s" "$r/DEBIAN/$s"
        fi
    done
    dpkg-deb --root-owner-group --build "$r" "$out/${pkg}_${version}_${arch}.deb" >/dev/null
}

r="$stage/deb-tessera"
install -d "$r/usr/bin" "$r/usr/share/tessera" "$r/usr/share/doc/tessera" "$r/lib/systemd/system" "$r/etc/tessera"
install -m 0755 "$bin/tessera" "$r/usr/bin/"
cp -r "$site" "$r/usr/share/tessera/site"
extras "$r/usr/share/tessera"
install -m 0644 "${docs[@]}" "$r/usr/share/doc/tessera/"
install -m 0644 packaging/systemd/tessera.service "packaging/systemd/tessera-lb-haproxy@.service" "$r/lib/systemd/system/"
install -m 0600 packaging/etc/tessera.env "$r/etc/tessera/tessera.env"
deb tessera "Tessera GPU-sharing control plane and web console" \
    "The Tessera server: the console, the REST API, the agents' endpoints and the scheduler that packs tasks onto shared NVIDIA GPUs (MPS), with the tessera command line and the HAProxy endpoint updater."

r="$stage/deb-tessera-agent"
install -d "$r/usr/bin" "$r/usr/share/doc/tessera-agent" "$r/lib/systemd/system" "$r/etc/tessera"
install -m 0755 "$bin/tessera-agent" "$r/usr/bin/"
install -m 0644 docs/operations.md docs/production.md "$r/usr/share/doc/tessera-agent/"
install -m 0644 packaging/systemd/tessera-agent.service "$r/lib/systemd/system/"
install -m 0600 packaging/etc/agent.env "$r/etc/tessera/agent.env"
deb tessera-agent "Tessera host agent: GPUs, MPS, tasks" \
    "The Tessera agent for a GPU host: discovers GPUs through NVML, runs and health-checks the MPS control daemon, starts tasks with their limits enforced and measures what they use. Check a host with: tessera-agent check."

ls -l "$out" | sed 1d
