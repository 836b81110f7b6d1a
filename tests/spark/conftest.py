"""Fixtures of the Spark tests' modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import generated_in_arrival_order
from velocity.generate import GenerateOptions


@pytest.fixture(scope="module")
def in_order_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-key increasing eventTimes (no late events), with duplicates and malformed lines."""
    folder = tmp_path_factory.mktemp("stream-events")
    return generated_in_arrival_order(
        folder,
        GenerateOptions(
            events=2500,
            rate=2.0,
            payers=25,
            files=5,
            spike_fraction=0.03,
            late_fraction=0.0,
            duplicate_fraction=0.02,
            malformed_fraction=0.02,
            seed=21,
        ),
    )


@pytest.fixture(scope="module")
def late_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Events with late arrivals (10–60 min behind), duplicates and malformed lines."""
    folder = tmp_path_factory.mktemp("backfill-events")
    return generated_in_arrival_order(
        folder,
        GenerateOptions(
            events=2400,
            rate=0.5,
            payers=20,
            files=6,
            spike_fraction=0.05,
            late_fraction=0.04,
            duplicate_fraction=0.02,
            malformed_fraction=0.01,
            seed=33,
        ),
    )
