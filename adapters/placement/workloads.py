"""Workload streams in the log: their codec, the appends that record them, and the read-back.

Each workload submitted for placement has a ``workload-<id>`` stream
(:mod:`fleetledger.domain.placement.workloads`). The placement service decides on the folded
streams it keeps in a :class:`WorkloadLedger` and appends what they decide with the stream's
version as the expected version, together with whatever else the same step writes (a batch's
node reservations, a release's ``PodDeleted``), so each step is one transaction.
:func:`read_workload_events` pages through them for a restart, and for a leader following
what other processes recorded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from fleetledger.adapters.runtime import EventCodec, Writer, events_of
from fleetledger.domain.placement import Workload, WorkloadCommand, WorkloadEvent, workloads
from fleetledger.eventstore import EventStore, RecordedEvent, StreamAppend

__all__ = [
    "WORKLOAD_CODEC",
    "WorkloadLedger",
    "read_workload",
    "read_workload_events",
    "read_workloads",
]

WORKLOAD_CODEC: EventCodec[WorkloadEvent] = EventCodec(
    "workloads", events_of(WorkloadEvent), correlation_fields=("workload_id",)
)

_PAGE = 1000


class WorkloadLedger:
    """The folded workload streams this process knows, with their versions. Not thread-safe:
    the placement service guards it with its lock."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, Workload]] = {}

    def __contains__(self, workload_id: object) -> bool:
        return workload_id in self._known

    def get(self, workload_id: str) -> tuple[int, Workload]:
        """``(version, state)`` of the workload's stream as far as this process knows it."""
        return self._known.get(workload_id, (0, workloads.initial_state()))

    def state(self, workload_id: str) -> Workload:
        return self.get(workload_id)[1]

    def put(self, workload_id: str, version: int, state: Workload) -> None:
        """What the log holds for the workload (read back after another writer moved it)."""
        if version >= self.get(workload_id)[0]:
            self._known[workload_id] = (version, state)

    def items(self) -> dict[str, tuple[int, Workload]]:
        """``{id: (version, state)}`` of every known workload."""
        return dict(self._known)

    def states(self) -> dict[str, Workload]:
        """Every known workload's state, in the order the workloads were first recorded."""
        return {rid: state for rid, (_, state) in self._known.items()}

    def fold(self, record: RecordedEvent) -> str | None:
        """Fold ``record``, read from the log in position order, into its workload's stream;
        the workload's id if it moved the ledger (``None``: not a workload event, or one this
        process appended and already knows). A record past the next version means the ledger
        missed one: ``LookupError`` (read the stream back whole)."""
        workload_id = workloads.workload_of_stream(record.stream_id)
        if workload_id is None:
            return None
        version, state = self.get(workload_id)
        if record.stream_version <= version:
            return None
        if record.stream_version != version + 1:
            raise LookupError(workload_id)
        event = WORKLOAD_CODEC.decode(record)
        self._known[workload_id] = (record.stream_version, workloads.evolve(state, event))
        return workload_id

    def decide(
        self, workload_id: str, commands: Sequence[WorkloadCommand]
    ) -> tuple[list[WorkloadEvent], Workload]:
        """The events ``commands`` decide in turn on the workload's known state, and the state
        they leave; raises the domain's ``Rejected``."""
        state = self.state(workload_id)
        events: list[WorkloadEvent] = []
        for command in commands:
            new = workloads.decide(state, command)
            for event in new:
                state = workloads.evolve(state, event)
            events.extend(new)
        return events, state

    def append_for(
        self,
        workload_id: str,
        events: Sequence[WorkloadEvent],
        *,
        writer: Writer,
        cause: str,
        term: int | None = None,
    ) -> StreamAppend:
        """The append of ``events`` to the workload's stream, expected version = the known one."""
        version = self.get(workload_id)[0]
        stream = workloads.stream_id(workload_id)
        records = WORKLOAD_CODEC.encode(
            stream,
            version + 1,
            events,
            causation_ids=[cause] * len(events),
            actor=writer.actor,
            labels=dict(writer.labels),
            leader_terms=[term] * len(events) if term is not None else None,
        )
        return StreamAppend(stream, records, expected_version=version)


def read_workload(store: EventStore, workload_id: str) -> tuple[int, Workload]:
    """The workload's stream folded from the log: ``(version, state)``."""
    state, version = workloads.initial_state(), 0
    stream = workloads.stream_id(workload_id)
    while True:
        records = store.read_stream(stream, from_version=version + 1, limit=_PAGE)
        for record in records:
            state = workloads.evolve(state, WORKLOAD_CODEC.decode(record))
            version = record.stream_version
        if len(records) < _PAGE:
            return version, state


def read_workload_events(store: EventStore, *, after: int) -> Iterator[list[RecordedEvent]]:
    """The workload events after log position ``after``, a page at a time, in position order."""
    types = WORKLOAD_CODEC.type_names()
    while True:
        records = store.read_all(after=after, limit=_PAGE, types=types)
        if records:
            yield records
        if len(records) < _PAGE:
            return
        after = records[-1].global_position


def read_workloads(store: EventStore) -> dict[str, tuple[int, Workload]]:
    """Every workload stream folded from the log, in the order the workloads were first
    submitted: ``{id: (version, state)}``."""
    ledger = WorkloadLedger()
    for page in read_workload_events(store, after=0):
        for record in page:
            ledger.fold(record)
    return ledger.items()
