"""The stream's spooled input (``delta.write_behind.InputSpool``): a batch Spark handed over
is kept whole until it commits, and listed in batch order for the next start."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from velocity.delta.write_behind import InputSpool
from velocity.settings import Settings

pytestmark = pytest.mark.timeout(60)


def lines(count: int, first: int = 0) -> pa.Table:
    return pa.table(
        {
            "raw": [f'{{"transactionId": "tx-{i}"}}' for i in range(first, first + count)],
            "accepted": pa.array([i % 3 != 0 for i in range(first, first + count)]),
            "eventTime": pa.array(range(first, first + count), pa.int64()),
        }
    )


def test_a_spooled_batch_reads_back_as_written_and_goes_once_committed(tmp_path: Path) -> None:
    spool = InputSpool(Settings(data_dir=tmp_path))
    assert spool.batches() == []
    spool.write(12, lines(5))
    spool.write(3, lines(7, first=100))
    spool.write(101, lines(0))  # an empty batch is still a batch Spark counted done
    assert spool.batches() == [3, 12, 101]
    assert spool.read(3).equals(lines(7, first=100))
    assert spool.read(101).num_rows == 0
    spool.remove(3)
    spool.remove(3)  # removed twice (a replay that finds itself committed): no error
    assert spool.batches() == [12, 101]


def test_a_write_cut_short_is_not_a_batch(tmp_path: Path) -> None:
    spool = InputSpool(Settings(data_dir=tmp_path))
    spool.write(4, lines(3))
    # What a process killed mid-write leaves: its staging file, never renamed.
    (spool.root / ".000000000005.4242").write_bytes(b"ARROW1\x00\x00 half")
    assert spool.batches() == [4]
    spool.write(4, lines(9))  # the same batch spooled again replaces it whole
    assert spool.read(4).equals(lines(9))
