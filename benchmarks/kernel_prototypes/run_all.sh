#!/bin/bash
# The kernel prototypes of issue 22 (numpy, DuckDB, Polars on 1M events), apart from the
# product: their own virtualenv and data under $PROTO_WORK. docs/benchmarks.md (Backtest, the
# kernel prototypes row) has the figures.  Usage: bash benchmarks/kernel_prototypes/run_all.sh [uniform|zipf]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PROTO_WORK="${PROTO_WORK:-/tmp/velocity-kernel-prototypes}"
mkdir -p "$PROTO_WORK"
D=${1:-uniform}
PY="$PROTO_WORK/venv/bin/python"
if [ ! -x "$PY" ]; then
  python3.11 -m venv "$PROTO_WORK/venv"
  "$PY" -m pip install -q numpy==2.4.6 pyarrow==21.0.0 duckdb==2.0.1 polars==2.1.0
fi
cd "$here"
[ -f "$PROTO_WORK/data_$D.parquet" ] || "$PY" gen_data.py "$D"
"$PY" impl_numpy.py "$D"            # merge-sort tree levels built by stable-sort merging of the previous level
"$PY" impl_numpy.py "$D" lexsort    # the same, levels built with np.lexsort
"$PY" impl_duckdb.py "$D"
"$PY" impl_polars.py "$D"
"$PY" verify.py "$D" numpy numpy_lexsort duckdb polars
