"""The page's "Try a payment" form: the pre-authorization check (SPEC §5a) run from the page
in process (its FastAPI app, a viewer signed in) over a real redis-server holding the state
the stream's own decide-and-commit path wrote, and the rules table (delta-rs) it names the
rule versions from. Each row must say what ``check_payment`` says; nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.test_check_decides_as_stream import accepted, stream_step
from tests.integration.test_check_docs import HISTORY, RULES, T

from velocity.domain.rules import Rule, RuleState, parse_rules
from velocity.settings import Settings
from velocity_airflow.page.home_html import PageData, render_page

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

# docs/serving/check.md's state (HISTORY, its RULES, the payment at T, 2026-01-01T00:00:00Z):
# p-18 paid 250 000 an hour before (rule 1, BLOCK, fires); b-37 was paid three times in the
# last minute (rule 4, REVIEW, fires within its cooldown). Besides: rule 5 (ALERT) does not
# fire; rule 7 looks at cash payments only, so a card payment is not evaluated by it.
MORE_RULES = """[
 {"ruleId": 5, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId", "beneficiaryId"],
  "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "MAX",
  "limitOperatorType": ">", "limit": 5000, "windowMinutes": 60},
 {"ruleId": 7, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
  "aggregatorFunctionType": "COUNT", "limitOperatorType": ">", "limit": 1, "windowMinutes": 5,
  "filter": {"paymentType": "CSH"}}
]"""
PAYMENT = {
    "transactionId": "tx-42", "eventTime": str(T), "payerId": "p-18", "beneficiaryId": "b-37",
    "paymentAmount": "120.50", "paymentType": "CRD",
}  # fmt: skip


class Viewer:
    def get_name(self) -> str:
        return "vic"


@pytest.fixture
def state(data_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The rules in the rules table and in Redis; the history committed by the stream's path;
    the page's app with a viewer signed in (who may change nothing)."""
    from velocity.delta.names import RULES as RULES_TABLE
    from velocity.delta.rule_store import RuleStore
    from velocity.redis import connection, mirror
    from velocity.redis.lock import state_lock
    from velocity_airflow.page import access
    from velocity_airflow.page.app import app

    store = RuleStore(data_settings.table_path(RULES_TABLE))
    store.apply(parse_rules(RULES) + parse_rules(MORE_RULES))
    rules = [r for r in store.history() if r.state is RuleState.ACTIVE]
    assert len(rules) == 4 and all(isinstance(r, Rule) for r in rules)
    writer = connection.connect(data_settings)
    connection.load_functions(writer)
    mirror.publish_rules(writer, data_settings.redis_keys, rules, data_settings.bucket_width_ms)
    with state_lock(writer, data_settings, "page check test") as lease:
        stream_step(data_settings, rules, lease.token, 0, accepted(HISTORY))
    monkeypatch.setattr(access, "settings", lambda: data_settings)
    monkeypatch.setattr(access, "can_edit", lambda user: False)
    app.dependency_overrides[access.current_user] = Viewer
    try:
        yield data_settings
    finally:
        app.dependency_overrides.clear()


def client() -> Any:
    from fastapi.testclient import TestClient

    from velocity_airflow.page.app import app

    return TestClient(app, follow_redirects=False)


def redis_contents(settings: Settings) -> dict[str, bytes]:
    """Every key of the server and its DUMP (value and type), to compare before and after."""
    import redis

    raw = redis.Redis.from_url(settings.redis_url)
    return {key.decode(): raw.dump(key) for key in raw.scan_iter(count=1000)}  # type: ignore[misc]


def rows(html: str) -> dict[int, str]:
    found = {}
    for part in html.split('<tr data-testid="check-rule" data-rule-id="')[1:]:
        rule_id, _, rest = part.partition('"')
        found[int(rule_id)] = rest.split("</tr>")[0]
    return found


def cell(row: str, testid: str) -> str:
    return row.split(f'data-testid="{testid}"')[1].split(">", 1)[1].split("</td>")[0]


