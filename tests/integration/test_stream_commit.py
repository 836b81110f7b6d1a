"""The stream's micro-batch commit on the real redis-server: atomic in one Function call
whatever the batch's size (its arguments chunked), refused on replay."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
import redis

from tests.builders import key_changes
from velocity.cli.commands.alerts import stream_start
from velocity.domain.buckets import BucketAggregate
from velocity.domain.stream_batch import KeyState
from velocity.redis import connection, mirror
from velocity.redis.commit_args import ALERTS_A_PIECE
from velocity.redis.keys import parse_bucket
from velocity.redis.lock import state_lock
from velocity.settings import PROJECT_ROOT, Settings

pytestmark = pytest.mark.redis


def test_a_batch_past_luas_argument_slices_commits_whole_and_in_order(
    settings: Settings,
) -> None:
    """The commit's arguments are used where they lie, in slices of 2 000 (Lua's unpack
    has a limit): a key with 1 500 buckets set and 4 500 transactionIds span slices."""
    client = connection.connect(settings)
    one = BucketAggregate.of_event("12.5", Decimal("12.5"))
    changed = {
        ("sig", f'["p-{i}"]'): (KeyState({60_000: one, 120_000: one}, {60_000: 60_001}), [60_000])
        for i in range(10)
    }
    wide = {60_000 * (i + 10): one for i in range(1500)}
    changed[("sig", '["wide"]')] = (KeyState(wide, {}), list(wide))
    # p-0's bucket 60 000 is changed and dropped below the horizon in the same batch.
    dropped = [("sig", '["p-0"]', 60_000)]
    alerts = [{"alertId": f"a-{i}", "n": i} for i in range(7)]
    accepted = [f"tx-{i}" for i in range(4500)]
    with state_lock(client, settings, "stream batch 0") as lease:
        commit = mirror.stream_commit(
            settings,
            0,
            123,
            key_changes(settings.redis_keys, changed, dropped),
            accepted,
            [json.dumps(a) for a in alerts],
            60,
            lease,
            [json.dumps({"alertId": f"s-{i}", "n": i, "shadow": True}) for i in range(3)],
        )
        published = mirror.send_stream_commit(client, settings, commit, lease)
        again = mirror.send_stream_commit(client, settings, commit, lease)
    assert (published, again) == (7, -1)
    entries = client.xrange(settings.alert_stream)
    assert [json.loads(f["alert"])["n"] for _, f in entries] == list(range(7))
    shadowed = client.xrange(settings.shadow_alert_stream)
    assert [json.loads(f["alert"])["alertId"] for _, f in shadowed] == ["s-0", "s-1", "s-2"]
    assert {f["batch"] for _, f in shadowed} == {"0"}
    assert mirror.read_stream_state(client, settings, [*accepted, "tx-x"]).seen == set(accepted)
    bucket_hash = settings.redis_keys.bucket_hash
    assert not mirror.key_fields(client, bucket_hash("sig", '["p-0"]'))
    for i in range(1, 10):
        value = mirror.key_fields(client, bucket_hash("sig", f'["p-{i}"]')).get("60000")
        assert parse_bucket(value) == (one, 60_001)  # type: ignore[arg-type]
        assert 0 < client.pttl(bucket_hash("sig", f'["p-{i}"]')) <= 60_000
    stored = mirror.key_fields(client, bucket_hash("sig", '["wide"]'))
    assert {int(f) for f in stored if f.isdigit()} == set(wide)  # type: ignore[union-attr]
    assert mirror.committed_batch(client, settings) == 0


def test_a_dense_keys_changes_check_roll_ups_with_one_hlen(settings: Settings) -> None:
    """A dense key's changes that only grew its hash, below ROLLUP_KEEP_FIELDS fields,
    cost one HLEN and build no roll-ups (a dense one keeps its roll-ups,
    tests/integration/test_rollups.py)."""
    client = connection.connect(settings)
    one = BucketAggregate.of_event("1", Decimal(1))
    small = KeyState({60_000 * i: one for i in range(6)}, {})
    changed = {("sig", f'["s-{i}"]'): (small, [0]) for i in range(100)}
    client.config_resetstat()
    with state_lock(client, settings, "stream batch 0") as lease:
        changes = key_changes(settings.redis_keys, changed)
        commit = mirror.stream_commit(settings, 0, 1, changes, [], [], 3600, lease)
        mirror.send_stream_commit(client, settings, commit, lease)
    calls = client.info("commandstats")
    assert calls["cmdstat_hlen"]["calls"] == 100
    assert "cmdstat_hexists" not in calls
    assert calls["cmdstat_hset"]["calls"] >= 100
    bucket_hash = settings.redis_keys.bucket_hash
    assert len(mirror.key_fields(client, bucket_hash("sig", '["s-0"]'))) == 1  # only the changed


def test_an_accepted_transaction_id_is_seen_for_one_to_two_horizons(settings: Settings) -> None:
    """Accepted ids are kept by horizon-long spans (velocity.lua's ``seen_indices``): seen
    through the span after the one that accepted them, gone from the span after that."""
    short = settings.model_copy(update={"dedup_horizon_seconds": 1})
    client = connection.connect(short)

    def redis_ms() -> int:
        seconds, micros = client.time()
        return seconds * 1000 + micros // 1000

    def wait_for_span(n: int) -> None:
        while redis_ms() // 1000 < n:
            time.sleep(0.02)

    with state_lock(client, short, "stream batch 0") as lease:
        span = redis_ms() // 1000
        commit = mirror.stream_commit(
            short, 0, None, mirror.BucketChanges(), ["tx-a"], [], 60, lease
        )
        mirror.send_stream_commit(client, short, commit, lease)
    accepted_in = next(
        s for s in (span, span + 1) if client.exists(f"{short.redis_keys.seen_prefix}{s}")
    )

    def seen() -> set[str]:
        return mirror.read_stream_state(client, short, ["tx-a", "tx-b"]).seen

    assert seen() == {"tx-a"}
    wait_for_span(accepted_in + 1)
    assert seen() == {"tx-a"}
    assert 0 < client.pttl(f"{short.redis_keys.seen_prefix}{accepted_in}") <= 1000
    wait_for_span(accepted_in + 2)
    assert seen() == set()


def test_many_alerts_go_out_in_pieces_once_each_even_when_a_crash_cut_them_short(
    settings: Settings,
) -> None:
    """A batch's alerts past ``ALERTS_A_PIECE`` go on the streams in pieces ahead of its
    commit (each a short call, so checks wait behind none long), in order, the shadow
    alerts after the others. A first attempt that died between pieces leaves the pieces it
    published recorded: its replay publishes only the rest, and a piece out of turn is
    refused."""
    client = connection.connect(settings)
    alerts = [json.dumps({"alertId": f"a-{i}", "n": i}) for i in range(ALERTS_A_PIECE * 2 + 5)]
    shadow = [json.dumps({"alertId": f"s-{i}", "shadow": True}) for i in range(ALERTS_A_PIECE)]
    with state_lock(client, settings, "stream batch 4") as lease:
        commit = mirror.stream_commit(
            settings, 4, 99, key_changes(settings.redis_keys, {}, []), ["tx-1"], alerts, 60,
            lease, shadow,
        )  # fmt: skip
        calls = commit.calls()
        assert [call[1].as_py() for call in calls] == [
            "velocity_stream_alerts", "velocity_stream_alerts", "velocity_stream_alerts",
            "velocity_stream_commit",
        ]  # fmt: skip
        # The first attempt publishes one piece and dies.
        assert client.execute_command(*calls[0].to_pylist()) == ALERTS_A_PIECE
        # A piece out of turn is refused, nothing published.
        with pytest.raises(redis.ResponseError, match="piece 3 of batch 4 before piece 2"):
            client.execute_command(*calls[2].to_pylist())
        assert client.xlen(settings.alert_stream) == ALERTS_A_PIECE
        assert mirror.committed_batch(client, settings) is None
        # The replay sends every call: the piece published before goes out no more.
        published = mirror.send_stream_commit(client, settings, commit, lease)
        assert mirror.send_stream_commit(client, settings, commit, lease) == -1
    assert published == len(alerts) - ALERTS_A_PIECE
    entries = client.xrange(settings.alert_stream)
    assert [json.loads(f["alert"])["alertId"] for _, f in entries] == [
        json.loads(a)["alertId"] for a in alerts
    ]
    shadowed = client.xrange(settings.shadow_alert_stream)
    assert [f["alert"] for _, f in shadowed] == shadow
    assert mirror.committed_batch(client, settings) == 4


@pytest.mark.parametrize("retention", ["1000", "1m"])
def test_the_alert_stream_keeps_what_its_retention_says(settings: Settings, retention: str) -> None:
    """By count, about that many entries stay (trimmed a node of 100 at a time, MAXLEN ~);
    by age, entries older than it go (MINID ~), whatever the count."""
    settings = settings.model_copy(update={"redis_alert_stream_retention": retention})
    client = connection.connect(settings)
    stream = settings.alert_stream
    now_ms = int(client.time()[0]) * 1000
    # 300 alerts of ten minutes ago, as an older stream held them.
    for i in range(300):
        client.xadd(stream, {"alert": "{}", "batch": "0"}, id=f"{now_ms - 600_000}-{i}")
    alerts = [json.dumps({"alertId": f"a-{i}"}) for i in range(900)]
    with state_lock(client, settings, "stream batch 1") as lease:
        commit = mirror.stream_commit(
            settings, 1, now_ms, key_changes(settings.redis_keys, {}, []), ["tx-1"], alerts, 60,
            lease,
        )  # fmt: skip
        assert mirror.send_stream_commit(client, settings, commit, lease) == 900
    ids = [entry_id for entry_id, _ in client.xrange(stream)]
    newest = [f["alert"] for _, f in client.xrange(stream)][-900:]
    assert newest == alerts  # what the batch published is all there, in order
    if retention == "1000":
        assert 1000 <= len(ids) < 1100
    else:  # every node of the older alerts went; none of the new
        assert len(ids) == 900
        assert all(int(i.split("-")[0]) >= now_ms - 60_000 for i in ids)


def test_a_replay_from_the_start_says_what_the_stream_kept_and_where_the_rest_is(
    settings: Settings,
) -> None:
    """`velocity watch --from-start` begins with the retention, the oldest entry's time and
    where trimmed alerts are (a consumer would otherwise miss them silently)."""
    client = connection.connect(settings)
    stream = settings.alert_stream
    assert stream_start(client, stream, "24h").endswith("keeps 24h "
        "(VELOCITY_REDIS_ALERT_STREAM_RETENTION); it is empty")  # fmt: skip
    client.xadd(stream, {"alert": "{}", "batch": "0"}, id="1767225600000-0")
    said = stream_start(client, stream, "24h")
    assert "oldest entry was published 2026-01-01 00:00:00 UTC" in said
    assert "velocity alerts" in said


def test_the_docs_gap_check_finds_a_gap_after_a_trim_and_none_before(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/serving/alerts.md's gap check, run as written against a trimmed stream."""
    page = (PROJECT_ROOT / "docs" / "serving" / "alerts.md").read_text(encoding="utf-8")
    block = next(b for b in page.split("```python")[1:] if "def entry_id" in b)
    snippet = block.split("```")[0]
    reader = connection.connect(settings)
    stream = settings.alert_stream
    for i in range(250):
        reader.xadd(stream, {"alert": "{}", "batch": "0"}, id=f"1000-{i}")
    exec(snippet, {"reader": reader, "stream": stream, "last": "1000-5"})
    assert capsys.readouterr().out == ""
    reader.xtrim(stream, minid="1000-200")  # as a retention would
    exec(snippet, {"reader": reader, "stream": stream, "last": "1000-5"})
    assert "missed the alerts published before 1000-200" in capsys.readouterr().out
