#!/usr/bin/env bash
# A Spark standalone cluster on this machine, from the Spark that pyspark installs:
# one master and two workers (one core each) on 127.0.0.1. Nothing is downloaded.
#
#   bash infra/cluster.sh up       start it (idempotent) and wait until both workers joined
#   bash infra/cluster.sh down     stop it
#   bash infra/cluster.sh status   the master's view: workers, cores, running applications
#
# Then: VELOCITY_SPARK_MASTER=spark://127.0.0.1:7077 velocity backtest ...
# Settings (environment): VELOCITY_CLUSTER_PORT (7077), VELOCITY_CLUSTER_UI_PORT (18080),
# VELOCITY_CLUSTER_WORKERS (2), VELOCITY_CLUSTER_WORKER_MEMORY (3g),
# VELOCITY_CLUSTER_DIR (.cache/cluster: pidfiles, logs, the workers' scratch space).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${VELOCITY_CLUSTER_PORT:-7077}"
ui_port="${VELOCITY_CLUSTER_UI_PORT:-18080}"
workers="${VELOCITY_CLUSTER_WORKERS:-2}"
worker_memory="${VELOCITY_CLUSTER_WORKER_MEMORY:-3g}"
dir="${VELOCITY_CLUSTER_DIR:-$root/.cache/cluster}"
spark_class="$root/.venv/bin/spark-class"
master_url="spark://127.0.0.1:$port"

# Daemons bind to loopback only; the workers' Python comes from the driver
# (PYSPARK_PYTHON, the project's interpreter), so executors run the locked packages.
export SPARK_LOCAL_IP=127.0.0.1 SPARK_LOG_DIR="$dir/logs"
# spark-class finds Spark through SPARK_HOME, else by importing pyspark with whatever
# python3 is first on PATH: name the project's own.
if [ -x "$root/.venv/bin/python" ]; then
  SPARK_HOME="$("$root/.venv/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
  export SPARK_HOME PYSPARK_PYTHON="$root/.venv/bin/python"
fi
export SPARK_NO_DAEMONIZE=1

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

state() { # the master's JSON view (no curl on a bare machine: Python's urllib)
  "$root/.venv/bin/python" -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$ui_port/json/" 2>/dev/null
}

alive_workers() {
  state | "$root/.venv/bin/python" -c \
    'import json,sys; print(sum(w["state"] == "ALIVE" for w in json.load(sys.stdin)["workers"]))' \
    2>/dev/null || echo 0
}

start() { # name, log, command...
  local name="$1" log="$2"
  shift 2
  if alive "$dir/$name.pid"; then return; fi
  nohup "$@" >"$log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

up() {
  [ -x "$spark_class" ] || { echo "no $spark_class; run \`make setup\` first" >&2; exit 1; }
  mkdir -p "$dir/logs"
  start master "$dir/logs/master.log" "$spark_class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$port" --webui-port "$ui_port"
  for i in $(seq 1 "$workers"); do
    mkdir -p "$dir/worker-$i"
    # Port 0: each worker and its UI take a free port.
    start "worker-$i" "$dir/logs/worker-$i.log" "$spark_class" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --cores 1 --memory "$worker_memory" --webui-port 0 \
      --work-dir "$dir/worker-$i" "$master_url"
  done
  for _ in $(seq 1 120); do
    if [ "$(alive_workers)" -ge "$workers" ]; then
      echo "Spark cluster up: $master_url, $workers workers of 1 core (UI http://127.0.0.1:$ui_port)"
      return
    fi
    sleep 0.5
  done
  echo "the Spark cluster did not come up within 60 s; logs in $dir/logs:" >&2
  tail -n 20 "$dir"/logs/*.log >&2
  exit 1
}

down() {
  local pidfile pid
  for pidfile in "$dir"/worker-*.pid "$dir"/master.pid; do
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
  echo "Spark cluster down"
}

status() {
  state | "$root/.venv/bin/python" -c '
import json, sys
s = json.load(sys.stdin)
print("%s: %s, %d workers alive, %d cores" % (s["url"], s["status"], s["aliveworkers"], s["cores"]))
for w in s["workers"]:
    print("  worker %s:%s %s, cores %d/%d" % (w["host"], w["port"], w["state"], w["coresused"], w["cores"]))
for a in s["activeapps"]:
    print("  application %s %s, cores %d" % (a["id"], a["name"], a["cores"]))
' || { echo "no Spark cluster at $master_url" >&2; exit 1; }
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
