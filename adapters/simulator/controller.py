"""A simulated controller process: the runtimes ``serve`` wires, threadless, on virtual time.

The deterministic simulation (:mod:`.dst`) and the fleet scenario (:mod:`.fleet`) both run
controller processes on one log: each has its own store connection, a lease on a board the
processes share, a leadership, and the machines, nodes and IPAM runtimes on that leadership
(placement is the caller's: each scenario builds it its own way). The runtimes never start threads:
the scenario's loop steps them, and their clocks and cloud calls are the scenario's virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetledger.adapters.ipam import IpAllocator, IpamRuntime
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.adapters.runtime import Leadership, MemoryLease, RetryPolicy
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.nodes import NodeConfig
from fleetledger.eventstore import EventStore

from .virtual_time import VirtualTime

__all__ = ["ControllerRuntimes", "controller_runtimes"]


@dataclass(frozen=True, slots=True)
class ControllerRuntimes:
    """One process's store, lease, leadership and runtimes (see the module docstring)."""

    store: EventStore
    lease: MemoryLease
    leadership: Leadership
    machines: MachinesRuntime
    nodes: NodesRuntime
    ipam: IpamRuntime


def controller_runtimes(
    store: EventStore,
    *,
    name: str,
    board: dict[str, str],
    time: VirtualTime,
    cloud: Any,
    cluster: Any,
    allocator: IpAllocator,
    grouper: str,
    grouper_config: GrouperConfig,
    node_config: NodeConfig,
    retry: RetryPolicy,
    **node_options: Any,
) -> ControllerRuntimes:
    """The runtimes of process ``name`` on ``store``, leading only once its lease on ``board``
    is won; ``node_options`` go to the nodes runtime (snapshot period, sync period)."""
    lease = MemoryLease(board, holder=name)
    leadership = Leadership(store, lease, clock=time, holder=name)
    return ControllerRuntimes(
        store=store,
        lease=lease,
        leadership=leadership,
        machines=MachinesRuntime(
            store,
            cloud,
            clock=time,
            config=grouper_config,
            grouper_name=grouper,
            threads=False,
            runner=time.runner(name),
            leadership=leadership,
            manage_leadership=False,
            retry=retry,
        ),
        nodes=NodesRuntime(
            store,
            cluster,
            clock=time,
            config=node_config,
            threads=False,
            leadership=leadership,
            manage_leadership=False,
            retry=retry,
            **node_options,
        ),
        ipam=IpamRuntime(
            store,
            allocator,
            clock=time,
            threads=False,
            leadership=leadership,
            manage_leadership=False,
            retry=retry,
        ),
    )
