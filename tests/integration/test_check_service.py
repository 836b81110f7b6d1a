"""`velocity serve`, the HTTP check service, as a service in another language meets it: the
real command on a loopback port, signed in to the real redis-server as the read-only user,
on the state of test_check_docs (rule 1 BLOCK on p-18's day, rule 4 REVIEW on b-37's
minute, in its cooldown). One server for the module; `velocity up`'s background service
once more at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import free_check_port, poll_until
from tests.integration.test_check_decides_as_stream import accepted, stream_step
from tests.integration.test_check_docs import RULES, T
from velocity.domain.decimals import dumps_json
from velocity.domain.rules import Rule, parse_rules
from velocity.redis import connection, mirror
from velocity.redis.check import check_payment
from velocity.redis.lock import state_lock
from velocity.serving.service import service_down, service_up, token_path
from velocity.settings import PROJECT_ROOT, Settings, load_settings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

VELOCITY = str(Path(sys.executable).parent / "velocity")


def payment(payer: str, beneficiary: str, amount: object, **more: object) -> dict[str, Any]:
    sent = {"transactionId": f"tx-{payer}-{beneficiary}", "eventTime": T, "payerId": payer,
            "beneficiaryId": beneficiary, "paymentAmount": amount}  # fmt: skip
    return {**sent, "paymentType": "CRD", **more}


@dataclass
class Service:
    url: str
    token: str
    settings: Settings
    writer: redis.Redis
    process: subprocess.Popen[str]
    env: dict[str, str]


def call(
    url: str, *, body: bytes | None = None, token: str | None = None, header: str | None = None
) -> tuple[int, dict[str, str], str]:
    """(status, headers, body text) of one request; POST when there is a body."""
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if token is not None or header is not None:
        request.add_header("Authorization", header or f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


def check(service: Service, body: bytes, token: str | None = "") -> tuple[int, dict[str, Any]]:
    status, _, text = call(f"{service.url}/check", body=body,
                           token=service.token if token == "" else token)  # fmt: skip
    return status, json.loads(text)


@pytest.fixture(scope="module")
def service(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    writer = redis.Redis.from_url(redis_url, decode_responses=True)
    writer.flushall()
    connection.load_functions(writer)
    settings = load_settings(data_dir=tmp_path_factory.mktemp("serve") / "data",
                             redis_url=redis_url, check_port=free_check_port())  # fmt: skip
    rules = [r.with_version(v) for r, v in zip(parse_rules(RULES), (3, 1), strict=True)]
    assert all(isinstance(r, Rule) for r in rules)
    events = [payment("p-18", "b-1", 250000)] + [
        {**payment("p-20", "b-37", 10), "transactionId": f"small-{n}",
         "eventTime": T - 50_000 + n * 10_000} for n in range(3)
    ]  # fmt: skip
    writer = connection.connect(settings)
    mirror.publish_rules(writer, settings.redis_keys, rules, settings.bucket_width_ms)  # type: ignore[arg-type]
    with state_lock(writer, settings, "serve test") as lease:
        stream_step(settings, rules, lease.token, 0, accepted(events))  # type: ignore[arg-type]
    # The stream's progress as its commit records it (stream_step leaves it to the caller).
    progress = {"newest": T - 30_000, "at": T + 400, "batch": 0}
    writer.hset(settings.redis_keys.stream_progress, mapping=progress)  # type: ignore[arg-type]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VELOCITY_")}
    env.update(VELOCITY_DATA_DIR=str(settings.data_dir), VELOCITY_REDIS_URL=redis_url,
               VELOCITY_CHECK_PORT=str(settings.check_port))  # fmt: skip
    process = subprocess.Popen([VELOCITY, "serve"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{settings.check_port}"
    try:
        poll_until("check service", lambda: process.poll() is not None or _answers(url), 30)
        assert process.poll() is None, process.communicate()[0]
        # No VELOCITY_CHECK_TOKEN: one drawn into the data dir, readable by its owner only.
        path = token_path(settings)
        assert path.stat().st_mode & 0o777 == 0o600
        token = path.read_text().strip()
        assert len(token) >= 40
        yield Service(url, token, settings, writer, process, env)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=20)[0]
    # It said where it serves and where its token is, and stopped on SIGTERM, exit 0.
    assert f"check service on {url}" in output and f"bearer token: in {path}" in output, output
    assert process.returncode == 0 and "check service stopped" in output, output


def _answers(url: str) -> bool:
    try:
        return call(f"{url}/healthz")[0] in (200, 503)
    except OSError:
        return False


def test_a_check_over_http_answers_as_check_payment(service: Service) -> None:
    keys = service.settings.redis_keys
    decisions = []
    for sent in (
        payment("p-18", "b-1", Decimal("120.50")),  # rule 1: 250 120.50 > 200 000
        payment("p-20", "b-37", 10),  # rule 4: the fourth of b-37's minute
        payment("p-99", "b-2", "5", ip="10.0.0.1"),  # nothing fires
    ):
        status, answer = check(service, dumps_json(sent).encode())
        assert status == 200, answer
        assert answer == check_payment(service.writer, keys, sent)
        decisions.append(answer["decision"])
    assert decisions == ["BLOCK", "REVIEW", "ALLOW"]
    # The amount read as an exact decimal, not a float.
    body = b'{"transactionId": "x", "eventTime": %d, "payerId": "p-18", "beneficiaryId": "b-5",' % T
    status, answer = check(service, body + b' "paymentAmount": 0.10000001, "paymentType": "CSH"}')
    assert status == 200 and answer["rules"][0]["aggregateValue"] == "250000.10000001", answer


def test_a_check_without_the_token_is_refused(service: Service) -> None:
    body = dumps_json(payment("p-18", "b-1", 1)).encode()
    for token, header in ((None, None), ("wrong-" + service.token, None),
                          (None, f"Basic {service.token}"), (None, "Bearer")):  # fmt: skip
        status, headers, text = call(f"{service.url}/check", body=body, token=token,
                                     header=header)  # fmt: skip
        assert status == 401, text
        assert headers["www-authenticate"].startswith("Bearer") and "bearer token" in text
    # Any route but the probes' needs it (a new route cannot forget it).
    assert call(f"{service.url}/anything")[0] == 401
    assert call(f"{service.url}/anything", token=service.token)[0] == 404
    # The scheme in any case.
    status, _, _ = call(f"{service.url}/check", body=body, header=f"bearer {service.token}")
    assert status == 200


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        (b"{not json", "(payment)", "is not one JSON object"),
        (b"\xff\xfe", "(payment)", "is not one JSON object"),
        (b"[1, 2]", "(payment)", ""),
        (dumps_json({k: v for k, v in payment("p", "b", 1).items() if k != "payerId"}).encode(),
         "payerId", "missing"),
        (dumps_json(payment("p", "b", "ten")).encode(), "paymentAmount", "ten"),
        (dumps_json(payment("p", "b", 1, paymentType="WIRE")).encode(), "paymentType", "WIRE"),
    ],
)  # fmt: skip
def test_a_malformed_payment_is_refused_naming_the_field(
    service: Service, body: bytes, field: str, says: str
) -> None:
    status, answer = check(service, body)
    assert status == 400, answer
    assert answer["field"] == field and says in answer["error"], answer


def test_a_body_too_large_is_refused(service: Service) -> None:
    status, answer = check(service, b'{"pad": "' + b"x" * 70_000 + b'"}')
    assert status == 413 and answer["field"] == "(payment)", answer


def test_healthz_answers_the_freshness_without_a_token(service: Service) -> None:
    status, _, text = call(f"{service.url}/healthz")
    assert status == 200, text
    health = json.loads(text)
    sent = payment("p-99", "b-2", 5)
    assert health == {"status": "ok",
                      "stateAsOf": check_payment(service.writer, service.settings.redis_keys,
                                                 sent)["stateAsOf"]}  # fmt: skip
    assert health["stateAsOf"] == {"eventTime": T - 30_000, "committedAt": T + 400, "batch": 0}


def samples(service: Service) -> dict[str, float]:
    status, headers, text = call(f"{service.url}/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain"), text
    return {
        match[1]: float(match[2])
        for match in re.finditer(r"^(velocity_check\S*) (\S+)$", text, re.MULTILINE)
    }


def test_the_metrics_count_the_checks(service: Service) -> None:
    before = samples(service)
    for sent in (payment("p-18", "b-1", 1), payment("p-18", "b-1", 2), payment("p-99", "b-2", 3)):
        assert check(service, dumps_json(sent).encode())[0] == 200
    assert check(service, b"{")[0] == 400
    assert check(service, dumps_json(payment("p", "b", 1)).encode(), token="nope")[0] == 401
    after = samples(service)

    def grew(name: str) -> float:
        return after[name] - before[name]

    assert grew('velocity_checks_total{decision="BLOCK"}') == 2
    assert grew('velocity_checks_total{decision="ALLOW"}') == 1
    assert grew('velocity_checks_total{decision="REVIEW"}') == 0
    assert grew('velocity_check_errors_total{reason="bad_request"}') == 1
    assert grew('velocity_check_errors_total{reason="unauthorized"}') == 1
    assert grew("velocity_check_seconds_count") == 3
    assert grew('velocity_check_seconds_bucket{le="+Inf"}') == 3
    assert 0 < grew("velocity_check_seconds_sum") < 3


def test_without_rules_in_redis_a_check_is_503_never_allow(service: Service) -> None:
    keys = service.settings.redis_keys
    saved = service.writer.hgetall(keys.check_rules)
    service.writer.delete(keys.check_rules)
    try:
        status, answer = check(service, dumps_json(payment("p-99", "b-2", 5)).encode())
        assert status == 503 and "holds no rules" in answer["error"], answer
        status, _, text = call(f"{service.url}/healthz")
        assert status == 503 and json.loads(text)["status"] == "unavailable", text
    finally:
        service.writer.hset(keys.check_rules, mapping=saved)
    assert samples(service)['velocity_check_errors_total{reason="unavailable"}'] >= 1


def test_a_second_serve_on_a_taken_port_exits_2_naming_the_setting(service: Service) -> None:
    done = subprocess.run([VELOCITY, "serve"], env=service.env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "VELOCITY_CHECK_PORT" in done.stderr and str(service.settings.check_port) in done.stderr


def test_up_starts_the_service_in_the_background_and_down_stops_it(service: Service) -> None:
    """What `velocity up` and `velocity down` call, on another port, with a token set."""
    settings = service.settings.model_copy(
        update={"check_port": free_check_port(), "check_token": "a-token-of-sixteen+"}
    )
    url = f"http://127.0.0.1:{settings.check_port}"
    try:
        started = service_up(settings)
        assert started is not None and started.started and started.token_file is None
        again = service_up(settings)
        assert again is not None and not again.started and again.pid == started.pid
        status, _, text = call(f"{url}/check", body=dumps_json(payment("p-18", "b-1", 1)).encode(),
                               token="a-token-of-sixteen+")  # fmt: skip
        assert status == 200 and json.loads(text)["decision"] == "BLOCK", text
    finally:
        stopped = service_down(settings)
    assert stopped and not service_down(settings)
    assert not _answers(url)
    assert service_up(settings.model_copy(update={"check_port": 0})) is None


def test_the_pages_curl_example_answers_as_the_page_shows(service: Service) -> None:
    """docs/serving/check.md's curl call, run as written but for the port and the data dir."""
    page = (PROJECT_ROOT / "docs" / "serving" / "check.md").read_text()
    (script,) = re.findall(r"^```shell\n(.*?)^```$", page, re.M | re.S)
    script = script.replace(":9394", f":{service.settings.check_port}").replace(
        "data/serve/check-token", str(token_path(service.settings))
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          check=True)  # fmt: skip
    shown = json.loads(re.search(r"^```json\n(.*?)^```$", page, re.M | re.S)[1])  # type: ignore[index]
    answer = json.loads(done.stdout)
    assert answer["decision"] == shown["decision"] == "BLOCK"
    assert answer["rules"] == shown["rules"]
