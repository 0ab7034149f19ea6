"""What other capabilities may use of node accounting's adapters.

Placement reserves on node streams in its own appends, so it needs the streams' codec and
naming and a read of the hosted node states, but nothing of how the nodes' service decides or
runs. This port names exactly that; :class:`~fleetledger.adapters.nodes.NodeService` is its
implementation.
"""

from __future__ import annotations

from typing import Protocol

from fleetledger.domain.nodes import NodeState

from .aggregate import NODE_CODEC, node_of_stream
from .service import NodeStream

__all__ = ["NODE_CODEC", "NodeStream", "NodeStreams", "node_of_stream"]


class NodeStreams(Protocol):
    """The node streams one process hosts, read and extended by other capabilities."""

    def stream(self, node: str) -> NodeStream:
        """``node``'s hosted stream, loaded from the log the first time it is asked for."""
        ...

    def logged_nodes(self) -> list[str]:
        """Every node that ever joined, from the log."""
        ...

    def hosted(self) -> dict[str, NodeState]:
        """The state of every node hosted here, by name."""
        ...

    def node_of(self, pod: str) -> str | None:
        """The node accounting ``pod``, if any hosted node does."""
        ...
