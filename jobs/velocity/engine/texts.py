"""Columns as texts, written column by column exactly as ``velocity.domain.decimals`` writes
one value at a time (pure): decimals without trailing zeros, and JSON strings. Shared by
the keyed rows, the alert lines and the Redis layout, so the three write the same bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.decimals import format_decimal, json_string


def decimal_texts(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """Each decimal as ``format_decimal`` writes it (null stays null)."""
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    text = pc.cast(column, pa.string())
    # Arrow writes an amount below 10^-6 with an exponent ("1E-8", "0E-8"): those few
    # are written by ``format_decimal`` itself.
    exponent = pc.fill_null(pc.match_substring(text, "E"), False).to_numpy(zero_copy_only=False)
    if exponent.any():
        rows = np.flatnonzero(exponent)
        plain = text.to_numpy(zero_copy_only=False).astype(object)
        plain[rows] = [format_decimal(value) for value in column.take(pa.array(rows)).to_pylist()]
        text = pa.chunked_array([pa.array(plain, pa.string())])
    # Trailing zeros after the point go, and a bare point with them: "1.50000000" ->
    # "1.5", "100.00000000" -> "100"; a text without a point stays as it is. (Trimmed, not
    # by a regex: 0.2 µs a value where two regex replacements took 1.0; measured, the
    # stream's fire-often rules write about 24 a payment.)
    trimmed = pc.utf8_rtrim(pc.utf8_rtrim(text, "0"), ".")
    return pc.if_else(pc.fill_null(pc.match_substring(text, "."), False), trimmed, text)


def json_string_texts(texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each text as a JSON string, exactly as ``json_string`` writes it, column by column:
    a backslash or quote escaped in place; a text with a control character (rare: never in
    a JSON text, a key name or a bucket start) through ``json_string`` itself; null stays
    null."""
    escaped = pc.replace_substring(pc.replace_substring(texts, "\\", "\\\\"), '"', '\\"')
    quoted = pc.binary_join_element_wise('"', escaped, '"', "")
    control = pc.fill_null(pc.match_substring_regex(texts, r"[\x00-\x1f]"), False)
    control = control.to_numpy(zero_copy_only=False)
    if not control.any():
        return quoted
    out = quoted.to_pylist()
    originals = texts.to_pylist()
    for row in np.flatnonzero(control).tolist():
        out[row] = json_string(originals[row])
    return pa.array(out, pa.string())
