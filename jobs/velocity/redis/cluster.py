"""The stream's read and commit on a Redis Cluster, where a data dir's keys live on
several masters.

On one server a micro-batch's commit is one Function call (velocity_stream_commit),
atomic. A Redis Cluster refuses a call that touches keys of another master, so there
the commit is staged:

1. **decide**, on the master of the stream's progress, in one call, fenced by the state
   lock and refused for a replay: the accepted transactionIds, the progress and a
   *pending* record holding the batch's alerts and each master's bucket changes (these
   keys share the data dir's hash tag, so they live in one slot);
2. **finish**: the alerts go on the alert stream (skipped if it has the batch already),
   each master applies its bucket changes (skipped where its *applied* marker, a key on
   that master, has the batch), and the pending record goes.

A crash between the two leaves the pending record. Whoever reads the stream's state next,
or takes the state lock, finishes it first, so buckets are never read behind the progress
and nothing is applied twice. Reads are one call on the progress's master plus one call
per master for the buckets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS as REDIS_CLUSTER_SLOTS
from redis.crc import key_slot

from velocity.redis.commit_args import BucketChanges, PartitionCommit, StreamCommit
from velocity.redis.keys import KEY_SEPARATOR, RedisKeys, data_dir_tag
from velocity.redis.lease import Lease
from velocity.settings import Settings

REPLAYED = -1  # decide: the batch is committed already (nothing written)
FENCED = -2  # decide: the state lock is not the caller's (nothing written)


def pending_record(keys: RedisKeys) -> str:
    """The pending record of a decided, unfinished batch (the data dir's slot)."""
    return f"{keys.prefix}:pending:{{{data_dir_tag(keys.data_dir)}}}"


def applied_marker(client: RedisCluster, keys: RedisKeys, node_name: str) -> str:
    """A key on master ``node_name`` holding the last batch it applied: the first of
    ``<prefix>:applied:{<digest>-<n>}`` whose slot that master serves."""
    tag = data_dir_tag(keys.data_dir)
    for n in range(100_000):
        name = f"{keys.prefix}:applied:{{{tag}-{n}}}"
        if client.get_node_from_key(name).name == node_name:
            return name
    raise RuntimeError(f"no slot of master {node_name} found for an applied marker")


def forget_staging(client: RedisCluster, keys: RedisKeys) -> None:
    """Drop the pending record and every applied marker: a rebuild from Delta sets the
    progress itself, and a batch after it must be decided and applied anew."""
    names = [pending_record(keys)]
    names.extend(client.scan_iter(match=f"{keys.prefix}:applied:*", count=1000))
    for name in names:
        client.delete(name)


def by_master(client: RedisCluster, names: Sequence[str]) -> dict[str, list[str]]:
    """``names`` grouped by the master that serves each one's slot."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(client.get_node_from_key(name).name, []).append(name)
    return groups


@dataclass(frozen=True)
class RulesCopy:
    """Where one master keeps its copy of the check's rules, and which slots it serves: a
    check there evaluates the rules whose keys those slots hold (velocity.lua's
    velocity_check)."""

    name: str  # "<prefix>:rules:{r<n>}", n the least whose slot the master serves
    slot_ranges: str  # "lo-hi,lo-hi"


_COPIES: dict[tuple[int, str], dict[str, RulesCopy]] = {}


def rules_copies(client: RedisCluster, keys: RedisKeys) -> dict[str, RulesCopy]:
    """Each master's copy of the check's rules, by master name, from the client's slot map
    (the writer and every checker derive the same names from the same map). Kept while the
    client's slot map is the same object (redis-py makes a new one when it reloads it)."""
    cache_key = (id(client.nodes_manager.slots_cache), keys.prefix)
    if cache_key not in _COPIES:
        _COPIES.clear()
        _COPIES[cache_key] = _rules_copies(client, keys)
    return _COPIES[cache_key]


def _rules_copies(client: RedisCluster, keys: RedisKeys) -> dict[str, RulesCopy]:
    served: dict[str, list[int]] = {}
    for slot in range(REDIS_CLUSTER_SLOTS):
        served.setdefault(client.nodes_manager.get_node_from_slot(slot).name, []).append(slot)
    copies = {}
    for master, slots in served.items():
        owned = set(slots)
        n = next(n for n in range(100_000) if key_slot(f"r{n}".encode()) in owned)
        starts = [s for s in slots if s - 1 not in owned]
        ends = [s for s in slots if s + 1 not in owned]
        ranges = [f"{lo}-{hi}" for lo, hi in zip(starts, ends, strict=True)]
        copies[master] = RulesCopy(keys.check_rules_copy(f"r{n}"), ",".join(ranges))
    return copies


def read_stream_state(
    client: RedisCluster,
    settings: Settings,
    transaction_ids: Sequence[str],
    names: Sequence[str],
) -> tuple[dict[str, str], set[int], str, str, list[str]]:
    """(progress, 0-based indices of the seen transactionIds, epoch, mirror marker, the
    named keys' packed texts as velocity.lua's read_keys gives each, in the names' order):
    mirror.read_stream_state's inputs, on a cluster. A pending batch is finished first."""
    keys = settings.redis_keys
    accepted = json.dumps(list(transaction_ids), ensure_ascii=False)

    def progress_read() -> dict[str, Any]:
        return json.loads(
            client.fcall(  # type: ignore[arg-type]
                "velocity_cluster_read_progress",
                2,
                keys.stream_progress,
                pending_record(keys),
                keys.seen_prefix,
                settings.dedup_horizon_seconds * 1000,
                accepted,
            )
        )

    reply = progress_read()
    if reply["b"]:
        finish_pending(client, settings)
        reply = progress_read()
    texts: dict[str, str] = {}
    for group in by_master(client, names).values():
        answer = client.fcall(
            "velocity_read_keys", 1, group[0], json.dumps(group, ensure_ascii=False)
        )
        texts.update(zip(group, cast(str, answer).split(KEY_SEPARATOR), strict=True))
    return (
        reply["p"] or {},
        {i - 1 for i in reply["s"] or []},
        str(client.get(keys.buckets_epoch) or "0"),
        str(client.get(keys.mirror_marker) or ""),
        [texts[name] for name in names],
    )


def finish_pending(client: RedisCluster, settings: Settings) -> None:
    """Finish the decided batch the pending record holds, if any (idempotent)."""
    keys = settings.redis_keys
    record = cast(dict[str, str], client.hgetall(pending_record(keys)))
    if record:
        _finish(client, keys, record["batch"], json.loads(record["changes"]))


def _finish(client: RedisCluster, keys: RedisKeys, batch: str, changes: Mapping[str, Any]) -> int:
    """Publish the alerts and apply each master's buckets of decided ``batch``; drop the
    pending record. Returns the alerts published (0 if they were already)."""
    published = int(
        client.fcall(  # type: ignore[arg-type]
            "velocity_cluster_publish",
            1,
            changes["alert_stream"],
            batch,
            changes["maxlen"],
            *changes["a"],
        )
    )
    if changes.get("s"):  # a shadow rule's alerts, on their own stream (own slot)
        client.fcall(
            "velocity_cluster_publish",
            1,
            changes["shadow_stream"],
            batch,
            changes["maxlen"],
            *changes["s"],
        )
    for marker, count, runs in changes["m"]:
        client.fcall(
            "velocity_cluster_apply",
            1,
            marker,
            batch,
            changes["ttl"],
            changes["bucket_ms"],
            count,
            *runs,
        )
    client.fcall("velocity_cluster_done", 1, pending_record(keys), batch)
    return max(published, 0)


def per_master_runs(
    client: RedisCluster, keys: RedisKeys, changes: BucketChanges, marker_suffix: str = ""
) -> list[list[Any]]:
    """``changes`` split by master, as velocity_cluster_apply takes them: [the master's
    applied marker (with ``marker_suffix``), its keys changed, their runs' arguments]."""
    runs = changes.runs
    per_master: dict[str, list[int]] = {}
    for row, base in enumerate(runs.column("base").to_pylist()):
        # One a key: its names share its slot's tag.
        per_master.setdefault(client.get_node_from_key(base).name, []).append(row)
    return [
        [
            applied_marker(client, keys, node) + marker_suffix,
            len(rows),
            [a for args in runs.column("args").take(rows).to_pylist() for a in args],
        ]
        for node, rows in sorted(per_master.items())
    ]


def commit_partition(client: RedisCluster, keys: RedisKeys, commit: PartitionCommit) -> int | str:
    """A key-partition's commit on a cluster, staged as the batch's: the record (holding
    the outcome and each master's changes) in the data dir's slot, fenced and idempotent,
    then each master's changes under a marker of the partition's own. Returns
    velocity_partition_commit's -2 or -1, or the outcome that counts."""
    partition = commit.keys[2].rsplit(":", 1)[1]
    staged = json.dumps(
        {
            "o": commit.outcome,
            "b": str(commit.batch),
            "ttl": commit.bucket_ttl_ms,
            "bucket_ms": commit.bucket_ms,
            "m": per_master_runs(client, keys, commit.changes, f":p{partition}"),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    head = commit.args(BucketChanges()).to_pylist()[3:]  # after FCALL <name> <numkeys>
    head[-2:] = ["1", staged]  # one piece: each master's changes are applied apart
    reply = client.fcall("velocity_partition_commit", 3, *head)
    if reply in (REPLAYED, FENCED):
        return cast(int, reply)
    return finish_partition(client, staged if reply == 0 else cast(list[str], reply)[0])


def finish_partition(client: RedisCluster, staged: str) -> str:
    """Apply a recorded partition's changes on each master (skipped where its marker has
    the batch); returns the partition's outcome."""
    record = json.loads(staged)
    for marker, count, runs in record["m"]:
        client.fcall(
            "velocity_cluster_apply", 1, marker, record["b"], record["ttl"],
            record["bucket_ms"], count, *runs,
        )  # fmt: skip
    return cast(str, record["o"])


class ClusterCommit:
    """A built ``mirror.stream_commit`` run on a Redis Cluster (decide, then finish);
    ``result`` as ``mirror.PendingCommit.result``. Runs when constructed: there is no one
    connection to leave the answer on while the caller goes on."""

    def __init__(
        self, client: RedisCluster, settings: Settings, commit: StreamCommit, lease: Lease
    ) -> None:
        self._lease = lease
        self._error: BaseException | None = None
        try:
            self._result = self._run(client, settings, commit)
        except redis.RedisError as exc:
            self._error = exc

    def _run(self, client: RedisCluster, settings: Settings, commit: StreamCommit) -> int:
        keys = settings.redis_keys
        progress, alert_stream, lock, shadow_stream = commit.keys
        changes = {
            "alert_stream": alert_stream,
            "shadow_stream": shadow_stream,
            "s": list(commit.shadow_alerts),
            "maxlen": commit.alert_retention,
            "ttl": commit.bucket_ttl_ms,
            "bucket_ms": commit.bucket_ms,
            "a": list(commit.alerts),
            "m": per_master_runs(client, keys, commit.changes),
        }
        decided = int(
            client.fcall(  # type: ignore[arg-type]
                "velocity_cluster_decide",
                3,
                progress,
                lock,
                pending_record(keys),
                commit.token,
                commit.batch,
                commit.newest,
                commit.seen_ttl_ms,
                json.dumps(changes, separators=(",", ":"), ensure_ascii=False),
                commit.seen_prefix,
                json.dumps(list(commit.accepted), ensure_ascii=False),
            )
        )
        if decided in (REPLAYED, FENCED):
            return decided
        return _finish(client, keys, str(commit.batch), changes)

    def result(self) -> int:
        """The alerts published, -1 for a replay; ``StateLockLost`` when fenced."""
        if self._error is not None:
            raise self._error
        if self._result == FENCED:
            self._lease.lost.set()
            self._lease.check()
        return self._result
