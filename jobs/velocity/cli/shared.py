"""What the command modules share: the exit codes, the settings ``main`` loaded, a rules
file read, the rule store, a Spark session, and text exported to a file or standard output.

Cheap to import (no Spark, no delta-rs): the stores and Spark are imported when asked for.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from velocity.domain.rules import RuleEntry, parse_rules
from velocity.errors import UsageError
from velocity.settings import Settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def read_rules_file(path: str) -> list[RuleEntry]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read rules file {path!r}: {exc.strerror}") from exc
    return parse_rules(text)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings ``main`` loaded for this command (flags over environment over file)."""
    settings: Settings = args.settings
    return settings


def spark_session(settings: Settings, app: str) -> Any:
    from velocity.spark.session import build_spark

    return build_spark(settings, app)


def rule_store(settings: Settings) -> Any:
    """The rule store (delta-rs: no Spark session, so a rule change takes well under 2 s)."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore

    return RuleStore(settings.table_path(RULES))


def export(text: str, out: str | None, written: str) -> int:
    """``text`` to the file ``out`` (then say ``written`` and where), or to standard output."""
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"{written} written to {out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK
