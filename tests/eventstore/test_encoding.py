"""Bad appends are refused with a clear InvalidEvent before anything is written."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from fleetledger.eventstore import (
    EventStore,
    InvalidEvent,
    NewEvent,
    StreamAppend,
    open_store,
)
from fleetledger.eventstore._encoding import DEFAULT_MAX_EVENT_BYTES, canonical_json
from tests.eventstore.support import new_events

ONE_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


@pytest.fixture
def seeded(store: EventStore) -> EventStore:
    """A store holding one event, so "nothing written" is checked against a non-empty log."""
    store.append("vm-0", new_events(1))
    return store


def assert_refused(store: EventStore, append: Callable[[], object], match: str) -> None:
    """``append`` raises InvalidEvent matching ``match`` and the log is unchanged."""
    before = store.read_all()

    with pytest.raises(InvalidEvent, match=match):
        append()

    assert store.head() == 1
    assert store.read_all() == before


class TestData:
    @pytest.mark.parametrize(
        "data",
        [
            {"tags": {"a", "b"}},
            {"at": datetime(2026, 1, 1, tzinfo=UTC)},
            {"x": math.nan},
            {"x": math.inf},
            {"nested": [{"deep": b"bytes"}]},
            {("tuple", "key"): 1},
        ],
        ids=["set", "datetime", "nan", "infinity", "bytes", "tuple-key"],
    )
    def test_data_that_is_not_json(self, seeded: EventStore, data: dict[Any, Any]) -> None:
        """Data JSON cannot represent exactly is refused, naming the event type."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("Bad", data)]),
            match=r"data of 'Bad' is not JSON-serialisable",
        )

    def test_data_already_encoded_is_stored_as_given(self, seeded: EventStore) -> None:
        """``data_json`` spares the store a second encoding: it is what is stored and hashed."""
        data = {"b": [1, 2.5], "a": "é"}
        seeded.append("vm-1", [NewEvent("T", data, data_json=canonical_json(data, what="data"))])

        [stored] = seeded.read_stream("vm-1")
        assert stored.data == data
        assert seeded.verify().ok

    def test_data_json_must_be_text(self, seeded: EventStore) -> None:
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("T", {}, data_json=b"{}")]),  # type: ignore[arg-type]
            match="data_json of 'T' must be text",
        )

    def test_metadata_that_is_not_json(self, seeded: EventStore) -> None:
        """Metadata is held to the same rule as data."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("Bad", {}, metadata={"at": {1, 2}})]),
            match="metadata of 'Bad'",
        )

    @pytest.mark.parametrize("data", [["a", "list"], "text", None])
    def test_data_must_be_a_mapping(self, seeded: EventStore, data: Any) -> None:
        """Event data must be a JSON object, not a list, string or null."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("Bad", data)]),
            match="must be a JSON object",
        )

    def test_text_that_is_not_unicode(self, seeded: EventStore) -> None:
        """A lone surrogate in the data is refused (it cannot be stored as UTF-8)."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("Bad", {"s": "\ud800"})]),
            match="not valid Unicode",
        )

    @pytest.mark.parametrize("schema_version", [0, -1, True, 1.0, "2"])
    def test_schema_version(self, seeded: EventStore, schema_version: Any) -> None:
        """schema_version must be an int >= 1."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("T", {}, schema_version=schema_version)]),
            match="schema_version",
        )


class TestSize:
    @pytest.fixture
    def small(self, store_url: str) -> Iterator[EventStore]:
        """A store with a 100-byte limit, pre-seeded with one event."""
        with open_store(store_url, max_event_bytes=100) as store:
            store.append("vm-0", new_events(1))
            yield store

    @staticmethod
    def sized(total: int) -> NewEvent:
        """An event whose data plus metadata text is exactly ``total`` bytes."""
        # '{"b":""}' is 8 bytes and the empty metadata '{}' 2 more.
        return NewEvent("Sized", {"b": "x" * (total - 10)})

    def test_an_event_at_the_limit_is_accepted(self, small: EventStore) -> None:
        """Data plus metadata of exactly max_event_bytes is accepted."""
        event = self.sized(100)
        assert len(canonical_json(event.data, what="data")) + len("{}") == 100

        small.append("vm-1", [event])

        assert small.head() == 2

    def test_an_event_over_the_limit_is_refused(self, small: EventStore) -> None:
        """One byte over max_event_bytes is refused, with the size and limit in the message."""
        assert_refused(small, lambda: small.append("vm-1", [self.sized(101)]), match="101 bytes")

    def test_the_limit_counts_metadata(self, small: EventStore) -> None:
        """Metadata counts towards the limit."""
        event = NewEvent("Sized", {"b": "x" * 80}, metadata={"m": "y" * 20})

        assert_refused(small, lambda: small.append("vm-1", [event]), match="limit is 100")

    def test_the_limit_counts_utf8_bytes(self, small: EventStore) -> None:
        """Size is measured in UTF-8 bytes, not characters."""
        event = NewEvent("Sized", {"b": "ü" * 46})  # 92 bytes of text, 46 characters

        assert_refused(small, lambda: small.append("vm-1", [event]), match="limit is 100")

    def test_the_default_limit_is_one_mebibyte(self, seeded: EventStore) -> None:
        """Without max_event_bytes an event over 1 MiB is refused."""
        assert DEFAULT_MAX_EVENT_BYTES == 1024 * 1024
        blob = NewEvent("Blob", {"b": "x" * DEFAULT_MAX_EVENT_BYTES})

        assert_refused(seeded, lambda: seeded.append("vm-1", [blob]), match="Store large payloads")


