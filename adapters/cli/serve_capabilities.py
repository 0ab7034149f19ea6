"""What ``serve`` runs beside the machines API: node accounting, subnets, slot testbeds and,
given worker pools, placement — their runtimes and HTTP routers, on the process's leadership;
node accounting, given a shard of the nodes (``--nodes-shard``), and the subnets' allocator
calls, given a shard of the subnets (``--ipam-shard``), each on that shard's leadership instead
(:mod:`fleetledger.adapters.cli.serve_shards`).

Node accounting and the testbeds read one cluster gateway (``--cluster``): an empty fake cluster,
or the Kubernetes API, where the testbeds' jobs run as Spark or Flink applications in the
testbeds' namespace. Every runtime follows the one leadership: only the elected process
reconciles ghost pods or creates applications; every process answers reads (and the extender,
whose reservations are appended with expected versions, not as duties).

Self-fencing: every side-effect port a runtime is given here — the cloud (:func:`fenced_cloud`,
for the machines runtime ``serve`` builds), the cluster's writes, the applications — is wrapped
in a guard that refuses the call once this process may no longer act on its lease (see
:mod:`fleetledger.adapters.runtime.self_fencing`); the callers are unchanged. The node
accounting of a shard writes to the cluster under the shard's lease, not the process's: it may
lead the one and not the other.

The lease itself (:func:`build_lease`) is the database's (an advisory lock on Postgres, a lock
file beside SQLite) or, with ``--leader-election kubernetes``, a ``coordination.k8s.io/v1``
Lease (:mod:`fleetledger.adapters.kubernetes.lease`); a shard's is the database's lease of the
shard, or a Lease named after it (``<lease name>-nodes-1-of-4``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetledger.adapters.cli.serve_shards import LedShard
    from fleetledger.adapters.runtime import Shard

__all__ = [
    "LEADER_ELECTIONS",
    "Capabilities",
    "build_capabilities",
    "build_lease",
    "fenced_cloud",
    "shard_lease_name",
]

LEADER_ELECTIONS = ("database", "kubernetes")
"""What ``--leader-election`` takes: the database's lease, or a Kubernetes Lease."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The runtimes ``serve`` starts beside the machines runtime, and the routers it mounts;
    the cluster gateway they share, and the testbeds runtime (whose service the extender
    answers from)."""

    runtimes: list[Any]
    routers: list[Any]
    cluster: Any
    testbeds: Any
    readiness_checks: list[Callable[[], Sequence[str]]]
    metrics: Any = None
    """The registry ``/metrics`` serves on the API and the extender (one fold of the log), given
    the machines runtime."""
    nodes: Any = None
    """The node accounting runtime (also among ``runtimes``)."""
    ipam: Any = None
    """The subnets' runtime (also among ``runtimes``)."""


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
    nodes_shard: LedShard | None = None,
    ipam_shard: LedShard | None = None,
) -> Capabilities:
    """The runtimes and routes served beside the machines API, on the process's leadership;
    node accounting, given ``nodes_shard``, leads only that shard's nodes on the shard's own
    leadership (:func:`~fleetledger.adapters.cli.serve_shards.lead_shard`), campaigning for it
    in a thread of its own while it runs, and the subnets' allocator calls, given
    ``ipam_shard``, likewise only that shard's subnets."""
    from fleetledger.adapters.cli.serve_shards import ShardRoles, leadership_router
    from fleetledger.adapters.cluster import ClusterHealth
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.agents import agents_router
    from fleetledger.adapters.http.subnets import subnets_router
    from fleetledger.adapters.http.testbeds import testbeds_router
    from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
    from fleetledger.adapters.metrics.http import runtime_metrics
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
        leadership=leadership if ipam_shard is None else ipam_shard.leadership,
        manage_leadership=ipam_shard is not None,
        shard=None if ipam_shard is None else ipam_shard.shard,
    )
    gateway, applications = _cluster(cluster, testbeds_namespace)
    fenced_gateway, fenced_applications = _fenced(gateway, applications, leadership)
    if nodes_shard is None:
        nodes = NodesRuntime(
            store, fenced_gateway, clock=clock, leadership=leadership, manage_leadership=False
        )
    else:
        # Its cluster writes are its shard's duties: self-fenced by the shard's lease.
        nodes = NodesRuntime(
            store,
            _fenced(gateway, applications, nodes_shard.leadership)[0],
            clock=clock,
            leadership=nodes_shard.leadership,
            manage_leadership=True,
            shard=nodes_shard.shard,
        )
    testbeds = TestbedsRuntime(
        store,
        fenced_gateway,
        fenced_applications,
        clock=clock,
        leadership=leadership,
        manage_leadership=False,
        namespace=testbeds_namespace,
    )
    runtimes: list[Any] = [nodes, ipam, _ConfiguredSubnets(ipam, subnets), testbeds]
    checks: list[Callable[[], Sequence[str]]] = []
    if isinstance(gateway, ClusterHealth):
        checks.append(gateway.problems)
    shards = [led for led in (nodes_shard, ipam_shard) if led is not None]
    routers: list[Any] = [
        agents_router(nodes),
        subnets_router(ipam),
        testbeds_router(testbeds),
        leadership_router(leadership, shards),
    ]
    placement: Any = None
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
        checks.append(lambda: [f"duty stalled: {stall}" for stall in placement.stalls()])
    # Last, so that it freezes what every runtime loaded at start-up.
    runtimes.append(FrozenStartupHeap())
    metrics = None if machines is None else runtime_metrics(machines, placement=placement)
    if metrics is not None and shards:
        metrics.register(ShardRoles(shards))
    return Capabilities(
        runtimes=runtimes,
        routers=routers,
        cluster=gateway,
        testbeds=testbeds,
        readiness_checks=checks,
        metrics=metrics,
        nodes=nodes,
        ipam=ipam,
    )