def test_a_viewer_checks_a_payment_and_each_rule_reads_as_the_check_answers(
    state: Settings,
) -> None:
    from velocity.redis import connection
    from velocity.redis.check import check_payment

    page = client()
    form = page.get("/check")
    assert form.status_code == 200
    assert 'name="transactionId" id="f-transactionId" size="40" value="try-' in form.text
    assert 'data-testid="check-decision"' not in form.text, "nothing checked yet"

    before = redis_contents(state)
    shown = page.get("/check", params={**PAYMENT, "check": "1"})
    assert shown.status_code == 200, shown.text
    answer = page.get("/api/check", params=PAYMENT).json()
    assert redis_contents(state) == before, "a check writes nothing"

    payment = {**PAYMENT, "eventTime": T}
    direct = check_payment(connection.connect(state), state.redis_keys, payment)
    assert {k: v for k, v in answer.items() if k != "rules"} == {
        k: v for k, v in direct.items() if k != "rules"
    }
    assert [{k: v for k, v in r.items() if k != "working"} for r in answer["rules"]] == direct[
        "rules"
    ]
    assert direct["decision"] == "BLOCK"
    assert 'data-decision="BLOCK">BLOCK</p>' in shown.text
    assert "2 of 3 rules evaluated fire" in shown.text

    by_rule = rows(shown.text)
    assert sorted(by_rule) == [r["ruleId"] for r in direct["rules"]] == [1, 4, 5]
    for rule in direct["rules"]:
        row = by_rule[rule["ruleId"]]
        assert f"ruleId {rule['ruleId']} v{rule['ruleVersion']}" in row
        assert f"outcome-{rule['outcome']}" in row
        assert f'data-fired="{str(rule["fired"]).lower()}"' in row
        assert f'data-value="{rule["aggregateValue"]}"' in row
        assert rule["limit"] in cell(row, "check-limit").replace(",", "")
        assert cell(row, "check-notified") == {True: "yes", False: "no (cooldown)"}.get(
            rule.get("notified"), ""
        )
    working = {r["ruleId"]: r["working"] for r in answer["rules"]}
    assert working == {
        1: "SUM(paymentAmount) over 1 d by payerId=p-18 = 250120.5 (the payment's 120.5 "
        "included) > 200000 → fires: BLOCK",
        4: "COUNT() over 1 min by beneficiaryId=b-37 = 4 (the payment included) >= 3 → fires: "
        "REVIEW; its alert would be suppressed: this key alerted within its 10-minute cooldown",
        5: "MAX(paymentAmount) over 1 h by payerId=p-18, beneficiaryId=b-37 = 120.5 (the "
        "payment's 120.5 included), not > 5000 → does not fire",
    }
    for rule_id, words in working.items():
        assert cell(by_rule[rule_id], "check-working") == words.replace("'", "&#x27;").replace(
            ">", "&gt;"
        )
    assert "2025-12-31 00:00:00.000Z … 2026-01-01 00:00:00.000Z" in by_rule[1], "the window"
    assert "250,120.5" in by_rule[1]
    assert 'payerId=p-18</span>, <span class="kv">beneficiaryId=b-37' in by_rule[5], "rule order"
    assert "state as of no committed micro-batch" in shown.text, "no stream progress written"
    assert 'value="p-18"' in shown.text and "<option selected>CRD</option>" in shown.text


def test_a_bad_field_is_named_beside_it_and_nothing_is_checked(state: Settings) -> None:
    page = client()
    before = redis_contents(state)
    for field, value, words in [
        ("paymentAmount", "12,50", "is not a decimal number"),
        ("eventTime", "yesterday", "is not a time"),
        ("payerId", "", "is missing"),
    ]:
        shown = page.get("/check", params={**PAYMENT, field: value, "check": "1"})
        assert shown.status_code == 422, field
        said = shown.text.split('data-testid="field-error" data-field="')[1:]
        assert len(said) == 1 and said[0].startswith(f'{field}">'), (field, said)
        assert words in said[0].split("</span>")[0], (field, said[0])
        assert 'data-testid="check-decision"' not in shown.text
        refused = page.get("/api/check", params={**PAYMENT, field: value})
        assert refused.status_code == 400
        assert refused.json()["detail"].startswith(f"field '{field}':"), refused.json()
    assert redis_contents(state) == before


