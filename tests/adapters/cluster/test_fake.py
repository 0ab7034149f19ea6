"""The in-memory cluster behind the ClusterGateway port."""

from __future__ import annotations

import pytest

from fleetledger.adapters.cluster import (
    ClusterError,
    ClusterGateway,
    FakeCluster,
    Node,
    NoRoom,
    PodExists,
    PodSpec,
    PriorityClassConflict,
    StalePod,
    UnknownPod,
    UnknownPriorityClass,
)


def cluster() -> FakeCluster:
    return FakeCluster(
        [
            Node("n1", labels={"testbed": "1"}, cpu_millis=2000, memory_mib=4096),
            Node("n2", cpu_millis=2000, memory_mib=4096),
        ]
    )


class TestPort:
    def test_the_fake_is_a_gateway(self) -> None:
        """The fake satisfies the port a controller is written against."""
        gateway: ClusterGateway = cluster()
        assert [n.name for n in gateway.list_nodes()] == ["n1", "n2"]

    def test_nodes_filter_by_label(self) -> None:
        """Only nodes carrying the label (whatever its value) are listed."""
        assert [n.name for n in cluster().list_nodes(label="testbed")] == ["n1"]

    def test_pods_filter_by_labels(self) -> None:
        """Pods are listed by every label asked for."""
        c = cluster()
        c.create_pod(PodSpec("a", labels={"app": "x", "tier": "1"}))
        c.create_pod(PodSpec("b", labels={"app": "x"}))
        assert [p.name for p in c.list_pods(labels={"app": "x", "tier": "1"})] == ["a"]
        assert [p.name for p in c.list_pods(labels={"app": "x"})] == ["a", "b"]

    def test_creating_a_taken_name_is_refused(self) -> None:
        """A second pod of one name is refused, so a repeated create is recognisable."""
        c = cluster()
        c.create_pod(PodSpec("a"))
        with pytest.raises(PodExists):
            c.create_pod(PodSpec("a"))
        assert c.creations == 1

    def test_deleting_an_unknown_pod_is_refused(self) -> None:
        """Deleting what is not there says so."""
        with pytest.raises(UnknownPod):
            cluster().delete_pod("ghost")


class TestPlacement:
    def test_a_pod_with_a_node_runs_there(self) -> None:
        """A pod created on a node is bound and running; one without waits for the scheduler."""
        c = cluster()
        placed = c.create_pod(PodSpec("g", node="n1", cpu_millis=1000, memory_mib=2048))
        pending = c.create_pod(PodSpec("p", cpu_millis=1000, memory_mib=2048))
        assert (placed.node, placed.phase) == ("n1", "Running")
        assert (pending.node, pending.phase) == (None, "Pending")
        assert placed.uid != pending.uid

    def test_binding_respects_allocatable_resources(self) -> None:
        """A node full of requests refuses one more pod until room is made."""
        c = cluster()
        for i in range(2):
            c.create_pod(PodSpec(f"g{i}", node="n1", cpu_millis=1000, memory_mib=2048))
        c.create_pod(PodSpec("job", cpu_millis=1000, memory_mib=2048))
        with pytest.raises(NoRoom, match="n1"):
            c.bind("job", "n1")
        c.delete_pod("g0")
        assert c.bind("job", "n1").node == "n1"
        assert c.free_on("n1") == (0, 0)

    def test_a_removed_node_takes_its_pods(self) -> None:
        """Pods bound to a node that leaves are gone with it."""
        c = cluster()
        c.create_pod(PodSpec("g", node="n1", cpu_millis=1, memory_mib=1))
        c.remove_node("n1")
        assert c.list_pods() == []
        assert c.pod("g") is None


