"""append_many: one atomic append over several streams."""

from __future__ import annotations

import pytest

from fleetledger.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    AppendResult,
    EventStore,
    InvalidEvent,
    StreamAppend,
    WrongExpectedVersion,
)
from tests.eventstore.support import new_events


class TestAppendMany:
    def test_writes_every_stream(self, store: EventStore) -> None:
        """Every stream of the call gets its events, with its own versions."""
        store.append("vm-a", new_events(1))

        store.append_many(
            [
                StreamAppend("vm-a", new_events(2), expected_version=1),
                StreamAppend("vm-b", new_events(1), expected_version=NO_STREAM),
            ]
        )

        assert [e.stream_version for e in store.read_stream("vm-a")] == [1, 2, 3]
        assert [e.stream_version for e in store.read_stream("vm-b")] == [1]
        assert store.head() == 4

    def test_results_come_back_in_the_callers_order(self, store: EventStore) -> None:
        """Results line up with the appends as given, each naming where its stream landed."""
        results = store.append_many(
            [
                StreamAppend("vm-c", new_events(1)),
                StreamAppend("vm-a", new_events(3)),
                StreamAppend("vm-b", new_events(2)),
            ]
        )

        for stream, result in zip(("vm-c", "vm-a", "vm-b"), results, strict=True):
            events = store.read_stream(stream)
            assert result == AppendResult(
                events[0].global_position, events[-1].global_position, len(events)
            )
        assert [r.first_position for r in results] == [1, 2, 5]

    def test_positions_follow_the_callers_order_not_the_stream_ids(self, store: EventStore) -> None:
        """A cause listed first gets the lower positions even when its stream id sorts last."""
        store.append_many(
            [
                StreamAppend("z-1", new_events(2, type="Cause")),
                StreamAppend("a-1", new_events(1, type="Effect")),
                StreamAppend("m-1", new_events(1, type="Effect")),
            ]
        )

        assert [(e.global_position, e.stream_id, e.type) for e in store.read_all()] == [
            (1, "z-1", "Cause"),
            (2, "z-1", "Cause"),
            (3, "a-1", "Effect"),
            (4, "m-1", "Effect"),
        ]
        assert store.verify().ok

    def test_events_keep_their_order_within_each_append(self, store: EventStore) -> None:
        """Within one stream's part the events take consecutive positions in the order given."""
        store.append_many(
            [
                StreamAppend("b-1", new_events(3, start=10)),
                StreamAppend("a-1", new_events(2, start=20)),
            ]
        )

        assert [e.data["n"] for e in store.read_all()] == [10, 11, 12, 20, 21]

    def test_events_are_contiguous_in_the_log(self, store: EventStore) -> None:
        """One call's events occupy consecutive global positions."""
        store.append("vm-x", new_events(1))

        results = store.append_many(
            [StreamAppend("vm-a", new_events(2)), StreamAppend("vm-b", new_events(2))]
        )

        assert min(r.first_position for r in results) == 2
        assert max(r.last_position for r in results) == 5

    @pytest.mark.parametrize("conflicting", ["vm-a", "vm-b", "vm-c"])
    def test_a_conflict_on_one_stream_writes_nothing_anywhere(
        self, store: EventStore, conflicting: str
    ) -> None:
        """A version conflict on any one stream aborts the whole call and names that stream."""
        store.append(conflicting, new_events(2))
        before = store.head()
        appends = [
            StreamAppend(stream, new_events(1), expected_version=NO_STREAM)
            for stream in ("vm-b", "vm-c", "vm-a")
        ]

        with pytest.raises(WrongExpectedVersion) as raised:
            store.append_many(appends)

        assert (raised.value.stream_id, raised.value.actual) == (conflicting, 2)
        assert raised.value.expected is NO_STREAM
        assert store.head() == before
        for stream in {"vm-a", "vm-b", "vm-c"} - {conflicting}:
            assert store.stream_version(stream) == 0

    def test_the_first_conflicting_stream_in_the_callers_order_is_reported(
        self, store: EventStore
    ) -> None:
        """With several conflicts, the one reported is the first the caller listed."""
        with pytest.raises(WrongExpectedVersion) as raised:
            store.append_many(
                [
                    StreamAppend("vm-z", new_events(1), expected_version=STREAM_EXISTS),
                    StreamAppend("vm-m", new_events(1), expected_version=3),
                ]
            )

        assert raised.value.stream_id == "vm-z"
        assert store.head() == 0

    def test_a_stream_named_twice_is_invalid(self, store: EventStore) -> None:
        """The same stream twice in one call is refused before anything is written."""
        with pytest.raises(InvalidEvent, match="twice"):
            store.append_many(
                [StreamAppend("vm-a", new_events(1)), StreamAppend("vm-a", new_events(1), ANY)]
            )
        assert store.head() == 0

    def test_no_appends_is_invalid(self, store: EventStore) -> None:
        """An empty list is refused."""
        with pytest.raises(InvalidEvent, match="non-empty"):
            store.append_many([])

    def test_items_must_be_stream_appends(self, store: EventStore) -> None:
        """Anything but StreamAppend items is refused and nothing is written."""
        with pytest.raises(InvalidEvent, match="StreamAppend"):
            store.append_many(
                [StreamAppend("vm-a", new_events(1)), ("vm-b", new_events(1))]  # type: ignore[list-item]
            )
        assert store.head() == 0
