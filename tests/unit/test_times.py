"""Times as people read them (``velocity.domain.times``, pure): epoch ms as ISO-8601 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.domain.times import iso_utc

pytestmark = pytest.mark.timeout(60)


def test_epoch_ms_read_as_iso_8601_utc_with_milliseconds() -> None:
    assert iso_utc(1_795_860_902_123) == "2026-11-28T10:15:02.123Z"
    assert iso_utc(1_767_225_600_000) == "2026-01-01T00:00:00.000Z"
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(-1) == "1969-12-31T23:59:59.999Z"


@given(st.integers(min_value=-(10**12), max_value=253_402_300_799_999))
def test_the_text_reads_back_as_the_same_millisecond(ms: int) -> None:
    back = datetime.strptime(iso_utc(ms), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert (back - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) == ms
