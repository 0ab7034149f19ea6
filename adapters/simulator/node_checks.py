"""Node accounting's invariants, checked on a replay of the log from position 0.

The log's node events are decoded from their records and folded with the domain's ``evolve``, one
by one, so each grant is checked against the state right before it: no amount may go below zero,
and no grant may raise a pod's reservation while that leaves the node reserved beyond
``total − system`` (a restart or a config change may leave a node above it, never a grant) — the
arithmetic ``audit verify`` checks too (:mod:`fleetledger.projections.invariants`). The states
folded are what the log rebuilds, for comparing with what a live runtime holds.
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
from fleetledger.projections.invariants import grant_overruns, negative_amounts
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
        self.negative_values += negative_amounts(after, event)
        self.states[node] = after

    def _check_grant(
        self, node: str, before: NodeState, after: NodeState, event: ResourcesGranted
    ) -> None:
        overruns = grant_overruns(node, before, after, event)
        self.grants_beyond_capacity += len(overruns)
        self.beyond_capacity.extend(overruns)
        if event.cpu_pressure or event.memory_pressure:
            self.grants_short += 1
