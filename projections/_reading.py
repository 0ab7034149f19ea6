"""Reading the log in pages: the one loop every read model catches up and replays with."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator, Sequence

from fleetledger.eventstore import EventStore, RecordedEvent

__all__ = [
    "PAGE",
    "YOUNG_COLLECTION_THRESHOLD",
    "bulk_read",
    "catch_up",
    "events_after",
    "position_in_log",
]

PAGE = 1000

YOUNG_COLLECTION_THRESHOLD = 50_000
"""Allocations between two collections of the youngest generation while the log is folded
(Python's default is 700)."""


class _BulkReads:
    """How many folds of the log are running; the collector's thresholds they replaced."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.saved = gc.get_threshold()
        self.raised: tuple[int, ...] | None = None


_bulk = _BulkReads()


@contextlib.contextmanager
def bulk_read() -> Iterator[None]:
    """Collect garbage less often while the log is folded; the thresholds come back after the
    last fold running ends.

    Folding allocates several objects per event and keeps many of them (the models' states), so
    with the default thresholds the collector ran every few events, its older generations over
    ever more surviving objects as the models grew: a third of the wall time of a million-event
    replay (``fleetledger bench replay``: 26 s, 18 s with these thresholds). Nothing else
    changes, and garbage is still collected. For the one-shot rebuilds (``replay``, the bench),
    not for a long-running process's catch-ups: the thresholds are the process's.
    """
    with _bulk.lock:
        if _bulk.running == 0:
            _bulk.saved = gc.get_threshold()
            young, *older = _bulk.saved
            _bulk.raised = None
            if 0 < young < YOUNG_COLLECTION_THRESHOLD:  # 0: collection is off; leave it so
                gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)
                _bulk.raised = gc.get_threshold()
        _bulk.running += 1
    try:
        yield
    finally:
        with _bulk.lock:
            _bulk.running -= 1
            # Thresholds someone else set meanwhile (serve's FrozenStartupHeap) are theirs.
            if _bulk.running == 0 and _bulk.raised == gc.get_threshold():
                gc.set_threshold(*_bulk.saved)


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
