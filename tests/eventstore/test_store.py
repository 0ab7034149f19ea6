"""The EventStore contract: versions, expectations, reads. Runs on SQLite and Postgres."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fleetledger.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    AppendResult,
    EventStore,
    ExpectedVersion,
    InvalidEvent,
    NewEvent,
    RecordedEvent,
    WrongExpectedVersion,
    open_store,
)
from tests.eventstore.support import new_events


def versions(events: list[RecordedEvent]) -> list[int]:
    return [e.stream_version for e in events]


class TestStreamVersions:
    def test_first_event_is_version_one(self, store: EventStore) -> None:
        """A new stream's first event is stream version 1 at global position 1."""
        result = store.append("vm-1", new_events(1), expected_version=NO_STREAM)

        assert result == AppendResult(first_position=1, last_position=1, stream_version=1)

    def test_versions_count_up_across_appends(self, store: EventStore) -> None:
        """Each append continues the stream's versions where the previous one stopped."""
        store.append("vm-1", new_events(3))
        result = store.append("vm-1", new_events(2))

        assert result == AppendResult(first_position=4, last_position=5, stream_version=5)
        assert versions(store.read_stream("vm-1")) == [1, 2, 3, 4, 5]

    def test_streams_have_independent_versions(self, store: EventStore) -> None:
        """Versions count per stream while global positions count over the whole log."""
        store.append("vm-1", new_events(2))
        result = store.append("vm-2", new_events(1))

        assert result == AppendResult(first_position=3, last_position=3, stream_version=1)


class TestExpectedVersion:
    def test_zero_is_no_stream(self, store: EventStore) -> None:
        """expected_version=0 creates a stream and is refused once it exists, like NO_STREAM."""
        store.append("vm-1", new_events(1), expected_version=0)

        with pytest.raises(WrongExpectedVersion) as zero:
            store.append("vm-1", new_events(1), expected_version=0)
        with pytest.raises(WrongExpectedVersion) as no_stream:
            store.append("vm-1", new_events(1), expected_version=NO_STREAM)
        assert (zero.value.expected, zero.value.actual) == (0, 1)
        assert (no_stream.value.expected, no_stream.value.actual) == (NO_STREAM, 1)

    def test_any_appends_at_whatever_version(self, store: EventStore) -> None:
        """ANY appends to a new and to an existing stream without a check."""
        first = store.append("vm-1", new_events(1), expected_version=ANY)
        second = store.append("vm-1", new_events(1), expected_version=ANY)

        assert (first.stream_version, second.stream_version) == (1, 2)

    def test_stream_exists_refuses_a_new_stream(self, store: EventStore) -> None:
        """STREAM_EXISTS on a stream without events raises with actual version 0."""
        with pytest.raises(WrongExpectedVersion) as raised:
            store.append("vm-1", new_events(1), expected_version=STREAM_EXISTS)

        assert raised.value.stream_id == "vm-1"
        assert raised.value.expected is STREAM_EXISTS
        assert raised.value.actual == 0

    def test_stream_exists_accepts_an_existing_stream(self, store: EventStore) -> None:
        """STREAM_EXISTS appends once the stream holds an event."""
        store.append("vm-1", new_events(2))

        result = store.append("vm-1", new_events(1), expected_version=STREAM_EXISTS)

        assert result.stream_version == 3

    def test_exact_version_is_accepted(self, store: EventStore) -> None:
        """An int expected version equal to the stream's version appends after it."""
        store.append("vm-1", new_events(2))

        result = store.append("vm-1", new_events(1), expected_version=2)

        assert result.stream_version == 3

    @pytest.mark.parametrize("expected", [1, 3, 7])
    def test_other_versions_are_refused(self, store: EventStore, expected: int) -> None:
        """A stale or future expected version raises with the stream, expectation and actual."""
        store.append("vm-1", new_events(2))

        with pytest.raises(WrongExpectedVersion) as raised:
            store.append("vm-1", new_events(1), expected_version=expected)

        assert (raised.value.stream_id, raised.value.expected, raised.value.actual) == (
            "vm-1",
            expected,
            2,
        )
        assert "vm-1" in str(raised.value)

    @pytest.mark.parametrize(
        ("stream", "expected"),
        [("vm-1", NO_STREAM), ("vm-1", 0), ("vm-1", 5), ("vm-new", STREAM_EXISTS), ("vm-new", 1)],
    )
    def test_a_refused_append_writes_nothing(
        self, store: EventStore, stream: str, expected: ExpectedVersion
    ) -> None:
        """After a version conflict the head, the stream and its version are unchanged."""
        store.append("vm-1", new_events(2))
        before = (store.head(), store.stream_version(stream), store.read_stream(stream))

        with pytest.raises(WrongExpectedVersion):
            store.append(stream, new_events(3), expected_version=expected)

        assert (store.head(), store.stream_version(stream), store.read_stream(stream)) == before


