#!/usr/bin/env bash
# The main job on the embedded defaults: Redis, the sample rules, a generator writing
# events at a steady rate with fraud spikes, the streaming job, and the alerts live.
#   DEMO_SECONDS (default 90)  DEMO_RATE events/s (default 100)  DEMO_KEYS payers (default 20000)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
velocity=.venv/bin/velocity
seconds="${DEMO_SECONDS:-90}"
rate="${DEMO_RATE:-100}"
keys="${DEMO_KEYS:-20000}"
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
$velocity stream --events "$live" --duration "$((seconds + 30))" > data/demo/stream.log 2>&1 &
pids+=($!)
for _ in $(seq 1 240); do
  $velocity stream-status 2>/dev/null | grep -q '"verdict": "running"' && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "the stream ended; see data/demo/stream.log" >&2; exit 1; }
  sleep 1
done
$velocity generate --out "$live" --follow --rate "$rate" --keys "$keys" --duration "$seconds" \
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
