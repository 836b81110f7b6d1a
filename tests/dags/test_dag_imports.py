"""Every DAG file imports with no errors and follows the house rules for DAGs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.dags.conftest import ROOT

DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
# dag_id -> (schedule, tags besides "velocity")
EXPECTED = {
    "run_stream": (None, {"stream"}),
    "check_stream": ("*/5 * * * *", {"stream"}),
    "stop_stream": (None, {"stream"}),
    "maintain_state": ("15 * * * *", {"maintenance"}),
    "check_quality": ("45 * * * *", {"quality"}),
    "backfill_alerts": (None, {"backfill"}),
}


def test_one_dag_file_per_expected_dag() -> None:
    assert sorted(p.stem for p in DAG_FILES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_dag_file_imports_and_follows_the_rules(path: Path, airflow_home: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(path), safe_mode=False)
    assert bag.import_errors == {}
    assert list(bag.dags) == [path.stem], "one DAG per file, named like the file"
    dag = bag.dags[path.stem]
    schedule, tags = EXPECTED[path.stem]
    assert dag.catchup is False
    assert dag.schedule == schedule
    assert dag.tags == {"velocity", *tags}
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring is not None
    assert all(f"{part}:" in docstring for part in ("What", "Why", "When", "Needs"))
    # The operator reads it in the UI, on the DAG's page.
    assert dag.doc_md == docstring.strip() or dag.doc_md.strip() == docstring.strip()


def test_parsing_the_dags_starts_no_spark_redis_or_network() -> None:
    """The dag-processor parses every file often: no Spark, Redis or GX import at parse time."""
    script = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(ROOT / 'dags')!r}, safe_mode=False)\n"
        "heavy = sorted(m for m in ('pyspark', 'redis', 'great_expectations', 'delta')"
        " if m in sys.modules)\n"
        "print(json.dumps({'dags': sorted(bag.dags), 'errors': bag.import_errors,"
        " 'heavy': heavy}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {"dags": sorted(EXPECTED), "errors": {}, "heavy": []}
