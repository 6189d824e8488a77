#!/usr/bin/env bash
# docs/production.md's walkthrough, every step run on this one machine: PostgreSQL, a CA and
# the servers' certificate (`tessera tls`), two servers on one database behind HAProxy
# (TLS, /healthz checks, --trusted-proxies), pools and join tokens, a host checked
# (`tessera-agent check`) and twenty joined, an inference service with an HTTP health check
# and a `metrics` port behind HAProxy (`tessera lb haproxy`), Prometheus scraping the
# servers and the tasks with the shipped alert rules, and a backup (`pg_dump`).
#
#   scripts/walkthrough.sh [--bin DIR] [--hosts N] [--keep]
#
# What stands in for a fleet here: loopback addresses for machines (127.0.0.2 is the
# balancer's side), simulated GPUs (`--simulate`) and a stand-in MPS control program, and
# tasks that are processes (`tessera example-server`) rather than images. Everything else is
# the real binaries, PostgreSQL, HAProxy and Prometheus from Debian's packages. Each
# command is printed before it runs (`$ …`), then what it printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/env.sh
bin="$CARGO_TARGET_DIR/debug"
hosts=20
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: scripts/walkthrough.sh [--bin DIR] [--hosts N] [--keep]" >&2; exit 2 ;;
  esac
done
[ "$hosts" -ge 2 ] || { echo "walkthrough: --hosts must be at least 2" >&2; exit 2; }
for tool in haproxy prometheus promtool curl python3; do
  command -v "$tool" >/dev/null || { echo "walkthrough: $tool is missing (scripts/setup.sh --test installs it)" >&2; exit 2; }
done
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$pgbin/initdb" ] || { echo "walkthrough: PostgreSQL is missing (apt-get install postgresql)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "walkthrough: run it as root (the agents give tasks uids of their own)" >&2; exit 2; }

w=$(mktemp -d /tmp/tessera-walkthrough.XXXXXX)
chmod 755 "$w"
pids=()
cgroups="tessera-walkthrough-${w##*.}"
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Stopped agents leave their tasks running (as an upgrade needs): stop them, and their cgroups.
  pkill -9 -f "^$w/bin/" 2>/dev/null || true
  sleep 0.5
  find /sys/fs/cgroup -maxdepth 3 -type d -name "$cgroups" 2>/dev/null | while read -r d; do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$w/pg" -m fast stop >/dev/null 2>&1 || true
  if [ "$keep" = 1 ]; then echo "walkthrough: kept $w"; else rm -rf "$w"; fi
}
trap cleanup EXIT
# Interrupted or killed: exit, so that the EXIT trap stops the fleet and removes its files.
trap 'exit 130' INT TERM

