"""The exported surface changes only on purpose."""

from __future__ import annotations

import eventstore


class TestEventStoreSurface:
    def test_exports(self) -> None:
        """``eventstore.__all__`` is exactly the documented API."""
        assert set(eventstore.__all__) == {
            "ANY",
            "DEFAULT_DATABASE_URL",
            "NO_STREAM",
            "STREAM_EXISTS",
            "AppendResult",
            "CorruptLog",
            "DuplicateEventId",
            "EventStore",
            "EventStoreError",
            "ExpectedVersion",
            "Handler",
            "InvalidEvent",
            "NewEvent",
            "RecordedEvent",
            "SchemaOutOfDate",
            "Snapshot",
            "StoreUnavailable",
            "StreamAppend",
            "Subscription",
            "SubscriptionFailed",
            "Upcaster",
            "Upcasters",
            "VerifyReport",
            "WrongExpectedVersion",
            "open_store",
        }

    def test_every_export_exists(self) -> None:
        """Every name in ``__all__`` is importable."""
        for name in eventstore.__all__:
            assert hasattr(eventstore, name), name
