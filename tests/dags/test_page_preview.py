"""The Velocity page's preview of the add-rules form's rules: its HTML from plain data, and
the routes in process over a real live events table (delta-rs, no Spark); nothing saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks.preview import write_live_events
from tests.builders import make_rule

from velocity.delta.names import RULES
from velocity.delta.preview_reader import preview
from velocity.delta.rule_store import RuleStore
from velocity.domain.rules import parse_rules
from velocity.generate import GenerateOptions, generate_events
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity_airflow.page.home_html import PageData, render_page

pytestmark = pytest.mark.timeout(300)

HOUR = 3_600_000
END = 1767225600000  # 2026-01-01 00:00:00Z


def _entry(tx: str, candidate: str | None, in_force: str | None) -> dict[str, Any]:
    return {
        "transactionId": tx,
        "eventTime": END - 60_000,
        "candidateValue": candidate,
        "inForceValue": in_force,
    }


def _preview_json() -> dict[str, Any]:
    """Rule 4 lowered from 5 to 3 over two hours: 4 alerts beside the version in force's 1."""
    alert = {
        "alertId": "x-1", "kind": "ALERT", "ruleId": 4, "ruleVersion": 0,
        "transactionId": "tx-<b>", "key": {"payerId": "<p>"}, "eventTime": END - 60_000,
        "aggregatorFunctionType": "COUNT", "aggregateValue": "4", "limitOperatorType": ">",
        "limit": "3", "windowStart": END - 660_000, "windowEnd": END - 60_000,
    }  # fmt: skip
    explanation = {
        "alert": alert,
        "eventCount": 4,
        "events": [{"transactionId": f"t{n}", "eventTime": END - n, "value": None} for n in (4, 3)],
        "arithmetic": "4 events",
        "agrees": True,
        "verdict": "the 4 events of the window give 4, the alert's value",
    }
    return {
        "span": {"start": END - 2 * HOUR, "end": END},
        "hours": 2.0,
        "eventsInSpan": 700,
        "eventsRead": 720,
        "readFrom": END - 2 * HOUR - 600_000,
        "rules": [
            {
                "rule": {"version": 0, **make_rule(ruleId=4, limit=3).to_json()},
                "summary": "COUNT() > 3 over 10 min by payerId",
                "inForce": {"version": 2, **make_rule(ruleId=4, limit=5).to_json()},
                "alerts": 4,
                "perHour": [
                    {"start": END - 2 * HOUR, "end": END - HOUR, "alerts": 1},
                    {"start": END - HOUR, "end": END, "alerts": 3},
                ],
                "inForceAlerts": 1,
                "inForcePerHour": [
                    {"start": END - 2 * HOUR, "end": END - HOUR, "alerts": 0},
                    {"start": END - HOUR, "end": END, "alerts": 1},
                ],
                "sample": [
                    {"alert": alert, "windowEvents": 4, "explanation": explanation},
                    {
                        "alert": {**alert, "transactionId": "tx-2"},
                        "windowEvents": 9000,
                        "explanation": None,
                    },
                ],
                "diff": {
                    "added": 3,
                    "removed": 0,
                    "changed": 1,
                    "unchanged": 0,
                    "addedShown": [_entry("tx-<b>", "4", None)],
                    "removedShown": [],
                    "changedShown": [_entry("tx-9", "7", "6")],
                },
            }
        ],
        "skipped": ["entry #2 (ruleId 1 -> PAUSE) is not a rule: nothing to preview"],
        "seconds": 2.345,
        "stepSeconds": {"rules": 0.1, "read": 1.2, "decide": 1.0},
    }


def _page(**fields: object) -> str:
    data = PageData(user="ana", can_edit=True, base="/velocity")
    for name, value in fields.items():
        setattr(data, name, value)
    return render_page(data)


