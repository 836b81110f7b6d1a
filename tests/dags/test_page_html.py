"""The Velocity page's HTML from plain data: what each role sees, and nothing unescaped;
the page's rule changes and reviews in process."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.builders import alert_row, append_alerts, make_rule

from velocity.analyst.alert_search import Cursor, parse_filter
from velocity.analyst.reviews import NOTE_MAX, Review, Verdict, VersionPrecision
from velocity.domain.rules import Outcome, RuleState
from velocity.settings import Settings
from velocity_airflow.page.home_html import Flash, PageData, render_page

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


class Analyst:
    """A signed-in user as the page sees one."""

    def get_name(self) -> str:
        return "ana"


def _page(**fields: object) -> str:
    data = PageData(user="ana", can_edit=True, base="/velocity", rules=RULES)
    data.rule_versions = {(r.rule_id, 1): replace(r, version=1) for r in RULES}
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
    # Each rule's outcome, set from its row.
    assert 'data-testid="outcome-1">ALERT</span>' in html
    cell = html.split('data-testid="outcome-1"')[1].split("</td>")[0]
    assert 'action="/velocity/rules/1/outcome"' in cell
    assert '<option value="ALERT" selected>ALERT</option><option value="REVIEW">' in cell
    blocking = _page(rules=[replace(RULES[0], outcome=Outcome.BLOCK)])
    assert 'data-testid="outcome-1">BLOCK</span>' in blocking
    assert '<option value="BLOCK" selected>BLOCK</option>' in blocking


def test_a_viewer_sees_the_rules_but_no_way_to_change_them() -> None:
    html = _page(can_edit=False, user="vic")
    assert 'data-testid="rule-1"' in html and 'data-testid="rule-2"' in html
    assert "/rules/" not in html
    assert 'data-testid="outcome-1">ALERT</span>' in html and "outcome-choice" not in html
    assert 'data-testid="apply-rule"' not in html
    assert "vic (read-only)" in html


def test_alert_values_are_escaped_and_link_to_their_explanation() -> None:
    html = _page(alerts=[ALERT], alert_filter=parse_filter({"rule": "1"}, None))
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;" in html and "tx-&lt;b&gt;" in html
    assert 'href="/velocity/?rule=1&amp;alert=a-1#explanation"' in html
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
    from velocity_airflow.page.rules import command_outcome

    jvm = "Picked up JAVA_TOOL_OPTIONS: -XX:+UseSerialGC\nWARNING: Using incubator modules\n"
    ok = CommandResult(["rules"], 0, "ruleId 4: version 2 PAUSE\n", jvm, None)
    assert command_outcome(ok) == (True, "ruleId 4: version 2 PAUSE")
    failed = CommandResult(["rules"], 2, "", jvm + "error: ruleId 9 is not in force\n", None)
    assert command_outcome(failed) == (False, "error: ruleId 9 is not in force")


def test_without_a_login_a_person_is_sent_to_sign_in_and_a_script_gets_401() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page.app import app

    client = TestClient(app)
    page = client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"].startswith("/api/v2/auth/login?next=%2Fplugin%2Fvelocity")
    assert client.get("/api/rules").status_code == 401
    assert client.post("/rules/1/pause").status_code == 401


def test_the_api_schema_needs_a_login_and_there_are_no_docs_pages() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page.app import app

    client = TestClient(app)
    for unserved in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(unserved).status_code == 404, unserved
    assert client.get("/api/openapi.json").status_code == 401
    assert "/api/lookup" in app.openapi()["paths"]


def test_a_change_outcome_survives_the_redirect_sealed_and_only_so() -> None:
    from velocity_airflow.page.flash import MAX_BYTES, seal, unseal

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
    # A viewer may neither change nor preview: no form posts, no words in flight.
    assert "data-progress=" not in viewer and 'method="post"' not in viewer
    assert "may read the rules but not change or preview them" in viewer


def test_every_form_that_posts_carries_the_page_s_token_and_its_script_sends_it() -> None:
    """The page's token (``PageData.csrf``) in each form that posts, in the page's meta,
    and in what the page's script posts: as the header and the form's field."""
    token = "ab" * 32
    reviewed = Review("a-1", 1, 1, Verdict.FALSE_POSITIVE, "", "ana", 1)
    html = _page(
        csrf=token,
        alerts=[ALERT],
        reviews={"a-1": reviewed},
        backfill_form={"from_time": "2026-01-01"},
    )
    posts = re.findall(r'<form[^>]*method="post".*?</form>', html, re.S)
    field = f'<input type="hidden" name="csrf_token" value="{token}">'
    # Pause/Activate, Delete and Set of each rule, Add or change rules, the backfill form,
    # the alert's review.
    assert len(posts) == 3 * len(RULES) + 3
    assert all(field in form for form in posts), [f for f in posts if field not in f]
    assert f'<meta name="csrf-token" content="{token}">' in html
    assert 'sent["X-CSRF-Token"] = token' in html and 'body.append("csrf_token", token)' in html
    assert '<meta name="csrf-token" content="&lt;x&gt;">' in _page(csrf="<x>")


def test_the_page_applies_a_change_in_process_in_the_words_of_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity.domain.rules import RuleState, StateChange
    from velocity.settings import load_settings
    from velocity_airflow.page import access, rules

    settings = load_settings(data_dir=tmp_path / "data")
    monkeypatch.setattr(access, "settings", lambda: settings)
    assert rules.apply_rules([make_rule(ruleId=1), make_rule(ruleId=2)]) == (
        True,
        "ruleId 1: version 1 ACTIVE\nruleId 2: version 1 ACTIVE",
    )
    assert rules.apply_rules([StateChange(2, RuleState.PAUSE)]) == (
        True,
        "ruleId 2: version 2 PAUSE",
    )
    assert rules.apply_rules([StateChange(2, RuleState.PAUSE)]) == (
        True,
        "ruleId 2 is PAUSE already: nothing to apply",
    )
    ok, text = rules.apply_rules([StateChange(9, RuleState.DELETE)])
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
    candidate = replace(RULES[0], version=2, state=RuleState.SHADOW)
    versions = {(1, 1): replace(RULES[0], version=1), (1, 2): candidate}
    marked = _page(precision=figures, rule_versions=versions)
    assert "shadow-version-badge" not in marked.split('data-testid="precision-1-2"')[0]
    assert 'shadow-version-badge">shadow</span>' in marked.split('data-testid="precision-1-2"')[1]
    broken = _page(precision_error="cannot read the reviews: <boom>")
    assert "cannot read the reviews: &lt;boom&gt;" in broken


def test_without_a_login_nobody_reviews() -> None:
    from fastapi.testclient import TestClient

    from velocity_airflow.page.app import app

    client = TestClient(app)
    assert client.post("/alerts/a-1/review", data={"verdict": "FALSE_POSITIVE"}).status_code == 401
    assert client.post("/api/alerts/a-1/reviews", json={"verdict": "x"}).status_code == 401
    assert client.get("/api/precision").status_code == 401
    assert client.get("/api/shadow").status_code == 401
    for action in ("promote", "discard"):
        assert client.post(f"/rules/1/{action}").status_code == 401


def test_the_page_records_a_review_from_the_alerts_table_and_refuses_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity.delta.names import ALERTS
    from velocity.delta.reader import review_store
    from velocity.errors import UsageError
    from velocity.settings import load_settings
    from velocity_airflow.page import alerts

    # No Redis here: an alert the table lacks is looked for on a stream that cannot be read.
    settings = load_settings(data_dir=tmp_path / "data", redis_url="redis://127.0.0.1:1/0")
    append_alerts(settings.table_path(ALERTS), [alert_row("a-1", (3, 2), 1_767_225_600_000)])
    review = alerts.record_review(settings, Analyst(), "a-1", "confirmed fraud", " stolen card ")
    assert (review.rule_id, review.rule_version, review.who, review.note) == (
        3,
        2,
        "ana",
        "stolen card",
    )
    assert alerts.reviewed(review) == "alert a-1: confirmed fraud (ruleId 3 v2), recorded by ana"
    for alert_id, verdict, field in [
        ("a-1", "fraud?", "verdict"),
        ("a-9", "NEEDS_REVIEW", "alertId"),
    ]:
        with pytest.raises(UsageError, match=f"field '{field}'"):
            alerts.record_review(settings, Analyst(), alert_id, verdict, "")
    assert [r.alert_id for r in review_store(settings).all()] == ["a-1"]


def _row(html: str, alert_id: str) -> str:
    return html.split(f'data-alert-id="{alert_id}"')[1].split("</tr>")[0]


def test_an_alert_row_reads_as_people_read_it_beside_its_rule_version() -> None:
    alert = {**ALERT, "key": {"beneficiaryId": "2034", "payerId": "p-4041"}, "decisionTime": 1}
    alert["decisionTime"] = 1767225600312
    row = _row(_page(alerts=[alert]), "a-1")
    # The rule's grouping order (payerId, beneficiaryId), not the record's.
    # Each field=value unbreakable: a key wraps between its fields, never inside a value.
    assert (
        '<td data-testid="alert-key"><span class="kv">payerId=p-4041</span>, '
        '<span class="kv">beneficiaryId=2034</span></td>'
    ) in row
    assert '<span data-testid="alert-version">v1</span>' in row
    assert "SUM(paymentAmount) &gt; 200000 over 1440 min by payerId, beneficiaryId" in row
    assert "<td>2026-01-01 00:00:00.312Z</td>" in row and "<td>2026-01-01 00:00:00.000Z</td>" in row
    # Drawn at a moment: when it was decided reads relative, the UTC time in its title; its
    # event time (data, copied into filters) stays absolute.
    later = _row(_page(alerts=[alert], now_ms=1767225600312 + 185_000), "a-1")
    assert (
        '<td><time class="ago" datetime="2026-01-01T00:00:00.312Z" data-ms="1767225600312" '
        'title="2026-01-01 00:00:00.312Z">3 min ago</time></td>'
    ) in later
    assert "<td>2026-01-01 00:00:00.000Z</td>" in later
    # A rule version the page does not know: the key's fields by name, always the same.
    unknown_rule = _row(_page(alerts=[{**alert, "ruleVersion": 9}]), "a-1")
    assert 'beneficiaryId=2034</span>, <span class="kv">payerId=p-4041' in unknown_rule
    assert 'data-cursor="1767225600312_a-1"' in row
    assert 'data-testid="review-form"' in row, "the review column stays beside each alert"
    unknown = _row(_page(alerts=[{**alert, "ruleVersion": 7}]), "a-1")
    assert "(version not in the rules table)" in unknown


def test_the_newest_page_is_live_with_its_filter_and_an_older_page_is_not() -> None:
    params = {"rule": "1", "key": "payerId=p 1", "from": "2026-01-01"}
    query = parse_filter(params, None)
    newest = _page(alerts=[ALERT], alert_filter=query, live_after="1767225600312-0", params=params)
    # One feed for the page, with its filters; it counts, the rows are drawn on request.
    live = newest.split('<body data-live="')[1].split('"')[0]
    assert live == "/velocity/api/page/live?rule=1&amp;key=payerId%3Dp+1&amp;from=2026-01-01"
    table = newest.split('<table data-testid="alerts"')[1].split(">")[0]
    assert 'data-after="1767225600312-0"' in table
    assert (
        'data-rows="/velocity/alerts/rows?rule=1&amp;key=payerId%3Dp+1&amp;from=2026-01-01"'
    ) in table
    assert 'data-testid="alerts-notice" hidden' in newest and 'data-testid="alerts-show"' in newest
    assert "insertAdjacentHTML" not in newest, "no row is put in the table by itself"
    assert 'data-testid="live-status"' in newest and "new EventSource" in newest
    assert 'value="payerId=p 1"' in newest, "the form keeps the filter"
    assert 'data-testid="older-alerts">' not in newest, "no older page"
    older = _page(
        alerts=[ALERT],
        alert_filter=query,
        live_after="1767225600312-0",
        alerts_before=Cursor(1767225600999, "a-9"),
        alerts_older=Cursor(1767225600312, "a-1"),
        alert_limit=10,
    )
    assert "data-after=" not in older and "Live updates show on the newest page" in older
    link = older.split(' data-testid="older-alerts">')[0].rsplit('href="', 1)[1].split('"')[0]
    assert link == (
        "/velocity/?rule=1&amp;key=payerId%3Dp+1&amp;from=2026-01-01&amp;limit=10"
        "&amp;before=1767225600312_a-1"
    )
    assert 'data-testid="newest-alerts">newest</a>' in older
    assert "older than 2026-01-01 00:00:00.999Z" in older


def test_a_filter_that_cannot_be_read_names_its_field_and_keeps_what_was_written() -> None:
    from velocity.analyst.alert_search import AlertFilter

    html = _page(
        filter_error="field 'from': 'yesterday' is not a time; write 2026-01-01 10:05 (UTC)",
        alert_filter=AlertFilter(text={"from": "yesterday"}),
    )
    assert 'data-testid="filter-error">field &#x27;from&#x27;: &#x27;yesterday&#x27;' in html
    assert 'value="yesterday" data-testid="filter-from"' in html
    assert '<table data-testid="alerts"' not in html


def test_the_heartbeat_age_reads_in_seconds_or_minutes() -> None:
    health = {"healthy": True, "verdict": "running", "reason": "ok", "heartbeatAgeMs": 308927}
    html = _page(health={**health, "lagMs": 4200, "lastBatchDurationMs": 850})
    assert "heartbeat age: <b>5 min 8 s</b>" in html
    assert "lag: <b>4.2 s</b>" in html and "last batch: <b>850 ms</b>" in html
    assert "308927" not in html


def _publish(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Publish alerts-table rows to the alert stream as the stream does (SPEC §4 records)."""
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    for row in rows:
        record = {k: v for k, v in row.items() if k != "signature_id"}
        record["key"] = dict(record["key"])
        client.xadd(settings.alert_stream, {"alert": json.dumps(record), "batch": "1"})


