#!/usr/bin/env bash
# Airflow for Velocity on this machine: `airflow standalone` (scheduler, dag-processor,
# api-server with the UI, triggerer) against the project's dags/ and plugins/, with
# AIRFLOW_HOME=<checkout>/airflow_home, SQLite, and a parallelism for two cores.
#
#   bash infra/airflow.sh up         start in the background, wait until healthy, print URL and login
#   bash infra/airflow.sh down       stop it (and its scheduler, workers, api-server, …)
#   bash infra/airflow.sh env        print the environment; `eval "$(bash infra/airflow.sh env)"`
#                                    then lets the airflow CLI talk to this instance
#   bash infra/airflow.sh test-env HOME PORT
#                                    the same environment for an isolated instance in HOME whose
#                                    api-server listens on PORT (tests/dags use it)
#
# VELOCITY_AIRFLOW_HOME (default <checkout>/airflow_home) moves the instance (tests use a tmp dir);
# VELOCITY_AIRFLOW_PORT (default 8790) is the UI/api-server port; the worker and triggerer
# log servers take the next two ports (Airflow's defaults, 8793/8794, are left free).
# VELOCITY_AIRFLOW_USERS (default admin:admin,viewer:viewer) lists user:role pairs.
# VELOCITY_AIRFLOW_SPARK_MASTER (default local[2]) is the master written into the
# velocity_spark connection on the first `up`; edit the connection afterwards in the UI.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
home="${VELOCITY_AIRFLOW_HOME:-${root}/airflow_home}"
port="${VELOCITY_AIRFLOW_PORT:-8790}"
python="${root}/.venv/bin/python"

print_env() {
  local home="$1" port="$2" users="${VELOCITY_AIRFLOW_USERS:-admin:admin,viewer:viewer}"
  cat <<EOF
export AIRFLOW_HOME='${home}'
export PATH='${root}/.venv/bin':"\$PATH"
export AIRFLOW__CORE__DAGS_FOLDER='${root}/dags'
export AIRFLOW__CORE__PLUGINS_FOLDER='${root}/plugins'
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN='sqlite:///${home}/airflow.db'
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
# standalone starts one LocalExecutor worker per unit of parallelism (32 by default):
# the stream holds one slot, one Spark batch job (pool velocity_spark) and a check the rest.
export AIRFLOW__CORE__PARALLELISM=3
export AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG=2
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=${port}
export AIRFLOW__API__WORKERS=1
export AIRFLOW__API__BASE_URL='http://127.0.0.1:${port}'
# Task processes report to the execution API; it lives on the api-server's port.
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL='http://127.0.0.1:${port}/execution/'
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=$((port + 1))
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=$((port + 2))
# New or edited DAG files show up within 30 s instead of 5 min.
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=True
# Users and their roles (SimpleAuthManager): a viewer may read the Velocity page and the
# DAGs but change nothing; passwords are generated into AIRFLOW_HOME on the first start.
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS='${users}'
EOF
}

port_busy() {
  "$python" - "$1" <<'EOF'
import socket, sys
with socket.socket() as s:
    s.settimeout(1)
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
}

healthy() {
  "$python" - "$1" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v2/monitor/health", timeout=3) as r:
        health = json.load(r)
except Exception:
    sys.exit(1)
parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
sys.exit(0 if all((health.get(p) or {}).get("status") == "healthy" for p in parts) else 1)
EOF
}

running_pid() {
  local pid
  pid="$(cat "${home}/standalone.pid" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

# Connections and the Spark pool, created once; later `up`s keep what was edited in the UI.
provision() {
  local master="${VELOCITY_AIRFLOW_SPARK_MASTER:-local[2]}"
  "$python" - "$master" > "${home}/connections.json" <<'EOF'
import json, sys
from velocity.settings import load_settings

settings = load_settings()
print(json.dumps({
    "velocity_spark": {"conn_type": "spark", "host": sys.argv[1],
                       "description": "Spark master for Velocity's spark-submit jobs"},
    "velocity_default": {"conn_type": "generic",
                         "description": "Velocity settings (extras named like VELOCITY_* settings)",
                         "extra": json.dumps({"data_dir": str(settings.data_dir),
                                              "redis_url": settings.redis_url})},
}, indent=2))
EOF
  airflow connections import "${home}/connections.json" >>"${home}/setup.log" 2>&1
  airflow pools get velocity_spark >>"${home}/setup.log" 2>&1 ||
    airflow pools set velocity_spark 1 "one Spark batch job at a time beside the stream" \
      >>"${home}/setup.log" 2>&1
}

up() {
  mkdir -p "$home"
  eval "$(print_env "$home" "$port")"
  local pid
  pid="$(running_pid)"
  if [ -n "$pid" ]; then
    echo "airflow already running (pid $pid) on http://127.0.0.1:${port}"
    return 0
  fi
  if port_busy "$port"; then
    echo "port ${port} is taken by another program; set VELOCITY_AIRFLOW_PORT to a free port" >&2
    exit 1
  fi
  echo "preparing ${home} (database, connections, pool)"
  airflow db migrate >"${home}/setup.log" 2>&1 || { tail -20 "${home}/setup.log" >&2; exit 1; }
  provision
  # A session of its own, so `down` can stop standalone and every process it started.
  setsid airflow standalone >"${home}/standalone.log" 2>&1 < /dev/null &
  echo $! >"${home}/standalone.pid"
  echo "starting airflow standalone (log: ${home}/standalone.log)"
  local waited=0
  until healthy "$port"; do
    if [ -z "$(running_pid)" ]; then
      tail -30 "${home}/standalone.log" >&2
      echo "airflow standalone exited; its log is above" >&2
      exit 1
    fi
    if [ "$waited" -ge 180 ]; then
      echo "airflow is not healthy after 180 s; see ${home}/standalone.log" >&2
      exit 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
  local password_file="${home}/simple_auth_manager_passwords.json.generated"
  echo
  echo "Airflow UI: http://127.0.0.1:${port}"
  "$python" - "$password_file" <<'EOF'
import json, sys
for number, (user, password) in enumerate(sorted(json.load(open(sys.argv[1])).items())):
    print(f"{'login:' if number == 0 else '':<12}{user} / {password}")
EOF
  echo "            (passwords generated by standalone into ${password_file})"
  echo "Velocity:   http://127.0.0.1:${port}/plugin/velocity (rules, alerts, stream health)"
  echo "DAGs are paused when first seen: unpause the ones to run in the UI."
  echo "stop with:  make airflow-down  (or bash infra/airflow.sh down)"
}

down() {
  local pid
  pid="$(running_pid)"
  if [ -z "$pid" ]; then
    echo "airflow was not running"
    rm -f "${home}/standalone.pid"
    return 0
  fi
  # SIGINT is how standalone shuts its components down; the whole group gets it.
  kill -INT -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill -TERM -- "-$pid" 2>/dev/null || true
  sleep 2
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "${home}/standalone.pid"
  echo "airflow stopped"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) print_env "$home" "$port" ;;
  test-env)
    [ $# -eq 3 ] || { echo "usage: $0 test-env HOME PORT" >&2; exit 2; }
    print_env "$2" "$3"
    ;;
  *)
    echo "usage: $0 {up|down|env|test-env HOME PORT}" >&2
    exit 2
    ;;
esac
