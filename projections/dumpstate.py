"""Dumpstate: the controller's whole accounting state as JSON, live or as of any log position.

Nodes (resources, pods, the migration queue) from :mod:`fleetledger.projections.nodes` and subnets
(per-node IP pools) from :mod:`fleetledger.projections.subnets`, both as of one position. The same
position always gives the same bytes (:func:`~fleetledger.projections.nodes.dump_json`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetledger.eventstore import EventStore

from . import nodes, subnets

__all__ = ["dumpstate_at", "with_subnets"]


def dumpstate_at(store: EventStore, position: int | None = None) -> dict[str, object]:
    """The state as of log ``position`` (the head when ``None``), replayed from the log.

    Raises ``ValueError`` for a position the log has not reached.
    """
    return with_subnets(store, nodes.dumpstate_at(store, position))


def with_subnets(store: EventStore, node_dump: Mapping[str, object]) -> dict[str, object]:
    """``node_dump`` with the subnets as of the same position."""
    position = node_dump["position"]
    assert isinstance(position, int)
    return {**node_dump, "subnets": subnets.dump_at(store, position)["subnets"]}
