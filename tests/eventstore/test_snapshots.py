"""Snapshots: the newest folded state of a stream, for fast aggregate loads."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetledger.eventstore import EventStore, InvalidEvent, Snapshot


class TestSnapshots:
    def test_none_when_absent(self, store: EventStore) -> None:
        """A stream without a snapshot loads None."""
        assert store.load_snapshot("vm-1") is None

    def test_save_then_load(self, store: EventStore) -> None:
        """A saved snapshot loads back with its version, schema version, state and time."""
        created = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

        saved = store.save_snapshot(
            "vm-1",
            version=5,
            state={"size": 3, "names": ["a", "ü"]},
            schema_version=2,
            created_at=created,
        )

        assert saved == Snapshot("vm-1", 5, 2, {"size": 3, "names": ["a", "ü"]}, created)
        assert store.load_snapshot("vm-1") == saved

    def test_a_newer_snapshot_replaces_an_older_one(self, store: EventStore) -> None:
        """Saving at a higher version replaces the stored snapshot."""
        store.save_snapshot("vm-1", version=3, state={"v": 3})

        store.save_snapshot("vm-1", version=7, state={"v": 7})

        loaded = store.load_snapshot("vm-1")
        assert loaded is not None
        assert (loaded.version, loaded.state) == (7, {"v": 7})

    def test_an_older_snapshot_never_replaces_a_newer_one(self, store: EventStore) -> None:
        """Saving at a lower version (a slow writer) leaves the newer snapshot in place."""
        store.save_snapshot("vm-1", version=7, state={"v": 7}, schema_version=2)

        store.save_snapshot("vm-1", version=3, state={"v": 3}, schema_version=1)

        loaded = store.load_snapshot("vm-1")
        assert loaded is not None
        assert (loaded.version, loaded.schema_version, loaded.state) == (7, 2, {"v": 7})

    def test_snapshots_are_per_stream(self, store: EventStore) -> None:
        """One stream's snapshot does not affect another's."""
        store.save_snapshot("vm-1", version=2, state={"who": 1})
        store.save_snapshot("vm-2", version=1, state={"who": 2})

        first, second = store.load_snapshot("vm-1"), store.load_snapshot("vm-2")

        assert first is not None and first.state == {"who": 1}
        assert second is not None and second.state == {"who": 2}

    def test_created_at_is_timezone_aware(self, store: EventStore) -> None:
        """A snapshot's default creation time is an aware datetime, also after loading."""
        store.save_snapshot("vm-1", version=1, state={})

        loaded = store.load_snapshot("vm-1")

        assert loaded is not None and loaded.created_at.utcoffset() is not None

    @pytest.mark.parametrize(
        ("version", "state", "match"),
        [(0, {}, "version"), (1, {"bad": {1, 2}}, "JSON"), (1, {"nan": float("nan")}, "JSON")],
    )
    def test_bad_snapshots_are_refused(
        self, store: EventStore, version: int, state: dict[str, object], match: str
    ) -> None:
        """A version below 1 or a state that is not JSON is refused and nothing is stored."""
        with pytest.raises(InvalidEvent, match=match):
            store.save_snapshot("vm-1", version=version, state=state)

        assert store.load_snapshot("vm-1") is None
