#!/usr/bin/env bash
# Fetch, once, into project-local caches (a second call downloads nothing):
#   .cache/jars/   the Delta JARs that match the pinned delta-spark and pyspark, and Spark's
#                  Kafka source (spark-sql-kafka-0-10 with the kafka-clients and
#                  commons-pool2 versions Spark's own build uses); Spark loads them through
#                  spark.jars, so no run ever resolves packages at session start;
#   .cache/kafka/  the JARs of the local Kafka broker that `velocity up` starts
#                  (infra/kafka/pom.xml), from Maven Central like everything else.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
jars="$root/.cache/jars"
m2="$root/.cache/m2"
read -r delta spark spark_mm < <("$python" - <<'PY'
from importlib.metadata import version
spark = version("pyspark")
print(version("delta-spark"), spark, ".".join(spark.split(".")[:2]))
PY
)
# Spark's Kafka source (spark-sql-kafka-0-10) is 4.1.3 on pyspark 4.1.1: its sources differ
# from 4.1.1's in one line only, the fix of SPARK-57438 (in 4.1.1 the first micro-batch
# after a restart that replays an uncommitted batch fails with a NullPointerException in
# the source's metrics). Its token provider is unchanged, and not published as 4.1.3.
# Built against kafka-clients 3.9.1 and commons-pool2 2.12.1 (Spark's pom); Spark's own jars
# folder already has the rest of its dependencies.
case "$spark" in
  4.1.1) spark_kafka=4.1.3 ;;
  *) spark_kafka="$spark" ;;
esac
artifacts=(
  "io.delta:delta-spark_${spark_mm}_2.13:${delta}"
  "io.delta:delta-storage:${delta}"
  "org.apache.spark:spark-sql-kafka-0-10_2.13:${spark_kafka}"
  "org.apache.spark:spark-token-provider-kafka-0-10_2.13:${spark}"
  "org.apache.kafka:kafka-clients:3.9.1"
  "org.apache.commons:commons-pool2:2.12.1"
)

need_mvn() {
  if ! command -v mvn >/dev/null 2>&1; then
    echo "installing maven to fetch JARs" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  fi
}

mkdir -p "$jars"
for artifact in "${artifacts[@]}"; do
  IFS=: read -r group name ver <<<"$artifact"
  if [ -s "$jars/$name-$ver.jar" ]; then continue; fi
  need_mvn
  echo "fetching $artifact into $jars" >&2
  mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$jars" \
    -Dmaven.repo.local="$m2" >&2
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

# A pom's runtime dependencies into a folder, once (complete once its marker is written).
copy_dependencies() { # <pom> <folder> <what, for the log>
  local pom="$1" folder="$2"
  [ -f "$folder/.complete" ] && return 0
  need_mvn
  echo "fetching $3 into $folder" >&2
  rm -rf "$folder"
  mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$folder" -Dmaven.repo.local="$m2" >&2
  touch "$folder/.complete"
}
pom_version() { # <pom> <property>
  sed -n "s:.*<$2>\(.*\)</$2>.*:\1:p" "$1"
}

# The broker: one folder per version; its JARs in libs/.
kafka_version="$(pom_version "$root/infra/kafka/pom.xml" kafka.version)"
copy_dependencies "$root/infra/kafka/pom.xml" "$root/.cache/kafka/$kafka_version/libs" \
  "the Kafka $kafka_version broker"
[ -f "$root/.cache/kafka/$kafka_version/.complete" ] \
  || touch "$root/.cache/kafka/$kafka_version/.complete"

# The docs' Java examples' client (Jedis), run as written by the docs' tests.
jedis_version="$(pom_version "$root/infra/examples/pom.xml" jedis.version)"
copy_dependencies "$root/infra/examples/pom.xml" "$root/.cache/examples/$jedis_version" \
  "Jedis $jedis_version for the docs' Java examples"
