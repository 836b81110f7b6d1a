"""The soak's short version (`make soak` is the long one, docs/operating/soak.md): the
stream on Kafka through run_stream, every fault kind once while payments are produced,
then the same checks. Its own Redis and broker (the faults kill and flush them: the
session's are shared), the session's Airflow home (migrated once)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.redis,
    pytest.mark.kafka,
    pytest.mark.airflow,
    pytest.mark.timeout(600),
]


def test_every_fault_together_for_a_short_soak(airflow_home: Path, tmp_path: Path) -> None:
    from tools.soak import Soak, SoakConfig

    lines: list[str] = []
    soak = Soak(
        SoakConfig(
            minutes=1.0,
            rate=200,
            keys=2000,
            each=1,
            gap=5.0,
            redis_with_sigkill=True,
            work=tmp_path / "soak",
            airflow_home=airflow_home,
            log=lines.append,
        )
    )
    outcome = soak.run()
    report = soak.report()
    assert outcome.held, "\n".join([*lines, report])
