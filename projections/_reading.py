"""Reading the log in pages: the one loop every read model catches up and replays with."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from fleetledger.eventstore import EventStore, RecordedEvent

__all__ = ["PAGE", "catch_up", "events_after", "position_in_log"]

PAGE = 1000


def events_after(
    store: EventStore, after: int, *, types: Sequence[str], until: int | None = None
) -> Iterator[RecordedEvent]:
    """The events of ``types`` after position ``after`` (up to ``until`` included), in order,
    read a page at a time."""
    while True:
        records = store.read_all(after=after, limit=PAGE, types=list(types))
        for record in records:
            if until is not None and record.global_position > until:
                return
            yield record
        if len(records) < PAGE:
            return
        after = records[-1].global_position


def position_in_log(store: EventStore, position: int | None) -> int:
    """``position``, or the head when ``None``; ``ValueError`` for one the log has not reached."""
    head = store.head()
    if position is None:
        return head
    if position < 0 or position > head:
        raise ValueError(f"position {position} is outside the log (0 to {head}); pick one in it")
    return position


def catch_up(
    store: EventStore,
    after: int,
    *,
    types: Sequence[str],
    apply: Callable[[RecordedEvent], None],
    to_head: bool = False,
) -> tuple[int, int | None]:
    """Apply every event of ``types`` after ``after``; returns how many were applied and, with
    ``to_head``, the head the model is now current to (else ``None``).

    Everything up to a head read first is committed (global order is commit order), so once the
    filtered read is done the model is current up to it: its position may move past the events of
    other capabilities, so that a dump or a readiness check can compare it with the head. That
    costs a query, which a follower woken by every append does without.
    """
    head = store.head() if to_head else None
    applied = 0
    for record in events_after(store, after, types=types, until=head):
        apply(record)
        applied += 1
    return applied, head
