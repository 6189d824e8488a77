#!/usr/bin/env bash
# The Debian packages, installed here and their services started from the installed
# files, then upgraded in place (scripts/package.sh):
#
#     scripts/package_check.sh BIN_DIR SITE_DIR
#
# 1. Packages BIN_DIR's tessera and tessera-agent (and the console in SITE_DIR) as version
#    V, and again as V+check2; installs V (dpkg -i).
# 2. Checks what the install made: the tessera user, /var/lib/tessera (0700, tessera's),
#    the conffiles (0600), the tarball's layout.
# 3. Starts each service as its unit says (User, Environment, EnvironmentFile, ExecStart:
#    this machine runs no systemd), the agent on a simulated GPU: the server answers
#    /healthz, its console page and the page's assets from /usr/share/tessera/site, and
#    the agent joins.
# 4. Installs V+check2 over V: the configuration changed in /etc/tessera is kept, and the
#    restarted server still knows the host (the data is kept); the agent comes back under
#    the same host id without joining again.
# Then purges both and removes what the check made. Needs root and dpkg; skipped (exit 0,
# said) where the packages or /var/lib/tessera are already on the machine: it never
# touches an install it did not make.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: scripts/package_check.sh BIN_DIR SITE_DIR}
site=${2:?usage: scripts/package_check.sh BIN_DIR SITE_DIR}
skip() { echo "package check skipped: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "it installs packages: run it as root"
command -v dpkg >/dev/null || skip "no dpkg on this machine"
for p in tessera tessera-agent; do
    if dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q installed; then
        skip "package $p is installed here already"
    fi
done
for d in /var/lib/tessera /var/lib/tessera-agent /etc/tessera; do
    [ ! -e "$d" ] || skip "$d exists here already"
done
user_existed=0
getent passwd tessera >/dev/null && user_existed=1

work=$(mktemp -d)
# Stops processes and waits until they are gone (SIGKILL after 10 s): an agent still
# stopping would write its state directory again after it is removed.
stop_pids() {
    local p
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
        local alive=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 1 ] || return 0
        sleep 0.1
    done
    for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
}
cleanup() {
    # Every service started (start_unit runs in a subshell: its pids are in a file).
    if [ -f "$work/pids" ]; then
        # shellcheck disable=SC2046
        stop_pids $(cat "$work/pids")
    fi
    # The simulated host's task-less agent leaves its stand-in MPS daemons.
    pkill -f "$work/fake-mps" 2>/dev/null || true
    dpkg --purge tessera tessera-agent >/dev/null 2>&1 || true
    rm -rf /var/lib/tessera /var/lib/tessera-agent /etc/tessera
    [ "$user_existed" = 1 ] || userdel tessera 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "package check FAILED: $*" >&2; for l in "$work"/*.log; do echo "--- $l" >&2; tail -20 "$l" >&2; done; exit 1; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
arch=$(dpkg --print-architecture)
"$root/scripts/package.sh" --bin "$bin" --site "$site" --out "$work/v1" >/dev/null
"$root/scripts/package.sh" --bin "$bin" --site "$site" --version "$version+check2" --out "$work/v2" >/dev/null
echo "packaged $version and $version+check2"

# The tarball: the binary finds its console beside it.
tar -C "$work" -xzf "$work/v1/tessera-$version-linux-$arch.tar.gz"
for f in bin/tessera bin/tessera-agent share/tessera/site/pkg/tessera.js \
    lib/systemd/system/tessera.service etc/tessera/tessera.env.example share/doc/tessera/production.md \
    share/tessera/prometheus/tessera-rules.yml share/tessera/grafana/tessera-dashboard.json \
    share/tessera/examples/embeddings.yaml; do
    [ -e "$work/tessera-$version/$f" ] || fail "the tarball lacks $f"
done

dpkg -i "$work/v1/tessera_${version}_$arch.deb" "$work/v1/tessera-agent_${version}_$arch.deb" >"$work/dpkg.log" 2>&1 ||
    fail "dpkg -i (see dpkg.log)"
getent passwd tessera >/dev/null || fail "no tessera user after the install"
[ "$(stat -c '%a %U' /var/lib/tessera)" = "700 tessera" ] || fail "/var/lib/tessera is $(stat -c '%a %U' /var/lib/tessera)"
for f in /etc/tessera/tessera.env /etc/tessera/agent.env; do
    [ "$(stat -c '%a' "$f")" = 600 ] || fail "$f is mode $(stat -c '%a' "$f")"
done
[ "$(/usr/bin/tessera --version)" = "tessera $version (build $(/usr/bin/tessera --version | sed 's/.*build //; s/)//'))" ] ||
    fail "tessera --version says $(/usr/bin/tessera --version)"
for f in /usr/share/tessera/prometheus/tessera-rules.yml /usr/share/tessera/grafana/tessera-dashboard.json \
    /usr/share/tessera/examples/embeddings.yaml /usr/share/doc/tessera/production.md; do
    [ -e "$f" ] || fail "the tessera package lacks $f"
done
echo "installed: $(/usr/bin/tessera --version), $(/usr/bin/tessera-agent --version)"

# The operator's configuration.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
sed -i "s|^TESSERA_BIND=.*|TESSERA_BIND=127.0.0.1:$port|" /etc/tessera/tessera.env
echo "package-check-admin-password" > /etc/tessera/admin-password
echo "package-check-join-token-0123456789" > /etc/tessera/join-token
chown tessera /etc/tessera/admin-password
chmod 0600 /etc/tessera/admin-password /etc/tessera/join-token
cp /etc/tessera/join-token /etc/tessera/server-join-token
chown tessera /etc/tessera/server-join-token
cat >> /etc/tessera/tessera.env <<EOF
TESSERA_ADMIN_PASSWORD_FILE=/etc/tessera/admin-password
TESSERA_JOIN_TOKEN_FILE=/etc/tessera/server-join-token
TESSERA_SYNC_INTERVAL=1
EOF
sed -i "s|^TESSERA_AGENT_SERVER=.*|TESSERA_AGENT_SERVER=$url|; s|^TESSERA_AGENT_POOL=.*|TESSERA_AGENT_POOL=default|" /etc/tessera/agent.env
cp "$root/agent/tests/fake-mps-control" "$work/fake-mps"
cat >> /etc/tessera/agent.env <<EOF
TESSERA_AGENT_SIMULATE=1xL4-24GB
TESSERA_AGENT_MPS_CONTROL=$work/fake-mps
TESSERA_AGENT_NAME=packaged
EOF

# A unit's service started as systemd would: its user, its environment, its command.
start_unit() {
    local unit=/lib/systemd/system/$1 log=$work/$2.log
    local user cmd
    user=$(sed -n 's/^User=//p' "$unit")
    cmd=$(sed -n 's/^ExecStart=//p' "$unit")
    local envs=()
    while IFS= read -r e; do envs+=("$e"); done < <(sed -n 's/^Environment=//p' "$unit")
    local file
    file=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$unit")
    while IFS= read -r e; do envs+=("$e"); done < <(grep -E '^[A-Z_]+=' "$file" || true)
    # StateDirectory= is made by systemd; here by hand, as it would.
    local state
    state=$(sed -n 's/^StateDirectory=//p' "$unit")
    if [ -n "$state" ]; then
        install -d -m 0700 ${user:+-o "$user"} "/var/lib/$state"
    fi
    (cd / && exec ${user:+runuser -u "$user" --} env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin RUST_LOG=info "${envs[@]}" $cmd) >"$log" 2>&1 &
    echo $! >>"$work/pids"
    echo $!
}
wait_for() {
    local what=$1 i
    shift
    for i in $(seq 1 150); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    fail "timed out waiting for $what"
}
signed_in() {
    rm -f "$work/cookies"
    curl -sf -c "$work/cookies" -H 'content-type: application/json' \
        -d '{"username":"admin","password":"package-check-admin-password"}' "$url/api/v1/session" >/dev/null
}
hosts() { curl -sf -b "$work/cookies" "$url/api/v1/hosts"; }

server=$(start_unit tessera.service server)
wait_for "the installed server's /healthz" curl -sf "$url/healthz"
page=$(curl -sf "$url/sign-in") || fail "no console page (/sign-in)"
assets=$(echo "$page" | grep -o '/pkg/[^"]*' | sort -u || true)
[ -n "$assets" ] || fail "the console page names no asset"
for asset in $assets; do
    curl -sf -o /dev/null "$url$asset" || fail "the console's $asset is not served"
done
grep -q "/usr/bin/../share/tessera/site" "$work/server.log" || fail "the server did not say it serves the console from its package"
echo "server: /healthz, the console page and its $(echo "$assets" | wc -l) assets ($(echo $assets | tr ' ' ,)) from the installed files"

agent=$(start_unit tessera-agent.service agent)
signed_in || fail "cannot sign in as the configured admin"
wait_for "the installed agent to join" bash -c "curl -sf -b '$work/cookies' '$url/api/v1/hosts' | grep -q '\"agent_version\":\"$version\"'"
host_id=$(hosts | python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][0]["id"])')
echo "agent: joined as $host_id, tessera-agent $version"

# The upgrade over it, with both stopped as their units stop them.
stop_pids "$server" "$agent"
dpkg -i "$work/v2/tessera_${version}+check2_$arch.deb" "$work/v2/tessera-agent_${version}+check2_$arch.deb" >>"$work/dpkg.log" 2>&1 ||
    fail "dpkg -i over the older packages (see dpkg.log)"
[ "$(dpkg-query -W -f '${Version}' tessera)" = "$version+check2" ] || fail "the upgrade did not take"
grep -q "^TESSERA_BIND=127.0.0.1:$port" /etc/tessera/tessera.env || fail "the upgrade did not keep /etc/tessera/tessera.env"
grep -q "^TESSERA_AGENT_NAME=packaged" /etc/tessera/agent.env || fail "the upgrade did not keep /etc/tessera/agent.env"
server=$(start_unit tessera.service server2)
wait_for "the upgraded server's /healthz" curl -sf "$url/healthz"
signed_in || fail "the admin account did not survive the upgrade"
[ "$(hosts | python3 -c 'import json,sys; print(",".join(h["id"] for h in json.load(sys.stdin)["hosts"]))')" = "$host_id" ] ||
    fail "the upgraded server does not know host $host_id: $(hosts)"
agent=$(start_unit tessera-agent.service agent2)
wait_for "the upgraded agent to sync" grep -q "the server's version" "$work/agent2.log"
grep -q "registered with the control plane" "$work/agent2.log" && fail "the upgraded agent joined again"
echo "upgraded to $version+check2: configuration kept, the data kept (host $host_id), the agent back without joining again"
echo "package check passed"
