"""The invariants every log must keep, checked on a replay from position 0, event by event.

What the deterministic simulation checks after each seed and ``audit verify`` checks on any log:

- ``one_outcome``: a machine request has at most one outcome (one ``MachineCreated`` or
  ``MachineFailed``, recorded once by its grouper), and no outcome without its request; a
  workload is placed at most once until it is released.
- ``grant_beyond_capacity``: no grant (``ResourcesGranted``) raises a pod's reservation while that
  leaves its node reserved beyond ``total − system`` (a restart or a config change may leave a
  node above it, never a grant), and no node amount goes below zero.
- ``slot_held_twice``: no testbed slot is reserved for a pod while another pod holds it.
- ``illegal_transition``: each aggregate moves only along its lifecycle — a request is requested,
  sealed into one batch, dispatched (again after the cloud lost it), then has its outcome; a batch
  stream opens once, first, and records nothing after it completed; a workload is submitted,
  then waits, is placed or rejected, is released, and may be submitted again.

A log in flight is not in breach: a request still without an outcome, a workload still waiting,
are where a live controller leaves them. The checks fold the raw records (the node checks fold
the domain's own states, since capacity is the domain's arithmetic), so a record the code no
longer decodes does not hide a breach behind an exception.

:class:`InvariantChecks` takes records one at a time and answers the breaches each brings;
:func:`first_breach` replays a store and stops at the first. The node arithmetic is public
(:func:`grant_overruns`, :func:`negative_amounts`) for checks that fold node events themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from fleetledger.domain import nodes
from fleetledger.domain.nodes import NodeEvent, NodeState, ResourcesGranted
from fleetledger.eventstore import EventStore, RecordedEvent

from ._reading import PAGE
from .recent import decode

__all__ = [
    "INVARIANTS",
    "Breach",
    "Invariant",
    "InvariantChecks",
    "first_breach",
    "grant_overruns",
    "negative_amounts",
]

Invariant = Literal["one_outcome", "grant_beyond_capacity", "slot_held_twice", "illegal_transition"]
INVARIANTS: tuple[Invariant, ...] = (
    "one_outcome",
    "grant_beyond_capacity",
    "slot_held_twice",
    "illegal_transition",
)


@dataclass(frozen=True, slots=True)
class Breach:
    """An invariant the event at ``position`` broke, and how."""

    position: int
    invariant: Invariant
    detail: str

    def to_dict(self) -> dict[str, object]:
        return {"position": self.position, "invariant": self.invariant, "detail": self.detail}

    def __str__(self) -> str:
        return f"position {self.position}: {self.invariant}: {self.detail}"


# -- machine requests ------------------------------------------------------------------------------

_Phase = Literal["requested", "sealed", "dispatched", "created", "failed"]
_TERMINAL: frozenset[_Phase] = frozenset({"created", "failed"})
_IN_A_BATCH: frozenset[_Phase] = frozenset({"sealed", "dispatched"})
_BATCH_STREAM_EVENTS = frozenset(
    {
        "vm.BatchOpened",
        "vm.BatchDispatched",
        "vm.MachineCreateAccepted",
        "vm.MachineNotFound",
        "vm.MachineCreated",
        "vm.MachineFailed",
        "vm.BatchCompleted",
    }
)


@dataclass(slots=True)
class _Batch:
    opened: bool = False
    completed: bool = False


@dataclass(slots=True)
class _Requests:
    """One grouper's requests and batches, by id."""

    phases: dict[str, _Phase] = field(default_factory=dict)
    recorded: set[str] = field(default_factory=set)
    """Requests whose outcome the grouper recorded (``BatchOutcomesRecorded``)."""
    batches: dict[str, _Batch] = field(default_factory=dict)


# -- workloads -------------------------------------------------------------------------------------

_WORKLOAD_MOVES: Mapping[str, frozenset[str]] = {
    "new": frozenset({"Submitted"}),
    "submitted": frozenset({"Placed", "Waiting", "Rejected", "Released"}),
    "waiting": frozenset({"Placed", "Waiting", "Rejected", "Released"}),
    "placed": frozenset({"Released"}),
    "rejected": frozenset({"Submitted", "Waiting", "Rejected", "Released"}),
    "released": frozenset({"Submitted"}),
}
"""A workload's phase → the events that may follow it (as placement's ``decide`` records them)."""
_WORKLOAD_PHASE = {
    "Submitted": "submitted",
    "Placed": "placed",
    "Waiting": "waiting",
    "Rejected": "rejected",
    "Released": "released",
}


