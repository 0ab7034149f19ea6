"""Read model of machine requests: request id → status, batch, outcome.

Folded from the log in global order: the grouper stream gives a request its batch (``pending``,
then ``sealed``), the batch's own stream its progress (``dispatched``, back to ``sealed`` when a
read finds the machine missing and it waits to be sent again) and its one outcome (``created`` or
``failed``). Statuses only move along that lifecycle; the log guarantees the order.

The model lives in memory and is rebuilt from position 0 on start (docs/ARCHITECTURE.md, "Read
models", says why); folding from 0 and folding incrementally give equal views, which the tests
check.
It keeps one view per request the grouper ever accepted — fine for this slice; a table-backed
version with its checkpoint in the same transaction is the step for very long-lived groupers.

Waiting is event-driven: :meth:`MachineRequestsProjection.wait_for_position` parks on a condition
until the model has read that far, and :meth:`MachineRequestsProjection.watch` returns a future
resolved when a request reaches its outcome (the HTTP long-poll awaits it).

Which streams belong to the grouper is passed in (``grouper_stream``, ``batch_stream_prefix``):
the naming convention is the runtime's (``adapters.machines.streams``), not this module's.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from fleetledger.domain.machines import (
    BatchDispatched,
    BatchSealed,
    MachineCreated,
    MachineError,
    MachineFailed,
    MachineNotFound,
    MachineRequested,
)
from fleetledger.eventstore import EventStore, RecordedEvent
from fleetledger.projections._reading import catch_up
from fleetledger.projections.recent import RecentEvents

__all__ = [
    "MachineRequestsProjection",
    "REQUEST_EVENT_TYPES",
    "RequestState",
    "RequestView",
    "TERMINAL_STATES",
]

RequestState = Literal["pending", "sealed", "dispatched", "created", "failed"]
TERMINAL_STATES: tuple[RequestState, ...] = ("created", "failed")

REQUEST_EVENT_TYPES: tuple[str, ...] = (
    "vm.MachineRequested",
    "vm.BatchSealed",
    "vm.BatchDispatched",
    "vm.MachineCreated",
    "vm.MachineFailed",
    "vm.MachineNotFound",
)
"""The event types that change a request's view (the rest of the vm.* events do not)."""
_REQUEST_TYPES = frozenset(REQUEST_EVENT_TYPES)


