"""The real store behind a counter: how many commits its callers make, how many streams they
read back, where their reads by type start. For tests that pin a duty's cost (commits per pass,
reads per rebuild, what a follower reads again), not its time."""

from __future__ import annotations

from collections.abc import Sequence

from fleetledger.eventstore import EventStore, RecordedEvent, StreamAppend, TypesPage

__all__ = ["CountingStore"]


class CountingStore:
    """Every append call is one commit; ``read_stream`` and ``load_snapshot`` are stream reads;
    ``types_reads_after`` lists where each ``read_types`` started."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.commits = 0
        self.stream_reads = 0
        self.types_reads_after: list[int] = []

    def append(self, *args: object, **kwargs: object) -> object:
        self.commits += 1
        return self._inner.append(*args, **kwargs)  # type: ignore[arg-type]

    def append_many(self, appends: list[StreamAppend]) -> object:
        self.commits += 1
        return self._inner.append_many(appends)

    def append_each(self, transactions: Sequence[Sequence[StreamAppend]]) -> object:
        self.commits += 1
        return self._inner.append_each(transactions)

    def read_stream(self, stream_id: str, **options: object) -> list[RecordedEvent]:
        self.stream_reads += 1
        return self._inner.read_stream(stream_id, **options)  # type: ignore[arg-type]

    def read_types(self, *, after: int, types: Sequence[str], limit: int = 1000) -> TypesPage:
        self.types_reads_after.append(after)
        return self._inner.read_types(after=after, types=types, limit=limit)

    def load_snapshot(self, stream_id: str) -> object:
        self.stream_reads += 1
        return self._inner.load_snapshot(stream_id)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)
