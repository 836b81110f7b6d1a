#!/usr/bin/env bash
# The main job on the embedded defaults: Redis and a local Kafka broker, the sample rules, a
# generator producing payments to the topic velocity.events at a steady rate with fraud
# spikes, the streaming job reading that topic, and the alerts live from the Redis stream
# (they also go to the topic velocity.alerts).
#   DEMO_SECONDS (default 90)  DEMO_RATE events/s (default 100)  DEMO_KEYS payers (default 20000)
#   DEMO_SOURCE kafka (default) or folder (files landing in data/demo/live)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
velocity=.venv/bin/velocity
seconds="${DEMO_SECONDS:-90}"
rate="${DEMO_RATE:-100}"
keys="${DEMO_KEYS:-20000}"
source="${DEMO_SOURCE:-kafka}"
live="data/demo/live"

$velocity up
rm -rf "$live" && mkdir -p "$live"
$velocity rules apply jobs/velocity/resources/sample_rules.json
echo "streaming for ${seconds}s: ${rate} events/s over ${keys} payers, alerts below (Ctrl-C stops)"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
# The stream starts first; the generator lands a file a second once the stream runs (Spark,
# the tables and the rules' history take half a minute on two cores the first time).
if [ "$source" = kafka ]; then
  # A first demo reads what the generator produces from now on (a later one resumes at
  # its checkpoint's offsets).
  reads=(--source kafka --starting-offsets latest)
  writes=(--kafka)
else
  reads=(--events "$live")
  writes=(--out "$live")
fi
$velocity stream "${reads[@]}" --duration "$((seconds + 30))" > data/demo/stream.log 2>&1 &
pids+=($!)
for _ in $(seq 1 240); do
  $velocity stream-status 2>/dev/null | grep -q '"verdict": "running"' && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "the stream ended; see data/demo/stream.log" >&2; exit 1; }
  sleep 1
done
$velocity generate "${writes[@]}" --follow --rate "$rate" --keys "$keys" --duration "$seconds" \
  --spike-fraction 0.02 --late-fraction 0.005 --duplicate-fraction 0.005 \
  --malformed-fraction 0.005 --events 100000000 > data/demo/generate.log &
pids+=($!)
$velocity watch --duration "$((seconds + 25))"
wait "${pids[@]}" || true
trap - EXIT
echo
echo "generator: $(.venv/bin/python -c 'import json, sys; d = json.load(sys.stdin); d.pop("files"); print(json.dumps(d))' < data/demo/generate.log)"
tail -1 data/demo/stream.log
$velocity alerts --out data/demo/stream_alerts.jsonl
echo "alerts in Delta: $(wc -l < data/demo/stream_alerts.jsonl) (data/demo/stream_alerts.jsonl)"
if [ "$source" = kafka ]; then
  echo "the alerts topic, read by examples/kafka_alert_consumer.py (drops repeats by alertId):"
  .venv/bin/python examples/kafka_alert_consumer.py --group "velocity-demo-$(date +%s)" \
    --idle-seconds 3
fi
