"""The event store's exceptions: one tree, raised at the store's boundary.

Exception tree::

    EventStoreError                 base of everything the store raises
     ├── InvalidEvent (ValueError)   the append itself is malformed; nothing was written
     ├── WrongExpectedVersion        a stream was not at the version the caller expected
     ├── DuplicateEventId            an event id is already stored somewhere else in the log
     ├── Fenced                      the append carries a leader term older than the latest
     │                               recorded one: its writer was deposed and must stop leading
     ├── StoreUnavailable            the database could not be reached or the connection broke;
     │    │                          retriable: re-send the same event ids and the append is
     │    │                          idempotent, so nothing is written twice
     │    └── StoreTimeout           the database did not answer within one of the session's
     │                               limits (``limit``: connect_timeout, statement_timeout,
     │                               pool_timeout); retriable alike, and says which to raise if
     │                               the database is only slow
     ├── SchemaOutOfDate             the database schema is not at the revision this code needs
     ├── CorruptLog                  the hash chain does not verify
     └── SubscriptionFailed          a subscription handler raised; the checkpoint stays before it

Driver errors (SQLAlchemy, psycopg, sqlite3) never escape: adapters translate them with
``raise … from e`` so callers handle one tree.
"""

from __future__ import annotations

__all__ = [
    "CorruptLog",
    "DuplicateEventId",
    "EventStoreError",
    "Fenced",
    "InvalidEvent",
    "SchemaOutOfDate",
    "StoreTimeout",
    "StoreUnavailable",
    "SubscriptionFailed",
    "WrongExpectedVersion",
]


class EventStoreError(Exception):
    """Base class of every error the event store raises."""


class InvalidEvent(EventStoreError, ValueError):
    """Raised before anything is written when an append is malformed."""


class WrongExpectedVersion(EventStoreError):
    """Raised when a stream's current version does not match ``expected_version``.

    ``actual`` is the stream's version at the time of the check (0 when it does not exist).
    """

    def __init__(self, stream_id: str, expected: object, actual: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, expected {expected}; "
            "reload the stream, decide again and retry"
        )
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class DuplicateEventId(EventStoreError):
    """Raised when an event id is already stored at another stream or version."""

    def __init__(self, event_id: str) -> None:
        super().__init__(
            f"event id {event_id} is already stored at another place in the log; "
            "use a fresh id for a new event, or the original stream and version to retry"
        )
        self.event_id = event_id


class Fenced(EventStoreError):
    """Raised when an append carries a ``leader_term`` (in an event's metadata) below the highest
    term the log has recorded; nothing of that append was written.

    ``term`` is the refused append's term, ``current_term`` the latest recorded one. Another
    process has been elected since this one became leader, so it must stop its side effects.
    """

    def __init__(self, term: int, current_term: int) -> None:
        super().__init__(
            f"append from leader term {term} refused: term {current_term} is the latest elected; "
            "this process is no longer the leader — stop side effects and follow"
        )
        self.term = term
        self.current_term = current_term


class StoreUnavailable(EventStoreError):
    """Raised when the database cannot be reached; safe to retry with the same event ids."""


class StoreTimeout(StoreUnavailable):
    """Raised when the database did not answer within ``limit`` (``"connect_timeout"``,
    ``"statement_timeout"`` or ``"pool_timeout"``): a statement cut short wrote nothing, so
    retrying with the same event ids is as safe as after any ``StoreUnavailable``."""

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class SchemaOutOfDate(EventStoreError):
    """Raised by ``open_store`` when the schema is missing or not at the expected revision."""


class CorruptLog(EventStoreError):
    """Raised when the hash chain does not verify (see ``EventStore.verify``)."""


class SubscriptionFailed(EventStoreError):
    """Raised when a subscription's handler failed; ``position`` is the event it failed on."""

    def __init__(self, name: str, position: int, cause: BaseException) -> None:
        super().__init__(
            f"subscription {name!r} stopped at global position {position}: {cause!r}; "
            "fix the handler and start the subscription again to resume at that event"
        )
        self.name = name
        self.position = position
