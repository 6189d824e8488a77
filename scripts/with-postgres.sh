#!/usr/bin/env bash
# Runs a command beside a throwaway PostgreSQL server, then stops the server and deletes it.
#
#   scripts/with-postgres.sh [--durable] COMMAND [ARGS...]
#
# The server is PostgreSQL from Debian's packages (installed when missing), in a temporary
# directory, on a free loopback port. COMMAND sees:
#   TESSERA_TEST_POSTGRES      postgres://postgres@127.0.0.1:PORT/postgres (a superuser)
#   TESSERA_TEST_POSTGRES_DIR  the server's data directory (pg_ctl -D), for drills that
#                              restart it
#   TESSERA_TEST_POSTGRES_CTL  the pg_ctl to run as the server's owner
#   TESSERA_TEST_POSTGRES_OPTIONS  the server's options (pg_ctl -o), to start it again
# Tests run it without fsync (a throwaway database need not survive a power cut);
# --durable keeps PostgreSQL's defaults, for benchmarks and drills.
set -euo pipefail

durable=0
if [ "${1:-}" = "--durable" ]; then
  durable=1
  shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--durable] COMMAND [ARGS...]" >&2; exit 2; }

find_bin() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

bin=$(find_bin || true)
if [ -z "$bin" ]; then
  echo "[with-postgres] installing PostgreSQL from Debian's packages" >&2
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq postgresql >/dev/null
  bin=$(find_bin)
fi

dir=$(mktemp -d /tmp/tessera-pg.XXXXXX)
chmod 755 "$dir"
as_owner=()
if [ "$(id -u)" = 0 ]; then
  # PostgreSQL refuses to run as root: the server runs as the `postgres` user Debian's
  # package creates.
  chown postgres "$dir"
  as_owner=(runuser -u postgres --)
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

stop() {
  "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT

"${as_owner[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >/dev/null
options="-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300"
[ "$durable" = 1 ] || options="$options -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
"${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -o "$options" -l "$dir/server.log" -w start >/dev/null

export TESSERA_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres"
export TESSERA_TEST_POSTGRES_DIR="$dir/data"
export TESSERA_TEST_POSTGRES_CTL="${as_owner[*]} $bin/pg_ctl"
export TESSERA_TEST_POSTGRES_OPTIONS="$options"
echo "[with-postgres] PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
set +e
"$@"
status=$?
set -e
exit $status
