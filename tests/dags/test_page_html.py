"""The Velocity page's HTML from plain data: what each role sees, and nothing unescaped;
the page's rule changes and reviews in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.builders import alert_row, append_alerts, make_rule

from velocity.reviews import NOTE_MAX, Review, Verdict, VersionPrecision
from velocity_airflow.page_html import Flash, PageData, render_page

pytestmark = pytest.mark.timeout(120)

RULES = [make_rule(ruleId=1), make_rule(ruleId=2, ruleState="PAUSE")]
ALERT = {
    "alertId": "a-1",
    "kind": "ALERT",
    "ruleId": 1,
    "ruleVersion": 1,
    "transactionId": "tx-<b>",
    "key": {"payerId": "<script>alert(1)</script>", "beneficiaryId": "b"},
    "eventTime": 1767225600000,
    "aggregatorFunctionType": "SUM",
    "aggregateValue": "250000",
    "limitOperatorType": ">",
    "limit": "200000",
    "windowStart": 1767139200000,
    "windowEnd": 1767225600000,
}


def _page(**fields: object) -> str:
    data = PageData(user="ana", can_edit=True, base="/velocity", rules=RULES)
    for name, value in fields.items():
        setattr(data, name, value)
    return render_page(data)


def test_an_editor_may_pause_an_active_rule_and_activate_a_paused_one() -> None:
    html = _page()
    assert 'action="/velocity/rules/1/pause"' in html
    assert 'action="/velocity/rules/2/activate"' in html
    assert 'action="/velocity/rules/2/pause"' not in html
    assert html.count('/delete"') == 2
    assert 'data-testid="apply-rule"' in html
    assert "SUM(paymentAmount) &gt; 200000 over 1440 min by payerId, beneficiaryId" in html


def test_a_viewer_sees_the_rules_but_no_way_to_change_them() -> None:
    html = _page(can_edit=False, user="vic")
    assert 'data-testid="rule-1"' in html and 'data-testid="rule-2"' in html
    assert "/rules/" not in html
    assert 'data-testid="apply-rule"' not in html
    assert "vic (read-only)" in html


def test_alert_values_are_escaped_and_link_to_their_explanation() -> None:
    html = _page(alerts=[ALERT], alert_rule=1)
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;" in html and "tx-&lt;b&gt;" in html
    assert 'href="/velocity/?rule=1&alert=a-1#explanation"' in html
    assert '<option value="1" selected>' in html


def test_an_explanation_shows_its_events_the_sum_and_the_verdict() -> None:
    explanation = {
        "alert": ALERT,
        "eventCount": 2,
        "events": [
            {"transactionId": "t1", "eventTime": 1767225500000, "value": "200000"},
            {"transactionId": "t2", "eventTime": 1767225600000, "value": "50000"},
        ],
        "arithmetic": "200000 + 50000 = 250000",
        "agrees": True,
        "verdict": "the 2 events of the window give 250000, the alert's value",
    }
    html = _page(explanation=explanation)
    assert "200000 + 50000 = 250000" in html
    assert 'data-testid="explanation-verdict" class="ok"' in html
    assert html.count("<tr><td>2025-12-31 23:58:20") == html.count("<tr><td>2026-01-01") == 1


def test_a_section_that_cannot_be_read_says_why_and_the_rest_still_shows() -> None:
    html = _page(alerts_error="cannot read the alerts from Redis: Connection refused")
    assert "Connection refused" in html
    assert 'data-testid="rule-1"' in html
    flash = _page(flash=Flash(False, "invalid rules, nothing applied:\n  rule #1: <x>"))
    assert 'class="flash bad"' in flash and "rule #1: &lt;x&gt;" in flash


def test_a_command_outcome_is_its_output_or_its_errors_without_jvm_chatter() -> None:
    from velocity_airflow.hooks import CommandResult
    from velocity_airflow.page import _command_outcome

    jvm = "Picked up JAVA_TOOL_OPTIONS: -XX:+UseSerialGC\nWARNING: Using incubator modules\n"
    ok = CommandResult(["rules"], 0, "ruleId 4: version 2 PAUSE\n", jvm, None)
    assert _command_outcome(ok) == (True, "ruleId 4: version 2 PAUSE")
    failed = CommandResult(["rules"], 2, "", jvm + "error: ruleId 9 is not in force\n", None)
    assert _command_outcome(failed) == (False, "error: ruleId 9 is not in force")


def test_without_a_login_a_person_is_sent_to_sign_in_and_a_script_gets_401() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page import app

    client = TestClient(app)
    page = client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"].startswith("/api/v2/auth/login?next=%2Fplugin%2Fvelocity")
    assert client.get("/api/rules").status_code == 401
    assert client.post("/rules/1/pause").status_code == 401


def test_the_api_schema_needs_a_login_and_there_are_no_docs_pages() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page import app

    client = TestClient(app)
    for unserved in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(unserved).status_code == 404, unserved
    assert client.get("/api/openapi.json").status_code == 401
    assert "/api/lookup" in app.openapi()["paths"]


def test_a_change_outcome_survives_the_redirect_sealed_and_only_so() -> None:
    from velocity_airflow.flash import MAX_BYTES, seal, unseal

    key, other = b"k" * 32, b"o" * 32
    said = Flash(False, "invalid rules, nothing applied:\n  ruleId: ≥ 1 — «é»")
    assert unseal(seal(said, key), key) == said
    assert unseal(seal(said, key), other) is None  # another deployment's, or forged
    body, _, signature = seal(said, key).rpartition(".")
    forged = seal(Flash(True, "ruleId 4: version 2 ACTIVE"), other).rpartition(".")[0]
    assert unseal(f"{forged}.{signature}", key) is None
    for junk in ("", ".", "x", "a.b", f"{body}!.{signature}"):
        assert unseal(junk, key) is None
    long = seal(Flash(True, "é" * 5000), key)
    assert len(long) < 4000  # fits a cookie
    text = unseal(long, key).text  # type: ignore[union-attr]
    assert text.endswith("…") and len(text.encode()) <= MAX_BYTES


def test_each_change_form_says_what_is_in_flight_and_a_viewer_has_none() -> None:
    html = _page()
    assert 'data-progress="Pausing ruleId 1…"' in html
    assert 'data-progress="Activating ruleId 2…"' in html
    assert html.count('data-progress="Deleting ruleId') == 2
    assert 'data-progress="Applying the rules…"' in html
    assert 'data-testid="change-progress"' in html and 'id="change-progress"' in html
    assert 'addEventListener("submit"' in html
    viewer = _page(can_edit=False, user="vic")
    assert "data-progress=" not in viewer and 'data-testid="change-progress"' not in viewer


def test_the_page_applies_a_change_in_process_in_the_words_of_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity.rules import RuleState, StateChange
    from velocity.settings import load_settings
    from velocity_airflow import page

    settings = load_settings(data_dir=tmp_path / "data")
    monkeypatch.setattr(page, "_settings", lambda: settings)
    assert page._apply_rules([make_rule(ruleId=1), make_rule(ruleId=2)]) == (
        True,
        "ruleId 1: version 1 ACTIVE\nruleId 2: version 1 ACTIVE",
    )
    assert page._apply_rules([StateChange(2, RuleState.PAUSE)]) == (
        True,
        "ruleId 2: version 2 PAUSE",
    )
    assert page._apply_rules([StateChange(2, RuleState.PAUSE)]) == (
        True,
        "ruleId 2 is PAUSE already: nothing to apply",
    )
    ok, text = page._apply_rules([StateChange(9, RuleState.DELETE)])
    assert not ok and text.startswith("error: ruleId 9 is not in force")


def test_an_editor_reviews_an_alert_beside_it_and_sees_its_latest_verdict() -> None:
    review = Review("a-1", 1, 1, Verdict.FALSE_POSITIVE, 'regular <payee> "x"', "<bo>", 7)
    retraction = {**ALERT, "alertId": "r-1", "kind": "RETRACTION"}
    html = _page(alerts=[ALERT, retraction], reviews={"a-1": review})
    assert html.count('data-testid="review-form"') == 1, "a RETRACTION is not reviewed"
    assert 'action="/velocity/alerts/a-1/review"' in html
    assert 'data-progress="Recording the review of alert a-1…"' in html
    assert '<option value="FALSE_POSITIVE" selected>false positive</option>' in html
    assert "verdict…" not in html, "a reviewed alert's form starts from its verdict"
    fresh = _page(alerts=[ALERT])
    assert '<select name="verdict" required' in fresh
    assert '<option value="" disabled selected>verdict…</option>' in fresh, "none by default"
    assert '<option value="CONFIRMED_FRAUD">confirmed fraud</option>' in html
    assert f'maxlength="{NOTE_MAX}"' in html
    assert 'class="verdict-FALSE_POSITIVE" title="regular &lt;payee&gt; &quot;x&quot;"' in html
    assert "by &lt;bo&gt;" in html and "<bo>" not in html


def test_a_viewer_sees_verdicts_but_no_review_form() -> None:
    review = Review("a-1", 1, 1, Verdict.CONFIRMED_FRAUD, "", "ana", 7)
    html = _page(can_edit=False, alerts=[ALERT], reviews={"a-1": review})
    assert "confirmed fraud</span>" in html
    assert "review-form" not in html and "/review" not in html


def test_precision_per_rule_version_and_a_version_without_verdicts() -> None:
    figures = [
        VersionPrecision(1, 1, 0, 4, 3, 2, 1, 0),
        VersionPrecision(1, 2, 5, 9, 1, 0, 0, 1),
    ]
    html = _page(precision=figures)
    row = html.split('data-testid="precision-1-1"')[1].split("</tr>")[0]
    assert 'data-reviewed="3" data-confirmed="2" data-false-positives="1"' in row
    assert '<td class="figure" data-testid="precision-value">67% ' in row and "(2/3)" in row
    newer = html.split('data-testid="precision-1-2"')[1].split("</tr>")[0]
    assert '<td class="figure">5</td><td class="figure">9</td>' in newer
    assert 'data-testid="precision-value"><span class="muted">—</span>' in newer
    assert 'data-testid="no-precision"' in _page(precision=[])
    broken = _page(precision_error="cannot read the reviews: <boom>")
    assert "cannot read the reviews: &lt;boom&gt;" in broken


def test_without_a_login_nobody_reviews() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page import app

    client = TestClient(app)
    assert client.post("/alerts/a-1/review", data={"verdict": "FALSE_POSITIVE"}).status_code == 401
    assert client.post("/api/alerts/a-1/reviews", json={"verdict": "x"}).status_code == 401
    assert client.get("/api/precision").status_code == 401


def test_the_page_records_a_review_from_the_alerts_table_and_refuses_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity.delta.names import ALERTS
    from velocity.delta.reader import review_store
    from velocity.errors import UsageError
    from velocity.settings import load_settings
    from velocity_airflow import page

    class Analyst:
        def get_name(self) -> str:
            return "ana"

    # No Redis here: an alert the table lacks is looked for on a stream that cannot be read.
    settings = load_settings(data_dir=tmp_path / "data", redis_url="redis://127.0.0.1:1/0")
    append_alerts(settings.table_path(ALERTS), [alert_row("a-1", (3, 2), 1_767_225_600_000)])
    review = page._record_review(settings, Analyst(), "a-1", "confirmed fraud", " stolen card ")
    assert (review.rule_id, review.rule_version, review.who, review.note) == (
        3,
        2,
        "ana",
        "stolen card",
    )
    assert page._reviewed(review) == "alert a-1: confirmed fraud (ruleId 3 v2), recorded by ana"
    for alert_id, verdict, field in [
        ("a-1", "fraud?", "verdict"),
        ("a-9", "NEEDS_REVIEW", "alertId"),
    ]:
        with pytest.raises(UsageError, match=f"field '{field}'"):
            page._record_review(settings, Analyst(), alert_id, verdict, "")
    assert [r.alert_id for r in review_store(settings).all()] == ["a-1"]