def test_a_preview_shows_each_rule_per_hour_its_difference_and_explained_samples() -> None:
    html = _page(preview=_preview_json(), rule_text="{}", preview_hours="2")
    shown = html.split('data-testid="preview-rule-4"')[1]
    assert 'data-alerts="4" data-in-force-alerts="1"' in shown
    assert "ruleId 4 (unsaved) COUNT() &gt; 3 over 10 min by payerId" in shown
    assert 'v2 in force (ACTIVE): <b data-testid="preview-in-force-alerts">1</b>' in shown
    hours = shown.split('data-testid="preview-per-hour"')[1].split("</table>")[0]
    assert hours.count('data-testid="preview-hour"') == 2
    assert '<td class="figure" data-testid="preview-hour-alerts">3</td>' in hours
    assert "2025-12-31 23:00:00.000Z … 2026-01-01 00:00:00.000Z" in hours
    assert 'style="width:160px"' in hours and 'style="width:53px"' in hours, "bars to scale"
    assert '<b data-testid="preview-added">3</b> added' in shown
    assert '<b data-testid="preview-changed">1</b> changed value' in shown
    assert 'data-testid="preview-added-entry" data-tx="tx-&lt;b&gt;"' in shown
    assert "<td>changed</td><td>tx-9</td>" in shown and "<td>6</td><td>7</td>" in shown
    samples = shown.split('data-testid="preview-sample"')[1:]
    assert len(samples) == 2
    assert "the 4 events of the window give 4" in samples[0]
    assert 'data-testid="explanation-verdict" class="ok"' in samples[0]
    assert "<code>payerId=&lt;p&gt;</code>" in samples[0] and "payerId=<p>" not in html
    assert "9000 events in the window" in samples[1]
    assert "2.3 s (rules 0.1 s, read 1.2 s, decide 1.0 s)" in html, "its time"
    assert "skipped: entry #2" in html
    assert 'name="hours" size="4" value="2"' in html
    assert 'formaction="/velocity/preview"' in html and 'data-testid="preview-rule"' in html


def test_without_a_version_in_force_every_alert_is_added_and_none_listed() -> None:
    shown = _preview_json()
    rule = shown["rules"][0]
    rule.update(inForce=None, inForceAlerts=0)
    html = _page(preview=shown)
    assert "no version in force: every alert is added" in html
    assert 'data-testid="preview-hour-in-force"' not in html
    assert 'data-testid="preview-added-entry"' not in html


def test_an_editor_previews_beside_validate_apply_and_shadow_and_a_viewer_has_none() -> None:
    html = _page()
    assert 'formaction="/velocity/preview"' in html and 'data-testid="preview-rule"' in html
    for change in ("validate-rule", "apply-rule", "shadow-rule"):
        assert f'data-testid="{change}"' in html
    viewer = _page(can_edit=False, user="vic")
    for control in ("preview-rule", "validate-rule", "apply-rule", "shadow-rule", "rule-json"):
        assert f'data-testid="{control}"' not in viewer
    assert "/velocity/preview" not in viewer and 'action="/velocity/rules"' not in viewer
    assert _page(preview_error="cannot <x>").count('data-testid="preview-error"') == 1
    assert 'id="preview"' not in _page(), "no preview asked for: no section"


