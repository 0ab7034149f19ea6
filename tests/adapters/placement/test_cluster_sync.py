"""Placed workloads and cluster sync: the sync does not release what placement holds."""

from __future__ import annotations

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.adapters.placement import PlacementRuntime
from fleetledger.eventstore import EventStore

from .support import CPU_POOL, GIB, T0, workload


def test_a_sync_pass_keeps_the_reservations_of_placed_workloads(store: EventStore) -> None:
    """A placed workload is a reservation the cluster does not show as a pod: a sync pass
    must not delete it as gone. Only releasing the workload returns its capacity."""
    clock = ManualClock(T0)
    cluster = FakeCluster([Node("cpu-000", cpu_millis=4000, memory_mib=16 * 1024)])
    with (
        NodesRuntime(store, cluster, clock=clock, threads=False) as nodes,
        PlacementRuntime(store, nodes.service, [CPU_POOL], clock=clock, threads=False) as placement,
    ):
        nodes.sync.sync()
        placement.submit([workload("w1", 1000, GIB)])
        placement.step()
        assert placement.status("w1").node == "cpu-000"

        assert "w1" in held_on(nodes, "cpu-000")  # the node's hosted stream has folded it
        nodes.sync.sync()

        assert "w1" in held_on(nodes, "cpu-000")
        assert placement.status("w1").state == "placed"

        placement.release("w1")
        nodes.sync.sync()
        assert "w1" not in held_on(nodes, "cpu-000")


def held_on(nodes: NodesRuntime, node: str) -> set[str]:
    stream = nodes.service.stream(node)
    stream.load()  # placement appends to the node's stream directly: fold what it wrote
    return set(stream.state.other_pods)