class TestReadStream:
    @pytest.fixture
    def five(self, store: EventStore) -> EventStore:
        """A store with vm-1 at version 5 and another stream interleaved."""
        store.append("vm-1", new_events(2))
        store.append("vm-2", new_events(2))
        store.append("vm-1", new_events(3, start=2))
        return store

    def test_reads_one_stream_in_version_order(self, five: EventStore) -> None:
        """read_stream returns only that stream's events, versions 1..n, data intact."""
        events = five.read_stream("vm-1")

        assert versions(events) == [1, 2, 3, 4, 5]
        assert {e.stream_id for e in events} == {"vm-1"}
        assert [e.data["n"] for e in events] == [0, 1, 2, 3, 4]

    def test_from_version(self, five: EventStore) -> None:
        """from_version starts the read at that version, inclusive."""
        assert versions(five.read_stream("vm-1", from_version=3)) == [3, 4, 5]

    def test_backwards(self, five: EventStore) -> None:
        """backwards reads from the newest version down to 1."""
        assert versions(five.read_stream("vm-1", backwards=True)) == [5, 4, 3, 2, 1]

    def test_backwards_from_version(self, five: EventStore) -> None:
        """backwards with from_version reads that version and older ones."""
        assert versions(five.read_stream("vm-1", from_version=3, backwards=True)) == [3, 2, 1]

    def test_limit(self, five: EventStore) -> None:
        """limit caps the number of events, from the start of the read's direction."""
        assert versions(five.read_stream("vm-1", limit=2)) == [1, 2]
        assert versions(five.read_stream("vm-1", backwards=True, limit=2)) == [5, 4]
        assert versions(five.read_stream("vm-1", from_version=2, limit=2)) == [2, 3]

    def test_past_the_end_is_empty(self, five: EventStore) -> None:
        """Reading from a version beyond the stream's end returns no events."""
        assert five.read_stream("vm-1", from_version=6) == []

    def test_missing_stream_is_empty(self, store: EventStore) -> None:
        """A stream that was never written reads as an empty list."""
        assert store.read_stream("vm-nothing") == []

    def test_limit_below_one_is_refused(self, store: EventStore) -> None:
        """limit=0 is a caller error, not an empty read."""
        with pytest.raises(InvalidEvent, match="limit"):
            store.read_stream("vm-1", limit=0)


class TestReadAll:
    @pytest.fixture
    def mixed(self, store: EventStore) -> EventStore:
        """Six events over three streams and two types."""
        store.append("vm-1", new_events(2, type="Started"))
        store.append("vm-2", new_events(1, type="Stopped"))
        store.append("vm-3", new_events(2, type="Started"))
        store.append("vm-1", new_events(1, type="Stopped"))
        return store

    def test_global_order(self, mixed: EventStore) -> None:
        """read_all returns every event in global position order, positions 1..n."""
        events = mixed.read_all()

        assert [e.global_position for e in events] == [1, 2, 3, 4, 5, 6]
        assert [e.stream_id for e in events] == ["vm-1", "vm-1", "vm-2", "vm-3", "vm-3", "vm-1"]

    def test_after(self, mixed: EventStore) -> None:
        """after=k returns events with positions strictly greater than k."""
        assert [e.global_position for e in mixed.read_all(after=4)] == [5, 6]
        assert mixed.read_all(after=6) == []

    def test_limit(self, mixed: EventStore) -> None:
        """limit caps the page; after + limit pages through the log."""
        assert [e.global_position for e in mixed.read_all(limit=2)] == [1, 2]
        assert [e.global_position for e in mixed.read_all(after=2, limit=3)] == [3, 4, 5]

    def test_types(self, mixed: EventStore) -> None:
        """types keeps only events of those types, still in global order."""
        stopped = mixed.read_all(types=["Stopped"])

        assert [e.global_position for e in stopped] == [3, 6]
        assert mixed.read_all(types=["Started", "Stopped"]) == mixed.read_all()
        assert mixed.read_all(types=["Unknown"]) == []

    def test_types_with_after_and_limit(self, mixed: EventStore) -> None:
        """types combines with after and limit."""
        started = mixed.read_all(after=1, limit=2, types=["Started"])

        assert [e.global_position for e in started] == [2, 4]

    def test_a_string_is_not_a_list_of_types(self, store: EventStore) -> None:
        """types="Started" is refused instead of being read as five one-letter types."""
        with pytest.raises(InvalidEvent, match="types"):
            store.read_all(types="Started")


