"""Idempotent appends: a faithful retry returns the original result; any other reuse conflicts."""

from __future__ import annotations

import pytest

from fleetledger.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    DuplicateEventId,
    EventStore,
    ExpectedVersion,
    NewEvent,
    StreamAppend,
)
from tests.eventstore.support import events_with_ids, fresh_ids, new_events, raw_rows


class TestFaithfulRetry:
    @pytest.mark.parametrize("expected", [NO_STREAM, 0, ANY])
    def test_returns_the_original_result(
        self, store: EventStore, expected: ExpectedVersion
    ) -> None:
        """Re-appending the same ids at the same versions returns the first AppendResult."""
        ids = fresh_ids(3)
        store.append("vm-0", new_events(1))
        original = store.append("vm-1", events_with_ids(*ids), expected_version=expected)

        again = store.append("vm-1", events_with_ids(*ids), expected_version=expected)

        assert again == original
        assert store.head() == 4
        assert len(raw_rows(store)) == 4

    def test_any_retry_of_an_exact_append(self, store: EventStore) -> None:
        """A retry with ANY of an append made with an exact version is still a replay."""
        ids = fresh_ids(2)
        original = store.append("vm-1", events_with_ids(*ids), expected_version=0)

        assert store.append("vm-1", events_with_ids(*ids), expected_version=ANY) == original
        assert store.stream_version("vm-1") == 2

    def test_stream_exists_retry(self, store: EventStore) -> None:
        """A retry with STREAM_EXISTS returns the original result."""
        store.append("vm-1", new_events(1))
        ids = fresh_ids(2)
        original = store.append("vm-1", events_with_ids(*ids), expected_version=STREAM_EXISTS)

        again = store.append("vm-1", events_with_ids(*ids), expected_version=STREAM_EXISTS)

        assert again == original

    def test_retry_after_the_stream_moved_on(self, store: EventStore) -> None:
        """A late retry still returns the original result after later appends to the stream."""
        ids = fresh_ids(2)
        original = store.append("vm-1", events_with_ids(*ids), expected_version=0)
        store.append("vm-1", new_events(3), expected_version=2)
        store.append("vm-2", new_events(1))

        assert store.append("vm-1", events_with_ids(*ids), expected_version=0) == original
        assert store.head() == 6

    def test_ids_as_strings_match_uuids(self, store: EventStore) -> None:
        """An event id given as a string is the same id as the UUID it spells."""
        [event_id] = fresh_ids(1)
        original = store.append("vm-1", [NewEvent("T", {}, event_id=event_id)])

        again = store.append("vm-1", [NewEvent("T", {}, event_id=str(event_id))])

        assert again == original
        assert store.head() == 1

    def test_an_id_in_capitals_is_the_same_id(self, store: EventStore) -> None:
        [event_id] = fresh_ids(1)
        original = store.append("vm-1", [NewEvent("T", {}, event_id=str(event_id))])

        again = store.append("vm-1", [NewEvent("T", {}, event_id=str(event_id).upper())])

        assert again == original
        assert store.head() == 1

    def test_retry_of_append_many(self, store: EventStore) -> None:
        """Re-sending a multi-stream append returns the original results in the caller's order."""
        a, b = fresh_ids(2)
        appends = [
            StreamAppend("vm-b", events_with_ids(a), expected_version=NO_STREAM),
            StreamAppend("vm-a", events_with_ids(b), expected_version=NO_STREAM),
        ]
        original = store.append_many(appends)

        assert store.append_many(appends) == original
        assert store.head() == 2


class TestReuseElsewhere:
    def test_same_ids_in_another_stream(self, store: EventStore) -> None:
        """The same ids appended to another stream raise DuplicateEventId naming an id."""
        ids = fresh_ids(2)
        store.append("vm-1", events_with_ids(*ids))

        with pytest.raises(DuplicateEventId) as raised:
            store.append("vm-2", events_with_ids(*ids))

        assert raised.value.event_id == str(ids[0])
        assert store.head() == 2
        assert store.stream_version("vm-2") == 0

    def test_same_ids_at_another_version(self, store: EventStore) -> None:
        """The same ids with an expected version they were not written at are a duplicate."""
        ids = fresh_ids(2)
        store.append("vm-1", events_with_ids(*ids), expected_version=0)

        with pytest.raises(DuplicateEventId):
            store.append("vm-1", events_with_ids(*ids), expected_version=2)
        assert store.head() == 2

    def test_same_ids_in_another_order(self, store: EventStore) -> None:
        """Reordered ids are not a retry of the original append."""
        a, b = fresh_ids(2)
        store.append("vm-1", events_with_ids(a, b))

        with pytest.raises(DuplicateEventId):
            store.append("vm-1", events_with_ids(b, a))
        assert store.head() == 2

    def test_partly_stored_ids(self, store: EventStore) -> None:
        """An append mixing a stored id with a new one conflicts and writes neither."""
        stored, new = fresh_ids(2)
        store.append("vm-1", events_with_ids(stored))

        with pytest.raises(DuplicateEventId) as raised:
            store.append("vm-1", events_with_ids(stored, new))

        assert raised.value.event_id == str(stored)
        assert [row["event_id"] for row in raw_rows(store)] == [stored]

    def test_partly_replayed_append_many(self, store: EventStore) -> None:
        """A multi-stream append where one stream's part is stored and another's is new
        conflicts, and the new part is not written."""
        old, new = fresh_ids(2)
        store.append("vm-a", events_with_ids(old), expected_version=NO_STREAM)

        with pytest.raises(DuplicateEventId) as raised:
            store.append_many(
                [
                    StreamAppend("vm-a", events_with_ids(old), expected_version=NO_STREAM),
                    StreamAppend("vm-b", events_with_ids(new), expected_version=NO_STREAM),
                ]
            )

        assert raised.value.event_id == str(old)
        assert store.head() == 1
        assert store.stream_version("vm-b") == 0

    def test_retry_spanning_two_appends_reports_real_positions(self, store: EventStore) -> None:
        """A retry whose ids were stored by two appends reports the positions they really
        hold, not a made-up contiguous range."""
        a, b = fresh_ids(2)
        store.append("vm-1", events_with_ids(a), expected_version=0)
        store.append("vm-2", new_events(1))
        store.append("vm-1", events_with_ids(b), expected_version=1)

        result = store.append("vm-1", events_with_ids(a, b), expected_version=0)

        positions = {row["event_id"]: row["global_position"] for row in raw_rows(store)}
        assert (result.first_position, result.last_position) == (positions[a], positions[b])
        assert result.stream_version == 2
        assert store.head() == 3