class TestDeletePreconditions:
    def test_a_delete_with_the_pods_uid_deletes_it(self) -> None:
        """The uid precondition matches: the pod goes."""
        c = cluster()
        pod = c.create_pod(PodSpec("a"))
        c.delete_pod("a", uid=pod.uid)
        assert c.pod("a") is None

    def test_a_delete_with_another_uid_is_stale(self) -> None:
        """A newer pod took the name: StalePod, and it stays."""
        c = cluster()
        c.create_pod(PodSpec("a"))
        c.delete_pod("a")
        newer = c.create_pod(PodSpec("a"))
        with pytest.raises(StalePod) as refused:
            c.delete_pod("a", uid="uid-1")
        assert c.pod("a") == newer
        assert refused.value.current == newer

    def test_a_delete_of_a_changed_pod_is_stale(self) -> None:
        """The pod was written since the version the caller saw: StalePod with the pod as it
        is now, and it stays."""
        c = cluster()
        seen = c.create_pod(PodSpec("a"))
        now = c.bind("a", "n1")
        with pytest.raises(StalePod) as refused:
            c.delete_pod("a", uid=seen.uid, resource_version=seen.resource_version)
        assert (c.pod("a"), refused.value.current) == (now, now)

    def test_a_delete_with_the_current_version_deletes(self) -> None:
        """Uid and resource version both match: the pod goes."""
        c = cluster()
        c.create_pod(PodSpec("a"))
        now = c.bind("a", "n1")
        c.delete_pod("a", uid=now.uid, resource_version=now.resource_version)
        assert c.pod("a") is None

    def test_every_write_gives_a_new_resource_version(self) -> None:
        """Created, bound, ended: three versions, each after the last."""
        c = cluster()
        versions = [
            c.create_pod(PodSpec("a")).resource_version,
            c.bind("a", "n1").resource_version,
        ]
        c.set_phase("a", "Succeeded")
        versions.append(c.pod("a").resource_version)  # type: ignore[union-attr]
        assert [int(v) for v in versions] == sorted({int(v) for v in versions})
        assert len(versions) == 3


class TestNamespaces:
    def test_one_name_in_two_namespaces_is_two_pods(self) -> None:
        """Each namespace has its own pod of the name; deleting one leaves the other."""
        c = cluster()
        a = c.create_pod(PodSpec("p", namespace="a"))
        b = c.create_pod(PodSpec("p", namespace="b"))
        assert [(p.namespace, p.uid) for p in c.list_pods()] == [("a", a.uid), ("b", b.uid)]
        c.delete_pod("p", namespace="a")
        assert c.list_pods() == [b]

    def test_a_pod_without_a_namespace_goes_to_the_default_one(self) -> None:
        """The cluster's default namespace serves a spec and a delete that name none."""
        c = FakeCluster(namespace="jobs")
        assert c.create_pod(PodSpec("p")).namespace == "jobs"
        with pytest.raises(UnknownPod):
            c.delete_pod("p", namespace="default")
        c.delete_pod("p")
        assert c.list_pods() == []


class TestPriorityAdmission:
    def test_a_pod_gets_its_classs_value(self) -> None:
        """Priority comes from the class the pod names; no class is priority 0."""
        c = cluster()
        c.ensure_priority_class("low", -10, description="d")
        assert c.create_pod(PodSpec("a", priority_class_name="low")).priority == -10
        assert c.create_pod(PodSpec("b")).priority == 0

    def test_the_system_classes_exist(self) -> None:
        """system-node-critical and system-cluster-critical are there from the start."""
        pod = cluster().create_pod(PodSpec("a", priority_class_name="system-node-critical"))
        assert pod.priority == 2_000_001_000

    def test_a_pod_naming_an_unknown_class_is_refused(self) -> None:
        """As the priority admission plugin does: refused, nothing created."""
        c = cluster()
        with pytest.raises(UnknownPriorityClass, match="no PriorityClass with name nope"):
            c.create_pod(PodSpec("a", priority_class_name="nope"))
        assert (c.list_pods(), c.creations) == ([], 0)

    def test_ensuring_a_class_twice_creates_it_once(self) -> None:
        """Idempotent for the same value."""
        c = cluster()
        c.ensure_priority_class("low", -10, description="d")
        c.ensure_priority_class("low", -10, description="d")
        assert (c.priority_classes()["low"], c.class_creations) == (-10, 1)

    def test_a_class_of_another_value_conflicts(self) -> None:
        """A class's value cannot change: the conflict is reported, the class kept."""
        c = cluster()
        c.ensure_priority_class("low", -10, description="d")
        with pytest.raises(PriorityClassConflict):
            c.ensure_priority_class("low", 0, description="d")
        assert c.priority_classes()["low"] == -10

    @pytest.mark.parametrize(
        ("name", "value"), [("system-mine", 1), ("huge", 1_000_000_001)], ids=["prefix", "value"]
    )
    def test_reserved_classes_are_refused(self, name: str, value: int) -> None:
        """The system- prefix and values above one billion are the system's."""
        with pytest.raises(ClusterError):
            cluster().ensure_priority_class(name, value, description="d")


class TestEndedPods:
    def test_an_evicted_pod_fails_and_frees_its_room(self) -> None:
        """Eviction leaves the pod listed, Failed with reason Evicted, no longer taking room."""
        c = cluster()
        c.create_pod(PodSpec("g", node="n1", cpu_millis=2000, memory_mib=4096))
        c.evict("g")
        pod = c.pod("g")
        assert pod is not None and (pod.phase, pod.reason, pod.node) == ("Failed", "Evicted", "n1")
        assert c.free_on("n1") == (2000, 4096)
