#!/usr/bin/env bash
# Airflow for Velocity on this machine: the components `airflow standalone` runs (scheduler,
# dag-processor, api-server with the UI, triggerer) against the project's dags/ and plugins/,
# with AIRFLOW_HOME=<checkout>/airflow_home, SQLite, and a parallelism for two cores. They are
# run by this script (`serve`) rather than by standalone so that every listener binds to
# 127.0.0.1: standalone's scheduler and triggerer start Airflow's log servers on every
# interface (Airflow has no host setting for them); here they run with --skip-serve-logs and
# the same log server listens on loopback (plugins/velocity_airflow/log_server.py).
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
# VELOCITY_AIRFLOW_PORT (default 8790) is the UI/api-server port (and the execution API's);
# every other listener follows it: the worker log server PORT+1, the triggerer log server
# PORT+2, the scheduler's health check PORT+3, all on 127.0.0.1; `up` refuses a taken one.
# Two deployments with ports at least 4 apart (and their own VELOCITY_AIRFLOW_HOME, data
# dir and Redis) run side by side.
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
# Tasks and triggers record this host as 127.0.0.1, where the api-server then fetches a
# running task's log (the log servers listen on loopback only).
export AIRFLOW__CORE__HOSTNAME_CALLABLE=velocity_airflow.log_server.loopback_hostname
# New or edited DAG files show up within 30 s instead of 5 min.
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=True
export AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST=127.0.0.1
export AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=$((port + 3))
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

# The components, in the foreground of the session `up` starts; each output line is
# prefixed with its component's name, as standalone prints them.
serve() {
  eval "$(print_env "$home" "$port")"
  component() {
    local name="$1"
    shift
    # The prefixer outlives a SIGTERM to the group, so a component's last lines are kept.
    { "$@" 2>&1; } | (trap '' INT TERM; exec sed -u "s/^/${name} | /") &
  }
  component scheduler airflow scheduler --skip-serve-logs
  component dag-processor airflow dag-processor
  component triggerer airflow triggerer --skip-serve-logs
  component api-server airflow api-server
  local log_server=(env PYTHONPATH="${root}/plugins" "$python" -m velocity_airflow.log_server)
  component worker-logs "${log_server[@]}" 127.0.0.1 $((port + 1))
  component trigger-logs "${log_server[@]}" 127.0.0.1 $((port + 2))
  wait
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
  local taken
  for taken in "$port" $((port + 1)) $((port + 2)) $((port + 3)); do
    if port_busy "$taken"; then
      echo "port ${taken} is taken by another program; Airflow here needs ${port}-$((port + 3)):" \
        "set VELOCITY_AIRFLOW_PORT to a free port with the next three free" >&2
      exit 1
    fi
  done
  echo "preparing ${home} (database, connections, pool)"
  airflow db migrate >"${home}/setup.log" 2>&1 || { tail -20 "${home}/setup.log" >&2; exit 1; }
  provision
  # A session of its own, so `down` can stop every component and what they started.
  setsid bash "${root}/infra/airflow.sh" serve >"${home}/standalone.log" 2>&1 < /dev/null &
  echo $! >"${home}/standalone.pid"
  echo "starting airflow: api-server on 127.0.0.1:${port}, log servers on $((port + 1))" \
    "and $((port + 2)), scheduler health check on $((port + 3)) (log: ${home}/standalone.log)"
  local waited=0
  until healthy "$port"; do
    if [ -z "$(running_pid)" ]; then
      tail -30 "${home}/standalone.log" >&2
      echo "airflow exited; its log is above" >&2
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
  echo "            (passwords generated by the api-server into ${password_file})"
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
  # SIGTERM shuts each component down cleanly (SIGINT would not: the components run as
  # background jobs of `serve`, which ignore it); the whole group gets it.
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "${home}/standalone.pid"
  echo "airflow stopped"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) print_env "$home" "$port" ;;
  serve) serve ;;
  test-env)
    [ $# -eq 3 ] || { echo "usage: $0 test-env HOME PORT" >&2; exit 2; }
    print_env "$2" "$3"
    ;;
  *)
    echo "usage: $0 {up|down|env|test-env HOME PORT}  (serve: run by up)" >&2
    exit 2
    ;;
esac
