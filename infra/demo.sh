#!/usr/bin/env bash
# The main job on the embedded defaults: Redis and a local Kafka broker, the sample rules, a
# generator producing payments to the topic velocity.events at a steady rate with fraud
# spikes, the streaming job reading that topic, and the alerts live from the Redis stream
# (they also go to the topic velocity.alerts).
#   DEMO_SECONDS (default 90) how long the generator produces  DEMO_RATE events/s (default 100)
#   DEMO_KEYS payers (default 20000)  DEMO_SOURCE kafka (default) or folder (files landing in
#   DEMO_DIR/live)  DEMO_DIR (default data/demo): the demo's logs and exported alerts
#   DEMO_DRAIN_SECONDS (default 10) how long alerts are still shown after the generator ends
# Redis, the broker and the check service that `velocity up` starts keep running after the
# demo (the README's tour reads them); its last line says so: `velocity down` stops them.
# Every port follows the settings (VELOCITY_* or VELOCITY_CONFIG): Redis the port of
# VELOCITY_REDIS_URL, the broker VELOCITY_KAFKA_BOOTSTRAP (its controller the next port), the
# stream's metrics VELOCITY_METRICS_PORT, and state lives in VELOCITY_DATA_DIR; Spark's UI is
# off and its driver takes free loopback ports.
# So a second copy runs beside the first with other ports and another data dir.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
velocity=.venv/bin/velocity
python=.venv/bin/python
seconds="${DEMO_SECONDS:-90}"
rate="${DEMO_RATE:-100}"
keys="${DEMO_KEYS:-20000}"
source="${DEMO_SOURCE:-kafka}"
drain="${DEMO_DRAIN_SECONDS:-10}"
demo_dir="${DEMO_DIR:-data/demo}"
live="${demo_dir}/live"
began=$SECONDS