class InvariantChecks:
    """The invariants (see the module docstring) over records fed in log order from position 0."""

    def __init__(self) -> None:
        self._groupers: dict[str, _Requests] = {}
        self._workloads: dict[str, str] = {}
        self._nodes: dict[str, NodeState] = {}
        self._slots: dict[str, dict[tuple[str, int], str]] = {}
        self._node_prefix = nodes.stream_id("")
        self._handlers: dict[str, Callable[[RecordedEvent], Iterator[Breach]]] = {
            "vm": self._machines,
            "placement": self._workload,
            "nodes": self._node,
            "testbed": self._testbed,
        }

    def check(self, record: RecordedEvent) -> list[Breach]:
        """Fold ``record``; the breaches it brings (none for most)."""
        handler = self._handlers.get(record.type.partition(".")[0])
        if handler is None:
            return []
        try:
            return list(handler(record))
        except (KeyError, TypeError, ValueError) as e:
            # A record that does not hold its type's fields hides whatever it decided.
            return [
                _illegal(
                    record.global_position,
                    f"{record.type} on {record.stream_id} does not decode "
                    f"({type(e).__name__}: {e})",
                )
            ]

    def check_all(self, records: Iterable[RecordedEvent]) -> Iterator[Breach]:
        for record in records:
            yield from self.check(record)

    # -- machine requests and batches ----------------------------------------------------------

    def _machines(self, record: RecordedEvent) -> Iterator[Breach]:
        # Request and batch ids are a grouper's: two groupers may use the same ones.
        grouper = str(record.metadata.get("grouper", ""))
        requests = self._groupers.setdefault(grouper, _Requests())
        data, kind, position = record.data, record.type, record.global_position
        yield from self._request_breaches(requests, record)
        # After the request's own: a second outcome is named as such even in a completed batch.
        if kind in _BATCH_STREAM_EVENTS:
            yield from _batch_move(requests.batches, data["batch_id"], kind, position)

    def _request_breaches(self, requests: _Requests, record: RecordedEvent) -> Iterator[Breach]:
        data, kind, position = record.data, record.type, record.global_position
        if kind == "vm.MachineRequested":
            request = data["request_id"]
            if request in requests.phases:
                yield _illegal(position, f"request {request} was requested again")
            requests.phases[request] = "requested"
        elif kind == "vm.BatchSealed":
            for request in data["request_ids"]:
                yield from _request_move(requests, request, "sealed", position, {"requested"})
        elif kind == "vm.BatchDispatched":
            for request in data["request_ids"]:
                yield from _request_move(requests, request, "dispatched", position, _IN_A_BATCH)
        elif kind == "vm.MachineCreateAccepted":
            yield from _request_move(
                requests, data["request_id"], "dispatched", position, {"dispatched"}
            )
        elif kind == "vm.MachineNotFound":
            yield from _request_move(requests, data["request_id"], "sealed", position, _IN_A_BATCH)
        elif kind in ("vm.MachineCreated", "vm.MachineFailed"):
            yield from _outcome(requests, data["request_id"], kind, position)
        elif kind == "vm.BatchOutcomesRecorded":
            for request in (*data["created_request_ids"], *data["failed_request_ids"]):
                if request in requests.recorded:
                    yield Breach(
                        position, "one_outcome", f"request {request}'s outcome recorded twice"
                    )
                requests.recorded.add(request)

    # -- workloads -----------------------------------------------------------------------------

    def _workload(self, record: RecordedEvent) -> Iterator[Breach]:
        data, move = record.data, record.type.partition(".")[2].removeprefix("Workload")
        if move not in _WORKLOAD_PHASE:
            return
        workload = data["request"]["id"] if move == "Submitted" else data["workload_id"]
        phase = self._workloads.get(workload, "new")
        if move not in _WORKLOAD_MOVES[phase]:
            invariant: Invariant = (
                "one_outcome" if (phase, move) == ("placed", "Placed") else "illegal_transition"
            )
            yield Breach(
                record.global_position,
                invariant,
                f"workload {workload} is {phase}: it cannot be {_WORKLOAD_PHASE[move]}",
            )
        self._workloads[workload] = _WORKLOAD_PHASE[move]

    # -- nodes ---------------------------------------------------------------------------------

    def _node(self, record: RecordedEvent) -> Iterator[Breach]:
        if not record.stream_id.startswith(self._node_prefix):
            return
        node = record.stream_id[len(self._node_prefix) :]
        event = decode(record)
        if not isinstance(event, NodeEvent):
            return
        before = self._nodes.get(node, nodes.initial_state())
        after = nodes.evolve(before, event)
        self._nodes[node] = after
        if isinstance(event, ResourcesGranted):
            for overrun in grant_overruns(node, before, after, event):
                yield Breach(record.global_position, "grant_beyond_capacity", overrun)
        below = negative_amounts(after, event)
        if below:
            yield Breach(
                record.global_position,
                "grant_beyond_capacity",
                f"{node}: {below} amount(s) below zero after {record.type}",
            )

    # -- testbed slots -------------------------------------------------------------------------

    def _testbed(self, record: RecordedEvent) -> Iterator[Breach]:
        held = self._slots.setdefault(record.stream_id, {})
        data = record.data
        if record.type == "testbed.SlotReserved":
            key = (data["node"], data["position_on_node"])
            holder = held.get(key, data["pod_name"])
            if holder != data["pod_name"]:
                yield Breach(
                    record.global_position,
                    "slot_held_twice",
                    f"slot {data['slot_id']} ({key[0]}/{key[1]}) of {record.stream_id} reserved "
                    f"for {data['pod_name']} while {holder} held it",
                )
            held[key] = data["pod_name"]
        elif record.type == "testbed.ReservationCleared":
            held.pop((data["node"], data["position_on_node"]), None)
        elif record.type == "testbed.TestbedDeleted":
            held.clear()


