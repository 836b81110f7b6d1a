#!/usr/bin/env bash
# Fetch the Delta Lake JARs that match the pinned delta-spark and pyspark into the
# project-local cache (.cache/jars), once. Spark loads them through spark.jars, so no
# run ever resolves packages at session start. A second call downloads nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
jars="$root/.cache/jars"
read -r delta spark_mm < <("$python" - <<'PY'
from importlib.metadata import version
print(version("delta-spark"), ".".join(version("pyspark").split(".")[:2]))
PY
)
artifacts=("io.delta:delta-spark_${spark_mm}_2.13:${delta}" "io.delta:delta-storage:${delta}")
mkdir -p "$jars"
for artifact in "${artifacts[@]}"; do
  IFS=: read -r group name ver <<<"$artifact"
  if [ -s "$jars/$name-$ver.jar" ]; then continue; fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "installing maven to fetch $artifact" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  fi
  echo "fetching $artifact into $jars" >&2
  mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$jars" \
    -Dmaven.repo.local="$root/.cache/m2" >&2
done
# Drop JARs of other versions so spark.jars never loads two Deltas.
for jar in "$jars"/*.jar; do
  keep=no
  for artifact in "${artifacts[@]}"; do
    IFS=: read -r group name ver <<<"$artifact"
    [ "$(basename "$jar")" = "$name-$ver.jar" ] && keep=yes
  done
  [ "$keep" = yes ] || rm -f "$jar"
done
