"""Upcasting: old event shapes are converted on read; the stored rows stay as written."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from fleetledger.eventstore import EventStore, NewEvent, RecordedEvent, Upcasters, open_store
from tests.eventstore.support import raw_rows


def v1_to_v2(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """v2 splits the name into given and family names."""
    given, family = str(data["name"]).split(" ", 1)
    return {"given": given, "family": family}


def v2_to_v3(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """v3 nests the names and adds a default locale."""
    return {"person": dict(data), "locale": "en"}


def upcasters() -> Upcasters:
    registry = Upcasters()
    registry.register("Renamed", 1, v1_to_v2)

    @registry.upcaster("Renamed", 2)
    def _two_to_three(data: Mapping[str, Any]) -> Mapping[str, Any]:
        return v2_to_v3(data)

    return registry


V3 = {"person": {"given": "Ada", "family": "Lovelace"}, "locale": "en"}


@pytest.fixture
def upcasting(store_url: str) -> Iterator[EventStore]:
    """A store with one v1, one v2 and one v3 "Renamed" event and an unrelated event."""
    with open_store(store_url) as writer:
        writer.append(
            "person-1",
            [
                NewEvent("Renamed", {"name": "Ada Lovelace"}, schema_version=1),
                NewEvent("Renamed", {"given": "Ada", "family": "Lovelace"}, schema_version=2),
                NewEvent("Renamed", V3, schema_version=3),
                NewEvent("Other", {"name": "Ada Lovelace"}, schema_version=1),
            ],
        )
    with open_store(store_url, upcasters=upcasters()) as store:
        yield store


def shapes(events: list[RecordedEvent]) -> list[tuple[int, Mapping[str, Any]]]:
    return [(e.schema_version, e.data) for e in events]


class TestUpcasting:
    def test_read_stream_returns_the_newest_shape(self, upcasting: EventStore) -> None:
        """v1 and v2 events are read as v3 data with schema_version 3; others are untouched."""
        events = upcasting.read_stream("person-1")

        assert shapes(events) == [(3, V3), (3, V3), (3, V3), (1, {"name": "Ada Lovelace"})]

    def test_read_all_upcasts_too(self, upcasting: EventStore) -> None:
        """read_all applies the same upcasters."""
        events = upcasting.read_all(types=["Renamed"])

        assert shapes(events) == [(3, V3)] * 3

    def test_subscriptions_see_upcast_events(self, upcasting: EventStore) -> None:
        """A subscription handler receives the upcast shape."""
        seen: list[tuple[int, Mapping[str, Any]]] = []
        upcasting.subscribe(
            "people", lambda e, _conn: seen.append((e.schema_version, e.data)), start=False
        ).run_until_caught_up()

        assert seen[:3] == [(3, V3)] * 3

    def test_stored_rows_are_never_rewritten(self, upcasting: EventStore) -> None:
        """After upcast reads the stored rows keep their original version and text."""
        upcasting.read_all()
        rows = raw_rows(upcasting)
        report = upcasting.verify()

        assert [(r["schema_version"], json.loads(r["data"])) for r in rows[:2]] == [
            (1, {"name": "Ada Lovelace"}),
            (2, {"given": "Ada", "family": "Lovelace"}),
        ]
        assert report.ok

    def test_other_fields_are_kept(self, upcasting: EventStore, store: EventStore) -> None:
        """An upcast event keeps its position, id, stream, metadata, time and hash."""
        upcast = upcasting.read_stream("person-1", limit=1)[0]
        original = store.read_stream("person-1", limit=1)[0]

        assert (original.schema_version, upcast.schema_version) == (1, 3)
        for field in ("global_position", "stream_id", "stream_version", "event_id", "type"):
            assert getattr(upcast, field) == getattr(original, field)
        assert (upcast.metadata, upcast.recorded_at, upcast.hash) == (
            original.metadata,
            original.recorded_at,
            original.hash,
        )


class TestUpcasters:
    def test_chains_single_steps(self) -> None:
        """upcast applies each registered step until none applies."""
        assert upcasters().upcast("Renamed", 1, {"name": "Ada Lovelace"}) == (3, V3)
        assert upcasters().upcast("Renamed", 3, V3) == (3, V3)
        assert upcasters().upcast("Unknown", 1, {"x": 1}) == (1, {"x": 1})

    def test_a_step_registered_twice_is_refused(self) -> None:
        """Registering a second upcaster for the same (type, version) raises."""
        registry = upcasters()

        with pytest.raises(ValueError, match="already registered"):
            registry.register("Renamed", 1, v1_to_v2)

    def test_empty_registry_is_falsy(self) -> None:
        """An empty registry is falsy (the store skips upcasting entirely)."""
        assert not Upcasters()
        assert upcasters()
