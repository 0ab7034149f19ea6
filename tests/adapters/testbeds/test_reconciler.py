"""The ghost-pod reconciler: the testbed's diff applied through the cluster port."""

from __future__ import annotations

import pytest

from fleetledger.adapters.cluster import (
    FakeCluster,
    Node,
    PodSpec,
    PriorityClassConflict,
    StalePod,
)
from fleetledger.adapters.testbeds import GHOST_LABEL, GhostPodReconciler
from fleetledger.adapters.testbeds.reconciler import (
    GHOST_PRIORITY,
    GHOST_PRIORITY_CLASS,
    POSITION_ANNOTATION,
)
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore

from .support import BED, World, stream_types, two_nodes, world


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
        error and the node gets no ghost pods."""
        w = world(store)
        w.cluster.add_node(Node("n2", labels={"testbed": "2"}, cpu_millis=1000, memory_mib=2048))

        w.runtime.reconciler.reconcile(BED)

        state = w.service.testbed(BED).state
        assert testbed.overall_state(state) == "error"
        assert [node for _, node, _ in ghosts(w)] == ["n1", "n1"]

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
        job_pod = w.cluster.create_pod(
            PodSpec(
                "job-pod",
                annotations={testbed.TESTBED_ANNOTATION: BED},
                node="n1",
                cpu_millis=1000,
                memory_mib=2048,
            )
        )
        w.service.execute(
            w.service.testbed(BED),
            lambda at: testbed.ReserveSlot("job-pod", job_pod.uid, (0,), at=at),
            cause="test",
        )
        w.clock.advance(1)

        w.runtime.reconciler.reconcile(BED)

        assert "bed-ghost-n1-0-1000m-2048mi" not in [name for name, _, _ in ghosts(w)]
        [slot0, *_] = testbed.slots(w.service.testbed(BED).state)
        assert (slot0.status, slot0.reserved_for) == ("occupied", "job-pod")


def slot_ghosts(w: World, node: str, position: int) -> list[str]:
    return [
        p.name
        for p in w.cluster.list_pods(labels={GHOST_LABEL: BED})
        if p.node == node and p.annotations[POSITION_ANNOTATION] == str(position)
    ]


class TestEndedGhosts:
    def test_a_failed_ghost_is_replaced_under_a_fresh_name(self, store: EventStore) -> None:
        """A ghost pod that failed holds nothing: it is deleted and its slot gets a new ghost
        under a name the failed pod object never held."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.set_phase("bed-ghost-n2-1-1000m-2048mi", "Failed")
        w.clock.advance(1)

        w.runtime.reconciler.reconcile(BED)

        assert slot_ghosts(w, "n2", 1) == ["bed-ghost-n2-1-1000m-2048mi-g1"]
        assert testbed.free_slot_ids(w.service.testbed(BED).state) == (0, 1, 2, 3)

    def test_an_evicted_ghost_is_replaced_under_a_fresh_name(self, store: EventStore) -> None:
        """A ghost the kubelet evicted (Failed, reason Evicted) is replaced the same way."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.evict("bed-ghost-n1-0-1000m-2048mi")
        w.clock.advance(1)

        w.runtime.reconciler.reconcile(BED)

        assert slot_ghosts(w, "n1", 0) == ["bed-ghost-n1-0-1000m-2048mi-g1"]
        [replacement] = [p for p in w.cluster.list_pods() if p.name.endswith("-g1")]
        assert (replacement.phase, replacement.node) == ("Running", "n1")

    def test_an_ended_job_pod_is_not_observed(self, store: EventStore) -> None:
        """A job pod that ended holds no slot: the observation leaves it out."""
        w = world(store)
        w.cluster.create_pod(
            PodSpec("job-pod", annotations={testbed.TESTBED_ANNOTATION: BED}, node="n1")
        )
        w.cluster.set_phase("job-pod", "Succeeded")

        w.runtime.reconciler.reconcile(BED)

        assert "job-pod" not in [p.name for p in w.service.testbed(BED).state.pods]


class _RacingCluster(FakeCluster):
    """Between the reconciler's observation and its delete, ``target`` is replaced by a newer
    pod of the same name (another process re-created it), or, with ``rewrite``, written again
    (its resource version moves). Every delete asked for is recorded."""

    target: str | None = None
    rewrite = False

    def __init__(self) -> None:
        super().__init__(two_nodes().list_nodes())
        self.asked: list[tuple[str, str | None, str | None]] = []

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self.asked.append((name, uid, resource_version))
        if name == self.target:
            self.target = None
            old = self.pod(name)
            assert old is not None and old.node is not None
            if self.rewrite:
                self.set_phase(name, old.phase)
            else:
                super().delete_pod(name)
                super().create_pod(
                    PodSpec(
                        name,
                        labels=old.labels,
                        annotations=old.annotations,
                        node=old.node,
                        cpu_millis=old.cpu_millis,
                        memory_mib=old.memory_mib,
                        priority_class_name=old.priority_class_name,
                    )
                )
        super().delete_pod(name, namespace=namespace, uid=uid, resource_version=resource_version)


STALE = "bed-ghost-n1-0-1000m-2048mi"


def _racing(
    store: EventStore, *, rewrite: bool
) -> tuple[World, _RacingCluster, GhostPodReconciler]:
    """Ghosts made, then the testbed resized so every ghost is to go, ``STALE`` racing."""
    w = world(store)
    cluster = _RacingCluster()
    cluster.rewrite = rewrite
    reconciler = GhostPodReconciler(w.service, cluster)
    reconciler.reconcile(BED)
    w.service.define_testbed(
        BED, node_label="testbed", slots_per_node=2, cpu_millis=500, memory_mib=1024
    )
    cluster.target = STALE
    return w, cluster, reconciler


class TestStaleDeletes:
    def test_a_stale_delete_is_decided_again_on_the_newer_pod(self, store: EventStore) -> None:
        """The delete carries the uid the reconciler observed: the newer pod that took the name
        is refused to it; the pass reads the cluster again and decides about the newer pod on
        its own uid, never repeating the refused delete."""
        _, cluster, reconciler = _racing(store, rewrite=False)
        first_uid = _uid(cluster, STALE)

        reconciler.reconcile(BED)

        asked = [(uid, version) for name, uid, version in cluster.asked if name == STALE]
        assert len(asked) == 2 and asked[0][0] == first_uid
        assert asked[1][0] not in (None, first_uid)
        assert cluster.pod(STALE) is None

    def test_a_delete_of_a_changed_pod_is_decided_again(self, store: EventStore) -> None:
        """The pod was written since it was observed: its old resource version is refused, and
        the pass deletes it on the version it reads again."""
        _, cluster, reconciler = _racing(store, rewrite=True)
        observed = cluster.pod(STALE)
        assert observed is not None

        reconciler.reconcile(BED)

        asked = [(uid, version) for name, uid, version in cluster.asked if name == STALE]
        assert asked[0] == (observed.uid, observed.resource_version)
        assert asked[1][0] == observed.uid and asked[1][1] != observed.resource_version
        assert cluster.pod(STALE) is None

    def test_the_fake_refuses_a_delete_with_another_uid(self) -> None:
        """StalePod, and the pod stays."""
        cluster = two_nodes()
        pod = cluster.create_pod(PodSpec("p", node="n1"))
        with pytest.raises(StalePod):
            cluster.delete_pod("p", uid="uid-other")
        assert cluster.pod("p") == pod


def _uid(cluster: FakeCluster, name: str) -> str:
    pod = cluster.pod(name)
    assert pod is not None
    return pod.uid


class TestGhostPriority:
    def test_ghosts_take_their_priority_from_the_ghost_class(self, store: EventStore) -> None:
        """Ghost pods name the ghost PriorityClass, created once, and the cluster resolves their
        priority from it: below the default, so any job pod may preempt them."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.delete_pod("bed-ghost-n2-1-1000m-2048mi")
        w.runtime.reconciler.reconcile(BED)

        pods = w.cluster.list_pods(labels={GHOST_LABEL: BED})
        assert {(p.priority_class_name, p.priority) for p in pods} == {
            (GHOST_PRIORITY_CLASS, GHOST_PRIORITY)
        }
        assert GHOST_PRIORITY < 0
        assert w.cluster.priority_classes()[GHOST_PRIORITY_CLASS] == GHOST_PRIORITY
        assert w.cluster.class_creations == 1

    def test_a_class_deleted_behind_its_back_is_created_again(self, store: EventStore) -> None:
        """Admission refusing a ghost for want of its class makes the reconciler create the
        class again, and the ghost is created."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        w.cluster.delete_priority_class(GHOST_PRIORITY_CLASS)
        w.cluster.delete_pod("bed-ghost-n2-1-1000m-2048mi")

        w.runtime.reconciler.reconcile(BED)

        assert len(ghosts(w)) == 4
        assert w.cluster.class_creations == 2

    def test_a_ghost_class_of_another_value_is_not_used(self, store: EventStore) -> None:
        """A class of the ghosts' name with another value (someone else's) is a conflict: no
        ghost is created with a priority it was not meant to have."""
        w = world(store)
        w.cluster.ensure_priority_class(GHOST_PRIORITY_CLASS, 5, description="someone else's")

        with pytest.raises(PriorityClassConflict):
            w.runtime.reconciler.reconcile(BED)

        assert ghosts(w) == []


class TestObservations:
    def _reserve(self, w: World, pod: str) -> None:
        uid = w.cluster.pod(pod).uid  # type: ignore[union-attr]
        w.service.execute(
            w.service.testbed(BED),
            lambda at: testbed.ReserveSlot(pod, uid, (0, 1, 2, 3), at=at),
            cause="test-reserve",
        )

    def test_a_reservation_made_while_listing_survives_the_listing(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A pod created and given a slot after the cluster was listed is absent from that
        listing; the observation is dated when it was listed, so it does not clear the
        reservation as if the pod were gone."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        listed = w.cluster.list_pods

        def listing_then_a_reservation(**kwargs: object) -> object:
            snapshot = listed()
            w.clock.advance(1)
            w.cluster.create_pod(PodSpec("late-1", annotations={"fleetledger.io/testbed": BED}))
            self._reserve(w, "late-1")
            w.clock.advance(1)
            return snapshot

        monkeypatch.setattr(w.cluster, "list_pods", listing_then_a_reservation)
        w.runtime.reconciler.observe(BED)

        assert testbed.reservation_of(w.service.testbed(BED).state, "late-1") is not None

    def test_a_pod_with_the_original_operators_label_belongs_to_the_testbed(
        self, store: EventStore
    ) -> None:
        """A job pod labelled the original operator's way keeps its reservation: it is observed
        as the testbed's pod, not taken for gone."""
        w = world(store)
        w.runtime.reconciler.reconcile(BED)
        labels = {testbed.SEED_TESTBED_LABEL: BED, testbed.SEED_SLOT_IDS_LABEL: "0_1"}
        w.cluster.create_pod(PodSpec("seed-1", labels=labels))
        self._reserve(w, "seed-1")
        w.clock.advance(5)

        w.runtime.reconciler.observe(BED)

        assert testbed.reservation_of(w.service.testbed(BED).state, "seed-1") is not None
