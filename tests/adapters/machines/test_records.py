"""Events ⇄ records: deterministic ids make a re-sent decision a replay, never a second copy."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetledger.adapters.machines.records import decode, encode, event_id
from fleetledger.domain.codec import CodecError
from fleetledger.domain.machines import MachineRequested
from fleetledger.domain.template import template_hash
from fleetledger.eventstore import (
    EventStore,
    InvalidEvent,
    NewEvent,
    StreamAppend,
    WrongExpectedVersion,
    canonical_json,
)

from .support import D4, EPOCH


def requested(n: int, seconds: float = 0) -> MachineRequested:
    return MachineRequested(
        f"r-{n}",
        f"m-{n}",
        D4,
        template_hash(D4),
        ("1",),
        (("team", "a"),),
        False,
        "b-1",
        EPOCH + timedelta(seconds=seconds),
    )


def records(*events: MachineRequested, first_version: int = 1) -> list[NewEvent]:
    return encode(
        "vmgrouper-t",
        first_version,
        events,
        causation_ids=[e.request_id for e in events],
        actor="test",
        grouper="t",
    )


class TestEventIds:
    def test_the_same_event_at_the_same_version_has_the_same_id(self) -> None:
        """Encoding a decision twice gives identical ids: a re-send is recognisable."""
        assert records(requested(1))[0].event_id == records(requested(1))[0].event_id

    def test_a_different_event_at_the_same_version_has_another_id(self) -> None:
        """Ids cover the content, so another decision in that slot is not taken for a replay."""
        assert records(requested(1))[0].event_id != records(requested(1, seconds=1))[0].event_id

    def test_the_same_event_at_another_version_has_another_id(self) -> None:
        """Ids cover the slot, so the same content later in the stream is a new event."""
        assert event_id("s", 1, "t", {}) != event_id("s", 2, "t", {})

    def test_ids_never_change(self) -> None:
        """The id of given content is fixed for good: a re-send after an upgrade must still be
        recognised as a replay (pinned from the first release's formula)."""
        data = {
            "z": [1, 2.5, None, True],
            "a": {"é": 'naïve "q" \\ \n', "b": -0.0, "c": 10**20},
            "m": "x",
        }
        assert str(event_id("vmgrouper-ü", 7, "vm.MachineRequested", data)) == (
            "221fd7f9-fdfb-586a-b8b5-e883f2d98883"
        )

    def test_records_carry_their_id_and_their_encoded_data(self) -> None:
        """The id is the one :func:`event_id` gives, and the data's canonical JSON travels
        with the record, so the store does not encode it again."""
        [record] = records(requested(1))

        assert record.event_id == str(event_id("vmgrouper-t", 1, record.type, record.data))
        assert record.data_json == canonical_json(record.data, what="data")

    def test_data_the_log_would_refuse_gets_no_id(self) -> None:
        with pytest.raises(InvalidEvent, match="not JSON-serialisable"):
            event_id("s", 1, "t", {"load": float("nan")})


class TestResending:
    def test_resending_the_same_records_is_a_replay(self, store: EventStore) -> None:
        """After an unknown outcome the same append returns the original result, stored once."""
        appends = [StreamAppend("vmgrouper-t", records(requested(1)), expected_version=0)]

        first = store.append_many(appends)
        again = store.append_many(appends)

        assert again == first
        assert len(store.read_stream("vmgrouper-t")) == 1

    def test_a_different_decision_for_a_taken_slot_is_a_conflict(self, store: EventStore) -> None:
        """A changed decision is refused by the expected version, so the caller decides again."""
        store.append("vmgrouper-t", records(requested(1)), expected_version=0)

        with pytest.raises(WrongExpectedVersion):
            store.append("vmgrouper-t", records(requested(1, seconds=1)), expected_version=0)


class TestDecode:
    def test_round_trips_a_domain_event(self, sqlite_store: EventStore) -> None:
        """What is appended decodes to an equal domain event."""
        sqlite_store.append("vmgrouper-t", records(requested(1)))

        (record,) = sqlite_store.read_stream("vmgrouper-t")

        assert decode(record) == requested(1)

    def test_refuses_foreign_events(self, sqlite_store: EventStore) -> None:
        """An event that is not one of ours is an error, not silently skipped."""
        sqlite_store.append("vmgrouper-t", [NewEvent("demo.Other", {})])

        with pytest.raises(CodecError):
            decode(sqlite_store.read_stream("vmgrouper-t")[0])
