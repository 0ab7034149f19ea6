"""The package's public surface changes only on purpose."""

from __future__ import annotations

from fleetledger import eventstore
from fleetledger.eventstore import errors

PUBLIC = {
    "canonical_json",
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
    "Fenced",
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


class TestPublicSurface:
    def test_all_is_the_agreed_surface(self) -> None:
        """eventstore.__all__ lists exactly the public names, each of which exists."""
        assert set(eventstore.__all__) == PUBLIC
        assert len(eventstore.__all__) == len(PUBLIC)
        for name in PUBLIC:
            assert getattr(eventstore, name) is not None

    def test_every_error_is_an_event_store_error(self) -> None:
        """Each exported exception derives from EventStoreError, so one except catches all."""
        for name in errors.__all__:
            error = getattr(errors, name)
            assert issubclass(error, errors.EventStoreError)
            assert getattr(eventstore, name) is error

    def test_invalid_event_is_a_value_error(self) -> None:
        """InvalidEvent is also a ValueError, for callers that validate generically."""
        assert issubclass(errors.InvalidEvent, ValueError)