@dataclass(frozen=True, slots=True)
class RequestView:
    """Everything known about one request, as of global position ``position``."""

    request_id: str
    machine_name: str
    template_hash: str
    batch_id: str
    status: RequestState
    skip_batching: bool
    requested_at: datetime
    position: int
    sealed_at: datetime | None = None
    seal_reason: str | None = None
    dispatched_at: datetime | None = None
    attempts: int = 0
    completed_at: datetime | None = None
    provider_id: str | None = None
    error: MachineError | None = None

    @property
    def terminal(self) -> bool:
        """True once the request has its one outcome."""
        return self.status in TERMINAL_STATES

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form; ``outcome`` is ``None`` until the request is created or failed."""
        outcome: dict[str, object] | None = None
        if self.terminal:
            error = self.error
            outcome = {
                "status": self.status,
                "provider_id": self.provider_id,
                "at": _iso(self.completed_at),
                "error": None if error is None else dataclasses.asdict(error),
            }
        return {
            "request_id": self.request_id,
            "machine_name": self.machine_name,
            "status": self.status,
            "batch_id": self.batch_id,
            "template_hash": self.template_hash,
            "skip_batching": self.skip_batching,
            "requested_at": _iso(self.requested_at),
            "sealed_at": _iso(self.sealed_at),
            "seal_reason": self.seal_reason,
            "dispatched_at": _iso(self.dispatched_at),
            "attempts": self.attempts,
            "outcome": outcome,
        }


_VIEW_FIELDS = tuple(RequestView.__dataclass_fields__)
_VIEW_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(RequestView)
    if f.default is not dataclasses.MISSING
}


class _Entry:
    """A request's view as the model folds it: updated in place, read as a :class:`RequestView`.
    A burst moves each request through three or four states (fifty at a time when a batch is
    sealed or dispatched); a new frozen view per change cost the model more than reading the
    log did."""

    __slots__ = _VIEW_FIELDS

    request_id: str
    status: RequestState
    position: int
    sealed_at: datetime | None
    seal_reason: str | None
    dispatched_at: datetime | None
    attempts: int
    completed_at: datetime | None
    provider_id: str | None
    error: MachineError | None

    def __init__(self, **values: object) -> None:
        for name, value in _VIEW_DEFAULTS.items():
            setattr(self, name, value)
        for name, value in values.items():
            setattr(self, name, value)

    def view(self) -> RequestView:
        return RequestView(**{name: getattr(self, name) for name in _VIEW_FIELDS})


class MachineRequestsProjection:
    """The views of one grouper's requests; thread-safe.

    ``recent``: the events this process's grouper and batch streams appended, which the model
    then folds without decoding them again (see
    :class:`~fleetledger.projections.recent.RecentEvents`).
    """

    def __init__(
        self, *, grouper_stream: str, batch_stream_prefix: str, recent: RecentEvents | None = None
    ) -> None:
        self.recent = recent if recent is not None else RecentEvents()
        self._grouper_stream = grouper_stream
        self._batch_prefix = batch_stream_prefix
        self._entries: dict[str, _Entry] = {}
        self._batches: dict[str, tuple[str, ...]] = {}
        self._position = 0
        self._grouper_version = 0
        self._changed = threading.Condition()
        self._reading = threading.Lock()
        self._watchers: dict[str, list[Future[RequestView]]] = {}
        # (position, sequence, future): futures of callers waiting for the model to read up to
        # a position, the nearest first.
        self._position_waiters: list[tuple[int, int, Future[None]]] = []
        self._waiter_sequence = itertools.count()

    # -- reading the log -----------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The global position of the last event read."""
        with self._changed:
            return self._position

    @property
    def grouper_version(self) -> int:
        """The grouper stream's version as of its last event the model read (of its
        ``REQUEST_EVENT_TYPES``: the requests and seals that change what the grouper decides)."""
        with self._changed:
            return self._grouper_version

    def catch_up(self, store: EventStore) -> int:
        """Read and apply every relevant event after :attr:`position`; return how many were read.
        The position then moves past the other events read over (see ``_reading.catch_up``)."""
        with self._reading:
            read, through = catch_up(
                store, self.position, types=REQUEST_EVENT_TYPES, apply=self.apply
            )
            self._read_up_to(through)
        return read

    def _read_up_to(self, position: int) -> None:
        with self._changed:
            if position > self._position:
                self._position = position
                self._changed.notify_all()
            reached = self._reached_waiters()
        _release(reached)

    def _reached_waiters(self) -> list[Future[None]]:
        """Pop the position waiters the model has reached; call holding ``_changed``."""
        waiters, reached = self._position_waiters, []
        while waiters and waiters[0][0] <= self._position:
            reached.append(heapq.heappop(waiters)[2])
        return reached

    def apply(self, record: RecordedEvent) -> None:
        """Fold one event; events at or before :attr:`position` are ignored (already applied)."""
        done: list[tuple[Future[RequestView], RequestView]] = []
        with self._changed:
            if record.global_position <= self._position:
                return
            self._position = record.global_position
            if record.stream_id == self._grouper_stream:
                self._grouper_version = record.stream_version
            if self._is_ours(record):
                for entry in self._fold(record):
                    if entry.status in TERMINAL_STATES and entry.request_id in self._watchers:
                        view = entry.view()
                        done.extend((f, view) for f in self._watchers.pop(entry.request_id))
            self._changed.notify_all()
            reached = self._reached_waiters() if self._position_waiters else []
        for future, view in done:
            _resolve(future, view)
        _release(reached)

    def _is_ours(self, record: RecordedEvent) -> bool:
        stream = record.stream_id
        return stream == self._grouper_stream or stream.startswith(self._batch_prefix)

    def _fold(self, record: RecordedEvent) -> list[_Entry]:
        """Update the entries ``record`` concerns in place; the ones it changed."""
        if record.type not in _REQUEST_TYPES:
            return []  # a third of a batch's events change no view: not worth decoding
        event = self.recent.decode(record)
        position = record.global_position
        if isinstance(event, MachineRequested):
            entry = _Entry(
                request_id=event.request_id,
                machine_name=event.machine_name,
                template_hash=event.template_hash,
                batch_id=event.batch_id,
                status="pending",
                skip_batching=event.skip_batching,
                requested_at=event.at,
                position=position,
            )
            self._entries[event.request_id] = entry
            return [entry]
        if isinstance(event, BatchSealed):
            self._batches[event.batch_id] = event.request_ids
            changed = self._open(event.request_ids, position)
            for entry in changed:
                entry.status, entry.sealed_at, entry.seal_reason = "sealed", event.at, event.reason
            return changed
        if record.stream_id != self._batch_prefix + getattr(event, "batch_id", ""):
            return []  # a batch stream of a grouper whose name merely starts like ours
        if isinstance(event, BatchDispatched):
            changed = self._open(event.request_ids, position)
            for entry in changed:
                entry.status, entry.dispatched_at = "dispatched", event.at
                entry.attempts += 1
            return changed
        if isinstance(event, MachineNotFound):
            changed = self._open((event.request_id,), position)
            for entry in changed:
                entry.status = "sealed"
            return changed
        if isinstance(event, MachineCreated):
            changed = self._open((event.request_id,), position)
            for entry in changed:
                entry.status, entry.completed_at = "created", event.at
                entry.provider_id = event.provider_id
            return changed
        if isinstance(event, MachineFailed):
            error = MachineError(
                event.code, event.message, event.retryable, event.retry_after_seconds
            )
            changed = self._open((event.request_id,), position)
            for entry in changed:
                entry.status, entry.completed_at, entry.error = "failed", event.at, error
            return changed
        return []

    def _open(self, request_ids: tuple[str, ...], position: int) -> list[_Entry]:
        """The known, not yet terminal entries of ``request_ids``, moved to ``position``."""
        entries = self._entries
        changed = []
        for request_id in request_ids:
            entry = entries.get(request_id)
            if entry is not None and entry.status not in TERMINAL_STATES:
                entry.position = position
                changed.append(entry)
        return changed

    # -- queries -------------------------------------------------------------------------------

    def get(self, request_id: str) -> RequestView | None:
        """The request's view, or ``None`` if the model has not seen it."""
        with self._changed:
            entry = self._entries.get(request_id)
            return None if entry is None else entry.view()

    def views(self) -> Mapping[str, RequestView]:
        """Every view by request id (a copy)."""
        with self._changed:
            return {request_id: entry.view() for request_id, entry in self._entries.items()}

    def batch(self, batch_id: str) -> tuple[str, ...]:
        """The request ids sealed in ``batch_id``, in batch order (empty if not sealed yet)."""
        with self._changed:
            return self._batches.get(batch_id, ())

    def counts(self) -> Mapping[str, int]:
        """How many requests are in each status."""
        with self._changed:
            return dict(Counter(entry.status for entry in self._entries.values()))

    # -- waiting -------------------------------------------------------------------------------

    def wait_for_position(self, position: int, timeout: float) -> bool:
        """Block until the model has read up to ``position`` (True) or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(lambda: self._position >= position, timeout=timeout)

    def reached(self, position: int) -> Future[None]:
        """A future resolved once the model has read up to ``position`` (at once if it has):
        :meth:`wait_for_position` for callers that must not block, such as an event loop."""
        future: Future[None] = Future()
        with self._changed:
            if self._position < position:
                heapq.heappush(
                    self._position_waiters, (position, next(self._waiter_sequence), future)
                )
                return future
        _release([future])
        return future

    def watch(self, request_id: str) -> Future[RequestView]:
        """A future resolved with the request's view once it is terminal (at once if it is).

        Cancel it to stop waiting. ``KeyError`` if the model has not seen the request.
        """
        future: Future[RequestView] = Future()
        with self._changed:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(request_id)
            view = entry.view()
            if not view.terminal:
                self._watchers.setdefault(request_id, []).append(future)
                future.add_done_callback(self._forget)
                return future
        _resolve(future, view)
        return future

    def _forget(self, future: Future[RequestView]) -> None:
        # A cancelled long-poll must not leave its future behind until the request completes.
        if not future.cancelled():
            return
        with self._changed:
            for request_id, futures in list(self._watchers.items()):
                if future in futures:
                    futures.remove(future)
                    if not futures:
                        del self._watchers[request_id]


def _release(futures: list[Future[None]]) -> None:
    for future in futures:
        if future.set_running_or_notify_cancel():
            future.set_result(None)


def _resolve(future: Future[RequestView], view: RequestView) -> None:
    if future.set_running_or_notify_cancel():
        future.set_result(view)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
