"""Why something happened: the causal chain of one id, from the originating request through every
decision to its outcome, read from the log.

The log links its events two ways. Metadata: ``correlation_id`` names what an event is about and
``causation_id`` the event (or command) that caused it. Domain ids: a workload's overflow names the
worker it waits for, placement asks for that worker as machine request ``placement-<worker>``, the
request names its batch and machine, the machine joins as the node of the same name, a job's
application names the testbed slots its pods then reserve. Causation alone does not cross those
hops (each capability writes its own streams), so the chain follows the domain ids, and each
step shows the earlier event its ``causation_id`` points at when there is one.

Each id is an *entity* (a machine request, workload, batch, machine or node, pod, job,
scheduling, testbed; a workload and its pod share the id, so do a machine and its node). An event
belongs to the entities it is about, and the entities are linked cause → effect::

    workload ──overflow──▶ machine request ──▶ machine/node        (the batch: shown with it)
    scheduling ──▶ job ──▶ pod                                     testbed ──▶ scheduling

The chain of an id is its entity with every entity upstream (its causes, transitively) and
downstream (its effects, transitively), never up then down, which would pull in siblings: the
other requests of a batch, the other pods of a job. A request shows its batch's own events (the
seal, the cloud call) without the batch's other requests; a batch asked about shows them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from fleetledger.eventstore import EventStore, RecordedEvent

from ._reading import PAGE

__all__ = ["ID_KINDS", "CausalIndex", "Explanation", "Step", "UnknownId", "explain"]

ID_KINDS: tuple[str, ...] = (
    "machine request",
    "workload",
    "batch",
    "machine or node",
    "pod",
    "job",
    "scheduling",
    "testbed",
)
"""The kinds of ids an explanation starts from, in the order an unknown id's error names them."""

_STEPS: Mapping[str, str] = {
    "placement.WorkloadSubmitted": "submitted",
    "placement.WorkloadWaiting": "overflow: waits for a new worker",
    "placement.WorkloadPlaced": "placed",
    "placement.WorkloadRejected": "rejected",
    "placement.WorkloadReleased": "released",
    "vm.MachineRequested": "machine requested",
    "vm.BatchSealed": "batch sealed",
    "vm.BatchOpened": "batch opened",
    "vm.BatchDispatched": "cloud call (dispatched)",
    "vm.MachineCreateAccepted": "cloud accepted the create",
    "vm.MachineNotFound": "machine not found: to be sent again",
    "vm.MachineCreated": "created",
    "vm.MachineFailed": "failed",
    "vm.BatchCompleted": "batch completed",
    "vm.BatchOutcomesRecorded": "outcomes recorded",
    "nodes.NodeJoined": "node joined",
    "nodes.NodeLeft": "node left",
    "nodes.OtherPodReserved": "reserved on the node",
    "nodes.OtherPodsReserved": "reserved on the node",
    "ipam.NodeJoined": "node joined the subnet",
    "ipam.NodeLeft": "node left the subnet",
    "batch_job.JobClaimed": "job claimed",
    "batch_job.ApplicationRequested": "application requested",
    "batch_job.ApplicationCreated": "application created",
    "testbed.SlotReserved": "slot reserved",
    "testbed.ReservationCleared": "slot cleared",
}
"""What each event is, as a step of a chain (other events show their type's name)."""

_KEY_FIELDS: tuple[str, ...] = (
    "workload_id",
    "request_id",
    "machine_name",
    "batch_id",
    "worker",
    "pool",
    "node",
    "pod",
    "pod_name",
    "job",
    "scheduling",
    "name",
    "slot_id",
    "attempt",
    "reason",
    "code",
    "provider_id",
    "subnet_id",
)
_LIST_FIELDS: tuple[str, ...] = ("request_ids", "created_request_ids", "failed_request_ids", "jobs")
_SHOWN_IN_FULL = 4
"""A list field with more items than this shows as its count."""


class UnknownId(LookupError):
    """No event of the log is about the id asked for."""

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"no event in the log is about {subject!r}: searched the ids of every "
            f"{', '.join(ID_KINDS[:-1])} and {ID_KINDS[-1]}; check the id against "
            "`fleetledger events tail`"
        )
        self.subject = subject


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One event of a chain."""

    position: int
    recorded_at: datetime
    at: str | None
    """The event's own time (when the decision was taken), if it has one."""
    type: str
    stream_id: str
    step: str
    correlation_id: str | None
    causation_id: str | None
    caused_by: int | None
    """The position of the event ``causation_id`` names, when it names one in the log."""
    fields: Mapping[str, object]

    def to_dict(self) -> dict[str, object]:
        return {
            "position": self.position,
            "recorded_at": self.recorded_at.isoformat(),
            "at": self.at,
            "type": self.type,
            "stream_id": self.stream_id,
            "step": self.step,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "caused_by": self.caused_by,
            "fields": dict(self.fields),
        }

    def line(self) -> str:
        """The step as one line: position, time, type, stream, step, key fields, cause."""
        shown = " ".join(f"{k}={v}" for k, v in self.fields.items())
        cause = f" (caused by #{self.caused_by})" if self.caused_by is not None else ""
        when = self.at or self.recorded_at.isoformat()
        return (
            f"#{self.position:<7} {when}  {self.type:<28} {self.stream_id}  [{self.step}] "
            f"{shown}{cause}"
        ).rstrip()


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """The chain of ``subject``: its steps in log order."""

    subject: str
    kinds: tuple[str, ...]
    """What the log knows ``subject`` as (a workload, a machine request, …)."""
    steps: tuple[Step, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.subject,
            "kinds": list(self.kinds),
            "steps": [step.to_dict() for step in self.steps],
        }

    def lines(self) -> Iterator[str]:
        yield f"{self.subject} ({', '.join(self.kinds)}): {len(self.steps)} events"
        for step in self.steps:
            yield step.line()


