"""The event store's public surface: one error tree a caller can catch whole."""

from __future__ import annotations

from fleetledger import eventstore
from fleetledger.eventstore import errors


class TestPublicSurface:
    def test_every_error_is_an_event_store_error(self) -> None:
        """Each exported exception derives from EventStoreError, so one except catches all."""
        for name in errors.__all__:
            error = getattr(errors, name)
            assert issubclass(error, errors.EventStoreError)
            assert getattr(eventstore, name) is error

    def test_invalid_event_is_a_value_error(self) -> None:
        """InvalidEvent is also a ValueError, for callers that validate generically."""
        assert issubclass(errors.InvalidEvent, ValueError)