step() { printf '\n== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local until=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || { echo "walkthrough: timed out waiting for $what" >&2; tail -n 20 "$w"/*.log >&2 || true; exit 1; }
    sleep 1
  done
}
hap() { # hap COMMAND: HAProxy's Runtime API on its admin socket
  python3 - "$w/haproxy/admin.sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
out = b""
while True:
    c = s.recv(65536)
    if not c:
        break
    out += c
print(out.decode(), end="")
PY
}
# The servers of BACKEND: name, address, state (2 = up, 0 = down), one per line.
hap_servers() { hap "show servers state $1" | awk 'NF > 5 && $1 !~ /^#/ {print $4, $5, $6}'; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

# The binaries, where the tasks' uids may run them.
install -d -m 0755 "$w/bin"
install -m 0755 "$bin/tessera" "$bin/tessera-agent" "$w/bin/"
export PATH="$w/bin:$PATH"
export HOME="$w/home"   # `tessera login` keeps its token here, not in the caller's home
install -d -m 0700 "$HOME"
cd "$w"

step "1. PostgreSQL: a database and a role for Tessera"
pgport=$(free_port)
install -d -o postgres -m 0700 "$w/pg"
printf '%s' "$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')" > "$w/db-password"
runuser -u postgres -- "$pgbin/initdb" -D "$w/pg" -U postgres --auth-local=peer --auth-host=scram-sha-256 -E UTF8 >/dev/null
runuser -u postgres -- "$pgbin/pg_ctl" -D "$w/pg" -l "$w/pg/server.log" -w \
  -o "-c listen_addresses=127.0.0.1 -p $pgport -k $w/pg -c max_connections=200" start >/dev/null
psql_() { runuser -u postgres -- "$pgbin/psql" -h "$w/pg" -p "$pgport" -U postgres -v ON_ERROR_STOP=1 -q "$@"; }
echo "\$ psql -c \"CREATE ROLE tessera LOGIN PASSWORD '…'\" && createdb --owner tessera tessera"
psql_ -c "CREATE ROLE tessera LOGIN PASSWORD '$(cat "$w/db-password")'"
psql_ -c "CREATE DATABASE tessera OWNER tessera"
database="postgres://tessera:$(cat "$w/db-password")@127.0.0.1:$pgport/tessera"
echo "PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$pgport, database tessera owned by tessera"

step "2. TLS: a private CA, the servers' certificate, the file agents trust"
run tessera tls ca create --dir pki
run tessera tls cert create --dir pki --server tessera.internal localhost --ip 127.0.0.1
run tessera tls cert create --dir pki --agent
ls -l pki | awk 'NR>1 {print $1, $NF}'

step "3. Two servers on the database"
p1=$(free_port); p2=$(free_port)
(umask 077; head -c 18 /dev/urandom | base64 | tr -d '\n' > admin-password)
(umask 077; head -c 32 /dev/urandom | base64 | tr -d '\n' > join-token)
chmod 0600 db-password
for i in 1 2; do
  port=$([ $i = 1 ] && echo "$p1" || echo "$p2")
  # The unit reads these from /etc/tessera/tessera.env; the database's password stays out
  # of the command line.
  cat > "tessera-$i.env" <<EOF
TESSERA_BIND=127.0.0.1:$port
TESSERA_DATABASE=$database
TESSERA_ALLOWED_HOSTS=tessera.internal,localhost
TESSERA_TLS_CERT=$w/pki/tessera-server.pem
TESSERA_TLS_KEY=$w/pki/tessera-server-key.pem
TESSERA_TRUSTED_PROXIES=127.0.0.2
TESSERA_CONNECTIONS_PER_ADDRESS=4096
TESSERA_ADMIN_PASSWORD_FILE=$w/admin-password
TESSERA_JOIN_TOKEN_FILE=$w/join-token
TESSERA_DATA_DIR=$w/server-$i
RUST_LOG=info
EOF
  chmod 0600 "tessera-$i.env"
  echo "\$ env \$(cat tessera-$i.env) tessera serve   # TESSERA_BIND=127.0.0.1:$port"
  (set -a; . "./tessera-$i.env"; set +a; exec tessera serve) > "server-$i.log" 2>&1 &
  pids+=($!)
  wait_for 120 "server $i" curl -sf --cacert pki/tessera-ca.pem "https://localhost:$port/healthz"
  grep -m1 "listening on" "server-$i.log" | sed 's/\x1b\[[0-9;]*m//g'
done
run curl -s --cacert pki/tessera-ca.pem "https://localhost:$p1/healthz"
echo

step "4. HAProxy in front of both servers (TLS in, TLS out, /healthz, the client's address forwarded)"
lbport=$(free_port); svcport=$(free_port)
cat pki/tessera-server.pem pki/tessera-server-key.pem > pki/haproxy.pem
chmod 0600 pki/haproxy.pem
install -d -m 0700 haproxy
cat > haproxy/haproxy.cfg <<EOF
global
    stats socket $w/haproxy/admin.sock mode 600 level admin

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    # the console's live stream and log follows stay open while they are read
    timeout tunnel 1h
    retries 3
    option redispatch

frontend tessera
    bind 127.0.0.1:$lbport ssl crt $w/pki/haproxy.pem
    option forwardfor
    default_backend tessera_servers

backend tessera_servers
    balance roundrobin
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    # the servers trust 127.0.0.2 (--trusted-proxies) to name the client
    default-server check inter 2s ssl verify required ca-file $w/pki/tessera-ca.pem verifyhost tessera.internal source 127.0.0.2
    server tessera-1 127.0.0.1:$p1
    server tessera-2 127.0.0.1:$p2

frontend embeddings
    bind 127.0.0.1:$svcport
    default_backend embeddings

backend embeddings
    balance roundrobin
    # servers are added at run time by \`tessera lb haproxy\`
EOF
run haproxy -c -f haproxy/haproxy.cfg
haproxy -f haproxy/haproxy.cfg -db > haproxy.log 2>&1 &
pids+=($!)
url="https://localhost:$lbport"
wait_for 30 "HAProxy" curl -sf --cacert pki/tessera-ca.pem "$url/healthz"
sleep 3   # both servers' checks passed
echo "\$ echo \"show servers state tessera_servers\" | socat stdio /run/haproxy/admin.sock   # name, address, state (2: up)"
hap_servers tessera_servers

step "5. The admin signs in through the balancer (from 127.0.0.3: the servers see that address, not the balancer's)"
echo "\$ TOKEN=\$(… | curl --interface 127.0.0.3 -X POST $url/api/v1/session/token -d @- | …)"
TOKEN=$(python3 -c 'import json,sys; print(json.dumps({"username": "admin", "password": open(sys.argv[1]).read(), "name": "setup", "expires_in_days": 1}))' admin-password |
  curl -sS --fail-with-body --cacert pki/tessera-ca.pem --interface 127.0.0.3 -H 'content-type: application/json' \
    -X POST "$url/api/v1/session/token" -d @- | json 'd["token"]')
echo "\$ tessera login $url --token \"\$TOKEN\" --ca-cert $w/pki/tessera-ca.pem"
tessera login "$url" --token "$TOKEN" --ca-cert "$w/pki/tessera-ca.pem"
api() { curl -sS --fail-with-body --cacert "$w/pki/tessera-ca.pem" -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' "$@"; }
echo "\$ curl '$url/api/v1/audit?limit=1'"
api "$url/api/v1/audit?limit=1"
echo
run tessera get hosts

step "6. Pools: training (admitted at once) and inference (new hosts wait for approval)"
for body in '{"name": "training"}' '{"name": "inference", "admission": "manual"}'; do
  echo "\$ api -X POST $url/api/v1/pools -d '$body'"
  api -X POST "$url/api/v1/pools" -d "$body" | json '"  " + d["name"] + ": admission " + str(d.get("admission"))'
done

step "7. Join tokens, each scoped to a pool, a number of hosts and an expiry"
inference=$((hosts / 5 > 0 ? hosts / 5 : 1)); training=$((hosts - inference))
# The token alone goes to standard output: into a file readable by root only.
for pool in training inference; do
  uses=$([ $pool = training ] && echo "$training" || echo "$inference")
  echo "\$ tessera join-token create --pool $pool --uses $uses --expires-in-hours 4 --description \"rack $pool\" > join-$pool"
  (umask 077; tessera join-token create --pool "$pool" --uses "$uses" --expires-in-hours 4 --description "rack $pool" > "join-$pool")
  [ -s "join-$pool" ] || { echo "walkthrough: no token from tessera join-token create" >&2; exit 1; }
done
run tessera join-token list

agent_env() { # agent_env NAME POOL GPUS I: the host's agent.env
  cat <<EOF
TESSERA_AGENT_SERVER=https://localhost:$p1,https://localhost:$p2
TESSERA_AGENT_CA_CERT=$w/pki/tessera-agent-ca.pem
TESSERA_AGENT_POOL=$2
TESSERA_AGENT_JOIN_TOKEN_FILE=$w/join-$2
TESSERA_AGENT_NAME=$1
TESSERA_AGENT_STATE_DIR=$w/agents/$1
TESSERA_AGENT_SIMULATE=$3
TESSERA_AGENT_MPS_CONTROL=$root/agent/tests/fake-mps-control
TESSERA_AGENT_CPU_MILLI=96000
TESSERA_AGENT_MEMORY_MIB=1048576
TESSERA_AGENT_ADVERTISE_ADDRESS=127.0.0.1
TESSERA_AGENT_PORT_RANGE=$((40000 + $4 * 200))-$((40000 + $4 * 200 + 199))
TESSERA_AGENT_TASK_UIDS=$((1100000000 + $4 * 65536))-$((1100000000 + $4 * 65536 + 65535))
TESSERA_AGENT_CGROUP_PARENT=$cgroups/$1
RUST_LOG=warn
EOF
}
install -d -m 0700 agents
for i in $(seq 1 "$hosts"); do
  name=$(printf 'gpu-%02d' "$i")
  if [ "$i" -le "$training" ]; then agent_env "$name" training 8xH100-80GB "$i"; else agent_env "$name" inference 4xL4-24GB "$i"; fi > "agents/$name.env"
  chmod 0600 "agents/$name.env"
done

step "8. A host checks itself before it joins"
echo "\$ set -a; . /etc/tessera/agent.env; set +a; tessera-agent check"
set +e
(set -a; . agents/gpu-01.env; set +a; exec tessera-agent check)
check=$?
set -e
echo "(exit status $check)"

step "9. $hosts hosts join: $training in training, $inference in inference"
for i in $(seq 1 "$hosts"); do
  name=$(printf 'gpu-%02d' "$i")
  (set -a; . "agents/$name.env"; set +a; exec tessera-agent) > "agents/$name.log" 2>&1 &
  pids+=($!)
done
echo "\$ systemctl enable --now tessera-agent   # on each host; here $hosts agent processes"
joined() { [ "$(api "$url/api/v1/hosts" | json 'len(d["hosts"] if isinstance(d,dict) else d)')" -ge "$hosts" ]; }
wait_for 180 "$hosts hosts" joined
run tessera get hosts
for i in $(seq $((training + 1)) "$hosts"); do run tessera approve "$(printf 'gpu-%02d' "$i")"; done

step "10. An inference service: an HTTP health check, a metrics port, eight tasks"
install -d -m 0755 apply
sed "s#/usr/bin/tessera#$w/bin/tessera#" "$root/examples/production/embeddings.yaml" > apply/embeddings.yaml
run tessera apply -f apply/embeddings.yaml --wait --timeout-secs 300
run tessera get endpoints embeddings

step "11. The service behind HAProxy: tessera lb haproxy keeps the backend equal to its healthy endpoints"
echo "\$ curl -X POST $url/api/v1/tokens -d '{\"name\": \"lb-embeddings\", \"role\": \"viewer\"}'"
api -X POST "$url/api/v1/tokens" -d '{"name": "lb-embeddings", "role": "viewer"}' | json 'd["token"]' | tr -d '\n' > lb-token
chmod 0600 lb-token
cat > lb-embeddings.env <<EOF
HAPROXY_SOCKET=$w/haproxy/admin.sock
HAPROXY_BACKEND=embeddings
HAPROXY_PORT_NAME=http
TESSERA_URL=$url
TESSERA_TOKEN=$(cat lb-token)
TESSERA_CA_CERT=$w/pki/tessera-ca.pem
EOF
chmod 0600 lb-embeddings.env
# What tessera-lb-haproxy@embeddings.service runs, with its environment file.
echo "\$ env \$(cat /etc/tessera/lb-embeddings.env) tessera lb haproxy --service embeddings"
(set -a; . ./lb-embeddings.env; set +a; exec tessera lb haproxy --service embeddings) > lb.log 2>&1 &
pids+=($!)
backend_up() { [ "$(hap_servers embeddings | awk '$3 == 2' | wc -l)" -ge 8 ]; }
wait_for 60 "8 servers in HAProxy's backend" backend_up
head -n 3 lb.log | sed 's/\x1b\[[0-9;]*m//g'
hap_servers embeddings
echo "\$ for i in 1 2 3 4 5 6; do curl -s http://127.0.0.1:$svcport/; done"
for _ in 1 2 3 4 5 6; do curl -sf "http://127.0.0.1:$svcport/"; echo; done

step "12. Prometheus: both servers, every task's metrics port (discovered), the shipped alert rules"
api -X POST "$url/api/v1/tokens" -d '{"name": "prometheus", "role": "viewer"}' | json 'd["token"]' | tr -d '\n' > prometheus-token
chmod 0600 prometheus-token
promport=$(free_port)
install -d prometheus
cp "$root/server/prometheus/tessera-rules.yml" prometheus/
cat > prometheus/prometheus.yml <<EOF
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files: [tessera-rules.yml]
scrape_configs:
  - job_name: tessera
    scheme: https
    authorization: {type: Bearer, credentials_file: $w/prometheus-token}
    tls_config: {ca_file: $w/pki/tessera-ca.pem}
    static_configs: [{targets: ["localhost:$p1", "localhost:$p2"]}]
  - job_name: tasks
    http_sd_configs:
      - url: $url/api/v1/discovery/prometheus
        authorization: {type: Bearer, credentials_file: $w/prometheus-token}
        tls_config: {ca_file: $w/pki/tessera-ca.pem}
EOF
run promtool check config prometheus/prometheus.yml
prometheus --config.file=prometheus/prometheus.yml --storage.tsdb.path=prometheus/data \
  --web.listen-address=127.0.0.1:$promport > prometheus.log 2>&1 &
pids+=($!)
query() { curl -sf "http://127.0.0.1:$promport/api/v1/query" --data-urlencode "query=$1"; }
scraped() { [ "$(query 'count(up{job="tasks"} == 1)' | json 'd["data"]["result"][0]["value"][1] if d["data"]["result"] else 0')" -ge 8 ] && query 'tessera_hosts' | grep -q '"result":\[{'; }
wait_for 90 "Prometheus's first scrapes" scraped
for q in 'up{job="tessera"}' 'count(up{job="tasks"} == 1)' 'max by (status) (tessera_hosts)' 'sum(example_requests_total)' 'ALERTS'; do
  echo "\$ promql: $q"
  query "$q" | python3 -c '
import json,sys
r=json.load(sys.stdin)["data"]["result"]
print("  (none)" if not r else "\n".join("  %s %s" % ({k: v for k, v in x["metric"].items() if k in ("instance","status","alertname","job")}, x["value"][1]) for x in r))'
done
run promtool check rules prometheus/tessera-rules.yml
python3 -c "import json; d=json.load(open('$root/server/grafana/tessera-dashboard.json')); print('server/grafana/tessera-dashboard.json:', d['title'], '-', len(d['panels']), 'panels')"

step "13. A backup of the database (PostgreSQL's own tools)"
run tessera backup fleet.db --database "postgres://tessera@127.0.0.1:$pgport/tessera" || true
echo "\$ pg_dump --format=custom --file tessera.dump postgres://tessera@…/tessera"
PGPASSWORD=$(cat db-password) "$pgbin/pg_dump" --format=custom --file tessera.dump "postgres://tessera@127.0.0.1:$pgport/tessera"
ls -l tessera.dump | awk '{print $5, "bytes", $NF}'
PGPASSWORD=$(cat db-password) "$pgbin/pg_restore" --list tessera.dump | grep -c 'TABLE DATA' | sed 's/^/tables in the dump: /'

step "walkthrough done: $hosts hosts, 2 servers behind HAProxy, embeddings served and scraped"
