"""Records read back from a database: their bodies are decoded on first use, and nothing else
tells them from the RecordedEvent built from the same fields."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from fleetledger.eventstore import EventStore, NewEvent, RecordedEvent

_FIELDS = tuple(f.name for f in dataclasses.fields(RecordedEvent))


def _plain(record: RecordedEvent) -> RecordedEvent:
    return RecordedEvent(*(getattr(record, name) for name in _FIELDS))


@pytest.fixture
def record(store: EventStore) -> RecordedEvent:
    store.append(
        "node-1",
        [NewEvent("T", {"n": 1, "nested": {"list": [1, 2.5, "x"]}}, metadata={"grouper": "g"})],
    )
    [read] = store.read_all()
    return read


class TestRecordsRead:
    def test_equal_to_the_record_built_from_its_fields(self, record: RecordedEvent) -> None:
        """A record read compares equal both ways to a RecordedEvent of the same fields, and
        unequal to one that differs in a field."""
        plain = _plain(record)
        assert record == plain and plain == record
        assert (record != plain, plain != record) == (False, False)
        assert record != dataclasses.replace(plain, data={"n": 2})
        assert dataclasses.replace(plain, data={"n": 2}) != record

    def test_shown_and_pickled_as_a_recorded_event(self, record: RecordedEvent) -> None:
        """Its repr, a pickle and a copy are those of a RecordedEvent."""
        assert repr(record) == repr(_plain(record))
        assert repr(record).startswith("RecordedEvent(")
        for copied in (pickle.loads(pickle.dumps(record)), copy.copy(record)):
            assert type(copied) is RecordedEvent
            assert copied == record

    def test_bodies_are_decoded_once(self, record: RecordedEvent) -> None:
        """Every read of a body gives the same decoded object."""
        assert record.data == {"n": 1, "nested": {"list": [1, 2.5, "x"]}}
        assert record.data is record.data
        assert record.metadata["grouper"] == "g"
        assert record.metadata is record.metadata
        assert isinstance(record.hash, str) and len(record.hash) == 64

    def test_frozen(self, record: RecordedEvent) -> None:
        """No field of a record read can be set, the bodies included."""
        for name in ("data", "metadata", "hash", "type"):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(record, name, {})

    def test_replace_takes_the_new_values(self, record: RecordedEvent) -> None:
        """``dataclasses.replace`` (as upcasting does) keeps every field it is not given and
        takes the ones it is."""
        replaced = dataclasses.replace(record, schema_version=2, data={"n": 3})
        assert (replaced.schema_version, replaced.data) == (2, {"n": 3})
        assert replaced.metadata == record.metadata
        assert replaced.hash == record.hash
        assert replaced == dataclasses.replace(_plain(record), schema_version=2, data={"n": 3})

    def test_a_big_integer_in_metadata_alone_reads_back_exactly(self, store: EventStore) -> None:
        """A page whose only big integer is in one event's metadata is decoded exactly, the
        data of the other events included."""
        store.append("m-1", [NewEvent("T", {"i": i}) for i in range(3)])
        store.append("m-2", [NewEvent("T", {"i": 3}, metadata={"n": -(2**63) - 1})])
        records = store.read_all()
        assert [r.data["i"] for r in records] == [0, 1, 2, 3]
        assert records[-1].metadata == {"n": -(2**63) - 1}