def test_without_rules_in_redis_the_page_says_no_check_is_possible(state: Settings) -> None:
    import redis

    redis.Redis.from_url(state.redis_url).delete(state.redis_keys.check_rules)
    page = client()
    shown = page.get("/check", params={**PAYMENT, "check": "1"})
    assert shown.status_code == 503
    banner = shown.text.split('data-testid="check-unavailable">')[1].split("</div>")[0]
    assert banner.startswith("No check possible now:") and "holds no rules" in banner, banner
    assert 'data-testid="check-decision"' not in shown.text, "never a silent ALLOW"
    assert page.get("/api/check", params=PAYMENT).status_code == 503


def test_the_check_signs_in_as_the_read_only_user(
    state: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity_airflow.page import access

    wrong = state.model_copy(update={"redis_reader_password": "not-the-readers"})
    monkeypatch.setattr(access, "settings", lambda: wrong)
    shown = client().get("/check", params={**PAYMENT, "check": "1"})
    assert shown.status_code == 503
    banner = shown.text.split('data-testid="check-unavailable">')[1].split("</div>")[0]
    assert "Redis refused the read-only user velocity-reader" in banner, banner


def test_the_check_is_a_read_any_signed_in_user_may_run_and_the_page_links_to_it() -> None:
    from fastapi.routing import APIRoute

    from velocity_airflow.page import access
    from velocity_airflow.page.app import app

    routes = {r.path: r for r in app.routes if isinstance(r, APIRoute)}
    assert routes["/check"].methods == routes["/api/check"].methods == {"GET"}
    # A read: no write check, so a viewer runs it.
    checks = {check.dependency for check in access.WRITE_CHECKS}
    for path in ("/check", "/api/check"):
        assert not {d.call for d in routes[path].dependant.dependencies} & checks
    html = render_page(PageData(user="vic", can_edit=False, base="/velocity"))
    assert '<a href="check" data-testid="nav-check">Try a payment</a>' in html
    anonymous = client()
    assert anonymous.get("/check").status_code == 401
    assert anonymous.get("/api/check", params=PAYMENT).status_code == 401


def test_the_answer_reads_its_freshness_and_escapes_what_the_payment_brought() -> None:
    from velocity_airflow.page.check_html import CheckView, render_check

    rule = {
        "ruleId": 4, "ruleVersion": 2, "outcome": "REVIEW", "key": {"beneficiaryId": "<b>"},
        "fired": True, "aggregateValue": "1234567.5", "limitOperatorType": ">=",
        "limit": "1000000", "windowStart": T - 60_000, "windowEnd": T, "notified": True,
        "working": "SUM(paymentAmount) … by beneficiaryId=<b> …",
    }  # fmt: skip
    view = CheckView(
        base="/velocity",
        user="vic",
        now_ms=T + 3_000,
        form={"payerId": '"><script>'},
        answer={
            "decision": "REVIEW",
            "rules": [rule],
            "stateAsOf": {"eventTime": T - 400, "committedAt": T - 2_000, "batch": 8812},
        },
        event_time=T,
    )
    html = render_check(view)
    state = html.split('data-testid="check-state-as-of">')[1].split("</p>")[0]
    assert state.startswith("state as of 2025-12-31 23:59:58.000Z (<time")
    assert ">5 s ago</time>), batch 8812" in state
    assert "the newest payment it has seen is of 2025-12-31 23:59:59.600Z" in state
    assert "1 of 1 rules evaluated fire. Payment at 2026-01-01 00:00:00.000Z." in html
    row = rows(html)[4]
    assert "1,234,567.5" in row and "<code>&gt;= 1,000,000</code>" in row
    assert cell(row, "check-notified") == "yes"
    assert "<b>" not in html.replace("<b>×", "") and "&lt;b&gt;" in row
    assert 'value="&quot;&gt;&lt;script&gt;"' in html, "the form's values escaped"
    assert html.count("<script>") == 2, "the document's own two scripts, no other"
