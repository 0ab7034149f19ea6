"""fleetledger's event log: streams of JSON events in one global, hash-chained order.

Quick start::

    from fleetledger.eventstore import open_store, NewEvent
    with open_store("sqlite:///fleetledger.db") as store:
        store.append("vm-batch-1", [NewEvent("BatchSealed", {"size": 5})], expected_version=0)
        for event in store.read_all():
            print(event.global_position, event.type, event.data)

Postgres (``postgresql+psycopg://…``) is the production backend; embedded SQLite serves
development and the simulator. Both pass the same contract tests.

Fencing: an event whose metadata carries ``"leader_term"`` (a positive int) is refused, with its
whole append, as :class:`Fenced` when a higher term has been recorded (``store.leader_term()``);
a higher term becomes the recorded one. The database checks it in the insert's own transaction.
With ``"leader_shard"`` beside it (a name such as ``"nodes/3"``), the term is fenced on that
shard's own recorded term instead (``store.leader_term("nodes/3")``), independent of the log-wide
term and of every other shard's.
"""

from __future__ import annotations

from fleetledger.eventstore._encoding import canonical_json
from fleetledger.eventstore._engine import DEFAULT_DATABASE_URL, resolve_url
from fleetledger.eventstore._sql import SqlBackend
from fleetledger.eventstore._store import EventStore
from fleetledger.eventstore._subscriptions import Handler, Subscription
from fleetledger.eventstore._types import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    AppendResult,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
    Snapshot,
    StreamAppend,
    TypesPage,
    VerifyReport,
)
from fleetledger.eventstore._upcasting import Upcaster, Upcasters
from fleetledger.eventstore.errors import (
    CorruptLog,
    DuplicateEventId,
    EventStoreError,
    Fenced,
    InvalidEvent,
    SchemaOutOfDate,
    StoreTimeout,
    StoreUnavailable,
    SubscriptionFailed,
    WrongExpectedVersion,
)

__all__ = [
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
    "StoreTimeout",
    "StoreUnavailable",
    "StreamAppend",
    "Subscription",
    "SubscriptionFailed",
    "TypesPage",
    "Upcaster",
    "Upcasters",
    "VerifyReport",
    "WrongExpectedVersion",
    "canonical_json",
    "open_store",
]


def open_store(
    url: str | None = None,
    *,
    upcasters: Upcasters | None = None,
    max_event_bytes: int | None = None,
    pool_size: int = 5,
    durable: bool = True,
) -> EventStore:
    """Open the log at ``url``, or ``FLEETLEDGER_DATABASE_URL``, or ``sqlite:///fleetledger.db``.

    Raises SchemaOutOfDate when the database is not migrated to this code's revision (the message
    names the command to run) and StoreUnavailable when it cannot be reached.

    ``durable=False`` is for scratch logs (a simulation's): on SQLite a commit then survives a
    process crash but not a power loss, and waits for no fsync, not even a checkpoint's.
    """
    backend = SqlBackend(resolve_url(url), pool_size=pool_size, durable=durable)
    try:
        backend.check_schema()
    except BaseException:
        backend.close()
        raise
    options = {} if max_event_bytes is None else {"max_event_bytes": max_event_bytes}
    return EventStore(backend, upcasters=upcasters, **options)
