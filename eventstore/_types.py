"""Values that cross the store's API: what callers append and what they read back."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeAlias

__all__ = [
    "ANY",
    "NO_STREAM",
    "STREAM_EXISTS",
    "AppendResult",
    "ExpectedVersion",
    "NewEvent",
    "RecordedEvent",
    "Snapshot",
    "StreamAppend",
    "TypesPage",
    "VerifyReport",
]


class _ExpectedVersionMarker:
    """A named expectation about a stream's version that is not a plain number."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        # Pickling keeps identity, so ``is ANY`` survives a round trip through multiprocessing.
        return self._name


ANY: Final = _ExpectedVersionMarker("ANY")
"""Append whatever the stream's current version is (no concurrency check)."""
NO_STREAM: Final = _ExpectedVersionMarker("NO_STREAM")
"""The stream must not exist yet; the same as ``expected_version=0``."""
STREAM_EXISTS: Final = _ExpectedVersionMarker("STREAM_EXISTS")
"""The stream must already hold at least one event."""

ExpectedVersion: TypeAlias = int | _ExpectedVersionMarker


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``event_id`` defaults to a fresh UUID.

    Pass your own ``event_id`` when you may retry: re-appending the same ids at the same
    versions returns the original result instead of writing twice.

    ``data_json``: ``data`` as :func:`~fleetledger.eventstore.canonical_json` encoded it, for a
    caller that has encoded it already (to derive its event id, say): the store then keeps this
    text instead of encoding ``data`` a second time. It must be exactly that encoding of
    ``data`` — the store stores and hashes the text as given.
    """

    type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID | str | None = None
    schema_version: int = 1
    data_json: str | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """One stream's part of an atomic multi-stream append."""

    stream_id: str
    events: Sequence[NewEvent]
    expected_version: ExpectedVersion = ANY


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed: its global positions and the stream's new version."""

    first_position: int
    last_position: int
    stream_version: int


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: immutable, positioned, chained."""

    global_position: int
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    type: str
    schema_version: int
    data: Mapping[str, Any]
    metadata: Mapping[str, Any]
    recorded_at: datetime
    hash: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of re-computing the hash chain."""

    ok: bool
    checked: int
    first_bad_position: int | None = None
    last_position: int = 0
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An aggregate's folded state at ``version`` of its stream."""

    stream_id: str
    version: int
    schema_version: int
    state: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TypesPage:
    """A page of the events of some types (:meth:`EventStore.read_types`) and how far it read.

    ``through``: every event of those types at or before this position is in ``events`` or was
    before the page's start. A reader that continues from ``through`` instead of from its last
    event skips the other types' events for good: a reader of rare types no longer walks
    everything appended since its last match on every read.
    """

    events: list[RecordedEvent]
    through: int
