"""docs/serving/check.md's examples, run as written against the real redis-server: the
redis-cli call, the Python service and the Java (Jedis) class, each on the state the page's
answer shows (rule 1 BLOCK on p-18's day, rule 4 REVIEW on b-37's minute, in its cooldown).
Only the port is the session server's instead of `velocity up`'s 6391."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.integration.test_check_decides_as_stream import accepted, stream_step
from velocity.domain.rules import Rule, parse_rules
from velocity.redis import connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import PROJECT_ROOT, load_settings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

PAGE = PROJECT_ROOT / "docs" / "serving" / "check.md"
T = 1_767_225_600_000  # the page's payment's eventTime
RULES = """[
 {"ruleId": 1, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"], "outcome": "BLOCK",
  "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "SUM",
  "limitOperatorType": ">", "limit": 200000, "windowMinutes": 1440},
 {"ruleId": 4, "ruleState": "ACTIVE", "groupingKeyNames": ["beneficiaryId"], "outcome": "REVIEW",
  "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 3, "windowMinutes": 1,
  "cooldownMinutes": 10}
]"""

# p-18 paid 250 000 an hour before; b-37 was paid three times in the last minute.
HISTORY: list[dict[str, object]] = [
    {"transactionId": "big", "eventTime": T - 3_600_000, "payerId": "p-18",
     "beneficiaryId": "b-1", "paymentAmount": 250000, "paymentType": "CRD"},
] + [
    {"transactionId": f"small-{n}", "eventTime": T - 50_000 + n * 10_000, "payerId": "p-20",
     "beneficiaryId": "b-37", "paymentAmount": 10, "paymentType": "CRD"}
    for n in range(3)
]  # fmt: skip


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


@pytest.fixture(scope="module")
def port(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> int:
    """The session server holding the page's state under the prefix velocity:prod."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    connection.load_functions(client)
    settings = load_settings(
        data_dir=tmp_path_factory.mktemp("check-docs"),
        redis_url=redis_url,
        redis_key_prefix="velocity:prod",
    )
    rules = [r.with_version(v) for r, v in zip(parse_rules(RULES), (3, 1), strict=True)]
    assert all(isinstance(r, Rule) for r in rules)
    writer = connection.connect(settings)
    mirror.publish_rules(writer, settings.redis_keys, rules, settings.bucket_width_ms)  # type: ignore[arg-type]
    with state_lock(writer, settings, "check docs") as lease:
        stream_step(settings, rules, lease.token, 0, accepted(HISTORY))  # type: ignore[arg-type]
    return int(urlsplit(redis_url).port or 0)


def answer_of(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_the_redis_cli_call_answers_as_the_page_shows(port: int) -> None:
    (script,) = blocks("bash")
    done = subprocess.run(
        ["bash", "-c", script.replace("-p 6391", f"-p {port}")],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    shown = json.loads(re.search(r"^```json\n(.*?)^```$", PAGE.read_text(), re.M | re.S)[1])
    got = answer_of(done.stdout)
    assert got["decision"] == shown["decision"] == "BLOCK"
    assert got["rules"] == shown["rules"]
    assert got["stateAsOf"] == {"eventTime": None, "committedAt": None, "batch": None}


def test_the_python_service_prints_the_decision(port: int) -> None:
    (code,) = blocks("python")
    done = subprocess.run(
        [sys.executable, "-c", code.replace("port=6391", f"port={port}")],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "BLOCK [1, 4]"


def test_the_java_class_prints_the_answer(port: int, tmp_path: Path) -> None:
    (code,) = blocks("java")
    jars = sorted((PROJECT_ROOT / ".cache" / "examples").glob("*/.complete"))
    assert jars, "infra/fetch_jars.sh (make setup) fetches the examples' Jedis"
    assert shutil.which("java"), "Java 17 is on every machine"
    source = tmp_path / "CheckPayment.java"
    source.write_text(code.replace("6391", str(port)))
    done = subprocess.run(
        ["java", "-cp", f"{jars[-1].parent}/*", str(source)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert answer_of(done.stdout)["decision"] == "BLOCK"
