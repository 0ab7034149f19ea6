"""ClusterSync: nodes and pods the cluster shows become node commands, idempotently."""

from __future__ import annotations

from dataclasses import replace

from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.nodes import NodesRuntime, SyncReport
from fleetledger.adapters.nodes.specs import (
    CPU_ANNOTATION,
    MEMORY_ANNOTATION,
    SCALING_ANNOTATION,
)
from fleetledger.eventstore import EventStore
from tests.counting_store import CountingStore

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

    def test_same_named_pods_of_two_namespaces_are_two_reservations(
        self, store: EventStore
    ) -> None:
        """A pod outside the default namespace is accounted as namespace/name, so a same-named
        pod of another namespace on the node is reserved too, and deleting one keeps the other."""
        web = PodSpec("web", node="n1", cpu_millis=300, memory_mib=100)
        fleet = cluster(
            node("n1"), pods=(web, PodSpec("web", node="n1", namespace="shop", cpu_millis=200))
        )
        runtime = manual_runtime(store, fleet)
        assert set(runtime.service.stream("n1").state.other_pods) == {"web", "shop/web"}
        _fleet(runtime).delete_pod("web", namespace="shop")
        runtime.step()
        assert set(runtime.service.stream("n1").state.other_pods) == {"web"}

    def test_a_second_vm_pod_under_one_name_is_left_out(self, store: EventStore) -> None:
        """VM pods keep their bare names (their agents know no other): a second VM pod of the
        same name in another namespace is not accounted over the first."""
        twin = vm_pod("vm", "n1")
        fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1"), replace(twin, namespace="other")))
        runtime = manual_runtime(store, fleet)
        assert set(runtime.service.stream("n1").state.vm_pods) == {"vm"}
        head = store.head()
        runtime.step()
        assert store.head() == head

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
            "bad", node="n1", annotations={CPU_ANNOTATION: "9,1,5", MEMORY_ANNOTATION: "1,1,1"}
        )
        runtime = manual_runtime(store, cluster(node("n1")))
        fleet = _fleet(runtime)
        fleet.create_pod(bad)
        fleet.create_pod(vm_pod("good", "n1"))
        report = runtime.step()
        assert set(runtime.service.stream("n1").state.vm_pods) == {"good"}
        assert any("bad" in reason for reason in report.skipped)

    def test_a_running_vm_using_more_than_a_lowered_max_is_counted(self, store: EventStore) -> None:
        """A VM whose max was just lowered under its use still holds that use: it is counted."""
        lagging = vm_pod("lagging", "n1", cpu=(1000, 3000, 2000))
        runtime = manual_runtime(store, cluster(node("n1"), pods=(lagging,)))
        assert runtime.service.stream("n1").state.vm_pods["lagging"].cpu.reserved == 3000

    def test_only_labelled_nodes_are_accounted_when_asked(self, store: EventStore) -> None:
        """With node_label, unlabelled nodes are not joined."""
        fleet = FakeCluster(
            [Node("vm-node", labels={"vms": "yes"}, cpu_millis=1000, memory_mib=1024), node("x")]
        )
        runtime = NodesRuntime(store, fleet, node_label="vms", threads=False).start()
        assert set(runtime.service.hosted()) == {"vm-node"}


class TestVmSettings:
    def test_a_vm_without_scaling_holds_its_use_and_follows_it(self, store: EventStore) -> None:
        """Taken over or reserved, a VM whose scaling is disabled holds exactly its use; a use
        the cluster shows changed is followed."""
        fleet = cluster(node("n1"), pods=(vm_pod("f", "n1", scaling=False),))
        runtime = manual_runtime(store, fleet)
        pod = runtime.service.stream("n1").state.vm_pods["f"]
        assert (pod.scaling_enabled, pod.cpu.reserved, pod.cpu.buffer) == (False, 2000, 0)
        _fleet(runtime).delete_pod("f")
        _fleet(runtime).create_pod(vm_pod("f", "n1", cpu=(1000, 3000, 4000), scaling=False))
        runtime.step()
        assert runtime.service.stream("n1").state.vm_pods["f"].cpu.reserved == 3000

    def test_settings_and_bounds_the_cluster_changes_are_followed(self, store: EventStore) -> None:
        """Scaling and migration switched off, new bounds: each reaches the node once."""
        runtime = manual_runtime(store, cluster(node("n1"), pods=(vm_pod("v", "n1"),)))
        runtime.service.request_resources("v", cpu_milli=3000, memory_slots=3)
        fleet = _fleet(runtime)
        fleet.delete_pod("v")
        fleet.create_pod(
            vm_pod(
                "v", "n1", cpu=(500, 2500, 3000), memory=(1, 3, 8), scaling=False, migration=False
            )
        )
        runtime.step()
        pod = runtime.service.stream("n1").state.vm_pods["v"]
        assert (pod.scaling_enabled, pod.migration_enabled) == (False, False)
        assert (pod.cpu.min, pod.cpu.max, pod.memory.max) == (500, 3000, 8)
        assert (pod.cpu.reserved, pod.memory.reserved) == (2500, 3)
        head = store.head()
        runtime.step()
        assert store.head() == head

    def test_an_unreadable_switch_leaves_the_pod_out(self, store: EventStore) -> None:
        """A setting that is neither true nor false is reported like any bad annotation."""
        readable = vm_pod("odd", "n1").annotations
        odd = PodSpec("odd", node="n1", annotations={**readable, SCALING_ANNOTATION: "maybe"})
        runtime = manual_runtime(store, cluster(node("n1"), pods=(odd, vm_pod("ok", "n1"))))
        assert set(runtime.service.stream("n1").state.vm_pods) == {"ok"}