class TestReadTypes:
    @pytest.fixture
    def mixed(self, store: EventStore) -> EventStore:
        """One rare event among others: Rare at 2, Common at 1 and 3 to 6."""
        store.append("vm-1", new_events(1, type="Common"))
        store.append("vm-2", new_events(1, type="Rare"))
        store.append("vm-3", new_events(4, type="Common"))
        return store

    def test_a_short_page_covers_the_log_to_its_head(self, mixed: EventStore) -> None:
        """Every event of the types is in the page, and the read covered the others after it:
        a reader continuing from ``through`` skips them."""
        page = mixed.read_types(after=0, types=["Rare"])

        assert [e.global_position for e in page.events] == [2]
        assert page.through == 6

    def test_nothing_of_the_types_still_covers_the_log(self, mixed: EventStore) -> None:
        page = mixed.read_types(after=2, types=["Rare"])

        assert page.events == []
        assert page.through == 6

    def test_a_full_page_covers_up_to_its_last_event(self, mixed: EventStore) -> None:
        """More may follow a full page: the next read starts after its last event."""
        page = mixed.read_types(after=0, types=["Common"], limit=2)

        assert [e.global_position for e in page.events] == [1, 3]
        assert page.through == 3

    def test_a_reader_ahead_of_the_log_stays_where_it_is(self, mixed: EventStore) -> None:
        assert mixed.read_types(after=9, types=["Rare"]).through == 9

    def test_the_same_checks_as_read_all(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="types"):
            store.read_types(after=0, types="Rare")
        with pytest.raises(InvalidEvent, match="limit"):
            store.read_types(after=0, types=["Rare"], limit=0)


class TestHeadAndStreamVersion:
    def test_empty_log(self, store: EventStore) -> None:
        """An empty log has head 0 and every stream has version 0."""
        assert store.head() == 0
        assert store.stream_version("vm-1") == 0
        assert store.read_all() == []

    def test_after_appends(self, store: EventStore) -> None:
        """head is the last global position; stream_version the stream's last version."""
        store.append("vm-1", new_events(3))
        store.append("vm-2", new_events(2))

        assert store.head() == 5
        assert store.stream_version("vm-1") == 3
        assert store.stream_version("vm-2") == 2