class TestNames:
    @pytest.mark.parametrize(
        ("stream_id", "match"),
        [
            ("", "non-empty string"),
            (42, "non-empty string"),
            (None, "non-empty string"),
            (b"vm-1", "non-empty string"),
            ("vm\n1", "control character"),
            ("vm\x001", "control character"),
            ("vm\x7f", "control character"),
            ("v" * 201, "limit is 200"),
            ("vm-\ud800", "Unicode"),
        ],
        ids=["empty", "int", "none", "bytes", "newline", "nul", "del", "too-long", "surrogate"],
    )
    def test_bad_stream_ids(self, seeded: EventStore, stream_id: Any, match: str) -> None:
        """Stream ids must be non-empty text of at most 200 characters without control
        characters."""
        assert_refused(seeded, lambda: seeded.append(stream_id, new_events(1)), match=match)

    @pytest.mark.parametrize("event_type", ["", "Tab\tbed", "x" * 201, 7, "Bad\ud800"], ids=str)
    def test_bad_event_types(self, seeded: EventStore, event_type: Any) -> None:
        """Event types follow the same rules as stream ids."""
        assert_refused(
            seeded, lambda: seeded.append("vm-1", [NewEvent(event_type, {})]), match="event type"
        )

    def test_a_long_valid_stream_id_is_accepted(self, store: EventStore) -> None:
        """200 characters, including non-ASCII ones, is within the limit."""
        stream = "ü" * 200

        store.append(stream, new_events(1))

        assert [e.stream_id for e in store.read_stream(stream)] == [stream]


class TestExpectedVersionValues:
    @pytest.mark.parametrize("expected", [-1, -2, "1", 1.5, True, False, None, "ANY"], ids=repr)
    def test_unknown_values_are_refused(self, seeded: EventStore, expected: Any) -> None:
        """Only ANY, NO_STREAM, STREAM_EXISTS and ints >= 0 are expected versions."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-0", new_events(1), expected_version=expected),
            match="expected_version must be",
        )


class TestEventList:
    def test_no_events(self, seeded: EventStore) -> None:
        """An append with an empty list is refused."""
        assert_refused(seeded, lambda: seeded.append("vm-1", []), match="has no events")

    @pytest.mark.parametrize(
        "events",
        [
            [{"type": "T", "data": {}}],
            [NewEvent("T", {}), "T"],
        ],
        ids=["dict", "str"],
    )
    def test_items_must_be_new_events(self, seeded: EventStore, events: list[Any]) -> None:
        """Items that are not NewEvent are refused, naming what was given."""
        assert_refused(seeded, lambda: seeded.append("vm-1", events), match="expected a NewEvent")

    @pytest.mark.parametrize("events", [NewEvent("T", {}), "events", {"a": 1}])
    def test_events_must_be_a_list(self, seeded: EventStore, events: Any) -> None:
        """A bare event, a string or a mapping is not a list of events."""
        assert_refused(seeded, lambda: seeded.append("vm-1", events), match="list of NewEvent")

    @pytest.mark.parametrize("event_id", ["not-a-uuid", "", 12345, ONE_ID.bytes])
    def test_bad_event_ids(self, seeded: EventStore, event_id: Any) -> None:
        """event_id must be a UUID or a string that parses as one."""
        assert_refused(
            seeded,
            lambda: seeded.append("vm-1", [NewEvent("T", {}, event_id=event_id)]),
            match="event_id",
        )

    def test_repeated_event_id_in_one_append(self, seeded: EventStore) -> None:
        """One append carrying the same id twice is refused."""
        events = [NewEvent("T", {}, event_id=ONE_ID), NewEvent("T", {}, event_id=str(ONE_ID))]

        assert_refused(seeded, lambda: seeded.append("vm-1", events), match="repeats an event id")

    def test_repeated_event_id_across_streams_of_append_many(self, seeded: EventStore) -> None:
        """append_many carrying one id in two streams is refused."""
        appends = [
            StreamAppend("vm-1", [NewEvent("T", {}, event_id=ONE_ID)]),
            StreamAppend("vm-2", [NewEvent("T", {}, event_id=ONE_ID)]),
        ]

        assert_refused(seeded, lambda: seeded.append_many(appends), match="repeats an event id")

    def test_a_bad_event_anywhere_refuses_the_whole_append(self, seeded: EventStore) -> None:
        """One invalid event among valid ones refuses the append; the valid ones aren't written."""
        events = [NewEvent("T", {}), NewEvent("T", {}), NewEvent("T", {"x": math.nan})]

        assert_refused(seeded, lambda: seeded.append("vm-1", events), match="JSON")

    def test_a_bad_stream_anywhere_refuses_append_many(self, seeded: EventStore) -> None:
        """An invalid part of append_many refuses every stream of it."""
        appends = [StreamAppend("vm-1", new_events(1)), StreamAppend("", new_events(1))]

        assert_refused(seeded, lambda: seeded.append_many(appends), match="stream id")
