"""The fan-out and the shuffle by key as Spark SQL expressions: keyed rows made and
partitioned in the JVM, each key-partition handed to the kernel in one Arrow hop.

``hashed_keyed_events`` gives, for every event and every signature whose filter it passes
and whose grouping fields it has, one HASHED_SCHEMA row: the signature's index (a small
int), an int64 hash (the index in its high bits, a hash of the key's canonical values in
the others), the key's text, and the kernel's columns. ``hash_partitioned`` shuffles
and sorts by the hash alone, an int64, so the shuffle never compares a string. The rows
are those of the Python reference fan-out (``velocity.engine.fan_out.keyed_rows``), which
a test holds them to.

Invariants:
- one (signature, key) has one hash, so its rows meet in one partition, contiguous once
  sorted by the hash;
- two keys may share a hash (a collision): nothing here compares or merges by the hash;
  the kernel groups a chunk's rows by the exact signature and key text
  (``velocity.engine.kernel.decide``), and a chunk is cut only where the hash changes,
  so a chunk holds whole keys however many share a hash.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from velocity.delta.tables import AMOUNT_TYPE
from velocity.domain.rules import RuleSignature, key_text
from velocity.domain.schema import FIELDS_BY_NAME
from velocity.engine.kernel import KEYED_COLUMNS

SIGNATURE_INDEX, KEY_HASH = "signature_index", "key_hash"
HASHED_SCHEMA = StructType(
    [
        StructField(SIGNATURE_INDEX, IntegerType(), False),
        StructField(KEY_HASH, LongType(), False),
        StructField("key", StringType(), False),
        StructField("eventTime", LongType(), False),
        StructField("transactionId", StringType(), False),
        StructField("value", StringType(), True),
        StructField("number", AMOUNT_TYPE, True),
    ]
)
# What JSON escapes in a string (``json.encoder.ESCAPE``, as Java's regex writes it): a
# key with such a value is written by Spark's ``to_json`` and rewritten by ``key_text``
# in the worker (``keyed_table``): Jackson writes a control character's hex in capitals.
_NEEDS_ESCAPE = '[\\x00-\\x1f\\\\"]'


def canonical_text(field: str) -> Column:
    """``field``'s canonical text (``velocity.engine.fan_out.canonical_texts``): the column
    itself, but an amount without trailing zeros (Spark writes a decimal plainly, with
    all its 8 places: ``100.00000000`` -> ``100``, ``0.50000000`` -> ``0.5``)."""
    column = F.col(field)
    if not FIELDS_BY_NAME[field].numeric:
        return column
    text = column.cast("string")
    return F.when(F.instr(text, ".") > 0, F.rtrim(F.rtrim(text, F.lit("0")), F.lit("."))).otherwise(
        text
    )


def hashed_keyed_events(
    events: DataFrame, signatures: Sequence[RuleSignature], hash_mask: int = -1
) -> DataFrame:
    """The keyed rows of ``events`` (the events table's columns) for ``signatures`` as
    HASHED_SCHEMA rows, made by Spark SQL in one pass over the events: a projection of
    every field's canonical text, then one generated row per (event, signature) kept.
    ``signature_index`` indexes ``signatures``. ``hash_mask`` keeps only some bits of
    the key's hash: a test's way to force collisions (-1: all of them)."""
    fields = sorted(
        {
            name
            for s in signatures
            for name in (*s.grouping_keys, *(n for n, _ in s.filter), s.aggregate_field)
            if name
        }
    )
    text = {name: f"_t_{name}" for name in fields}
    plain = {name: f"_p_{name}" for name in fields}
    # Per event, once: each field's text and whether JSON would escape it.
    projected = events.select(
        "eventTime",
        "transactionId",
        *[F.col(name) for name in fields if FIELDS_BY_NAME[name].numeric],  # the number
        *[canonical_text(name).alias(text[name]) for name in fields],
        *[
            F.coalesce(~F.col(text[name]).rlike(_NEEDS_ESCAPE), F.lit(True)).alias(plain[name])
            for name in fields
        ],
    )
    # The signature's index in the hash's high bits: sorted by the hash, a partition's rows
    # come signature by signature, as the kernel groups them (its sorts then find runs).
    low_bits = 63 - max(1, (len(signatures) - 1).bit_length())
    low_mask = (1 << low_bits) - 1
    rows = []
    for index, signature in enumerate(signatures):
        keep: Column = F.lit(True)
        for name in signature.grouping_keys:
            keep = keep & F.col(text[name]).isNotNull()
        for name, allowed in signature.filter:
            keep = keep & F.coalesce(F.col(text[name]).isin(list(allowed)), F.lit(False))
        values = [F.col(text[name]) for name in signature.grouping_keys]
        hashed = F.xxhash64(F.lit(index), *values).bitwiseAND(F.lit(low_mask & hash_mask))
        key_hash = F.shiftleft(F.lit(index).cast("long"), low_bits).bitwiseOR(hashed)
        field = signature.aggregate_field
        value, number = F.lit(None).cast("string"), F.lit(None).cast(AMOUNT_TYPE)
        if field:
            value = F.col(text[field])
            if FIELDS_BY_NAME[field].numeric:
                number = F.col(field).cast(AMOUNT_TYPE)
        row = F.struct(
            F.lit(index).alias(SIGNATURE_INDEX),
            key_hash.alias(KEY_HASH),
            _key_text(
                [text[n] for n in signature.grouping_keys],
                [plain[n] for n in signature.grouping_keys],
            ).alias("key"),
            F.col("eventTime").alias("eventTime"),
            F.col("transactionId").alias("transactionId"),
            value.alias("value"),
            number.alias("number"),
        )
        rows.append(F.when(keep, row))
    if not rows:
        return events.sparkSession.createDataFrame([], HASHED_SCHEMA)
    generated = projected.select(F.explode(F.array(*rows)).alias("_row"))
    return generated.where(F.col("_row").isNotNull()).select(
        *[F.col(f"_row.{f.name}").alias(f.name) for f in HASHED_SCHEMA.fields]
    )


def _key_text(texts: Sequence[str], plains: Sequence[str]) -> Column:
    """``key_text`` of the key values' texts: joined in place when no value needs JSON's
    escapes, else Spark's ``to_json`` (valid JSON of the same values, which the worker
    rewrites with ``key_text``: ``keyed_table``)."""
    if not texts:
        return F.lit("[]")
    joined = F.concat(F.lit('["'), *_between([F.col(t) for t in texts], F.lit('","')), F.lit('"]'))
    plain: Column = F.lit(True)
    for name in plains:
        plain = plain & F.col(name)
    return F.when(plain, joined).otherwise(F.to_json(F.array(*[F.col(t) for t in texts])))


def _between(columns: list[Column], separator: Column) -> list[Column]:
    out: list[Column] = []
    for index, column in enumerate(columns):
        if index:
            out.append(separator)
        out.append(column)
    return out


def hash_partitioned(keyed: DataFrame, partitions: int) -> DataFrame:
    """HASHED_SCHEMA rows shuffled by their key hash into ``partitions`` and sorted by it
    (an int64: Spark's radix sort of the prefix), so each key's rows are contiguous in
    one partition: the input of ``velocity.spark.evaluate.hashed_alerts``."""
    return keyed.repartition(partitions, KEY_HASH).sortWithinPartitions(KEY_HASH)


def keyed_table(batch: pa.Table, signature_ids: Sequence[str]) -> pa.Table:
    """HASHED_SCHEMA rows as the kernel's columns (KEYED_COLUMNS, ``key_hash`` beside):
    the signature's id for its index, and a key Spark's ``to_json`` wrote (one with a
    value JSON escapes) rewritten by ``key_text``, so every key is the reference's text."""
    ids = pa.array(list(signature_ids), pa.string())
    keys = batch.column("key")
    escaped = pc.fill_null(pc.match_substring(keys, "\\"), False)
    if pc.any(escaped).as_py():
        rows = np.flatnonzero(escaped.to_numpy(zero_copy_only=False))
        texts = keys.to_numpy(zero_copy_only=False).astype(object)
        texts[rows] = [key_text(json.loads(texts[row])) for row in rows.tolist()]
        keys = pa.chunked_array([pa.array(texts, pa.string())])
    columns = {
        "signature_id": ids.take(batch.column(SIGNATURE_INDEX).combine_chunks()),
        "key": keys,
        **{name: batch.column(name) for name in KEYED_COLUMNS[2:]},
        KEY_HASH: batch.column(KEY_HASH),
    }
    return pa.table(columns)


def last_hash_start(chunk: pa.Table) -> int:
    """Where the last run of equal key hashes of ``hash_partitioned`` rows begins: a chunk
    cut there holds every key whole, however many share a hash."""
    hashes = chunk.column(KEY_HASH)
    return int(pc.index(pc.equal(hashes, hashes[chunk.num_rows - 1]), True).as_py())