# The settings' metrics port and the stream's status file, read once: a poll that loaded
# the settings each time would start Velocity's imports every 3 s (~1 s of a CPU the
# stream's own start needs).
{ read -r metrics_port; read -r status_file; } < <("$python" -c '
from velocity.settings import load_settings
from velocity.operating.stream_control import status_path
settings = load_settings()
print(settings.metrics_port)
print(status_path(settings.data_dir))')
# "<state> <micro-batches with input this run>" of the stream this script started (its pid
# in the status file: an earlier run's file says nothing about this one), read with the
# standard library only.
stream_state() {
  "$python" -S - "$status_file" "$stream_pid" <<'EOF' 2>/dev/null || echo "unknown 0"
import json, sys
status = json.load(open(sys.argv[1]))
mine = status.get("pid") == int(sys.argv[2])
print(status.get("state") if mine else "unknown", status.get("batchesThisRun") or 0)
EOF
}

up_status=0
up_said="$($velocity up)" || up_status=$?
echo "$up_said"
# What `velocity up` started now, not what ran before the demo: the demo leaves them running
# (the tour's next steps read Redis) and says, whatever way it ends, how to stop them.
started=() kept=()
for service in "redis:Redis" "kafka:the Kafka broker" "check service:the check service"; do
  if grep -qE "^${service%%:*} ([^ ]+ )?started " <<< "$up_said"; then
    started+=("${service#*:}")
  elif grep -qE "^${service%%:*} ([^ ]+ )?already running " <<< "$up_said"; then
    kept+=("${service#*:}")
  fi
done
# "A", "A and B", "A, B and C"
listed() {
  local text
  text="$(printf '%s, ' "${@:1:$#-1}")"
  echo "${text%, }${2:+ and }${!#}"
}
how_to_stop() {
  local said=()
  [ "${#started[@]}" -gt 0 ] && said+=("$(listed "${started[@]}"), started by this demo")
  [ "${#kept[@]}" -gt 0 ] && said+=("$(listed "${kept[@]}"), which ran before the demo")
  [ "${#said[@]}" -gt 0 ] || said=("what \`velocity up\` started")
  local text
  text="$(printf '%s; ' "${said[@]}")"
  echo "still running: ${text%; } (the tour's next steps read Redis);" \
    "\`velocity down\` (or \`make down\`) stops them"
}
if [ "$up_status" -ne 0 ]; then
  how_to_stop
  exit "$up_status"
fi
rm -rf "$live" && mkdir -p "$live"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap 'cleanup; how_to_stop' EXIT
if [ "$source" = kafka ]; then
  # A first demo reads what the generator produces from now on (a later one resumes at
  # its checkpoint's offsets).
  reads=(--source kafka --starting-offsets latest)
  writes=(--kafka)
else
  reads=(--events "$live")
  writes=(--out "$live")
fi
# The stream applies the sample rules itself as it starts (one Spark start, not two). The
# generator starts once the stream runs: Spark's start is most of the wait. The duration is
# a safety net: the demo stops the stream itself once the generator is done.
$velocity stream "${reads[@]}" --rules jobs/velocity/resources/sample_rules.json \
  --duration "$((seconds + drain + 600))" > "${demo_dir}/stream.log" 2>&1 &
stream_pid=$!
pids+=("$stream_pid")
echo "starting the stream (log: ${demo_dir}/stream.log)"
# Polled every second (a file read), told every 10 s.
waited=$SECONDS
told=$((SECONDS - 10))
until read -r state _ < <(stream_state) && [ "$state" = RUNNING ]; do
  if ! kill -0 "$stream_pid" 2>/dev/null; then
    tail -20 "${demo_dir}/stream.log" >&2
    echo "the stream ended before it ran; its log is above (${demo_dir}/stream.log)" >&2
    exit 1
  fi
  if [ $((SECONDS - waited)) -ge 600 ]; then
    echo "the stream is not running after 600 s; see ${demo_dir}/stream.log" >&2
    exit 1
  fi
  if [ $((SECONDS - told)) -ge 10 ]; then
    echo "waiting for the stream to start (Spark, the Delta tables, the rules' history)… $((SECONDS - began)) s"
    told=$SECONDS
  fi
  sleep 1
done
echo "the stream runs ($((SECONDS - began)) s since the demo began)"
if [ "$metrics_port" != 0 ]; then
  echo "its metrics, for Prometheus: http://127.0.0.1:${metrics_port}/metrics"
fi
echo "streaming for ${seconds}s: ${rate} events/s over ${keys} payers, alerts below (Ctrl-C stops)"

$velocity generate "${writes[@]}" --follow --rate "$rate" --keys "$keys" --duration "$seconds" \
  --spike-fraction 0.02 --late-fraction 0.005 --duplicate-fraction 0.005 \
  --malformed-fraction 0.005 --events 100000000 > "${demo_dir}/generate.log" &
generate_pid=$!
pids+=("$generate_pid")
# Until the first micro-batch with input is done, say so instead of staying silent.
(
  while read -r state batches < <(stream_state) && [ "$state" = RUNNING ] \
    && [ "${batches:-0}" -lt 1 ]; do
    echo "waiting for the stream's first micro-batch… $((SECONDS - began)) s"
    sleep 3
  done
  [ "$state" = RUNNING ] &&
    echo "the stream's first micro-batch is done ($((SECONDS - began)) s since the demo began)"
) &
pids+=($!)
$velocity watch --duration "$((seconds + drain))"
wait "$generate_pid"
$velocity stream-stop --reason "the demo ended" --wait 120 > /dev/null
status=0
wait "$stream_pid" || status=$?
trap how_to_stop EXIT  # the last words, however the rest ends
cleanup
if [ "$status" -ne 0 ]; then
  tail -20 "${demo_dir}/stream.log" >&2
  echo "the stream failed (exit ${status}); its log is above (${demo_dir}/stream.log)" >&2
  exit 1
fi
echo
echo "generator: $("$python" -c 'import json, sys; d = json.load(sys.stdin); d.pop("files"); print(json.dumps(d))' < "${demo_dir}/generate.log")"
tail -1 "${demo_dir}/stream.log"
$velocity alerts --out "${demo_dir}/stream_alerts.jsonl"
exported="${demo_dir}/stream_alerts.jsonl"
echo "alerts in Delta: $(wc -l < "$exported") ($(grep -c '"suppressed":true' "$exported" || true)" \
  "suppressed by a rule's cooldown, so not on the alert stream or topic): $exported"
if [ "$source" = kafka ]; then
  echo "the alerts topic, read by examples/kafka_alert_consumer.py (drops repeats by alertId):"
  "$python" examples/kafka_alert_consumer.py --group "velocity-demo-$(date +%s)" --idle-seconds 3
fi
echo "demo done in $((SECONDS - began)) s"