def _alerts_settings(data_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Rules 1 and 2 (version 1) in the rules table, and the page reading these settings."""
    from velocity.delta.names import RULES
    from velocity.delta.rule_store import RuleStore
    from velocity_airflow.page import access

    RuleStore(data_settings.table_path(RULES)).apply([make_rule(ruleId=1), make_rule(ruleId=2)])
    monkeypatch.setattr(access, "settings", lambda: data_settings)
    return data_settings


@pytest.mark.redis
def test_pages_of_alerts_come_from_the_table_and_the_stream_each_alert_once(
    data_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 alerts in the alerts table; the newest 3 only on the alert stream (not written to
    Delta yet) and the newest of the table's on both: paging lists all 15, once each."""
    from velocity.delta.names import ALERTS
    from velocity_airflow.page import alerts

    settings = _alerts_settings(data_settings, monkeypatch)
    start = int(time.time() * 1000) - 60_000
    table = [alert_row(f"d-{n:02d}", (1, 1), start + n * 1000) for n in range(12)]
    table[3] = alert_row("d-03", (2, 1), start + 3000, kind="CORRECTION")
    append_alerts(settings.table_path(ALERTS), table)
    _publish(
        settings,
        [table[-1]] + [alert_row(f"r-{n}", (1, 1), start + n * 1000) for n in (12, 13, 14)],
    )

    listed, before, pages = [], None, 0
    while pages < 10:
        params = {"limit": "5", **({"before": before.text()} if before else {})}
        found, error = alerts.search_alerts(settings, alerts.alert_search(params, {1, 2}))
        assert error is None
        listed += [a["alertId"] for a in found.alerts]
        pages += 1
        before = found.older
        if before is None:
            break
    assert listed == ["r-14", "r-13", "r-12"] + [f"d-{n:02d}" for n in range(11, -1, -1)]
    assert pages == 3
    only = alerts.alert_search({"rule": "2", "kind": "correction"}, {1, 2})
    assert [a["alertId"] for a in alerts.search_alerts(settings, only)[0].alerts] == ["d-03"]
    by_key = alerts.alert_search({"key": "p-1", "tx": "tx-r-13"}, {1, 2})
    assert [a["alertId"] for a in alerts.search_alerts(settings, by_key)[0].alerts] == ["r-13"]

    # Redis down: the table's alerts are still listed, and the page says what is missing.
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    found, error = alerts.search_alerts(down, alerts.alert_search({"limit": "3"}, None))
    assert [a["alertId"] for a in found.alerts] == ["d-11", "d-10", "d-09"]
    assert error is not None and error.startswith("cannot read the alert stream in Redis")


@pytest.mark.redis
def test_the_live_feed_sends_the_rows_of_new_alerts_that_pass_the_filter(
    data_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from velocity.redis import alert_feed, mirror
    from velocity_airflow.page import access, live
    from velocity_airflow.page.app import app

    settings = _alerts_settings(data_settings, monkeypatch)
    monkeypatch.setattr(live, "_LIVE_SECONDS", 1.5)
    monkeypatch.setattr(access, "can_edit", lambda user: True)
    app.dependency_overrides[access.current_user] = Analyst
    try:
        client = TestClient(app)
        after = alert_feed.last_entry_id(mirror.connect(settings), settings.alert_stream)
        now = int(time.time() * 1000)
        _publish(settings, [alert_row("one", (1, 1), now), alert_row("two", (2, 1), now)])
        started = time.monotonic()
        reply = client.get("/api/alerts/live", params={"rule": "2", "after": after})
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert time.monotonic() - started < 10, "the connection ends by itself"
        events = [e for e in reply.text.split("\n\n") if e.startswith("event: ")]
        alerts = [e for e in events if e.startswith("event: alert")]
        assert len(alerts) == 1, events
        lines = dict(line.split(": ", 1) for line in alerts[0].splitlines())
        sent = json.loads(lines["data"])
        assert sent["alertId"] == "two" and lines["id"] > after
        assert 'data-alert-id="two"' in sent["html"] and 'data-rule="2"' in sent["html"]
        assert 'data-testid="review-form"' in sent["html"]
        assert "payerId=p-1" in sent["html"] and "v1</span>" in sent["html"]
        assert any(e.startswith("event: health") for e in events)
        # Resuming from the alert's id (the browser's Last-Event-ID) sends nothing again.
        again = client.get(
            "/api/alerts/live", params={"rule": "2", "after": after},
            headers={"last-event-id": lines["id"]},
        )  # fmt: skip
        assert "event: alert" not in again.text
        for params, field in [({"after": "x"}, "after"), ({"after": after, "rule": "9"}, "rule")]:
            refused = client.get("/api/alerts/live", params=params)
            assert refused.status_code == 400 and f"field '{field}'" in refused.text
        listed = client.get("/api/alerts", params={"rule": "2", "limit": "1"}).json()
        assert [a["alertId"] for a in listed["alerts"]] == ["two"] and listed["older"] is None
        bad = client.get("/api/alerts", params={"from": "yesterday"})
        assert bad.status_code == 400 and "field 'from'" in bad.text
    finally:
        app.dependency_overrides.clear()


def test_backfill_runs_show_their_figures_state_and_airflow_link() -> None:
    from velocity.analyst.backfill_runs import AirflowRun, RecordedRun, backfill_runs

    recorded = RecordedRun(
        "r1", 1767225600000, 1767229200000, (5, 7), 8904, 20, 0, 1767300000000,
        1767300030000, lock_seconds=12.456, airflow_run_id="manual__<1>",
    )  # fmt: skip
    runs = backfill_runs(
        [recorded],
        [
            AirflowRun("manual__<1>", "success", {}, 1767299999000, "/dags/b/runs/manual__%3C1%3E"),
            AirflowRun("manual__2", "running", {"rule_ids": ["4"]}, 1767400000000, "/dags/x"),
        ],
    )
    html = _page(backfills=runs)
    running, done = html.split('data-testid="backfill-run" ')[1:]
    assert running.startswith('data-state="running"') and "every rule" not in running
    assert "the late and out-of-order events not yet backfilled, rules 4" in running
    assert 'data-state="success"' in done
    assert "2026-01-01 00:00:00.000Z … 2026-01-01 01:00:00.000Z" in done
    assert '<td>5, 7</td><td class="figure">8904</td><td class="figure">20</td>' in done
    assert '<td class="figure">12.46 s</td>' in done
    assert 'href="/dags/b/runs/manual__%3C1%3E" target="_top"' in done
    late = replace(recorded, late_through_batch=41, late_events=3, out_of_order_events=1598)
    assert (
        '<span data-testid="late-covered">(late events: 3 late, 1598 out of order)</span>'
        in _page(backfills=backfill_runs([late], []))
    )
    assert 'data-testid="no-backfills"' in _page(backfills=[])
    assert "cannot read the backfill runs: &lt;x&gt;" in _page(
        backfills_error="cannot read the backfill runs: <x>"
    )


def test_the_backfills_table_reads_with_and_without_the_later_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from velocity.delta.names import BACKFILLS
    from velocity.delta.reader import recorded_backfills
    from velocity.settings import load_settings

    settings = load_settings(data_dir=tmp_path / "data")
    assert recorded_backfills(settings) == []
    row = {
        "run_id": "r1", "from_ms": 1, "to_ms": 2, "rule_ids": [5], "late_through_batch": None,
        "events_evaluated": 3, "corrections": 1, "retractions": 0, "alert_ids": ["a"],
        "started_at": 10, "finished_at": 20,
    }  # fmt: skip
    schema = pa.schema(
        [
            *(pa.field(n, pa.int64()) for n in ("from_ms", "to_ms")),
            pa.field("run_id", pa.string()),
            pa.field("rule_ids", pa.list_(pa.int64())),
            pa.field("late_through_batch", pa.int64()),
            *(pa.field(n, pa.int64()) for n in ("events_evaluated", "corrections", "retractions")),
            pa.field("alert_ids", pa.list_(pa.string())),
            *(pa.field(n, pa.int64()) for n in ("started_at", "finished_at")),
        ]
    )
    path = str(settings.table_path(BACKFILLS))
    write_deltalake(path, pa.Table.from_pylist([row], schema))
    [old] = recorded_backfills(settings)
    assert (old.run_id, old.corrections, old.lock_seconds, old.airflow_run_id) == (
        "r1", 1, None, None,
    )  # fmt: skip
    newer = schema.append(pa.field("lock_seconds", pa.float64())).append(
        pa.field("airflow_run_id", pa.string())
    )
    later = {**row, "run_id": "r2", "lock_seconds": 1.5, "airflow_run_id": "manual__1"}
    write_deltalake(path, pa.Table.from_pylist([later], newer), mode="append", schema_mode="merge")
    runs = {r.run_id: r for r in recorded_backfills(settings)}
    assert (runs["r2"].lock_seconds, runs["r2"].airflow_run_id) == (1.5, "manual__1")
    assert runs["r1"].lock_seconds is None
    counted = newer.append(pa.field("late_events", pa.int64())).append(
        pa.field("out_of_order_events", pa.int64())
    )
    covered = {**later, "run_id": "r3", "late_through_batch": 9, "late_events": 0,
               "out_of_order_events": 12}  # fmt: skip
    write_deltalake(path, pa.Table.from_pylist([covered], counted), mode="append",
                    schema_mode="merge")  # fmt: skip
    runs = {r.run_id: r for r in recorded_backfills(settings)}
    assert runs["r3"].covered_text == "late events: 0 late, 12 out of order"
    assert runs["r2"].out_of_order_events is None


def _comparison(**figures: Any) -> Any:
    from velocity.analyst.shadow_compare import ShadowComparison, SideFigures
    from velocity.domain.rules import RuleState

    candidate = make_rule(ruleId=1, limit=150000).with_version(2).with_state(RuleState.SHADOW)
    return ShadowComparison(
        candidate=candidate,
        in_force=replace(RULES[0], version=1),
        since=1767225600000,
        candidate_figures=SideFigures(5, 2, 1, 1, 0),
        in_force_figures=SideFigures(3, 1, 1, 0, 0),
        both=2,
        only_candidate=3,
        only_in_force=1,
    )


def test_a_candidate_is_shown_beside_its_rule_in_force_with_its_figures() -> None:
    html = _page(shadow=[_comparison()])
    body = html.split('data-testid="shadow-1"')[1].split("</tbody>")[0]
    assert 'data-candidate-version="2" data-in-force-version="1"' in body
    assert 'data-both="2" data-only-candidate="3" data-only-in-force="1"' in body
    in_force, candidate = body.split('data-testid="shadow-1-candidate"')
    assert 'data-alerts="3" data-reviewed="1" data-confirmed="1"' in in_force
    assert "SUM(paymentAmount) &gt; 200000 over 1440 min" in in_force
    assert 'data-alerts="5" data-reviewed="2" data-confirmed="1"' in candidate
    assert 'v2 <span class="state-SHADOW">SHADOW</span>' in candidate
    assert "SUM(paymentAmount) &gt; 150000 over 1440 min" in candidate
    assert '"shadow-precision">50% <span class="muted">(1/2)</span>' in candidate
    assert "2026-01-01 00:00:00.000Z" in body, "since when"
    assert 'action="/velocity/rules/1/promote"' in body and ">Promote v2</button>" in body
    assert 'action="/velocity/rules/1/discard"' in body
    assert 'data-progress="Promoting the candidate of ruleId 1…"' in body
    assert 'data-testid="candidate-of-1"' in html, "the rule in force points to its candidate"
    assert 'data-testid="shadow-rule"' in html and 'value="shadow"' in html
    viewer = _page(shadow=[_comparison()], can_edit=False, user="vic")
    assert 'data-testid="shadow-1"' in viewer
    assert "/promote" not in viewer and "/discard" not in viewer
    assert 'data-testid="shadow-rule"' not in viewer
    assert 'data-testid="no-shadow-rules"' in _page(shadow=[])
    assert "cannot read the shadow rules: &lt;x&gt;" in _page(
        shadow_error="cannot read the shadow rules: <x>"
    )


def test_a_shadow_alert_is_marked_in_the_list_of_alerts() -> None:
    shadow = {**ALERT, "alertId": "s-1", "shadow": True, "decisionTime": 2}
    html = _page(alerts=[ALERT, shadow])
    assert 'data-testid="shadow-badge"' in _row(html, "s-1") and "data-shadow=1" in html
    assert "shadow-badge" not in _row(html, "a-1")


@pytest.mark.redis
def test_the_page_adds_compares_promotes_and_discards_a_candidate(
    data_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the page's routes, in process: Shadow from the add-rules form, the figures
    from the tables, Promote, Shadow again and Discard; each outcome in the CLI's words."""
    from fastapi.testclient import TestClient

    from velocity.delta.names import ALERTS
    from velocity.domain.rule_changes import rules_file_text
    from velocity_airflow.page import access, common, flash
    from velocity_airflow.page.app import app

    settings = _alerts_settings(data_settings, monkeypatch)
    monkeypatch.setattr(access, "can_edit", lambda user: True)
    changer = access.Editor.__metadata__[0].dependency  # the editor's check: passed here
    app.dependency_overrides.update({access.current_user: Analyst, changer: Analyst})

    def said(reply: Any) -> str:
        assert reply.status_code == 303, reply.text
        # Starlette quotes a value with "=" in it, as cookies may be.
        sealed = reply.cookies[flash.COOKIE].strip('"')
        shown = flash.unseal(sealed, common.flash_key())
        assert shown is not None
        return shown.text

    try:
        client = TestClient(app, follow_redirects=False)
        candidate = rules_file_text([make_rule(ruleId=1, limit=150000).to_json()])
        added = client.post("/rules", data={"rules_json": candidate, "intent": "shadow"})
        assert said(added) == "ruleId 1: version 2 SHADOW"
        now = int(time.time() * 1000)  # after the candidate was applied
        append_alerts(
            settings.table_path(ALERTS),
            [
                alert_row("a-1", (1, 1), now + 1, transaction_id="tx-1", shadow=False),
                alert_row("a-2", (1, 1), now + 2, transaction_id="tx-2", shadow=False),
                alert_row("s-1", (1, 2), now + 1, transaction_id="tx-1", shadow=True),
                alert_row("s-3", (1, 2), now + 3, transaction_id="tx-3", shadow=True),
            ],
        )
        [shown] = client.get("/api/shadow").json()
        assert (shown["candidateVersion"], shown["inForceVersion"]) == (2, 1)
        assert (shown["both"], shown["onlyCandidate"], shown["onlyInForce"]) == (1, 1, 1)
        assert shown["candidate"]["alerts"] == shown["inForce"]["alerts"] == 2
        rules = client.get("/api/rules").json()
        assert [(r["ruleId"], r["version"], r["ruleState"]) for r in rules] == [
            (1, 1, "ACTIVE"), (1, 2, "SHADOW"), (2, 1, "ACTIVE"),
        ]  # fmt: skip
        html = client.get("/").text
        assert html.count('<tr data-testid="rule-1"') == 1, "one row per rule in force"
        assert 'data-testid="shadow-1" data-candidate-version="2"' in html
        assert 'data-testid="shadow-badge"' in _row(html, "s-3")

        assert said(client.post("/rules/1/promote")) == "ruleId 1: version 3 ACTIVE"
        assert client.get("/api/shadow").json() == []
        rules = client.get("/api/rules").json()
        assert (rules[0]["ruleId"], rules[0]["version"], rules[0]["limit"]) == (1, 3, 150000)
        another = {"rules_json": candidate.replace("150000", "9"), "intent": "shadow"}
        assert said(client.post("/rules", data=another)) == "ruleId 1: version 4 SHADOW"
        assert said(client.post("/rules/1/discard")) == "ruleId 1: version 5 DISCARD"
        assert client.get("/api/shadow").json() == []
        assert said(client.post("/rules/1/discard")).startswith(
            "error: ruleId 1 has no shadow candidate to discard"
        )
        assert client.post("/rules/1/forget").status_code == 404
        # The outcome, set beside the rule like any change of it: a new version.
        set_block = client.post("/rules/1/outcome", data={"outcome": "block"})
        assert said(set_block) == "ruleId 1: version 6 ACTIVE"
        rules = client.get("/api/rules").json()
        assert [(r["ruleId"], r["version"], r["outcome"]) for r in rules] == [
            (1, 6, "BLOCK"), (2, 1, "ALERT"),
        ]  # fmt: skip
        assert 'data-testid="outcome-1">BLOCK</span>' in client.get("/").text
        refused = said(client.post("/rules/1/outcome", data={"outcome": "deny"}))
        assert refused.startswith("error: field 'outcome': 'deny' is not one of ALERT, REVIEW")
        control = client.post(
            "/rules", data={"rules_json": '{"ruleId": 1, "ruleState": "PAUSE"}', "intent": "shadow"}
        )
        assert control.status_code == 422 and "a shadow candidate is a whole rule" in control.text
    finally:
        app.dependency_overrides.clear()