def fenced_cloud(cloud: Any, leadership: Any) -> Any:
    """``cloud``, called only while ``leadership`` may act (unchanged without leadership)."""
    from fleetledger.adapters.runtime.self_fencing import FencedCloud, SelfFence

    if leadership is None:
        return cloud
    return FencedCloud(cloud, SelfFence(leadership))


def _fenced(gateway: Any, applications: Any, leadership: Any) -> tuple[Any, Any]:
    """The cluster gateway and the applications, written to only while the process may act."""
    from fleetledger.adapters.runtime.self_fencing import (
        FencedApplications,
        FencedCluster,
        SelfFence,
    )

    if leadership is None:
        return gateway, applications
    fence = SelfFence(leadership)
    return FencedCluster(gateway, fence), FencedApplications(applications, fence)


def build_lease(
    url: str,
    *,
    election: str,
    lease_seconds: float,
    holder: str,
    lease_name: str | None = None,
    lease_namespace: str | None = None,
    shard: Shard | None = None,
) -> Any:
    """The leader lease ``serve`` campaigns for, or with ``shard`` that shard's own; a
    ``ValueError`` saying what to fix for an unknown election, a lease name or namespace
    Kubernetes would refuse, or a Kubernetes option given with the database's lease.

    A shard's Kubernetes Lease is named after it (:func:`shard_lease_name`)."""
    from fleetledger.adapters.runtime.leadership import lease_for

    if election not in LEADER_ELECTIONS:
        raise ValueError(
            f"--leader-election must be one of {', '.join(LEADER_ELECTIONS)}, not {election!r}"
        )
    if election == "database":
        if lease_name is not None or lease_namespace is not None:
            raise ValueError(
                "--lease-name and --lease-namespace name a Kubernetes Lease: give "
                "--leader-election kubernetes too"
            )
        return lease_for(url, lease_seconds=lease_seconds, shard=shard)
    from fleetledger.adapters.kubernetes.lease import (
        DEFAULT_LEASE_NAME,
        KubernetesLease,
        check_lease_name,
        check_namespace,
        pod_namespace,
    )

    name = check_lease_name(DEFAULT_LEASE_NAME if lease_name is None else lease_name)
    if shard is not None:
        name = check_lease_name(shard_lease_name(name, shard))
    namespace = check_namespace(pod_namespace() if lease_namespace is None else lease_namespace)
    return KubernetesLease(
        _kubernetes_api_client(),
        name=name,
        namespace=namespace,
        holder=holder,
        lease_seconds=lease_seconds,
    )


def shard_lease_name(lease_name: str, shard: Shard) -> str:
    """The Kubernetes Lease of ``shard`` beside the process's Lease ``lease_name``: the shard's
    name with ``/`` as ``-`` (``fleetledger-nodes-0-of-2``). An object's name is a DNS
    subdomain, which has no ``/``; a capability has no ``-``, so no two shards share a name.
    Like the shard's name it holds the count: partitions of different counts overlap, so they
    are never one lease."""
    return f"{lease_name}-{shard.name.replace('/', '-')}"


def _kubernetes_api_client() -> Any:
    """A client of the Kubernetes API: the service account in a pod, else ~/.kube/config."""
    from kubernetes import client, config

    # The kubernetes client is untyped; these only read the service account or ~/.kube/config.
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as e:
            raise ValueError(
                f"--leader-election kubernetes needs the Kubernetes API: not in a pod, and no "
                f"usable ~/.kube/config ({e})"
            ) from e
    return client.ApiClient()


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
        KubernetesCluster(api_client, namespace=namespace).start(),
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
