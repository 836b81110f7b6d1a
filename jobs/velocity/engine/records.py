"""The SPEC §4 alert rows of the kernel's decisions, built column by column (pure).

The row of each decision equals ``velocity.domain.alerts.alert_record`` of it (plus its
signature), with the per-rule fields filled once per rule and the key's JSON parsed
once per distinct key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.alerts import ALERT_FIELDS, AlertKind, alert_ids
from velocity.domain.rules import Outcome, Rule, RuleState
from velocity.domain.schema import format_decimal
from velocity.engine.kernel import Decisions, value_texts
from velocity.engine.texts import json_string_texts


def alert_rows(
    decisions: Decisions,
    events: pa.Table,
    rules: Sequence[Rule],
    decision_time: int,
    schema: pa.Schema,
    suppressed_by: pa.Array | None = None,
) -> pa.Table:
    """ALERT rows (``schema``: the alerts table's columns) of ``decisions`` over
    ``events`` (the kernel's input, ``velocity.engine.kernel.KEYED_COLUMNS``);
    ``suppressed_by``: per decision, the notified alert's transactionId that suppressed
    it, null when notified (``velocity.engine.cooldown.notify``; None: all notified)."""
    if suppressed_by is None:
        suppressed_by = pa.nulls(len(decisions), pa.string())
    parts = []
    for index in np.unique(decisions.rules).tolist():
        chosen = np.flatnonzero(decisions.rules == index)
        by = suppressed_by.take(pa.array(chosen))
        parts.append(_rule_rows(decisions, chosen, events, rules[index], decision_time, schema, by))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _rule_rows(
    decisions: Decisions,
    chosen: np.ndarray,
    events: pa.Table,
    rule: Rule,
    decision_time: int,
    schema: pa.Schema,
    suppressed_by: pa.Array,
) -> pa.Table:
    n = len(chosen)
    rows = pa.array(decisions.rows[chosen])
    taken = events.select(["signature_id", "key", "eventTime", "transactionId"]).take(rows)
    transaction_ids = taken.column("transactionId").to_pylist()
    event_times = taken.column("eventTime").combine_chunks()

    def constant(value: object, name: str) -> pa.Array:
        return pa.repeat(pa.scalar(value, schema.field(name).type), n)

    columns = {
        "alertId": pa.array(
            alert_ids(rule.rule_id, rule.version, AlertKind.ALERT, transaction_ids), pa.string()
        ),
        "kind": constant(AlertKind.ALERT.value, "kind"),
        "ruleId": constant(rule.rule_id, "ruleId"),
        "ruleVersion": constant(rule.version, "ruleVersion"),
        "transactionId": taken.column("transactionId").combine_chunks(),
        "key": _keys(taken.column("key"), rule, schema.field("key").type),
        "eventTime": event_times,
        "aggregatorFunctionType": constant(rule.aggregator.value, "aggregatorFunctionType"),
        "aggregateValue": value_texts(decisions.values[chosen]),
        "limitOperatorType": constant(rule.operator.value, "limitOperatorType"),
        "limit": constant(format_decimal(rule.limit), "limit"),
        "windowStart": pa.array(decisions.window_starts[chosen], pa.int64()),
        "windowEnd": event_times,
        "decisionTime": constant(decision_time, "decisionTime"),
        "signature_id": taken.column("signature_id").combine_chunks(),
        "shadow": constant(rule.state is RuleState.SHADOW, "shadow"),
        "suppressed": suppressed_by.is_valid(),
        "suppressedBy": suppressed_by,
        "caseId": pa.nulls(n, pa.string()),  # the write-behind gathers it into a case
        "outcome": constant(rule.outcome.value, "outcome"),
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def _keys(texts: pa.ChunkedArray, rule: Rule, map_type: pa.DataType) -> pa.Array:
    """Each key's JSON text (values in the signature's field order) as the map of the
    rule's grouping fields, in the rule's order (``velocity.domain.alerts.rule_key``)."""
    names = list(rule.grouping_keys)
    position = [rule.signature.grouping_keys.index(name) for name in names]
    encoded = texts.combine_chunks().dictionary_encode()
    parsed = [json.loads(text) for text in encoded.dictionary.to_pylist()]
    by_key = np.array(
        [[str(values[p]) for p in position] for values in parsed], dtype=object
    ).reshape(len(parsed), len(names))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    width = len(names)
    items = by_key[codes].reshape(-1) if len(codes) else np.array([], dtype=object)
    offsets = pa.array(
        np.arange(0, (len(codes) + 1) * width, width, dtype=np.int32)
        if width
        else np.zeros(len(codes) + 1, dtype=np.int32)
    )
    keys = pa.array(names * len(codes), pa.string())
    return pa.MapArray.from_arrays(offsets, keys, pa.array(items.tolist(), pa.string())).cast(
        map_type
    )


# The text fields that come from events (a transactionId, a suppressor's) and may need
# JSON escapes, as may a key's names and values (``_json_objects``); the others are
# Velocity's own: a UUID, enum names, decimal texts and integers.
_EVENT_TEXTS = frozenset({"transactionId", "suppressedBy"})
_INTEGERS = frozenset(
    {"ruleId", "ruleVersion", "eventTime", "windowStart", "windowEnd", "decisionTime"}
)


def alert_lines(alerts: pa.Table) -> pa.Array:
    """The SPEC §4 JSON line of each alert row (``velocity.domain.alerts.record_of_stored`` as
    compact JSON, non-ASCII left as UTF-8), made column by column by Arrow: 2-3 µs an
    alert where ``json.dumps`` of a record took 27."""
    if alerts.num_rows == 0:
        return pa.array([], pa.string())
    parts: list[str | pa.Array] = []
    for index, name in enumerate(ALERT_FIELDS):
        if name == "outcome":
            text = _outcome_texts(alerts)
            parts += [f',"{name}":"', text, '"']
            continue
        column = alerts.column(name).combine_chunks()
        if name == "key":
            text = _json_objects(column)
        elif name in _INTEGERS:
            text = column.cast(pa.string())
        elif name in _EVENT_TEXTS:
            text = _json_texts(column)
        else:
            text = pc.binary_join_element_wise('"', column, '"', "")
        parts += [("{" if index == 0 else ",") + f'"{name}":', text]
    shadow = pc.fill_null(alerts.column("shadow").combine_chunks(), False)
    suppressed = pc.fill_null(alerts.column("suppressed").combine_chunks(), False)
    by = _json_texts(alerts.column("suppressedBy").combine_chunks())
    parts += [
        pc.if_else(shadow, ',"shadow":true', ""),
        pc.if_else(
            suppressed,
            pc.binary_join_element_wise(',"suppressed":true,"suppressedBy":', by, ""),
            "",
        ),
        "}",
    ]
    return pc.binary_join_element_wise(*parts, "")


def _outcome_texts(alerts: pa.Table) -> pa.Array:
    """Each row's outcome (``velocity.domain.alerts.stored_outcome``): ALERT where the
    column is null or missing (rows of a Velocity before outcome existed)."""
    if "outcome" not in alerts.column_names:
        return pa.repeat(pa.scalar(Outcome.ALERT.value), alerts.num_rows)
    return pc.fill_null(alerts.column("outcome").combine_chunks(), Outcome.ALERT.value)


def _json_texts(values: pa.Array) -> pa.Array:
    """JSON string literals of ``values``, null as ``null``."""
    return pc.fill_null(json_string_texts(values), "null")


def _json_objects(keys: pa.MapArray) -> pa.Array:
    """JSON objects of string maps, entries in the map's order."""
    entries = pc.binary_join_element_wise(_json_texts(keys.keys), ":", _json_texts(keys.items), "")
    joined = pc.binary_join(pa.ListArray.from_arrays(keys.offsets, entries), ",")
    return pc.binary_join_element_wise("{", joined, "}", "")
