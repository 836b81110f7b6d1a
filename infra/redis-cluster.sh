#!/usr/bin/env bash
# A Redis Cluster on this machine: three masters (no replicas) in cluster mode on
# consecutive loopback ports, with a password, from Debian's redis-server.
#
#   bash infra/redis-cluster.sh up       start it (idempotent) and wait for cluster_state:ok
#   bash infra/redis-cluster.sh down     stop it and forget its state
#   bash infra/redis-cluster.sh status   CLUSTER NODES: masters and their slots
#
# Then: VELOCITY_REDIS_URL=redis+cluster://:<password>@127.0.0.1:<port>/0
# Downstream services read as velocity-reader (lookups through FCALL_RO, rule entries, the
# alert stream, keys under the prefix only), as on the server `velocity up` starts.
# Settings (environment): VELOCITY_REDIS_CLUSTER_PORT (7100; the masters take it and the
# next two), VELOCITY_REDIS_CLUSTER_PASSWORD (velocity-cluster),
# VELOCITY_REDIS_CLUSTER_DIR (.cache/redis-cluster: configs, node files, logs),
# VELOCITY_REDIS_READER_PASSWORD (velocity-reader-local) and VELOCITY_REDIS_KEY_PREFIX
# (velocity: every data dir's default prefix starts so) for the reader.
# A running master keeps the config it started with: `down` and `up` to change them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
first="${VELOCITY_REDIS_CLUSTER_PORT:-7100}"
password="${VELOCITY_REDIS_CLUSTER_PASSWORD:-velocity-cluster}"
dir="${VELOCITY_REDIS_CLUSTER_DIR:-$root/.cache/redis-cluster}"
ports=("$first" "$((first + 1))" "$((first + 2))")

cli() { # port, command...
  local port="$1"
  shift
  REDISCLI_AUTH="$password" redis-cli -h 127.0.0.1 -p "$port" "$@"
}

up() {
  command -v redis-server >/dev/null || { echo "no redis-server; run \`make setup\`" >&2; exit 1; }
  local port reader
  # The reader's ACL line is velocity's own (velocity.redis.server), quoted for redis.conf.
  reader="$("$root/.venv/bin/python" -c '
import sys
from velocity.redis.server import reader_user_config
print(reader_user_config(sys.argv[1], sys.argv[2], cluster=True))
' "${VELOCITY_REDIS_READER_PASSWORD:-velocity-reader-local}" "${VELOCITY_REDIS_KEY_PREFIX:-velocity}")"
  for port in "${ports[@]}"; do
    mkdir -p "$dir/$port"
    cat >"$dir/$port/redis.conf" <<EOF
bind 127.0.0.1
port $port
protected-mode yes
requirepass $password
masterauth $password
$reader
cluster-enabled yes
cluster-config-file $dir/$port/nodes.conf
cluster-node-timeout 5000
daemonize yes
pidfile $dir/$port/redis.pid
logfile $dir/$port/redis.log
dir $dir/$port
appendonly no
save ""
EOF
    cli "$port" PING >/dev/null 2>&1 || redis-server "$dir/$port/redis.conf"
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 1 50); do cli "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
  done
  if ! cli "$first" CLUSTER INFO | grep -q "cluster_state:ok"; then
    if [ "$(cli "$first" CLUSTER INFO | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 1 ]; then
      REDISCLI_AUTH="$password" redis-cli --cluster create \
        "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
        { cat "$dir/create.log" >&2; exit 1; }
    fi
  fi
  for _ in $(seq 1 100); do
    if cli "$first" CLUSTER INFO | grep -q "cluster_state:ok"; then
      echo "Redis Cluster up: 3 masters on 127.0.0.1:${ports[0]}-${ports[2]}"
      return
    fi
    sleep 0.1
  done
  echo "the Redis Cluster did not reach cluster_state:ok; logs in $dir/*/redis.log" >&2
  exit 1
}

down() {
  local port pid
  for port in "${ports[@]}"; do
    pid="$(cat "$dir/$port/redis.pid" 2>/dev/null || true)"
    cli "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    if [ -n "$pid" ]; then
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "${dir:?}/$port"
  done
  echo "Redis Cluster down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) cli "$first" CLUSTER NODES ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
