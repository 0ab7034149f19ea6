"""ClusterSync: nodes and pods the cluster shows become node commands, idempotently."""

from __future__ import annotations

from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.adapters.nodes.specs import CPU_ANNOTATION, MEMORY_ANNOTATION
from fleetledger.eventstore import EventStore

from .support import cluster, manual_runtime, node, vm_pod


def _fleet(runtime: NodesRuntime) -> FakeCluster:
    fleet = runtime.cluster
    assert isinstance(fleet, FakeCluster)
    return fleet


class TestClusterSync:
    def test_nodes_and_their_pods_are_accounted_at_start(self, store: EventStore) -> None:
        """Every listed node joins with its allocatable resources; its pods are reserved."""
        fleet = cluster(
            node("n1", cpus=8, memory_gib=16),
            pods=(vm_pod("vm", "n1"), PodSpec("web", node="n1", cpu_millis=300, memory_mib=100)),
        )
        runtime = manual_runtime(store, fleet)
        state = runtime.service.stream("n1").state
        assert (state.cpu.total, state.memory.total) == (8000, 16)
        assert set(state.vm_pods) == {"vm"}
        assert set(state.other_pods) == {"web"}

    def test_a_second_pass_appends_nothing(self, store: EventStore) -> None:
        """Sync is idempotent: with nothing changed in the cluster, the log does not grow."""
        runtime = manual_runtime(store, cluster(node("n1"), pods=(vm_pod("vm", "n1"),)))
        head = store.head()
        report = runtime.step()
        assert store.head() == head
        assert (report.nodes_joined, report.pods_reserved, report.pods_deleted) == (0, 0, 0)

    def test_new_deleted_and_finished_pods_are_followed(self, store: EventStore) -> None:
        """A new bound pod is reserved; deleted or finished ones are released."""
        runtime = manual_runtime(
            store, cluster(node("n1"), pods=(vm_pod("old", "n1"), vm_pod("done", "n1")))
        )
        fleet = _fleet(runtime)
        fleet.create_pod(vm_pod("new", "n1"))
        fleet.delete_pod("old")
        fleet.set_phase("done", "Succeeded")
        report = runtime.step()
        assert (report.pods_reserved, report.pods_deleted) == (1, 2)
        assert set(runtime.service.stream("n1").state.vm_pods) == {"new"}

    def test_a_node_that_leaves_is_removed_and_a_resized_one_updated(
        self, store: EventStore
    ) -> None:
        """A node gone from the cluster leaves; a node with new allocatable gets new totals."""
        runtime = manual_runtime(store, cluster(node("n1"), node("n2")))
        fleet = _fleet(runtime)
        fleet.remove_node("n2")
        fleet.add_node(node("n1", cpus=16))
        report = runtime.step()
        assert report.nodes_removed == 1
        assert not runtime.service.stream("n2").state.present
        assert runtime.service.stream("n1").state.cpu.total == 16000

    def test_a_pod_with_unreadable_annotations_is_left_out(self, store: EventStore) -> None:
        """A VM pod whose bounds cannot be read is skipped; the other pods are still reserved."""
        broken = PodSpec(
            "broken", node="n1", annotations={CPU_ANNOTATION: "1,2", MEMORY_ANNOTATION: "1,1,1"}
        )
        runtime = manual_runtime(store, cluster(node("n1"), pods=(broken, vm_pod("ok", "n1"))))
        assert set(runtime.service.stream("n1").state.vm_pods) == {"ok"}

    def test_a_refused_pod_does_not_block_the_rest(self, store: EventStore) -> None:
        """A pod the node refuses (bounds out of order) is reported; the others go in."""
        bad = PodSpec(
            "bad", node="n1", annotations={CPU_ANNOTATION: "5,1,9", MEMORY_ANNOTATION: "1,1,1"}
        )
        runtime = manual_runtime(store, cluster(node("n1")))
        fleet = _fleet(runtime)
        fleet.create_pod(bad)
        fleet.create_pod(vm_pod("good", "n1"))
        report = runtime.step()
        assert set(runtime.service.stream("n1").state.vm_pods) == {"good"}
        assert any("bad" in reason for reason in report.skipped)

    def test_only_labelled_nodes_are_accounted_when_asked(self, store: EventStore) -> None:
        """With node_label, unlabelled nodes are not joined."""
        fleet = FakeCluster(
            [Node("vm-node", labels={"vms": "yes"}, cpu_millis=1000, memory_mib=1024), node("x")]
        )
        runtime = NodesRuntime(store, fleet, node_label="vms", threads=False).start()
        assert set(runtime.service.hosted()) == {"vm-node"}
