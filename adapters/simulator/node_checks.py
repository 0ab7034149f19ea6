"""Node accounting's invariants, checked on a replay of the log from position 0.

The log's node events are decoded from their records and folded with the domain's ``evolve``, one
by one, so each grant is checked against the state right before it: no amount may go below zero,
and no grant may raise a pod's reservation while that leaves the node reserved beyond
``total − system`` (a restart or a config change may leave a node above it, never a grant). The
states folded are what the log rebuilds, for comparing with what a live runtime holds.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleetledger.adapters.nodes import NODE_CODEC, node_of_stream
from fleetledger.domain import nodes
from fleetledger.domain.nodes import (
    ControllerRestarted,
    MigrationStarted,
    NodeEvent,
    NodeState,
    ResourcesGranted,
)
from fleetledger.eventstore import EventStore
from fleetledger.projections.nodes import NODE_EVENT_TYPE_NAMES

__all__ = ["NodeLogChecks"]

_PAGE = 1000


class NodeLogChecks:
    """The node events of a log replayed from position 0, checked event by event (see the
    module docstring). ``beyond_capacity`` names each offending grant."""

    def __init__(self) -> None:
        self.states: dict[str, NodeState] = {}
        self.grants_short = 0
        self.grants_beyond_capacity = 0
        self.beyond_capacity: list[str] = []
        self.negative_values = 0
        self.migrations_started = 0
        self.restarts: list[ControllerRestarted] = []

    def replay(self, store: EventStore) -> None:
        after = 0
        while True:
            records = store.read_all(after=after, limit=_PAGE, types=list(NODE_EVENT_TYPE_NAMES))
            for record in records:
                node = node_of_stream(record.stream_id)
                if node is not None:
                    self.fold(node, NODE_CODEC.decode(record))
            if len(records) < _PAGE:
                return
            after = records[-1].global_position

    def fold_all(self, events: Iterable[tuple[str, NodeEvent]]) -> None:
        """Fold ``(node, event)`` pairs in order (events not read from a log)."""
        for node, event in events:
            self.fold(node, event)

    def fold(self, node: str, event: NodeEvent) -> None:
        before = self.states.get(node, nodes.initial_state())
        after = nodes.evolve(before, event)
        if isinstance(event, ResourcesGranted):
            self._check_grant(node, before, after, event)
        elif isinstance(event, MigrationStarted):
            self.migrations_started += 1
        elif isinstance(event, ControllerRestarted):
            self.restarts.append(event)
        self.negative_values += _negatives(after, _touched(event))
        self.states[node] = after

    def _check_grant(
        self, node: str, before: NodeState, after: NodeState, event: ResourcesGranted
    ) -> None:
        pod = before.vm_pods[event.pod]
        for resource, granted, held, total in (
            ("cpu", event.cpu_milli, pod.cpu.reserved, after.cpu),
            ("memory", event.memory_slots, pod.memory.reserved, after.memory),
        ):
            if granted > held and total.reserved > total.reservable:
                self.grants_beyond_capacity += 1
                self.beyond_capacity.append(
                    f"{node}: grant of {resource} to {event.pod} leaves {total.reserved} "
                    f"reserved of {total.reservable} reservable"
                )
        if event.cpu_pressure or event.memory_pressure:
            self.grants_short += 1


def _touched(event: NodeEvent) -> set[str] | None:
    """The pod an event is about, or ``None`` if it is about the whole node."""
    pod = getattr(event, "pod", None)
    return {pod} if isinstance(pod, str) else None


def _negatives(state: NodeState, touched: set[str] | None) -> int:
    """How many amounts of the node, or of its ``touched`` pods, are below zero.

    The decider must never produce one; pods a decision did not touch cannot have changed.
    """
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
    pods = state.vm_pods.values() if touched is None else (state.vm_pods.get(n) for n in touched)
    for pod in pods:
        if pod is None:
            continue
        amounts.extend((pod.gpu, pod.cpu_accounted, pod.memory_accounted))
        for held in (pod.cpu, pod.memory):
            amounts.extend(
                (held.min, held.use, held.max, held.reserved, held.buffer, held.capacity_pressure)
            )
    return sum(1 for amount in amounts if amount < 0)
