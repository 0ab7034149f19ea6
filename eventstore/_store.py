"""``EventStore``: the public face of the log."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
import structlog

from fleetledger.eventstore._chain import GENESIS_HASH, chain_hash, epoch_micros
from fleetledger.eventstore._encoding import (
    DEFAULT_MAX_EVENT_BYTES,
    PreparedAppend,
    canonical_json,
    check_leader_shard,
    prepare_append,
    prepare_many,
)
from fleetledger.eventstore._groupcommit import GroupCommitter
from fleetledger.eventstore._planner import AppendOutcome
from fleetledger.eventstore._sql import SqlBackend
from fleetledger.eventstore._subscriptions import Handler, Subscription
from fleetledger.eventstore._types import (
    ANY,
    AppendResult,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
    Snapshot,
    StreamAppend,
    TypesPage,
    VerifyReport,
)
from fleetledger.eventstore._upcasting import Upcasters
from fleetledger.eventstore.errors import EventStoreError, InvalidEvent

__all__ = ["EventStore"]

log = structlog.get_logger("eventstore")

_VERIFY_PAGE = 5000


class EventStore:
    """An append-only log of streams of JSON events with a global order.

    Thread-safe. Create it with :func:`fleetledger.eventstore.open_store`; close it when done (or
    use it as a context manager).
    """

    def __init__(
        self,
        backend: SqlBackend,
        *,
        upcasters: Upcasters | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self._backend = backend
        self._upcasters = upcasters or Upcasters()
        self._max_event_bytes = max_event_bytes
        self._committer: GroupCommitter[tuple[PreparedAppend, ...], AppendOutcome] = GroupCommitter(
            self._backend.commit
        )
        # Wake-ups for subscribers: bumped on every local commit and on every NOTIFY. A local
        # commit also records, per event type it carried, the sequence that announced it, so a
        # waiter interested in some types only sleeps through other types' commits (a NOTIFY
        # names no types: it is a broadcast, like an explicit wake()). Each waiter parks on an
        # event of its own that only a commit it wants sets: with one condition for all, every
        # commit woke every reader of other capabilities just to go back to sleep, and those
        # thread switches were a large share of a busy server's CPU.
        self._wake = threading.Lock()
        self._wake_seq = 0
        self._broadcast_seq = 0
        self._type_seq: dict[str, int] = {}
        self._waiters: list[_WakeWaiter] = []
        self._listener: threading.Thread | None = None
        self._listener_stop = threading.Event()
        self._subscriptions: list[Subscription] = []

    # -- writing -----------------------------------------------------------------------------

    def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: ExpectedVersion = ANY,
    ) -> AppendResult:
        """Append ``events`` to one stream atomically.

        Raises WrongExpectedVersion, DuplicateEventId, Fenced, InvalidEvent or StoreUnavailable.
        A retry with the same event ids at the same versions returns the original result.

        Fencing: an event whose metadata has ``"leader_term"`` (a positive int) is refused, with
        its whole append, as ``Fenced`` when that term is below :meth:`leader_term`; a higher
        term becomes the recorded one. The check runs in the transaction of the insert.
        """
        prepared = prepare_append(
            stream_id, events, expected_version, max_event_bytes=self._max_event_bytes
        )
        return self._commit((prepared,))[0]

    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        """Append to several streams in one transaction: all or nothing.

        The events take global positions in the order of ``appends`` (and of each one's
        events), so list causes before their effects. Results come back in that order too. A
        version conflict names the first conflicting stream in that order.
        """
        return self._commit(prepare_many(appends, max_event_bytes=self._max_event_bytes))

    def append_each(
        self, transactions: Sequence[Sequence[StreamAppend]]
    ) -> list[list[AppendResult] | EventStoreError]:
        """Several :meth:`append_many` calls at once, each all or nothing on its own: they
        share one database transaction but not their fate. Each gets its results or the error
        its ``append_many`` would have raised (a conflict, a fence, an event the store refuses;
        ``StoreUnavailable`` for all when the commit's outcome is unknown).

        For a caller committing for many others (one thread deciding for many streams): one
        commit instead of one per stream, without a thread per stream to wait for each.
        """
        outcomes: list[list[AppendResult] | EventStoreError] = []
        prepared: list[tuple[PreparedAppend, ...]] = []
        places: list[int] = []
        for place, appends in enumerate(transactions):
            try:
                prepared.append(prepare_many(appends, max_event_bytes=self._max_event_bytes))
            except EventStoreError as e:
                outcomes.append(e)
                continue
            outcomes.append([])  # replaced by the commit's outcome below
            places.append(place)
        if not prepared:
            return outcomes
        weight = sum([_weight_of(item) for item in prepared])
        committed: Sequence[AppendOutcome]
        try:
            committed = self._committer.submit_many(prepared, weight=weight)
        except EventStoreError as e:
            committed = [e] * len(prepared)
        types: set[str] = set()
        for place, item, outcome in zip(places, prepared, committed, strict=True):
            outcomes[place] = outcome
            if not isinstance(outcome, EventStoreError):
                types |= _types_of(item)
        if types:
            self._notify_local(types)
        return outcomes

    def _commit(self, item: tuple[PreparedAppend, ...]) -> list[AppendResult]:
        outcome = self._committer.submit(item, weight=_weight_of(item))
        if isinstance(outcome, EventStoreError):
            raise outcome
        self._notify_local(_types_of(item))
        return outcome

    # -- reading -----------------------------------------------------------------------------

    def read_stream(
        self,
        stream_id: str,
        *,
        from_version: int | None = None,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[RecordedEvent]:
        """Events of one stream in version order (newest first with ``backwards``).

        ``from_version`` defaults to 1, or to the last version when reading backwards.
        """
        if not isinstance(stream_id, str) or not stream_id:
            raise InvalidEvent("stream id must be a non-empty string")
        if limit is not None and limit < 1:
            raise InvalidEvent(f"limit must be >= 1, got {limit}")
        start = from_version if from_version is not None else (2**62 if backwards else 1)
        rows = self._backend.read_stream(
            stream_id, from_version=start, backwards=backwards, limit=limit
        )
        return self._upcast(rows)

    def read_all(
        self, *, after: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]:
        """Up to ``limit`` events with ``global_position > after``, in global order."""
        if limit < 1:
            raise InvalidEvent(f"limit must be >= 1, got {limit}")
        if isinstance(types, str):
            raise InvalidEvent("types must be a list of event type names, not a string")
        rows = self._backend.read_all(after=after, limit=limit, types=types)
        return self._upcast(rows)

    def read_types(self, *, after: int, types: Sequence[str], limit: int = 1000) -> TypesPage:
        """Up to ``limit`` events of ``types`` after ``after``, in global order, and the position
        the read covered (:class:`TypesPage`): the last event's when the page is full, else the
        head as it was before the read (or the last event's, if one committed since).

        That head is sound because global order is commit order: every event at or before it
        had committed when the page was read, and so had every event before one the page holds.
        It costs one more (index-only) query. A reader that continued from its last event
        instead would have the database walk, on every later read, all the other types' events
        appended since: Postgres plans a rare type's page as a walk of the log by position.
        """
        head = self.head()
        events = self.read_all(after=after, limit=limit, types=types)
        last = events[-1].global_position if events else after
        return TypesPage(events, last if len(events) == limit else max(head, last))

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version, 0 when it does not exist."""
        return self._backend.stream_version(stream_id)

    def head(self) -> int:
        """The highest committed global position (0 for an empty log)."""
        return self._backend.head()

    def leader_term(self, shard: str | None = None) -> int:
        """The highest leader term any committed append carried (0 when none has).

        With ``shard``, the highest term an append carried with ``"leader_shard": shard``: each
        shard's events are fenced on that shard's own term, independent of the log-wide term and
        of every other shard's. Raises InvalidEvent for a malformed shard name.
        """
        if shard is not None:
            check_leader_shard(shard, what="shard")
        return self._backend.leader_term(shard)

    def _upcast(self, rows: list[RecordedEvent]) -> list[RecordedEvent]:
        if not self._upcasters:
            return rows
        return [self._upcast_one(row) for row in rows]

    def _upcast_one(self, row: RecordedEvent) -> RecordedEvent:
        version, data = self._upcasters.upcast(row.type, row.schema_version, row.data)
        if version == row.schema_version:
            return row
        return dataclasses.replace(row, schema_version=version, data=data)

    # -- audit -------------------------------------------------------------------------------

    def verify(
        self, *, after: int = 0, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Recompute the hash chain from ``after`` to the head; report the first bad position.

        ``progress(checked, last_position)`` is called after every page for long logs.
        """
        previous = GENESIS_HASH if after == 0 else self._backend.hash_at(after)
        if previous is None:
            raise InvalidEvent(f"there is no event at position {after} to verify from")
        checked = 0
        expected_position = after + 1
        last = after
        while True:
            rows = self._backend.chain_rows(after=last, limit=_VERIFY_PAGE)
            if not rows:
                return VerifyReport(ok=True, checked=checked, last_position=last)
            for row in rows:
                if row.global_position != expected_position:
                    return VerifyReport(
                        ok=False,
                        checked=checked,
                        first_bad_position=expected_position,
                        last_position=last,
                        reason=f"position {expected_position} is missing",
                    )
                computed = chain_hash(
                    previous,
                    position=row.global_position,
                    stream_id=row.stream_id,
                    stream_version=row.stream_version,
                    event_id=row.event_id,
                    type=row.type,
                    schema_version=row.schema_version,
                    recorded_at_us=epoch_micros(row.recorded_at),
                    data_text=row.data_text,
                    metadata_text=row.metadata_text,
                )
                if computed != row.hash:
                    return VerifyReport(
                        ok=False,
                        checked=checked,
                        first_bad_position=row.global_position,
                        last_position=last,
                        reason="stored hash does not match the event's content and predecessor",
                    )
                previous = computed
                checked += 1
                expected_position += 1
                last = row.global_position
            if progress is not None:
                progress(checked, last)

    # -- snapshots ---------------------------------------------------------------------------

    def save_snapshot(
        self,
        stream_id: str,
        *,
        version: int,
        state: Mapping[str, Any],
        schema_version: int = 1,
        created_at: datetime | None = None,
    ) -> Snapshot:
        """Store an aggregate's state as of ``version``; an older snapshot never wins."""
        if version < 1:
            raise InvalidEvent(f"snapshot version must be >= 1, got {version}")
        text = canonical_json(dict(state), what=f"snapshot state of {stream_id!r}")
        snapshot = Snapshot(
            stream_id=stream_id,
            version=version,
            schema_version=schema_version,
            state=json.loads(text),
            created_at=created_at or datetime.now(UTC),
        )
        self._backend.save_snapshot(snapshot, text)
        return snapshot

    def load_snapshot(self, stream_id: str) -> Snapshot | None:
        """The newest snapshot of a stream, or None."""
        found = self._backend.load_snapshot(stream_id)
        if found is None:
            return None
        version, schema_version, text, created_at = found
        return Snapshot(stream_id, version, schema_version, json.loads(text), created_at)

    # -- subscriptions -----------------------------------------------------------------------

    def subscribe(
        self,
        name: str,
        handler: Handler,
        *,
        types: Sequence[str] | None = None,
        batch_size: int = 200,
        poll_interval: float = 1.0,
        start: bool = True,
        handler_writes: bool = True,
    ) -> Subscription:
        """A checkpointed subscription: catch up from its checkpoint, then follow live.

        ``handler(event, connection)`` runs inside the transaction that also advances the
        checkpoint, so rows it writes through ``connection`` take effect exactly once, each
        event's under a savepoint (a failing handler's writes are undone, the earlier events'
        kept). ``handler_writes=False`` declares a handler that never writes through the
        connection, which spares the savepoints. With ``start=False`` nothing runs until
        ``start()`` or ``run_until_caught_up()``.
        """
        subscription = Subscription(
            self,
            name,
            handler,
            types=types,
            batch_size=batch_size,
            poll_interval=poll_interval,
            handler_writes=handler_writes,
        )
        self._subscriptions.append(subscription)
        if start:
            subscription.start()
        return subscription

    @property
    def backend(self) -> SqlBackend:
        return self._backend

    @property
    def max_event_bytes(self) -> int:
        """The largest event (data plus metadata, in UTF-8) an append may carry."""
        return self._max_event_bytes

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine, for read models that live in the same database."""
        return self._backend.engine

    def wake_sequence(self) -> int:
        with self._wake:
            return self._wake_seq

    def wait_for_wake(
        self, seen: int, timeout: float, *, types: Collection[str] | None = None
    ) -> bool:
        """Block until something may have been appended since ``seen`` (True) or ``timeout``
        passes (False).

        With ``types``, this process's own appends wake the caller only if they carry one of
        those event types: a reader that filters by type is not sent to read (and find nothing)
        after every append of another capability. Appends by other processes, known only from
        a NOTIFY, and :meth:`wake` wake every waiter.
        """
        self._ensure_listener()
        wanted = None if types is None else frozenset(types)
        if timeout <= 0:
            # A poll (the extender asks on the event loop, per call): no waiter to build.
            with self._wake:
                return self._woken_for(seen, wanted)
        waiter = _WakeWaiter(wanted)
        with self._wake:
            if self._woken_for(seen, waiter.types):
                return True
            self._waiters.append(waiter)
        try:
            return waiter.event.wait(timeout)
        finally:
            with self._wake:
                self._waiters.remove(waiter)

    def _woken_for(self, seen: int, types: frozenset[str] | None) -> bool:
        if self._wake_seq == seen:
            return False
        if types is None or self._broadcast_seq > seen:
            return True
        type_seq = self._type_seq
        return any(type_seq.get(name, 0) > seen for name in types)

    def wake(self) -> None:
        """Wake everything waiting for new events (subscriptions, long-polls) to re-check now.

        Appends through this store do it themselves; call it after changing something a waiter
        checks besides the log, such as a stop flag.
        """
        self._notify_local()

    def _notify_local(self, types: Collection[str] | None = None) -> None:
        """Wake waiters: for an append of ``types``, or everyone (``None``)."""
        with self._wake:
            self._wake_seq += 1
            if types is None:
                self._broadcast_seq = self._wake_seq
                for waiter in self._waiters:
                    waiter.event.set()
                return
            for name in types:
                self._type_seq[name] = self._wake_seq
            for waiter in self._waiters:
                if waiter.types is None or not waiter.types.isdisjoint(types):
                    waiter.event.set()

    def _ensure_listener(self) -> None:
        if self._backend.is_sqlite or self._listener is not None:
            return
        with self._wake:
            if self._listener is not None:
                return
            self._listener = threading.Thread(
                target=self._backend.listen,
                args=(self._notify_local, self._listener_stop),
                kwargs={"timeout": 1.0},
                name="eventstore-listen",
                daemon=True,
            )
            self._listener.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop subscriptions and the listener, release connections."""
        for subscription in self._subscriptions:
            subscription.stop()
        self._listener_stop.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        self._backend.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventStore({self._backend.url_for_humans!r})"


class _WakeWaiter:
    """One caller of ``wait_for_wake``: the event types it waits for (``None``: any)."""

    __slots__ = ("event", "types")

    def __init__(self, types: frozenset[str] | None) -> None:
        self.types = types
        self.event = threading.Event()


def _weight_of(item: tuple[PreparedAppend, ...]) -> int:
    """How many events one commit request carries (the group commit bounds a batch by it)."""
    return sum([len(append.events) for append in item])


def _types_of(item: tuple[PreparedAppend, ...]) -> set[str]:
    """The event types one commit request carries (what its local wake-up announces)."""
    return {event.type for append in item for event in append.events}
