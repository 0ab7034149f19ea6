"""A batch's reservations as the node aggregate decides them, and the one append carrying them.

Each touched node's planned ``ReservePod`` commands are decided together, as one
:class:`~fleetledger.domain.nodes.ReservePods`, by :func:`fleetledger.domain.nodes.decide` on the
state the batch planned on: one event per touched node, appended to the node's stream with that
state's version as the expected version. All touched nodes go in one ``append_many``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetledger.adapters.nodes.port import NODE_CODEC
from fleetledger.adapters.runtime import Writer
from fleetledger.domain import nodes
from fleetledger.domain.errors import Rejected
from fleetledger.domain.nodes import NodeEvent, NodeState, OtherPodSpec, ReservePod, ReservePods
from fleetledger.eventstore import StreamAppend

__all__ = ["NodeBatch", "node_append", "node_appends"]


@dataclass(slots=True)
class NodeBatch:
    """One node as a batch planned on it: its state and version, and the commands planned."""

    state: NodeState
    version: int
    commands: list[ReservePod] = field(default_factory=list)
    _decided: tuple[list[NodeEvent], list[str], NodeState] | None = None

    def extend(self, commands: Iterable[ReservePod]) -> None:
        self.commands.extend(commands)
        self._decided = None

    def without(self, pod: str) -> None:
        """Take ``pod``'s command out (its placement is no longer this batch's to make)."""
        self.commands = [c for c in self.commands if c.spec.name != pod]
        self._decided = None

    def decided(self) -> tuple[list[NodeEvent], list[str], NodeState]:
        """The node's events for the commands, their causes, and the state they leave."""
        if self._decided is None:
            self._decided = self._decide()
        return self._decided

    def _decide(self) -> tuple[list[NodeEvent], list[str], NodeState]:
        if not self.commands:
            return [], [], self.state
        specs = []
        for command in self.commands:
            if not isinstance(command.spec, OtherPodSpec):
                raise AssertionError(f"placement planned a VM pod: {command.spec.name}")
            specs.append(command.spec)
        first = self.commands[0]
        try:
            events = nodes.decide(self.state, ReservePods(tuple(specs), at=first.at))
        except Rejected as e:
            # The plan was made on this very state, so the node agrees; if it ever does
            # not, failing the batch loudly beats losing a workload silently.
            raise AssertionError(f"node refused a planned reservation: {e.reason}") from e
        state = self.state
        for event in events:
            state = nodes.evolve(state, event)
        causes = [f"workloads:{first.spec.name}+{len(specs) - 1}"] * len(events)
        return events, causes, state


def node_appends(touched: Mapping[str, NodeBatch], writer: Writer) -> list[StreamAppend]:
    """One append per touched node stream, expected version = the version planned on; with the
    leader term on every event while the writer leads."""
    term = writer.fencing.term()
    appends = []
    for node in sorted(touched):
        batch = touched[node]
        events, causes, _ = batch.decided()
        if not events:
            continue  # every pod planned is on the node already (a retried batch)
        appends.append(node_append(node, batch.version, events, causes, writer=writer, term=term))
    return appends


def node_append(
    node: str,
    version: int,
    events: Sequence[NodeEvent],
    causes: Sequence[str],
    *,
    writer: Writer,
    term: int | None = None,
) -> StreamAppend:
    """``events`` decided on ``node`` at stream ``version``, as the append that expects it."""
    stream_id = nodes.stream_id(node)
    records = NODE_CODEC.encode(
        stream_id,
        version + 1,
        events,
        causation_ids=causes,
        actor=writer.actor,
        labels=dict(writer.labels),
        leader_terms=[term] * len(events) if term is not None else None,
    )
    return StreamAppend(stream_id, records, expected_version=version)