class TestRecordedEvent:
    def test_carries_every_field(self, store: EventStore) -> None:
        """A read event carries what was appended plus position, version, time and hash."""
        event_id = uuid.uuid4()
        before = datetime.now(UTC) - timedelta(seconds=5)
        store.append("vm-0", new_events(1))
        store.append(
            "vm-1",
            [
                NewEvent(
                    "VmStarted",
                    {"size": "D4", "nested": {"list": [1, 2.5, None, True]}, "text": "ünï 🚀"},
                    metadata={"correlation_id": "req-7", "actor": "alice"},
                    event_id=event_id,
                    schema_version=2,
                )
            ],
        )

        [event] = store.read_stream("vm-1")

        assert event.global_position == 2
        assert event.stream_id == "vm-1"
        assert event.stream_version == 1
        assert event.event_id == event_id
        assert isinstance(event.event_id, uuid.UUID)
        assert event.type == "VmStarted"
        assert event.schema_version == 2
        assert event.data == {
            "size": "D4",
            "nested": {"list": [1, 2.5, None, True]},
            "text": "ünï 🚀",
        }
        assert event.metadata == {"correlation_id": "req-7", "actor": "alice"}
        assert event.recorded_at.tzinfo is not None
        assert event.recorded_at.utcoffset() is not None
        assert before <= event.recorded_at <= datetime.now(UTC) + timedelta(seconds=5)
        assert len(event.hash) == 64
        assert int(event.hash, 16) >= 0
        assert event.hash == event.hash.lower()

    def test_metadata_defaults_to_empty(self, store: EventStore) -> None:
        """An event appended without metadata reads back with an empty mapping."""
        store.append("vm-1", [NewEvent("T", {})])

        [event] = store.read_all()

        assert event.metadata == {}
        assert event.data == {}

    def test_is_frozen(self, store: EventStore) -> None:
        """RecordedEvent cannot be modified after reading."""
        store.append("vm-1", new_events(1))
        [event] = store.read_all()

        with pytest.raises(dataclasses.FrozenInstanceError):
            event.type = "Changed"  # type: ignore[misc]

    def test_read_stream_and_read_all_agree(self, store: EventStore) -> None:
        """Both read paths return equal RecordedEvents for the same stored event."""
        store.append("vm-1", new_events(3), expected_version=NO_STREAM)

        assert store.read_stream("vm-1") == store.read_all()

    def test_hashes_differ_per_event(self, store: EventStore) -> None:
        """Identical content at different positions still gets different chain hashes."""
        store.append("vm-1", [NewEvent("T", {"same": 1}), NewEvent("T", {"same": 1})])

        first, second = store.read_all()

        assert first.hash != second.hash


class TestContextManager:
    def test_with_block_closes_the_store(self, store_url: str) -> None:
        """open_store works as a context manager and the log outlives the closed store."""
        with open_store(store_url) as first:
            first.append("vm-1", new_events(1))
        with open_store(store_url) as second:
            assert second.head() == 1
            assert repr(second).startswith("EventStore(")


class TestBodyFidelity:
    def test_integers_beyond_64_bits_read_back_exactly(self, store: EventStore) -> None:
        """Big integers and long digit strings survive the fast replay decoder unchanged."""
        data = {"big": 2**70, "negative": -(2**65), "digits": "1" * 25, "max": 2**64 - 1}
        store.append("big-1", [NewEvent("T", data, metadata={"n": 2**100})])
        [event] = store.read_all()
        assert (event.data, event.metadata) == (data, {"n": 2**100})
        assert isinstance(event.data["big"], int)

    def test_a_big_integer_among_small_bodies_reads_back_exactly(self, store: EventStore) -> None:
        """One body on a page that needs the exact decoder does not confuse the others."""
        bodies = [{"n": i} for i in range(5)] + [{"n": 2**70}] + [{"n": 2**63 - 1, "m": -1}]
        store.append("mixed-1", [NewEvent("T", body) for body in bodies])

        assert [e.data for e in store.read_all()] == bodies
        assert [e.data for e in store.read_stream("mixed-1")] == bodies

    def test_integers_just_beyond_the_fast_decoders_range_read_back_exactly(
        self, store: EventStore
    ) -> None:
        """The edges orjson cannot hold as ints — below -2**63 with 19 digits, 2**64 with 20 —
        come back as ints, beside the largest it can, in ASCII and non-ASCII bodies."""
        data = {
            "low": -(2**63) - 1,
            "lowest_19_digits": -9_999_999_999_999_999_999,
            "high": 2**64,
            "ok": [-(2**63), 2**64 - 1, 10**18],
        }
        store.append("edge-1", [NewEvent("T", data), NewEvent("T", {**data, "text": "é"})])

        events = store.read_all()

        assert [e.data for e in events] == [data, {**data, "text": "é"}]
        assert all(isinstance(e.data["low"], int) for e in events)

    def test_unicode_and_floats_read_back_exactly(self, store: EventStore) -> None:
        """Non-ASCII text, escapes and floats come back as they were appended."""
        data = {"text": 'é "quoted" \\ \n tab\t ✓', "floats": [0.1, 1e-7, 1.5e300, -0.0]}
        store.append("txt-1", [NewEvent("T", data)])
        [event] = store.read_all()
        assert event.data == data
