"""What ``serve`` runs beside the machines API: node accounting, subnets, slot testbeds and,
given worker pools, placement — their runtimes and HTTP routers, on the process's leadership.

Node accounting and the testbeds read one cluster gateway (``--cluster``): an empty fake cluster,
or the Kubernetes API, where the testbeds' jobs run as Spark or Flink applications in the
testbeds' namespace. Every runtime follows the one leadership: only the elected process
reconciles ghost pods or creates applications; every process answers reads (and the extender,
whose reservations are appended with expected versions, not as duties)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Capabilities", "build_capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The runtimes ``serve`` starts beside the machines runtime, and the routers it mounts;
    the cluster gateway they share, and the testbeds runtime (whose service the extender
    answers from)."""

    runtimes: list[Any]
    routers: list[Any]
    cluster: Any
    testbeds: Any


def build_capabilities(
    store: Any,
    leadership: Any,
    clock: Any,
    machines: Any,
    *,
    subnets: list[tuple[str, int]],
    pools: list[Any],
    cluster: str,
    testbeds_namespace: str = "default",
    ipam_config: Any = None,
    search_steps: int | None = None,
) -> Capabilities:
    """The runtimes and routes served beside the machines API, on the process's leadership."""
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.agents import agents_router
    from fleetledger.adapters.http.subnets import subnets_router
    from fleetledger.adapters.http.testbeds import testbeds_router
    from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
    from fleetledger.adapters.nodes import NodesRuntime
    from fleetledger.adapters.testbeds import TestbedsRuntime

    allocator = InMemoryAllocator()
    for subnet_id, capacity in subnets:
        allocator.add_subnet(subnet_id, capacity)
    ipam = IpamRuntime(
        store,
        allocator,
        clock=clock,
        config=ipam_config,
        leadership=leadership,
        manage_leadership=False,
    )
    gateway, applications = _cluster(cluster, testbeds_namespace)
    nodes = NodesRuntime(
        store, gateway, clock=clock, leadership=leadership, manage_leadership=False
    )
    testbeds = TestbedsRuntime(
        store,
        gateway,
        applications,
        clock=clock,
        leadership=leadership,
        manage_leadership=False,
        namespace=testbeds_namespace,
    )
    runtimes: list[Any] = [nodes, ipam, _ConfiguredSubnets(ipam, subnets), testbeds]
    routers: list[Any] = [agents_router(nodes), subnets_router(ipam), testbeds_router(testbeds)]
    if pools:
        from fleetledger.adapters.http.workloads import workloads_router
        from fleetledger.adapters.placement import PlacementRuntime
        from fleetledger.domain.placement import DEFAULT_SEARCH_STEPS

        placement = PlacementRuntime(
            store, nodes.service, pools, machines=machines.service, clock=clock,
            leadership=leadership,
            search_steps=DEFAULT_SEARCH_STEPS if search_steps is None else search_steps,
        )  # fmt: skip
        runtimes.append(placement)
        routers.append(workloads_router(placement))
    # Last, so that it freezes what every runtime loaded at start-up.
    runtimes.append(FrozenStartupHeap())
    return Capabilities(runtimes=runtimes, routers=routers, cluster=gateway, testbeds=testbeds)


def _cluster(kind: str, namespace: str) -> tuple[Any, Any]:
    """The cluster gateway and the application operators on it."""
    if kind == "fake":
        from fleetledger.adapters.cluster import FakeCluster
        from fleetledger.adapters.testbeds import FakeApplications

        fake = FakeCluster()
        return fake, FakeApplications(fake)
    from kubernetes import client, config

    from fleetledger.adapters.kubernetes import KubernetesApplications, KubernetesCluster

    # The kubernetes client is untyped; these only read the service account or ~/.kube/config.
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    api_client = client.ApiClient()
    return (
        KubernetesCluster(api_client).start(),
        KubernetesApplications(api_client, namespace=namespace),
    )


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
