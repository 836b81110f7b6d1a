"""`velocity rules preview` as a user runs it (a real process, no Spark): the text and
JSON forms, an invalid rules file refused naming the field, no events table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from benchmarks.preview import write_live_events

from tests.integration.test_cli import run
from velocity.delta.preview_reader import preview
from velocity.domain.rules import parse_rules
from velocity.errors import UsageError
from velocity.generate import GenerateOptions, generate_events
from velocity.resources import sample_rules_path
from velocity.settings import load_settings

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose live events table holds 3 000 events over about 50 minutes."""
    lines = tmp_path_factory.mktemp("lines")
    generate_events(
        lines,
        GenerateOptions(
            events=3000, rate=1.0, payers=30, files=2, spike_fraction=0.05,
            late_fraction=0, duplicate_fraction=0, malformed_fraction=0, seed=3,
        ),
    )  # fmt: skip
    home = tmp_path_factory.mktemp("data")
    write_live_events(sorted(lines.glob("*.jsonl")), home / "tables" / "events", 500)
    return home


def test_preview_json_is_the_functions_preview(data_dir: Path) -> None:
    done = run(
        "rules", "preview", str(sample_rules_path()), "--hours", "0.5", "--json",
        data_dir=data_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    entries = parse_rules(sample_rules_path().read_text())
    expected = preview(load_settings(data_dir=data_dir), entries, hours=0.5).to_json()
    assert shown["span"] == expected["span"] and shown["eventsRead"] == expected["eventsRead"]
    assert [r["alerts"] for r in shown["rules"]] == [r["alerts"] for r in expected["rules"]]
    assert sum(r["alerts"] for r in shown["rules"]) > 0
    for rule in shown["rules"]:
        assert rule["inForce"] is None and rule["diff"]["added"] == rule["alerts"]
        assert sum(h["alerts"] for h in rule["perHour"]) == rule["alerts"]
        assert len(rule["sample"]) == min(5, rule["alerts"])
        assert all(e["explanation"]["agrees"] for e in rule["sample"])


def test_preview_text_names_the_span_and_the_version_in_force(
    data_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "data"
    shutil.copytree(data_dir, home)  # the module's data dir keeps no rules in force
    applied = run("rules", "apply", str(sample_rules_path()), data_dir=home)
    assert applied.returncode == 0, applied.stderr
    done = run("rules", "preview", str(sample_rules_path()), "--sample", "1", data_dir=home)
    assert done.returncode == 0, done.stderr
    assert "anchored on the newest eventTime in the events table" in done.stdout
    assert "ruleId 4 v0 (unsaved) COUNT() > 5 over 10 min by payerId" in done.stdout
    assert "against v1 in force (ACTIVE" in done.stdout
    assert "0 added, 0 removed, 0 changed value" in done.stdout


def test_invalid_rules_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "ruleId": 3,
                "ruleState": "ACTIVE",
                "groupingKeyNames": ["cardId"],
                "aggregatorFunctionType": "COUNT",
                "limitOperatorType": ">",
                "limit": 5,
                "windowMinutes": 10,
            }
        )
    )
    done = run("rules", "preview", str(bad), data_dir=tmp_path)
    assert done.returncode == 2
    assert "field 'groupingKeyNames[0]'" in done.stderr and "cardId" in done.stderr
    assert done.stdout == ""


def test_no_events_table_is_a_usage_error(tmp_path: Path) -> None:
    done = run("rules", "preview", str(sample_rules_path()), data_dir=tmp_path)
    assert done.returncode == 2
    assert "no events table" in done.stderr and "the stream has accepted no event" in done.stderr


def test_hours_must_be_positive(data_dir: Path) -> None:
    done = run("rules", "preview", str(sample_rules_path()), "--hours", "0", data_dir=data_dir)
    assert done.returncode == 2
    assert "hours must be a positive number" in done.stderr


def test_a_preview_that_would_read_too_many_events_refuses_before_reading(
    data_dir: Path,
) -> None:
    entries = parse_rules(sample_rules_path().read_text())
    with pytest.raises(UsageError, match="would read up to 3000 events") as refused:
        preview(load_settings(data_dir=data_dir), entries, hours=0.5, max_events=2999)
    assert "preview fewer hours, or a rule with a shorter window" in str(refused.value)
