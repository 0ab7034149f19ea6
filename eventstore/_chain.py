"""The tamper-evident hash chain over the global log.

``hash_n = sha256(hash_{n-1} || utf8(position, stream, version, event id, type, schema version,
recorded_at in µs since the epoch, data text, metadata text — newline-separated))`` with 32 zero
bytes before the first event. The Postgres append function computes the same bytes in SQL; the
contract tests check that ``verify`` (which uses this module) accepts what both backends wrote.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

__all__ = ["GENESIS_HASH", "chain_hash", "epoch_micros"]

GENESIS_HASH = bytes(32)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_micros(moment: datetime) -> int:
    """Exact integer microseconds since the epoch (float timestamps would round)."""
    return (moment - _EPOCH) // _MICROSECOND


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
    body = "\n".join(
        (
            str(position),
            stream_id,
            str(stream_version),
            event_id,
            type,
            str(schema_version),
            str(recorded_at_us),
            data_text,
            metadata_text,
        )
    )
    return hashlib.sha256(previous + body.encode("utf-8")).digest()