@dataclass(slots=True)
class _Entity:
    kinds: set[str] = field(default_factory=set)
    positions: list[int] = field(default_factory=list)
    causes: set[str] = field(default_factory=set)
    effects: set[str] = field(default_factory=set)
    context: set[str] = field(default_factory=set)
    """Entities whose own events the chain shows, not followed further (a request's batch)."""
    members: set[str] = field(default_factory=set)
    """Entities asked about along with this one when it is the subject (a batch's requests)."""


class CausalIndex:
    """Every id of the log with the events about it and its causes and effects; fed in log
    order (:meth:`add`), then asked (:meth:`explain`)."""

    def __init__(self) -> None:
        self._entities: dict[str, _Entity] = {}
        self._records: dict[int, RecordedEvent] = {}
        self._positions_by_event_id: dict[str, int] = {}
        self._requests_by_machine: dict[str, set[str]] = {}
        self._waiting_for: dict[str, set[str]] = {}
        """Worker (machine) name → the workloads whose overflow waits for it."""
        self._job_of_slot: dict[tuple[str, int], str] = {}
        """(testbed, slot id) → the job whose application was last given the slot."""

    def add(self, record: RecordedEvent) -> None:
        """Index one event; events come in log order."""
        self._positions_by_event_id[str(record.event_id)] = record.global_position
        about = list(self._link(record))
        if about:
            self._records[record.global_position] = record
        for subject, kind in about:
            entity = self._entity(subject)
            entity.kinds.add(kind)
            if not entity.positions or entity.positions[-1] != record.global_position:
                entity.positions.append(record.global_position)

    def add_all(self, records: Iterable[RecordedEvent]) -> None:
        for record in records:
            self.add(record)

    def _entity(self, subject: str) -> _Entity:
        entity = self._entities.get(subject)
        if entity is None:
            entity = self._entities[subject] = _Entity()
        return entity

    def _edge(self, cause: str, effect: str) -> None:
        self._entity(cause).effects.add(effect)
        self._entity(effect).causes.add(cause)

    def _link(self, record: RecordedEvent) -> Iterator[tuple[str, str]]:
        """The entities ``record`` is about, with the kind each is; records its links."""
        data, kind = record.data, record.type
        if kind.startswith("vm."):
            yield from self._link_machines(record)
        elif kind.startswith("placement."):
            workload = data["request"]["id"] if kind.endswith("Submitted") else data["workload_id"]
            yield workload, "workload"
            if kind == "placement.WorkloadWaiting":
                worker = data["worker"]
                self._waiting_for.setdefault(worker, set()).add(workload)
                for request in self._requests_by_machine.get(worker, ()):
                    self._edge(workload, request)
        elif kind.startswith("nodes."):
            yield from self._link_node(record)
        elif kind in ("ipam.NodeJoined", "ipam.NodeLeft"):
            yield data["node"], "machine or node"
        elif kind.startswith(("batch_job.", "scheduling.", "testbed.")):
            yield from self._link_testbeds(record)

    def _link_machines(self, record: RecordedEvent) -> Iterator[tuple[str, str]]:
        data = record.data
        batch = data.get("batch_id")
        request = data.get("request_id")
        if record.type == "vm.MachineRequested":
            machine, request = data["machine_name"], str(request)
            self._requests_by_machine.setdefault(machine, set()).add(request)
            self._edge(request, machine)
            for workload in self._waiting_for.get(machine, ()):
                self._edge(workload, request)
            self._entity(machine).kinds.add("machine or node")
        if isinstance(request, str):
            yield request, "machine request"
            if isinstance(batch, str):
                self._entity(request).context.add(batch)
                self._entity(batch).members.add(request)
        elif isinstance(batch, str):
            yield batch, "batch"
            for member in data.get("request_ids") or ():
                self._entity(batch).members.add(member)

    def _link_node(self, record: RecordedEvent) -> Iterator[tuple[str, str]]:
        data = record.data
        if record.type == "nodes.OtherPodsReserved":
            for pod in data["pods"]:
                yield pod["pod"], "pod"
        elif isinstance(data.get("pod"), str):
            yield data["pod"], "pod"
        elif record.type in ("nodes.NodeJoined", "nodes.NodeLeft"):
            # NodeLeft carries no name: the stream's is the node's (``node-<name>``).
            node = data.get("node") or record.stream_id.partition("-")[2]
            yield node, "machine or node"

    def _link_testbeds(self, record: RecordedEvent) -> Iterator[tuple[str, str]]:
        data, kind = record.data, record.type
        if kind == "scheduling.SchedulingCreated":
            yield data["name"], "scheduling"
            self._edge(data["testbed"], data["name"])
        elif kind.startswith("scheduling."):
            # A scheduling's stream is ``scheduling-<name>``; its later events do not repeat it.
            scheduling = record.stream_id.partition("-")[2]
            yield scheduling, "scheduling"
            for job in data.get("jobs") or ():
                self._edge(scheduling, job)
            for assignment in data.get("assignments") or ():
                self._edge(scheduling, assignment["job"])
        elif kind.startswith("batch_job."):
            job = data.get("job") or data["name"]
            yield job, "job"
            if isinstance(data.get("scheduling"), str):
                self._edge(data["scheduling"], job)
            if kind == "batch_job.ApplicationRequested":
                testbed = data["request"]["testbed"]
                for slot in data["request"]["slot_ids"]:
                    self._job_of_slot[(testbed, slot)] = job
        elif kind in ("testbed.SlotReserved", "testbed.ReservationCleared"):
            pod = data["pod_name"]
            yield pod, "pod"
            testbed = record.stream_id.partition("-")[2]
            job = self._job_of_slot.get((testbed, data["slot_id"]))
            if job is not None and kind == "testbed.SlotReserved":
                self._edge(job, pod)
        elif kind in ("testbed.TestbedClaimed", "testbed.TestbedReleased"):
            yield data["scheduling"], "scheduling"
        elif kind == "testbed.TestbedDefined":
            yield data["name"], "testbed"

    # -- asking ---------------------------------------------------------------------------------

    def explain(self, subject: str) -> Explanation:
        """The chain of ``subject``; :class:`UnknownId` if no event is about it."""
        start = self._entities.get(subject)
        if start is None or not (start.positions or start.members or start.causes):
            raise UnknownId(subject)
        asked = {subject, *start.members}
        chain = self._follow(asked, upstream=True) | self._follow(asked, upstream=False)
        shown = set(chain)
        for name in chain:
            shown |= self._entities[name].context
        positions = sorted(
            {p for name in shown if name in self._entities for p in self._entities[name].positions}
        )
        kinds = tuple(k for k in ID_KINDS if k in start.kinds)
        return Explanation(
            subject=subject,
            kinds=kinds,
            steps=tuple(self._step(self._records[p]) for p in positions),
        )

    def _follow(self, asked: set[str], *, upstream: bool) -> set[str]:
        reached, frontier = set(asked), list(asked)
        while frontier:
            entity = self._entities.get(frontier.pop())
            if entity is None:
                continue
            for name in entity.causes if upstream else entity.effects:
                if name not in reached:
                    reached.add(name)
                    frontier.append(name)
        return reached

    def _step(self, record: RecordedEvent) -> Step:
        metadata = record.metadata
        causation = metadata.get("causation_id")
        at = record.data.get("at")
        return Step(
            position=record.global_position,
            recorded_at=record.recorded_at,
            at=at if isinstance(at, str) else None,
            type=record.type,
            stream_id=record.stream_id,
            step=_STEPS.get(record.type, record.type.partition(".")[2]),
            correlation_id=metadata.get("correlation_id") or None,
            causation_id=causation if isinstance(causation, str) else None,
            caused_by=self._positions_by_event_id.get(causation)
            if isinstance(causation, str)
            else None,
            fields=_key_fields(record),
        )


def _key_fields(record: RecordedEvent) -> dict[str, object]:
    data = record.data
    shown: dict[str, object] = {}
    if record.type == "placement.WorkloadSubmitted":
        shown["workload_id"] = data["request"]["id"]
    for name in _KEY_FIELDS:
        value = data.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool):
            shown[name] = value
    if record.type == "nodes.OtherPodsReserved":
        shown["pods"] = ",".join(pod["pod"] for pod in data["pods"])
    for name in _LIST_FIELDS:
        items = data.get(name)
        if isinstance(items, list) and items:
            shown[name] = (
                ",".join(map(str, items)) if len(items) <= _SHOWN_IN_FULL else f"{len(items)} ids"
            )
    return shown


def explain(store: EventStore, subject: str) -> Explanation:
    """The chain of ``subject`` in the log, read from position 0 (see the module docstring);
    :class:`UnknownId` if no event is about it."""
    index = CausalIndex()
    after = 0
    while True:
        records = store.read_all(after=after, limit=PAGE)
        index.add_all(records)
        if len(records) < PAGE:
            return index.explain(subject)
        after = records[-1].global_position
