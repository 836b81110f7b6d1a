"""Each benchmark's machine-readable figures: ``--figures PATH`` writes one JSON object with
the figures docs/benchmarks.md quotes, beside the human output (which stays as it is).
``benchmarks.smoke`` reads them and checks their shape."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--figures",
        type=Path,
        metavar="PATH",
        help="also write the figures as one JSON object to PATH (benchmarks.smoke reads it)",
    )


def write(path: Path | None, figures: Mapping[str, object]) -> None:
    """One JSON object at ``path`` (nothing without a path); the folder is made."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
