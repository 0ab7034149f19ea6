"""What ``serve`` runs beside the machines API: node accounting, subnets and, given worker
pools, placement — their runtimes and HTTP routers, on the process's leadership."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Capabilities", "build_capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The runtimes ``serve`` starts beside the machines runtime, and the routers it mounts."""

    runtimes: list[Any]
    routers: list[Any]


def build_capabilities(
    store: Any,
    leadership: Any,
    clock: Any,
    machines: Any,
    *,
    subnets: list[tuple[str, int]],
    pools: list[Any],
    cluster: str,
) -> Capabilities:
    """The runtimes and routes served beside the machines API, on the process's leadership."""
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.agents import agents_router
    from fleetledger.adapters.http.subnets import subnets_router
    from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
    from fleetledger.adapters.nodes import NodesRuntime

    allocator = InMemoryAllocator()
    for subnet_id, capacity in subnets:
        allocator.add_subnet(subnet_id, capacity)
    ipam = IpamRuntime(
        store, allocator, clock=clock, leadership=leadership, manage_leadership=False
    )
    nodes = NodesRuntime(
        store, _cluster(cluster), clock=clock, leadership=leadership, manage_leadership=False
    )
    runtimes: list[Any] = [nodes, ipam, _ConfiguredSubnets(ipam, subnets)]
    routers: list[Any] = [agents_router(nodes), subnets_router(ipam)]
    if pools:
        from fleetledger.adapters.http.workloads import workloads_router
        from fleetledger.adapters.placement import PlacementRuntime

        placement = PlacementRuntime(
            store, nodes.service, pools, machines=machines.service, clock=clock,
            leadership=leadership,
        )  # fmt: skip
        runtimes.append(placement)
        routers.append(workloads_router(placement))
    # Last, so that it freezes what every runtime loaded at start-up.
    runtimes.append(FrozenStartupHeap())
    return Capabilities(runtimes=runtimes, routers=routers)


def _cluster(kind: str) -> Any:
    if kind == "fake":
        from fleetledger.adapters.cluster import FakeCluster

        return FakeCluster()
    from kubernetes import client, config

    from fleetledger.adapters.kubernetes import KubernetesCluster

    # The kubernetes client is untyped; these only read the service account or ~/.kube/config.
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return KubernetesCluster(client.ApiClient()).start()


@dataclass(frozen=True, slots=True)
class _ConfiguredSubnets:
    """Records the subnets given on the command line once the subnet runtime runs (creating a
    subnet again with the same capacity changes nothing)."""

    ipam: Any
    subnets: list[tuple[str, int]]

    def start(self) -> None:
        for subnet_id, capacity in self.subnets:
            self.ipam.service.create(subnet_id, capacity)

    def stop(self) -> None:
        return None