def _illegal(position: int, detail: str) -> Breach:
    return Breach(position, "illegal_transition", detail)


def _request_move(
    requests: _Requests, request: str, to: _Phase, position: int, allowed: Iterable[_Phase]
) -> Iterator[Breach]:
    phase = requests.phases.get(request)
    if phase is None:
        yield _illegal(position, f"request {request} was never requested: it cannot be {to}")
        return
    if phase not in allowed:
        yield _illegal(position, f"request {request} is {phase}: it cannot be {to}")
    if phase not in _TERMINAL:
        requests.phases[request] = to


def _outcome(requests: _Requests, request: str, kind: str, position: int) -> Iterator[Breach]:
    phase = requests.phases.get(request)
    outcome: _Phase = "created" if kind == "vm.MachineCreated" else "failed"
    if phase is None:
        yield Breach(position, "one_outcome", f"request {request} has an outcome, never a request")
    elif phase in _TERMINAL:
        yield Breach(
            position, "one_outcome", f"request {request} was {phase} already: now {outcome}"
        )
        return
    requests.phases[request] = outcome


def _batch_move(
    batches: dict[str, _Batch], batch_id: str, kind: str, position: int
) -> Iterator[Breach]:
    batch = batches.setdefault(batch_id, _Batch())
    if kind == "vm.BatchOpened":
        if batch.opened:
            yield _illegal(position, f"batch {batch_id} was opened twice")
        batch.opened = True
        return
    if not batch.opened:
        yield _illegal(position, f"batch {batch_id} records {kind} before it was opened")
    elif batch.completed:
        yield _illegal(position, f"batch {batch_id} records {kind} after it completed")
    if kind == "vm.BatchCompleted":
        batch.completed = True


# -- node arithmetic -------------------------------------------------------------------------------


def grant_overruns(
    node: str, before: NodeState, after: NodeState, event: ResourcesGranted
) -> list[str]:
    """Each resource ``event`` raised a pod's reservation of while that leaves ``node`` reserved
    beyond ``total − system``, described; ``before`` and ``after`` are the node around it."""
    pod = before.vm_pods[event.pod]
    overruns = []
    for resource, granted, held, total in (
        ("cpu", event.cpu_milli, pod.cpu.reserved, after.cpu),
        ("memory", event.memory_slots, pod.memory.reserved, after.memory),
    ):
        if granted > held and total.reserved > total.reservable:
            overruns.append(
                f"{node}: grant of {resource} to {event.pod} leaves {total.reserved} "
                f"reserved of {total.reservable} reservable"
            )
    return overruns


def negative_amounts(state: NodeState, event: NodeEvent) -> int:
    """How many amounts of the node, or of the pod ``event`` is about, are below zero.

    The decider must never produce one; pods an event is not about cannot have changed."""
    amounts = [state.gpu_total, state.gpu_reserved, state.other_raw_cpu_milli]
    amounts.append(state.other_raw_memory_bytes)
    for resource in (state.cpu, state.memory):
        amounts.extend(
            (
                resource.total,
                resource.system,
                resource.reserved,
                resource.buffer,
                resource.capacity_pressure,
                resource.pressure_accounted_for,
            )
        )
    about = getattr(event, "pod", None)
    pods = state.vm_pods.values() if not isinstance(about, str) else [state.vm_pods.get(about)]
    for pod in pods:
        if pod is None:
            continue
        amounts.extend((pod.gpu, pod.cpu_accounted, pod.memory_accounted))
        for held in (pod.cpu, pod.memory):
            amounts.extend(
                (held.min, held.use, held.max, held.reserved, held.buffer, held.capacity_pressure)
            )
    return sum(1 for amount in amounts if amount < 0)


def first_breach(
    store: EventStore,
    *,
    until: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[Breach | None, int]:
    """Replay the log from position 0 (up to ``until`` included): the first breach, if any, and
    how many events were checked. ``progress`` is called with the position of each page's last
    event."""
    checks = InvariantChecks()
    checked, after = 0, 0
    while True:
        page = store.read_all(after=after, limit=PAGE)
        records = [r for r in page if until is None or r.global_position <= until]
        for record in records:
            checked += 1
            found = checks.check(record)
            if found:
                return found[0], checked
        if records and progress is not None:
            progress(records[-1].global_position)
        if len(records) < PAGE:
            return None, checked
        after = records[-1].global_position
