"""Dumpstate: the controller's whole accounting state as JSON, live or as of any log position.

Nodes (resources, pods, the migration queue) from :mod:`fleetledger.projections.nodes` and subnets
(per-node IP pools) from :mod:`fleetledger.projections.subnets`, both as of one position. The same
position always gives the same bytes (:func:`~fleetledger.projections.nodes.dump_json`).
:func:`dumpstate_of` builds the same dump from states a live runtime holds in memory, so a
simulation can record what its runtime held at a position and compare it with a replay later.

The live dump (``GET /v1/dumpstate``) is :func:`with_subnets` of the node read model's dump. Given
the subnets read model the process keeps (``held``, an
:class:`~fleetledger.adapters.ipam.IpamRuntime`'s ``projection``), it dumps the subnets from there
instead of replaying every subnet event from the start of the log: the same bytes, at the cost of
the subnets' size instead of the log's length.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetledger.domain.ipam import BatchSizeChanged, SubnetState
from fleetledger.domain.nodes import NodeState
from fleetledger.eventstore import EventStore

from . import nodes, subnets
from .subnets import SUBNET_EVENT_TYPE_NAMES, SubnetsProjection

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


def with_subnets(
    store: EventStore,
    node_dump: Mapping[str, object],
    *,
    held: SubnetsProjection | None = None,
) -> dict[str, object]:
    """``node_dump`` with the subnets as of the same position: replayed from the log, or taken
    from ``held``, a subnets read model of this process, caught up with the log here.

    ``held`` may have folded subnet events beyond the dump's position (the log moved on since
    the nodes were dumped): then, and only then, the subnets are replayed.
    """
    position = node_dump["position"]
    assert isinstance(position, int)
    if held is not None:
        held.catch_up(store)
        dump = held.dump()
        folded = dump["position"]
        assert isinstance(folded, int)
        # The model has every subnet event up to the head it just read, which is at or past
        # the dump's position: it holds the subnets as of that position unless it holds more.
        if folded <= position or not _subnet_events_between(store, position, folded):
            return {**node_dump, "subnets": dump["subnets"]}
    return {**node_dump, "subnets": subnets.dump_at(store, position)["subnets"]}


def _subnet_events_between(store: EventStore, after: int, until: int) -> bool:
    """Whether the log has a subnet event after ``after``, up to ``until`` included."""
    found = store.read_all(after=after, limit=1, types=list(SUBNET_EVENT_TYPE_NAMES))
    return bool(found) and found[0].global_position <= until
