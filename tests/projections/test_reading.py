"""Reading the log a page at a time, the next page read ahead while the caller folds."""

from __future__ import annotations

import contextlib
import threading
from typing import cast

import pytest

from fleetledger.eventstore import EventStore, NewEvent, RecordedEvent
from fleetledger.eventstore.errors import StoreUnavailable
from fleetledger.projections._reading import catch_up, log_pages


@pytest.fixture
def log(sqlite_store: EventStore) -> EventStore:
    for stream in range(5):
        sqlite_store.append(f"s-{stream}", [NewEvent("T", {"i": i}) for i in range(5)])
    return sqlite_store


def _positions(pages: list[list[RecordedEvent]]) -> list[list[int]]:
    return [[record.global_position for record in page] for page in pages]


class _FailingOnSecondPage:
    """A store whose second read fails, as a database that went away would."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.reads = 0

    def read_all(self, *, after: int, limit: int) -> list[RecordedEvent]:
        self.reads += 1
        if self.reads == 2:
            raise StoreUnavailable("the database went away")
        return self._store.read_all(after=after, limit=limit)


class TestLogPages:
    def test_the_whole_log_in_order_in_pages(self, log: EventStore) -> None:
        """Every event once, in log order, in pages of the size asked (the last one shorter)."""
        pages = list(log_pages(log, page=10))
        assert _positions(pages) == [list(range(1, 11)), list(range(11, 21)), [21, 22, 23, 24, 25]]

    def test_a_log_ending_on_a_page_boundary_has_no_empty_page(self, log: EventStore) -> None:
        """Pages exactly dividing the log end with the last full one."""
        assert [len(page) for page in log_pages(log, page=5)] == [5] * 5

    def test_the_first_events_after_a_position(self, log: EventStore) -> None:
        """``after`` and ``events``: the ``events`` events after that position, across pages."""
        pages = list(log_pages(log, page=4, after=3, events=6))
        assert _positions(pages) == [[4, 5, 6, 7], [8, 9]]

    def test_an_empty_log_has_no_pages(self, sqlite_store: EventStore) -> None:
        assert list(log_pages(sqlite_store, page=10)) == []

    def test_a_caller_stopping_early_leaves_no_reader_behind(self, log: EventStore) -> None:
        """Closing the pages after the first (a replay stopping at a time) waits for the page
        read ahead and ends the reading thread."""
        before = threading.active_count()
        with contextlib.closing(log_pages(log, page=10)) as pages:
            first = next(pages)
        assert len(first) == 10
        assert threading.active_count() == before

    def test_a_failed_read_reaches_the_caller(self, log: EventStore) -> None:
        """A page that cannot be read raises where the caller asks for it, after the pages
        read before it."""
        store = _FailingOnSecondPage(log)
        pages = log_pages(cast(EventStore, store), page=10)
        assert len(next(pages)) == 10
        with pytest.raises(StoreUnavailable, match="went away"):
            next(pages)

    def test_a_page_size_below_one_is_refused(self, log: EventStore) -> None:
        with pytest.raises(ValueError, match="at least 1"):
            list(log_pages(log, page=0))


class TestCatchUp:
    def test_the_model_is_current_past_the_other_types(self, log: EventStore) -> None:
        """Its events applied, and the position at the head: the next catch-up does not read
        the other events again."""
        log.append("rare-1", [NewEvent("Rare", {})])
        log.append("s-0", [NewEvent("T", {})], expected_version=5)
        applied: list[RecordedEvent] = []

        count, through = catch_up(log, 0, types=["Rare"], apply=applied.append)

        assert (count, through) == (1, 27)
        assert [record.global_position for record in applied] == [26]

    def test_nothing_new_leaves_a_model_ahead_where_it_is(self, log: EventStore) -> None:
        assert catch_up(log, 30, types=["T"], apply=lambda record: None) == (0, 30)