@pytest.fixture(scope="module")
def events_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose live events table holds 1 500 events over about 25 minutes."""
    lines = tmp_path_factory.mktemp("lines")
    generate_events(
        lines,
        GenerateOptions(
            events=1500, rate=1.0, payers=20, files=1, spike_fraction=0.05,
            late_fraction=0, duplicate_fraction=0, malformed_fraction=0, seed=5,
        ),
    )  # fmt: skip
    home = tmp_path_factory.mktemp("data")
    write_live_events(sorted(lines.glob("*.jsonl")), home / "tables" / "events", 500)
    return home


def test_the_page_previews_a_candidate_in_process_and_saves_nothing(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the routes, in process, by an editor: the sample rules in force, rule 4 with a
    lower limit previewed from the form and through /api/preview (the function's figures,
    alerts added), a bad field named as Validate names it, and the rules table unchanged."""
    from fastapi.testclient import TestClient

    from velocity.settings import load_settings
    from velocity_airflow.page import access, home
    from velocity_airflow.page.app import app

    settings: Settings = load_settings(data_dir=events_dir, redis_url="redis://127.0.0.1:1/0")
    store = RuleStore(settings.table_path(RULES))
    if not store.in_force():
        store.apply(parse_rules(sample_rules_path().read_text()))
    before = store.history()
    monkeypatch.setattr(access, "settings", lambda: settings)
    monkeypatch.setattr(access, "can_edit", lambda user: True)
    monkeypatch.setattr(home, "backfill_runs", lambda settings, user: [])

    class Editor:
        def get_name(self) -> str:
            return "ed"

    # The preview's write check passed here (tests/dags/test_page_writes.py runs it).
    previewer = access.Previewer.__metadata__[0].dependency
    app.dependency_overrides.update({access.current_user: Editor, previewer: Editor})
    candidate = json.dumps(
        {
            "ruleId": 4, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
            "aggregatorFunctionType": "COUNT", "limitOperatorType": ">", "limit": 2,
            "windowMinutes": 10,
        }
    )  # fmt: skip
    expected = preview(settings, parse_rules(candidate), hours=1).to_json()
    [rule] = expected["rules"]
    assert rule["inForce"]["limit"] == 5 and rule["diff"]["added"] > 0
    try:
        client = TestClient(app)
        shown = client.post("/preview", data={"rules_json": candidate, "hours": "1"})
        assert shown.status_code == 200, shown.text
        html = shown.text
        assert (
            f'data-alerts="{rule["alerts"]}" data-in-force-alerts="{rule["inForceAlerts"]}"' in html
        )
        hours = [h["alerts"] for h in rule["perHour"]]
        assert html.count('data-testid="preview-hour"') == len(hours) == 1
        assert f'<b data-testid="preview-added">{rule["diff"]["added"]}</b> added' in html
        first = rule["diff"]["addedShown"][0]["transactionId"]
        assert f'data-testid="preview-added-entry" data-tx="{first}"' in html
        assert html.count('data-testid="preview-sample"') == min(5, rule["alerts"])
        assert 'data-testid="explanation-verdict" class="ok"' in html
        assert "candidate" in html and "(unsaved)" in html

        api = client.post("/api/preview", json={"rules": json.loads(candidate), "hours": 1})
        assert api.status_code == 200, api.text
        got = api.json()["rules"][0]
        assert (got["alerts"], got["diff"]["added"]) == (rule["alerts"], rule["diff"]["added"])
        assert got["perHour"] == rule["perHour"]
        # The same alerts sampled (a decisionTime is the moment of each preview).
        ids = [[e["alert"]["alertId"] for e in r["sample"]] for r in (got, rule)]
        assert ids[0] == ids[1] and api.json()["seconds"] > 0

        bad = client.post("/preview", data={"rules_json": candidate.replace("payerId", "cardId")})
        assert bad.status_code == 422
        assert "invalid rules, nothing previewed:" in bad.text
        assert "field &#x27;groupingKeyNames[0]&#x27;" in bad.text and "cardId" in bad.text
        assert "cardId" in bad.text.split('data-testid="rule-json">')[1], "the text is kept"
        hours_bad = client.post("/preview", data={"rules_json": candidate, "hours": "x"})
        assert hours_bad.status_code == 422 and "field &#x27;hours&#x27;" in hours_bad.text
        api_bad = client.post("/api/preview", json={"rules": candidate, "hours": 0})
        assert api_bad.status_code == 400 and "hours must be a positive" in api_bad.text
        assert "/api/preview" in app.openapi()["paths"]
    finally:
        app.dependency_overrides.clear()
    assert store.history() == before, "nothing saved"
