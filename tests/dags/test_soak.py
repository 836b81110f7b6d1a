"""The soak's short version (`make soak` is the long one, docs/operating/soak.md): the
stream on Kafka through run_stream, every fault kind once while payments are produced,
then the same checks (``tests.background.SHORT_SOAK``). It runs as `python -m tools.soak`
beside the suite from the end of collection, after the bench smoke (``tests/background.py``:
about four minutes of waiting for JVMs and Airflow that would otherwise be the suite's);
this test, run last, reads how it ended. Its own Redis, broker and Airflow home (the
faults kill and flush them)."""

from __future__ import annotations

import pytest
from tests.background import run_of, start_soak

pytestmark = [
    pytest.mark.spark,
    pytest.mark.redis,
    pytest.mark.kafka,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),  # the smoke before it included, when both are still running
]


def test_every_fault_together_for_a_short_soak(request: pytest.FixtureRequest) -> None:
    soak = run_of(request, "soak", start_soak)
    code = soak.wait(timeout=1700)
    assert code == 0, f"the short soak exited {code} (its log: {soak.log}):\n{soak.tail(20_000)}"
