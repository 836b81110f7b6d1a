"""Files shipped with the package: ``sample_rules.json``, the sample rules the docs, the demo,
the tests and the benchmarks use."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def sample_rules_path() -> Path:
    return Path(str(files(__name__) / "sample_rules.json"))
