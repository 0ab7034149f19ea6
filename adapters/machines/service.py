"""The grouper's application service: machine requests in, grouper decisions into the log.

One grouper stream (``vmgrouper-<name>``) holds every grouper decision. It is hosted by a
:class:`~fleetledger.adapters.runtime.HostedStream`, which keeps the folded state, decides on it,
appends with the expected version, catches up and decides again on a conflict, re-sends after an
unknown outcome and decides requests that arrive during an append together. A decision that seals
batches also opens each batch's own stream (``OpenBatch``) in the *same* append, so a batch is
never sealed without its stream, nor opened without its seal.

Outcome futures (the seed's response channel) are resolved when the grouper has recorded a
batch's outcomes (:meth:`record_batch_outcomes`), not earlier: by then a failed request's machine
name is released, so a caller reacting to a failure by asking again is accepted.

Observers: ``on_sealed(batch_ids)`` is called after every append that sealed batches, including
ones learnt while catching up (the coordinator executes them); ``on_change()`` after every append
(the driver recomputes its deadline). Both run outside the stream's lock. Ticks, shutdown seals
and recorded outcomes are the leader's duties: they carry its fencing term.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import structlog

from fleetledger.adapters import runtime
from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import (
    CommandRefused,
    Decision,
    Folded,
    HostedStream,
    Plan,
    RetryPolicy,
    Writer,
    opening_append,
)
from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.machines import (
    DEFAULT_MAX_ATTEMPTS,
    BatchSealed,
    GrouperCommand,
    GrouperConfig,
    GrouperEvent,
    GrouperState,
    MachineCreated,
    MachineFailed,
    OpenBatch,
    RecordBatchOutcomes,
    RequestMachine,
    RequestStatus,
    Shutdown,
    Tick,
    grouper,
)
from fleetledger.eventstore import EventStore, NewEvent, StreamAppend

from .aggregates import batch_aggregate, grouper_aggregate
from .context import should_skip_batching
from .errors import (
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MachinesError,
    RequestRejected,
    UnknownRequest,
)
from .machine_request import MachineRequest
from .outcomes import MachineOutcome
from .records import decode_batch_event
from .streams import DEFAULT_GROUPER, batch_stream_id, grouper_stream_id, validate_grouper_name

__all__ = ["Accepted", "MachineService"]

log = structlog.get_logger(__name__)

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
        writer: Writer | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._name = validate_grouper_name(grouper_name)
        self._max_attempts = max_attempts
        self._writer = writer or Writer(actor=actor, labels=(("grouper", self._name),))
        self._batches = batch_aggregate(self._name)
        self._stream: HostedStream[GrouperState, GrouperCommand, GrouperEvent] = HostedStream(
            store,
            grouper_aggregate(config, max_event_bytes=store.max_event_bytes),
            grouper_stream_id(self._name),
            clock=clock,
            writer=self._writer,
            retry=retry,
            companions=self._open_sealed_batches,
        )
        self._stream.on_events(self._folded)
        self._futures_lock = threading.Lock()
        self._futures: dict[str, list[Future[MachineOutcome]]] = {}
        self._sealed_observers: list[Callable[[tuple[str, ...]], None]] = []
        self._change_observers: list[Callable[[], None]] = []

    # -- properties --------------------------------------------------------------------------

    @property
    def grouper_name(self) -> str:
        return self._name

    @property
    def stream_id(self) -> str:
        return self._stream.stream_id

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
    def writer(self) -> Writer:
        return self._writer

    @property
    def version(self) -> int:
        return self._stream.version

    @property
    def state(self) -> GrouperState:
        return self._stream.state

    # -- observers ---------------------------------------------------------------------------

    def on_sealed(self, observer: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``observer(batch_ids)`` after each append that sealed batches."""
        self._sealed_observers.append(observer)

    def on_change(self, observer: Callable[[], None]) -> None:
        """Call ``observer()`` after each append to the grouper stream."""
        self._change_observers.append(observer)

    def _folded(self, folded: Sequence[Folded[GrouperEvent]]) -> None:
        sealed = tuple(
            dict.fromkeys(f.event.batch_id for f in folded if isinstance(f.event, BatchSealed))
        )
        for change_observer in self._change_observers:
            change_observer()
        if sealed:
            for sealed_observer in self._sealed_observers:
                sealed_observer(sealed)

    # -- loading -----------------------------------------------------------------------------

    def load(self, *, through_version: int | None = None) -> None:
        """Fold the grouper stream, or its new tail (none if it already holds
        ``through_version``, once the append in flight has landed).

        The first load does not announce the batches sealed in the stream's history (most are long
        done): :meth:`unfinished_batches` says which to resume. Later catch-ups announce what they
        find, since those batches were sealed by a decision this process did not see.
        """
        with _translated():
            self._stream.load(through_version=through_version)

    # -- commands ----------------------------------------------------------------------------

    def request(self, requests: Sequence[MachineRequest]) -> Accepted:
        """Accept ``requests`` atomically: all are appended in one transaction, or none is.

        Raises :class:`InvalidRequest` or :class:`RequestRejected` naming the request at fault
        (by ``index``), :class:`LogUnavailable` or :class:`LogContention`.
        """
        ids, commands = self._request_plan(requests)
        decision = self._execute(commands)
        return Accepted(ids, _sealed(decision), decision.last_position)

    async def arequest(self, requests: Sequence[MachineRequest]) -> Accepted:
        """:meth:`request` for a caller on an event loop (which must not wait for the log on
        its own thread): decided on a committer thread, with the errors ``request`` raises."""
        ids, commands = self._request_plan(requests)
        try:
            with _translated():
                decision = await self._stream.decide(commands)
        except CommandRefused as e:
            raise _refusal(e) from e.error
        return Accepted(ids, _sealed(decision), decision.last_position)

    def _request_plan(
        self, requests: Sequence[MachineRequest]
    ) -> tuple[tuple[str, ...], Plan[GrouperCommand]]:
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

        return ids, commands

    def tick(self) -> tuple[str, ...]:
        """Seal every batch whose deadline has passed; returns the sealed batch ids."""
        decision = self._execute(lambda at: [(Tick(at), f"tick:{at.isoformat()}")], duty=True)
        return _sealed(decision)

    def shutdown(self) -> tuple[str, ...]:
        """Seal everything still pending (a graceful stop); returns the sealed batch ids."""
        decision = self._execute(
            lambda at: [(Shutdown(at), f"shutdown:{at.isoformat()}")], duty=True
        )
        sealed = _sealed(decision)
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
        self._execute(
            lambda at: [(RecordBatchOutcomes(batch_id, created, failed, at=at), causation_id)],
            duty=True,
        )
        resolved: list[tuple[Future[MachineOutcome], MachineOutcome]] = []
        with self._futures_lock:
            for outcome in outcomes:
                for future in self._futures.pop(outcome.request_id, ()):
                    resolved.append((future, outcome))
        for future, outcome in resolved:
            _resolve(future, outcome)

    def fail_waiting(self, error: MachinesError) -> int:
        """Fail every outcome future still waiting with ``error`` (a stop that cannot finish
        their batches); returns how many. The requests stay in the log and resume later."""
        with self._futures_lock:
            waiting = [f for futures in self._futures.values() for f in futures]
            self._futures.clear()
        for future in waiting:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        return len(waiting)

    def _execute(
        self,
        commands: Callable[[datetime], Sequence[tuple[GrouperCommand, str]]],
        *,
        duty: bool = False,
    ) -> Decision[GrouperEvent]:
        try:
            with _translated():
                return self._stream.execute(commands, duty=duty)
        except CommandRefused as e:
            raise _refusal(e) from e.error

    def _open_sealed_batches(
        self, events: Sequence[GrouperEvent], records: Sequence[NewEvent], at: datetime
    ) -> list[StreamAppend]:
        return [
            opening_append(
                self._batches,
                event.batch_id,
                OpenBatch(event, self._max_attempts, at=at),
                causation_id=str(record.event_id),
                writer=self._writer,
            )
            for event, record in zip(events, records, strict=True)
            if isinstance(event, BatchSealed)
        ]

    # -- queries -----------------------------------------------------------------------------

    def next_deadline(self) -> datetime | None:
        """When the next pending batch falls due (idle or max), or ``None`` if none is pending."""
        return self._stream.next_deadline()

    def status(self, request_id: str) -> tuple[RequestStatus, str] | None:
        """``(status, batch_id)`` of a request as the grouper knows it, or ``None``."""
        return grouper.request_status(self._stream.state, request_id)

    def unfinished_batches(self) -> tuple[str, ...]:
        """Sealed batches with a request the grouper has no outcome for, oldest first."""
        ledger = self._stream.state.ledger
        # A pending batch split when sealed (a lowered max_batch_size) has parts of its own ids.
        batch_ids = {
            ledger.sealed_in.get(request_id) or request.batch_id
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
        with self._futures_lock:
            found = grouper.request_status(self._stream.state, request_id)
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


def _sealed(decision: Decision[GrouperEvent]) -> tuple[str, ...]:
    return tuple(e.batch_id for e in decision.events if isinstance(e, BatchSealed))


@contextmanager
def _translated() -> Iterator[None]:
    """The host's log errors as this package's."""
    try:
        yield
    except runtime.LogUnavailable as e:
        raise LogUnavailable(str(e)) from e
    except runtime.LogContention as e:
        raise LogContention(
            f"{e}; is another controller writing to the same grouper? Run one leader per database"
        ) from e


def _refusal(refused: CommandRefused) -> MachinesError:
    """The grouper's refusal of one request, as this package's error naming it."""
    error = refused.error
    if isinstance(error, InvalidCommand):
        return InvalidRequest(str(error), index=refused.index, field=_field_of(str(error)))
    return RequestRejected(error.reason, index=refused.index)


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
