"""LogFollower: reads what is appended; with a minimum interval, reads no more often than that."""

from __future__ import annotations

import threading
import time

import pytest

from fleetledger.adapters.runtime import LogFollower
from fleetledger.eventstore import EventStore, NewEvent


class CountingModel:
    """Reads every event after its position and notes when each non-empty read happened."""

    def __init__(self) -> None:
        self.position = 0
        self.reads: list[tuple[float, int]] = []
        self.changed = threading.Condition()

    def catch_up(self, store: EventStore) -> int:
        records = store.read_all(after=self.position, limit=1000)
        if records:
            with self.changed:
                self.position = records[-1].global_position
                self.reads.append((time.monotonic(), len(records)))
                self.changed.notify_all()
        return len(records)

    def wait_for(self, position: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.position >= position, timeout=10)


def append(store: EventStore, count: int) -> int:
    result = store.append("follow-1", [NewEvent(type="test.Noted", data={}) for _ in range(count)])
    return result.last_position


def test_it_reads_each_append_as_it_lands(store: EventStore) -> None:
    model = CountingModel()
    follower = LogFollower(store, model).start()
    try:
        model.wait_for(append(store, 1))
        model.wait_for(append(store, 2))
    finally:
        follower.stop()

    assert [count for _, count in model.reads] == [1, 2]


def test_with_a_minimum_interval_the_next_read_waits_it_out(store: EventStore) -> None:
    """Appended right after a read, the next events are read only once the interval has
    passed: a burst costs a read per interval, not one per append."""
    model = CountingModel()
    follower = LogFollower(store, model, min_interval_seconds=0.3).start()
    try:
        model.wait_for(append(store, 1))
        last = 0
        for _ in range(5):
            last = append(store, 1)
        model.wait_for(last)
    finally:
        follower.stop()

    (first, _), (second, burst) = model.reads
    assert second - first >= 0.3
    assert burst == 5


def test_a_negative_interval_is_refused(store: EventStore) -> None:
    with pytest.raises(ValueError, match="min_interval_seconds"):
        LogFollower(store, CountingModel(), min_interval_seconds=-1)
