"""The tamper-evident hash chain over the global log.

``hash_n = sha256(hash_{n-1} || utf8(position, stream, version, event id, type, schema version,
recorded_at in µs since the epoch, data text, metadata text — newline-separated))`` with 32 zero
bytes before the first event. The Postgres append function computes the same bytes in SQL; the
contract tests check that ``verify`` (which uses this module) accepts what both backends wrote.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from hashlib import sha256 as _sha256
from time import time_ns as _time_ns

__all__ = [
    "GENESIS_HASH",
    "chain_hash",
    "epoch_micros",
    "from_epoch_micros",
    "now_micros",
]

GENESIS_HASH = bytes(32)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_micros(moment: datetime) -> int:
    """Exact integer microseconds since the epoch (float timestamps would round)."""
    return (moment - _EPOCH) // _MICROSECOND


def from_epoch_micros(micros: int) -> datetime:
    """The UTC moment ``micros`` microseconds after the epoch; inverse of epoch_micros."""
    return _EPOCH + timedelta(microseconds=micros)


def now_micros() -> int:
    """The current time in whole microseconds since the epoch, the precision the log stores."""
    return _time_ns() // 1000


def chain_hash(
    previous: bytes,
    *,
    position: int,
    stream_id: str,
    stream_version: int,
    event_id: str,
    type: str,
    schema_version: int,
    recorded_at_us: int,
    data_text: str,
    metadata_text: str,
) -> bytes:
    body = (
        f"{position}\n{stream_id}\n{stream_version}\n{event_id}\n{type}\n{schema_version}\n"
        f"{recorded_at_us}\n{data_text}\n{metadata_text}"
    )
    return _sha256(previous + body.encode()).digest()
