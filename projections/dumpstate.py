"""Dumpstate: the controller's whole accounting state as JSON, live or as of any log position.

Nodes (resources, pods, the migration queue) from :mod:`fleetledger.projections.nodes` and subnets
(per-node IP pools) from :mod:`fleetledger.projections.subnets`, both as of one position. The same
position always gives the same bytes (:func:`~fleetledger.projections.nodes.dump_json`).
:func:`dumpstate_of` builds the same dump from states a live runtime holds in memory, so a
simulation can record what its runtime held at a position and compare it with a replay later.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetledger.domain.ipam import BatchSizeChanged, SubnetState
from fleetledger.domain.nodes import NodeState
from fleetledger.eventstore import EventStore

from . import nodes, subnets

__all__ = ["dumpstate_at", "dumpstate_of", "with_subnets"]


def dumpstate_at(store: EventStore, position: int | None = None) -> dict[str, object]:
    """The state as of log ``position`` (the head when ``None``), replayed from the log.

    Raises ``ValueError`` for a position the log has not reached.
    """
    return with_subnets(store, nodes.dumpstate_at(store, position))


def dumpstate_of(
    node_states: Mapping[str, NodeState],
    subnet_states: Mapping[str, tuple[SubnetState, BatchSizeChanged | None]],
    *,
    position: int,
) -> dict[str, object]:
    """The dump of states held in memory, labelled with ``position``: equal to
    :func:`dumpstate_at` of that position when they are the states the log holds as of it.

    ``subnet_states`` gives each subnet's state with its last batch change (``None`` if none)."""
    return {
        **nodes.dump_of(node_states, position),
        "subnets": subnets.dump_of(subnet_states, position)["subnets"],
    }


def with_subnets(store: EventStore, node_dump: Mapping[str, object]) -> dict[str, object]:
    """``node_dump`` with the subnets as of the same position."""
    position = node_dump["position"]
    assert isinstance(position, int)
    return {**node_dump, "subnets": subnets.dump_at(store, position)["subnets"]}
