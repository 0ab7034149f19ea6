"""NodeService: agents' requests against the node streams, and its errors."""

from __future__ import annotations

import threading

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster
from fleetledger.adapters.nodes import (
    InvalidRequest,
    MigratingPodMismatch,
    NodeService,
    NodesRuntime,
    RequestRefused,
    ResourceRequest,
    UnknownPod,
)
from fleetledger.domain import nodes
from fleetledger.eventstore import EventStore
from fleetledger.projections.nodes import NodesProjection
from tests.counting_store import CountingStore

from .support import EPOCH, cluster, manual_runtime, node, vm_pod


@pytest.fixture
def runtime(store: EventStore) -> NodesRuntime:
    fleet = cluster(node("n1"), node("n2"), pods=(vm_pod("a", "n1"), vm_pod("b", "n2")))
    return manual_runtime(store, fleet)


class TestRequestResources:
    def test_a_grant_is_the_new_reservation_with_the_compute_unit(
        self, runtime: NodesRuntime
    ) -> None:
        """An increase that fits is granted in full, with the node's compute unit."""
        grant = runtime.service.request_resources("a", cpu_milli=3000, memory_slots=3)
        assert (grant.node, grant.cpu_milli, grant.memory_slots) == ("n1", 3000, 3)
        assert (grant.compute_unit.cpu_milli, grant.compute_unit.memory_slots) == (250, 1)
        assert runtime.service.stream("n1").state.vm_pods["a"].cpu.reserved == 3000

    def test_the_grant_is_in_the_log(self, runtime: NodesRuntime, store: EventStore) -> None:
        """The decision is appended before the answer: its position holds a ResourcesGranted."""
        grant = runtime.service.request_resources("a", cpu_milli=1000, memory_slots=1)
        assert grant.position is not None
        [record] = store.read_all(after=grant.position - 1, limit=1)
        assert record.type == "nodes.ResourcesGranted"
        assert record.stream_id == nodes.stream_id("n1")

    def test_an_unknown_pod_is_refused(self, runtime: NodesRuntime) -> None:
        """A pod no node accounts is UnknownPod."""
        with pytest.raises(UnknownPod, match="ghost"):
            runtime.service.request_resources("ghost", cpu_milli=1000, memory_slots=1)

    def test_fractional_cpu_on_an_old_protocol_is_invalid(self, runtime: NodesRuntime) -> None:
        """An agent without fractional CPU asking for 2.5 CPUs is told to ask in whole CPUs."""
        with pytest.raises(InvalidRequest, match="whole CPUs"):
            runtime.service.request_resources(
                "a", cpu_milli=2500, memory_slots=2, fractional_cpu=False
            )

    def test_a_migrating_pod_must_ask_for_its_reservation(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """Once its node starts migrating it, the pod's other amounts are refused as a mismatch."""
        # Fill n1 past its watermark with a's own growth: 4 CPUs of a, plus a big neighbour.
        fleet = runtime.cluster
        assert isinstance(fleet, FakeCluster)
        fleet.create_pod(vm_pod("big", "n1", cpu=(1000, 6000, 6000), memory=(1, 1, 1)))
        runtime.step()
        grant = runtime.service.request_resources("a", cpu_milli=4000, memory_slots=2)
        state = runtime.service.stream("n1").state
        migrating = [p.name for p in state.vm_pods.values() if p.migrating]
        assert migrating, "the node should have started a migration"
        pod = migrating[0]
        held = state.vm_pods[pod]
        with pytest.raises(MigratingPodMismatch):
            runtime.service.request_resources(
                pod, cpu_milli=held.cpu.min, memory_slots=held.memory.min
            )
        assert grant.node == "n1"

    def test_a_unit_mismatch_is_answered_with_a_warning(self, runtime: NodesRuntime) -> None:
        """An amount off the compute unit is granted, and the grant says what was off."""
        runtime.service.request_resources("a", cpu_milli=2000, memory_slots=2)
        grant = runtime.service.request_resources("a", cpu_milli=2000, memory_slots=3)
        assert grant.cpu_milli == 2000
        assert grant.warnings == (
            "2000 milli-CPU and 3 memory slots are not the same whole number of the compute "
            "unit (250 milli-CPU, 1 slots) last sent to this pod",
        )

    def test_a_vm_without_scaling_is_refused(self, store: EventStore) -> None:
        """No permits for a VM whose scaling is disabled: the request is refused (409)."""
        fleet = cluster(node("n1"), pods=(vm_pod("fixed", "n1", scaling=False),))
        runtime = manual_runtime(store, fleet)
        with pytest.raises(RequestRefused, match="scaling is disabled"):
            runtime.service.request_resources("fixed", cpu_milli=3000, memory_slots=2)


class TestRequestResourcesEach:
    def test_each_agent_gets_what_its_own_request_would(self, runtime: NodesRuntime) -> None:
        """Grants for the known pods, the error for the unknown one, in the order asked."""
        answers = runtime.service.request_resources_each(
            [
                ResourceRequest(pod="a", cpu_milli=3000, memory_slots=3),
                ResourceRequest(pod="ghost", cpu_milli=1000, memory_slots=1),
                ResourceRequest(pod="b", cpu_milli=2000, memory_slots=2),
            ]
        )

        a, ghost, b = answers
        assert isinstance(ghost, UnknownPod)
        assert not isinstance(a, Exception) and not isinstance(b, Exception)
        assert [(g.pod, g.node, g.cpu_milli) for g in (a, b)] == [
            ("a", "n1", 3000),
            ("b", "n2", 2000),
        ]
        assert runtime.service.stream("n2").state.vm_pods["b"].cpu.reserved == 2000

    def test_many_nodes_share_one_commit(self, store: EventStore) -> None:
        pods = tuple(vm_pod(f"p{n}", f"n{n}") for n in range(20))
        counting = CountingStore(store)
        runtime = manual_runtime(
            counting,  # type: ignore[arg-type]
            cluster(*(node(f"n{n}") for n in range(20)), pods=pods),
        )
        before = counting.commits

        answers = runtime.service.request_resources_each(
            [ResourceRequest(pod=f"p{n}", cpu_milli=2000, memory_slots=2) for n in range(20)]
        )

        assert counting.commits - before == 1
        assert not any(isinstance(a, Exception) for a in answers)


class TestBatching:
    def test_concurrent_requests_for_one_node_share_appends(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """Requests arriving together are all granted, in fewer appends than requests."""
        pods = [f"p{i}" for i in range(30)]
        fleet = runtime.cluster
        assert isinstance(fleet, FakeCluster)
        fleet.add_node(node("n3"))
        for name in pods:
            fleet.create_pod(vm_pod(name, "n3", cpu=(0, 0, 1000), memory=(0, 0, 1)))
        runtime.step()
        positions: list[int | None] = []
        lock = threading.Lock()
        start = threading.Barrier(len(pods))

        def ask(pod: str) -> None:
            start.wait()
            grant = runtime.service.request_resources(pod, cpu_milli=250, memory_slots=0)
            with lock:
                positions.append(grant.position)

        threads = [threading.Thread(target=ask, args=(p,)) for p in pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(positions) == len(pods)
        state = runtime.service.stream("n3").state
        assert all(state.vm_pods[p].cpu.reserved == 250 for p in pods)
        # Each distinct position is one append's last event; shared ones mean shared appends.
        assert len(set(positions)) < len(pods)


class TestAnotherProcess:
    def test_a_pod_reserved_by_another_process_is_found_through_the_log(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """A service that did not see a pod's reservation finds its node in the read model and
        folds the reservation before deciding."""
        projection = NodesProjection()

        def locate(pod: str) -> str | None:
            projection.catch_up(store)
            return projection.node_of(pod)

        other = NodeService(store, clock=ManualClock(EPOCH), locate=locate)
        other.stream("n1")
        fleet = runtime.cluster
        assert isinstance(fleet, FakeCluster)
        fleet.create_pod(vm_pod("late", "n1"))
        runtime.step()
        grant = other.request_resources("late", cpu_milli=3000, memory_slots=2)
        assert (grant.node, grant.cpu_milli) == ("n1", 3000)
        assert (
            runtime.service.request_resources("late", cpu_milli=1000, memory_slots=1).cpu_milli
            == 1000
        )
