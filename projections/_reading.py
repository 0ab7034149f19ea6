"""Reading the log in pages: the one loop every read model catches up and replays with."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from fleetledger.eventstore import EventStore, RecordedEvent

__all__ = [
    "PAGE",
    "bulk_read",
    "catch_up",
    "events_after",
    "log_pages",
    "position_in_log",
]

PAGE = 1000


class _BulkReads:
    """How many folds of the log are running, and whether the first one turned the collector
    off (it was on)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.turned_off = False


_bulk = _BulkReads()


@contextlib.contextmanager
def bulk_read() -> Iterator[None]:
    """Turn the collector's automatic runs off while the log is folded; they come back once the
    last fold running ends.

    Folding allocates several objects per event and keeps many of them (the models' states), so
    the collector ran every few events, over ever more surviving objects as the models grew: a
    third of the wall time of a million-event replay with the default thresholds (``fleetledger
    bench replay``: 26 s, 18 s with the youngest generation's raised to 50,000), and still a
    twentieth with it raised. It finds nothing to free: a fold frees what it replaces by
    reference counting and makes no reference cycles (a million events left four unreachable
    objects, none of them the models'; the bench's tests check that a longer log leaves no more),
    so each run was pure cost. Garbage made meanwhile waits for the first collection after the
    fold. For the one-shot rebuilds (``replay``, the benches), not for a long-running process's
    catch-ups: the collector is the process's.
    """
    with _bulk.lock:
        if _bulk.running == 0:
            _bulk.turned_off = gc.isenabled()
            gc.disable()
        _bulk.running += 1
    try:
        yield
    finally:
        with _bulk.lock:
            _bulk.running -= 1
            # On again only if nobody else turned it on meanwhile: then it is theirs.
            if _bulk.running == 0 and _bulk.turned_off and not gc.isenabled():
                gc.enable()


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


def log_pages(
    store: EventStore, *, page: int, after: int = 0, events: int | None = None
) -> Generator[list[RecordedEvent], None, None]:
    """The log after position ``after`` (its first ``events`` events, or all of it), a page of
    ``page`` events at a time, in order; the next page is read in a thread of its own while the
    caller folds the one before.

    Most of a page's read is the server's: finding and sending the rows, while this process
    waits on the socket with the interpreter released. Read in turn, a replay sat idle that long
    on every page (``fleetledger bench replay``: a sixth of its wall time on Postgres); read
    ahead, the server works while this process folds. Turning the rows into records holds the
    interpreter as folding does, so that part is no faster, and only one page is read ahead:
    the pages held stay two.
    """
    if page < 1:
        raise ValueError(f"page must be at least 1, got {page}")

    def limit_after(read: int) -> int:
        return page if events is None else min(page, events - read)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-pages") as reader:
        read, limit = 0, limit_after(0)
        pending: Future[list[RecordedEvent]] | None = None
        if limit > 0:
            pending = reader.submit(store.read_all, after=after, limit=limit)
        try:
            while pending is not None:
                records = pending.result()
                read += len(records)
                pending = None
                # A short page ends the log: there is nothing after it to read ahead.
                if len(records) == limit and limit_after(read) > 0:
                    limit = limit_after(read)
                    last = records[-1].global_position
                    pending = reader.submit(store.read_all, after=last, limit=limit)
                if records:
                    yield records
        finally:
            # A caller that stops early (an error, a replay up to a time) leaves the page read
            # ahead unused; leaving the executor waits for it.
            if pending is not None:
                pending.cancel()


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
) -> tuple[int, int]:
    """Apply every event of ``types`` after ``after``; returns how many were applied and the
    position the model is now current to.

    That position is past the other capabilities' events too (:meth:`EventStore.read_types`):
    a dump or a readiness check compares it with the head, and the next catch-up starts there
    instead of reading those events again.
    """
    applied = 0
    while True:
        page = store.read_types(after=after, types=types, limit=PAGE)
        for record in page.events:
            apply(record)
        applied += len(page.events)
        after = page.through
        if len(page.events) < PAGE:
            return applied, after