def _counted(store: EventStore, fleet: FakeCluster) -> tuple[NodesRuntime, CountingStore]:
    counting = CountingStore(store)
    return manual_runtime(counting, fleet), counting  # type: ignore[arg-type]


def _many(count: int) -> FakeCluster:
    names = [f"n{n:02d}" for n in range(count)]
    return cluster(
        *(node(name) for name in names),
        pods=tuple(vm_pod(f"vm-{name}", name) for name in names),
    )


class TestPassCost:
    def test_a_take_over_of_many_nodes_commits_a_few_times(self, store: EventStore) -> None:
        """Joining and restarting 30 nodes goes in shared commits (the joins, the restarts),
        not one per node."""
        runtime, counting = _counted(store, _many(30))
        assert counting.commits == 2
        assert runtime.last_restart is not None
        assert runtime.last_restart.nodes_restarted == 30
        assert all(len(state.vm_pods) == 1 for state in runtime.service.hosted().values())

    def test_a_pass_over_unchanged_nodes_commits_nothing(self, store: EventStore) -> None:
        """Nodes whose cluster view equals their state get no command: nothing is decided,
        appended or committed."""
        runtime, counting = _counted(store, _many(30))
        head, commits = store.head(), counting.commits
        report = runtime.step()
        assert (store.head(), counting.commits) == (head, commits)
        assert report == SyncReport()

    def test_a_pass_over_changed_nodes_commits_once(self, store: EventStore) -> None:
        """Thirty nodes with a new pod each: their reservations share one commit."""
        runtime, counting = _counted(store, _many(30))
        fleet = _fleet(runtime)
        for name in runtime.service.hosted():
            fleet.create_pod(PodSpec(f"web-{name}", node=name, cpu_millis=100, memory_mib=64))
        commits = counting.commits
        report = runtime.step()
        assert (counting.commits - commits, report.pods_reserved) == (1, 30)

    def test_a_resized_node_alone_is_updated(self, store: EventStore) -> None:
        """Only the node whose capacity changed is sent a command; the others' streams do not
        move."""
        runtime, _ = _counted(store, _many(3))
        versions = {name: runtime.service.stream(name).version for name in ("n00", "n02")}
        _fleet(runtime).add_node(node("n01", cpus=16))
        head = store.head()
        runtime.step()
        assert store.head() == head + 1
        assert runtime.service.stream("n01").state.cpu.total == 16000
        assert {name: runtime.service.stream(name).version for name in versions} == versions

    def test_a_refused_command_is_dropped_and_the_node_sent_the_rest(
        self, store: EventStore
    ) -> None:
        """One node refusing a pod of a shared pass: that pod is reported, the node's other
        pods go in the next round, and the other nodes' commands are not held back."""
        runtime, counting = _counted(store, _many(3))
        fleet = _fleet(runtime)
        fleet.create_pod(
            PodSpec(
                "bad", node="n01", annotations={CPU_ANNOTATION: "9,1,5", MEMORY_ANNOTATION: "1,1,1"}
            )
        )
        fleet.create_pod(vm_pod("good", "n01"))
        fleet.create_pod(vm_pod("other", "n02"))
        commits = counting.commits
        report = runtime.step()
        assert [reason for reason in report.skipped if "bad" in reason]
        assert set(runtime.service.stream("n01").state.vm_pods) == {"vm-n01", "good"}
        assert set(runtime.service.stream("n02").state.vm_pods) == {"vm-n02", "other"}
        assert (counting.commits - commits, report.pods_reserved) == (2, 2)
