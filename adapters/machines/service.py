"""The grouper's application service: load the stream, decide, append with an expected version.

One grouper stream (``vmgrouper-<name>``) holds every grouper decision. The service keeps the
folded state and the stream version in memory and catches up from the stream's tail whenever an
append meets a newer version (another writer, or an earlier append whose outcome was lost); a
snapshot would only shorten the first load, so it is left for when streams grow long.

Every command goes the same way (:meth:`MachineService._decide`): take the time from the clock,
``decide`` on the cached state, append with ``expected_version`` = the cached version; on
``WrongExpectedVersion`` catch up and decide again (bounded by ``RetryPolicy.conflict_attempts``).
A decision that seals batches also opens each batch's own stream (``OpenBatch``) in the *same*
``append_many``, so a batch is never sealed without its stream, nor opened without its seal.

Outcome futures (the seed's response channel) are resolved when the grouper has recorded a
batch's outcomes (:meth:`record_batch_outcomes`), not earlier: by then a failed request's machine
name is released, so a caller reacting to a failure by asking again is accepted.

Observers: ``on_sealed(batch_ids)`` is called after every append that sealed batches, including
ones learnt while catching up (the coordinator executes them); ``on_change()`` after every append
(the driver recomputes its deadline). Both run outside the service's lock.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.domain import grouper, machine_batch
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.grouper import (
    BatchSealed,
    GrouperCommand,
    GrouperConfig,
    GrouperEvent,
    GrouperState,
    RecordBatchOutcomes,
    RequestMachine,
    RequestStatus,
    Shutdown,
    Tick,
)
from fleetledger.domain.machine_batch import (
    DEFAULT_MAX_ATTEMPTS,
    MachineCreated,
    MachineFailed,
    OpenBatch,
)
from fleetledger.eventstore import NO_STREAM, EventStore, StreamAppend, WrongExpectedVersion

from .appends import RetryPolicy, append_decision
from .context import should_skip_batching
from .errors import InvalidRequest, LogContention, RequestRejected, UnknownRequest
from .machine_request import MachineRequest
from .outcomes import MachineOutcome
from .records import decode_batch_event, decode_grouper_event, encode
from .streams import DEFAULT_GROUPER, batch_stream_id, grouper_stream_id, validate_grouper_name

__all__ = ["Accepted", "MachineService"]

log = structlog.get_logger(__name__)

_PAGE = 1000
# Fields a domain refusal of a request names first in its message (domain.grouper).
_REQUEST_FIELDS = ("request_id", "machine_name", "template", "zones", "tags")


@dataclass(frozen=True, slots=True)
class Accepted:
    """What an accepted call appended: its request ids, the batches it sealed, where it landed.

    ``last_position`` is ``None`` when nothing was appended (every request an exact repeat).
    """

    request_ids: tuple[str, ...]
    sealed_batch_ids: tuple[str, ...]
    last_position: int | None


@dataclass(frozen=True, slots=True)
class _Decision:
    events: tuple[GrouperEvent, ...]
    last_position: int | None


class MachineService:
    """Decides grouper commands against the log; thread-safe."""

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Clock,
        config: GrouperConfig,
        grouper_name: str = DEFAULT_GROUPER,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        actor: str = "fleetledger",
        retry: RetryPolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._name = validate_grouper_name(grouper_name)
        self._stream = grouper_stream_id(grouper_name)
        self._max_attempts = max_attempts
        self._actor = actor
        self._retry = retry or RetryPolicy()
        self._lock = threading.RLock()
        self._state: GrouperState = grouper.initial_state()
        self._version = 0
        self._loaded = False
        self._futures: dict[str, list[Future[MachineOutcome]]] = {}
        self._unannounced: list[str] = []
        self._changed = False
        self._sealed_observers: list[Callable[[tuple[str, ...]], None]] = []
        self._change_observers: list[Callable[[], None]] = []

    # -- properties --------------------------------------------------------------------------

    @property
    def grouper_name(self) -> str:
        return self._name

    @property
    def stream_id(self) -> str:
        return self._stream

    @property
    def config(self) -> GrouperConfig:
        return self._config

    @property
    def store(self) -> EventStore:
        return self._store

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def state(self) -> GrouperState:
        with self._lock:
            return self._state

    # -- observers ---------------------------------------------------------------------------

    def on_sealed(self, observer: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``observer(batch_ids)`` after each append that sealed batches."""
        self._sealed_observers.append(observer)

    def on_change(self, observer: Callable[[], None]) -> None:
        """Call ``observer()`` after each append to the grouper stream."""
        self._change_observers.append(observer)

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        """Fold the grouper stream, or its new tail.

        The first load does not announce the batches sealed in the stream's history (most are long
        done): :meth:`unfinished_batches` says which to resume. Later catch-ups announce what they
        find, since those batches were sealed by a decision this process did not see.
        """
        with self._lock:
            self._ensure_loaded()
            self._catch_up()
        self._announce()

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._catch_up()
            self._unannounced.clear()
            self._loaded = True

    def _catch_up(self) -> None:
        while True:
            records = self._store.read_stream(
                self._stream, from_version=self._version + 1, limit=_PAGE
            )
            for record in records:
                event = decode_grouper_event(record)
                self._state = grouper.evolve(self._state, event)
                self._version = record.stream_version
                self._changed = True
                if isinstance(event, BatchSealed):
                    self._unannounced.append(event.batch_id)
            if len(records) < _PAGE:
                return

    # -- commands ----------------------------------------------------------------------------

    def request(self, requests: Sequence[MachineRequest]) -> Accepted:
        """Accept ``requests`` atomically: all are appended in one transaction, or none is.

        Raises :class:`InvalidRequest` or :class:`RequestRejected` naming the request at fault
        (by ``index``), and the log errors of :func:`append_decision`.
        """
        if not requests:
            raise InvalidRequest("send at least one machine request", field="requests")
        skip_default = should_skip_batching()
        ids = tuple(r.request_id or uuid.uuid4().hex for r in requests)

        def commands(at: datetime) -> list[tuple[GrouperCommand, str]]:
            return [
                (
                    RequestMachine(
                        request_id,
                        r.machine_name,
                        r.template,
                        r.zones,
                        r.tag_pairs,
                        skip_default if r.skip_batching is None else r.skip_batching,
                        at=at,
                    ),
                    request_id,
                )
                for request_id, r in zip(ids, requests, strict=True)
            ]

        decision = self._decide(commands)
        sealed = tuple(e.batch_id for e in decision.events if isinstance(e, BatchSealed))
        return Accepted(ids, sealed, decision.last_position)

    def tick(self) -> tuple[str, ...]:
        """Seal every batch whose deadline has passed; returns the sealed batch ids."""
        decision = self._decide(lambda at: [(Tick(at), f"tick:{at.isoformat()}")])
        return tuple(e.batch_id for e in decision.events if isinstance(e, BatchSealed))

    def shutdown(self) -> tuple[str, ...]:
        """Seal everything still pending (a graceful stop); returns the sealed batch ids."""
        decision = self._decide(lambda at: [(Shutdown(at), f"shutdown:{at.isoformat()}")])
        sealed = tuple(e.batch_id for e in decision.events if isinstance(e, BatchSealed))
        if sealed:
            log.info("sealed every pending batch for shutdown", batches=len(sealed))
        return sealed

    def record_batch_outcomes(
        self, batch_id: str, outcomes: Sequence[MachineOutcome], *, causation_id: str
    ) -> None:
        """Report a completed batch's outcomes to the grouper, then resolve their futures.

        Idempotent: outcomes the grouper already knows append nothing, and futures are resolved
        either way (the case after a restart). ``causation_id`` is the ``BatchCompleted`` event.
        """
        created = tuple(o.request_id for o in outcomes if o.status == "created")
        failed = tuple(o.request_id for o in outcomes if o.status == "failed")
        self._decide(
            lambda at: [(RecordBatchOutcomes(batch_id, created, failed, at=at), causation_id)]
        )
        resolved: list[tuple[Future[MachineOutcome], MachineOutcome]] = []
        with self._lock:
            for outcome in outcomes:
                for future in self._futures.pop(outcome.request_id, ()):
                    resolved.append((future, outcome))
        for future, outcome in resolved:
            _resolve(future, outcome)

    def _decide(
        self, commands: Callable[[datetime], Sequence[tuple[GrouperCommand, str]]]
    ) -> _Decision:
        """Decide ``commands(now)`` (each with its causation id) and append, catching up on
        conflicts; observers are told afterwards, outside the lock."""
        try:
            with self._lock:
                self._ensure_loaded()
                for _ in range(self._retry.conflict_attempts):
                    at = self._clock.now()
                    events, causes = self._decide_all(commands(at))
                    if not events:
                        return _Decision((), None)
                    try:
                        position = self._append(events, causes, at)
                    except WrongExpectedVersion as e:
                        log.info(
                            "grouper stream moved; catching up and deciding again",
                            stream=e.stream_id,
                            expected=str(e.expected),
                            actual=e.actual,
                        )
                        self._catch_up()
                        continue
                    return _Decision(tuple(events), position)
                raise LogContention(
                    f"{self._stream} kept changing under this process through "
                    f"{self._retry.conflict_attempts} attempts; is another controller writing to "
                    "the same grouper? Run one leader per grouper name"
                )
        finally:
            self._announce()

    def _decide_all(
        self, commands: Sequence[tuple[GrouperCommand, str]]
    ) -> tuple[list[GrouperEvent], list[str]]:
        state = self._state
        events: list[GrouperEvent] = []
        causes: list[str] = []
        for index, (command, cause) in enumerate(commands):
            try:
                new = grouper.decide(state, command, self._config)
            except InvalidCommand as e:
                raise InvalidRequest(str(e), index=index, field=_field_of(str(e))) from e
            except Rejected as e:
                raise RequestRejected(e.reason, index=index) from e
            for event in new:
                state = grouper.evolve(state, event)
            events.extend(new)
            causes.extend([cause] * len(new))
        return events, causes

    def _append(self, events: list[GrouperEvent], causes: list[str], at: datetime) -> int:
        """Append ``events`` (and open the batches they seal); update the cache; last position."""
        records = encode(
            self._stream,
            self._version + 1,
            events,
            causation_ids=causes,
            actor=self._actor,
            grouper=self._name,
        )
        appends = [StreamAppend(self._stream, records, expected_version=self._version)]
        sealed: list[str] = []
        for event, record in zip(events, records, strict=True):
            if not isinstance(event, BatchSealed):
                continue
            stream = batch_stream_id(self._name, event.batch_id)
            opened = machine_batch.decide(
                machine_batch.initial_state(), OpenBatch(event, self._max_attempts, at=at)
            )
            opening = encode(
                stream,
                1,
                opened,
                causation_ids=[str(record.event_id)] * len(opened),
                actor=self._actor,
                grouper=self._name,
            )
            appends.append(StreamAppend(stream, opening, expected_version=NO_STREAM))
            sealed.append(event.batch_id)
        results = append_decision(self._store, appends, clock=self._clock, policy=self._retry)
        state = self._state
        for event in events:
            state = grouper.evolve(state, event)
        self._state = state
        self._version += len(events)
        self._unannounced.extend(sealed)
        self._changed = True
        return max(result.last_position for result in results)

    def _announce(self) -> None:
        with self._lock:
            batch_ids = tuple(dict.fromkeys(self._unannounced))
            self._unannounced.clear()
            changed, self._changed = self._changed, False
        if changed:
            for change_observer in self._change_observers:
                change_observer()
        if batch_ids:
            for sealed_observer in self._sealed_observers:
                sealed_observer(batch_ids)

    # -- queries -----------------------------------------------------------------------------

    def next_deadline(self) -> datetime | None:
        """When the next pending batch falls due (idle or max), or ``None`` if none is pending."""
        with self._lock:
            self._ensure_loaded()
            return grouper.next_deadline(self._state, self._config)

    def status(self, request_id: str) -> tuple[RequestStatus, str] | None:
        """``(status, batch_id)`` of a request as the grouper knows it, or ``None``."""
        with self._lock:
            self._ensure_loaded()
            return grouper.request_status(self._state, request_id)

    def unfinished_batches(self) -> tuple[str, ...]:
        """Sealed batches with a request the grouper has no outcome for, oldest first."""
        with self._lock:
            self._ensure_loaded()
            ledger = self._state.ledger
            batch_ids = {
                request.batch_id
                for request_id, request in ledger.requests.items()
                if ledger.outcomes.get(request_id) is None
            }
        # Batch ids end in the grouper's sequence number: sort by it, i.e. by sealing order.
        return tuple(sorted(batch_ids, key=lambda b: (b.rsplit("-", 1)[-1], b)))

    def outcome_future(self, request_id: str) -> Future[MachineOutcome]:
        """A future for the request's outcome; already done if the outcome is known.

        Raises :class:`UnknownRequest` for an id the grouper never accepted.
        """
        future: Future[MachineOutcome] = Future()
        with self._lock:
            self._ensure_loaded()
            found = grouper.request_status(self._state, request_id)
            if found is None:
                raise UnknownRequest(request_id)
            status, batch_id = found
            if status not in ("created", "failed"):
                self._futures.setdefault(request_id, []).append(future)
                return future
        _resolve(future, self._recorded_outcome(batch_id, request_id))
        return future

    def _recorded_outcome(self, batch_id: str, request_id: str) -> MachineOutcome:
        stream = batch_stream_id(self._name, batch_id)
        for record in self._store.read_stream(stream):
            event = decode_batch_event(record)
            if isinstance(event, MachineCreated | MachineFailed) and event.request_id == request_id:
                return MachineOutcome.of(event)
        raise UnknownRequest(request_id)  # pragma: no cover - the grouper only learns recorded ones


def _resolve(future: Future[MachineOutcome], outcome: MachineOutcome) -> None:
    if future.set_running_or_notify_cancel():
        future.set_result(outcome)


def _field_of(message: str) -> str | None:
    first = message.split(" ", 1)[0]
    if first in _REQUEST_FIELDS:
        return first
    if message.startswith(("each tag", "tag keys")):
        return "tags"
    return None
