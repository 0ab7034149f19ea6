"""The ghost-pod reconciler: the testbed's diff applied through the cluster port."""

from __future__ import annotations

from fleetledger.adapters.cluster import Node, PodSpec
from fleetledger.adapters.testbeds import GHOST_LABEL
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore

from .support import BED, World, stream_types, world


def ghosts(w: World) -> list[tuple[str, str | None, str]]:
    return sorted(
        (p.name, p.node, p.annotations["fleetledger.io/slot-id"])
        for p in w.cluster.list_pods(labels={GHOST_LABEL: BED})
    )


class TestGhostPods:
    def test_every_slot_gets_a_ghost_pod_on_its_node(self, store: EventStore) -> None:
        """Slots are numbered round-robin over the nodes and each gets a ghost of its size."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)

        assert ghosts(w) == [
            ("bed-ghost-n1-0-1000m-2048mi", "n1", "0"),
            ("bed-ghost-n1-1-1000m-2048mi", "n1", "2"),
            ("bed-ghost-n2-0-1000m-2048mi", "n2", "1"),
            ("bed-ghost-n2-1-1000m-2048mi", "n2", "3"),
        ]
        state = w.service.testbed(BED).state
        assert testbed.free_slot_ids(state) == (0, 1, 2, 3)
        assert testbed.overall_state(state) == "success"

    def test_a_second_pass_changes_nothing(self, store: EventStore) -> None:
        """Re-running the reconciler on an unchanged cluster creates, deletes and appends
        nothing."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        version, created = w.service.testbed(BED).version, w.cluster.creations

        assert w.runtime.reconciler.reconcile(BED) == 0
        assert (w.service.testbed(BED).version, w.cluster.creations) == (version, created)

    def test_a_lost_ghost_pod_is_created_again(self, store: EventStore) -> None:
        """A ghost pod deleted behind the controller's back is replaced on the next pass."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.delete_pod("bed-ghost-n2-1-1000m-2048mi")

        w.runtime.reconciler.reconcile(BED)

        assert len(ghosts(w)) == 4
        assert testbed.free_slot_ids(w.service.testbed(BED).state) == (0, 1, 2, 3)

    def test_a_node_that_leaves_the_testbed_loses_its_ghosts(self, store: EventStore) -> None:
        """Removing a node's label shrinks the testbed: its ghost pods are deleted and the slots
        renumber over the remaining node."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.add_node(Node("n2", cpu_millis=2000, memory_mib=4096))

        w.runtime.reconciler.reconcile(BED)

        assert [(name, node) for name, node, _ in ghosts(w)] == [
            ("bed-ghost-n1-0-1000m-2048mi", "n1"),
            ("bed-ghost-n1-1-1000m-2048mi", "n1"),
        ]
        assert testbed.free_slot_ids(w.service.testbed(BED).state) == (0, 1)

    def test_a_resize_replaces_the_ghosts(self, store: EventStore) -> None:
        """A new slot size deletes the old ghosts and creates ones of the new size."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.service.define_testbed(
            BED, node_label="testbed", slots_per_node=2, cpu_millis=500, memory_mib=1024
        )

        w.runtime.reconciler.reconcile(BED)

        assert {name.rsplit("-", 2)[1] for name, _, _ in ghosts(w)} == {"500m"}
        assert len(ghosts(w)) == 4

    def test_a_node_too_small_is_reported_not_forced(self, store: EventStore) -> None:
        """Slots that do not fit their node are a problem for an operator: the testbed is in
        error and the ghost that cannot be placed is not."""
        w = world(store)
        w.cluster.add_node(Node("n2", labels={"testbed": "2"}, cpu_millis=1000, memory_mib=2048))

        w.runtime.reconciler.reconcile(BED)

        state = w.service.testbed(BED).state
        assert testbed.overall_state(state) == "error"
        assert [node for _, node, _ in ghosts(w)].count("n2") == 1

    def test_the_observation_is_recorded(self, store: EventStore) -> None:
        """What the reconciler saw is in the testbed's stream: before and after acting."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)

        assert stream_types(store, testbed.stream_name(BED)) == [
            "TestbedDefined",
            "ClusterObserved",
            "ClusterObserved",
        ]


class TestPreemption:
    def test_an_occupied_slot_loses_its_ghost(self, store: EventStore) -> None:
        """When a job pod runs in its reserved slot beside the ghost (room to spare), the ghost
        is deleted: the preemption is done."""
        w = world(store)
        w.cluster.add_node(Node("n1", labels={"testbed": "1"}, cpu_millis=3000, memory_mib=6144))
        w.runtime.reconciler.reconcile(BED)
        w.service.execute(
            w.service.testbed(BED),
            lambda at: testbed.ReserveSlot("job-pod", "uid-x", (0,), at=at),
            cause="test",
        )
        w.cluster.create_pod(
            PodSpec(
                "job-pod",
                annotations={testbed.TESTBED_ANNOTATION: BED},
                node="n1",
                cpu_millis=1000,
                memory_mib=2048,
            )
        )
        w.clock.advance(1)

        w.runtime.reconciler.reconcile(BED)

        assert "bed-ghost-n1-0-1000m-2048mi" not in [name for name, _, _ in ghosts(w)]
        [slot0, *_] = testbed.slots(w.service.testbed(BED).state)
        assert (slot0.status, slot0.reserved_for) == ("occupied", "job-pod")
