"""Node accounting as the decider host runs it: one ``node-<name>`` stream per node.

Snapshots matter here: an agent asks every few seconds, so a node's stream grows by an event per
request, and a restart loads each node from its last snapshot plus the tail.
"""

from __future__ import annotations

from fleetledger.adapters.runtime import Aggregate, EventCodec, SnapshotCodec, events_of
from fleetledger.domain import nodes
from fleetledger.domain.nodes import NodeCommand, NodeEvent, NodeState

__all__ = ["NODE_CODEC", "NODE_EVENT_TYPES", "node_aggregate", "node_of_stream"]

NODE_EVENT_TYPES: tuple[type, ...] = events_of(NodeEvent)

NODE_CODEC: EventCodec[NodeEvent] = EventCodec(
    "nodes", NODE_EVENT_TYPES, correlation_fields=("pod", "node")
)

_PREFIX = nodes.stream_id("")


def node_of_stream(stream_id: str) -> str | None:
    """The node a ``node-<name>`` stream holds, or ``None`` for any other stream."""
    return stream_id[len(_PREFIX) :] if stream_id.startswith(_PREFIX) else None


def node_aggregate(*, snapshot_every: int = 1000) -> Aggregate[NodeState, NodeCommand, NodeEvent]:
    """The node aggregate; it keeps no time, so it has no tick."""
    return Aggregate(
        name="nodes",
        initial_state=nodes.initial_state,
        evolve=nodes.evolve,
        decide=nodes.decide,
        codec=NODE_CODEC,
        stream_of=nodes.stream_id,
        snapshots=SnapshotCodec(
            to_data=nodes.snapshot,
            from_data=nodes.state_from_snapshot,
            schema_version=nodes.SNAPSHOT_SCHEMA_VERSION,
            every=snapshot_every,
        ),
    )
