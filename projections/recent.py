"""The domain events this process has just appended, kept by id for its read models.

A read model folds the log, including what this process's own streams appended a moment earlier:
those events were domain objects in memory before they were encoded, and decoding them back from
their stored JSON is a large share of a read model's work under load. A writer that knows what it
appended hands the events over here; the read model takes the object by the record's event id and
decodes only what it does not find (another process's events, an older log, one evicted).

That is exact, not an approximation: an event id names one stored event (the log's ids are
unique), and decoding a freshly encoded event gives an equal object, so the model folds the same
values either way. Only events this process saw committed may be handed over.

The same goes for whole streams this process created (each batch stream a seal opens): the events
a stream was opened with are kept under its id until the stream is hosted here, which then starts
from them instead of reading them back (``take_opening``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from fleetledger.domain.codec import from_data
from fleetledger.eventstore import RecordedEvent

__all__ = ["RecentEvents", "decode"]

Opening = tuple[tuple[str, object], ...]
"""A stream's first events as ``(event_id, event)`` pairs, in stream order from version 1."""


class RecentEvents:
    """The last ``capacity`` events handed over, by event id; thread-safe."""

    def __init__(self, *, capacity: int = 16_384, openings: int = 1_024) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if openings < 1:
            raise ValueError(f"openings must be at least 1, got {openings}")
        self._capacity = capacity
        self._openings_capacity = openings
        self._lock = threading.Lock()
        self._events: OrderedDict[str, object] = OrderedDict()
        self._openings: OrderedDict[str, Opening] = OrderedDict()

    def remember(self, events: Iterable[tuple[str, object]]) -> None:
        """Keep ``(event_id, event)`` pairs of events this process saw committed; the oldest
        go once more than ``capacity`` are kept."""
        with self._lock:
            self._events.update(events)
            for _ in range(len(self._events) - self._capacity):
                self._events.popitem(last=False)

    def opened(self, stream_id: str, events: Sequence[tuple[str, object]]) -> None:
        """``stream_id`` was created, holding exactly ``events`` (``(event_id, event)`` pairs
        from version 1), by an append this process saw committed. Kept until a hosted stream
        takes it (the oldest go once more than ``openings`` wait)."""
        with self._lock:
            self._openings[stream_id] = tuple(events)
            for _ in range(len(self._openings) - self._openings_capacity):
                self._openings.popitem(last=False)

    def take_opening(self, stream_id: str) -> Opening | None:
        """The events ``stream_id`` was opened with, handed over once (``None`` if it was not
        opened here, already taken, or evicted). They are the stream's state when it was
        opened; a writer that appended since is found by the next append's expected version."""
        with self._lock:
            return self._openings.pop(stream_id, None)

    def get(self, record: RecordedEvent) -> object | None:
        """The domain event handed over for ``record``, if it was (and is still kept)."""
        # A replay from position 0 has nothing handed over: spare it the id's text per event.
        if not self._events:
            return None
        return self._events.get(str(record.event_id))

    def decode(self, record: RecordedEvent) -> object:
        """The domain event stored in ``record``: the one handed over, else decoded."""
        # :meth:`get` and :func:`decode` written out: a replay comes here for most events.
        if self._events:
            event = self._events.get(str(record.event_id))
            if event is not None:
                return event
        return from_data(record.type, record.schema_version, record.data)

    def __len__(self) -> int:
        return len(self._events)


def decode(record: RecordedEvent) -> object:
    """The domain event stored in ``record``, decoded from its data."""
    return from_data(record.type, record.schema_version, record.data)
