"""A testbed world for runtime tests: a fake cluster of two nodes × two slots, fake applications,
the runtime without threads on a manual clock, and a fake kube-scheduler using the extender."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node, NoRoom
from fleetledger.adapters.extender.server import ExtenderDecider
from fleetledger.adapters.extender.wire import ExtenderPod, pod_to_place
from fleetledger.adapters.testbeds import FakeApplications, TestbedsRuntime, TestbedsService
from fleetledger.eventstore import EventStore

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
BED = "bed"
JOB_PRIORITY_CLASS = "fleetledger-batch"
"""The job pods' PriorityClass, as an administrator installs it next to the runtime."""


def two_nodes() -> FakeCluster:
    """Two labelled nodes, each with room for exactly two 1000m/2048Mi slots, and the job pods'
    priority class."""
    return FakeCluster(
        [
            Node("n1", labels={"testbed": "1"}, cpu_millis=2000, memory_mib=4096),
            Node("n2", labels={"testbed": "2"}, cpu_millis=2000, memory_mib=4096),
        ],
        priority_classes={JOB_PRIORITY_CLASS: 1000},
    )


@dataclass
class World:
    store: EventStore
    clock: ManualClock
    cluster: FakeCluster
    apps: FakeApplications
    runtime: TestbedsRuntime

    @property
    def service(self) -> TestbedsService:
        return self.runtime.service

    def settle(self) -> int:
        """A second of virtual time, then passes until nothing changes."""
        self.clock.advance(1)
        return self.runtime.run_until_settled()

    def place_pending(self) -> int:
        """The kube-scheduler's part: filter, else preempt, then bind."""
        decider = ExtenderDecider(self.runtime.service)
        nodes = tuple(n.name for n in self.cluster.list_nodes())
        placed = 0
        for pod in self.cluster.list_pods():
            if pod.node is not None or pod.scheduler_name != "fleetledger":
                continue
            bed, to_place = pod_to_place(ExtenderPod(pod.name, "default", pod.uid, pod.annotations))
            decision = decider.filter(bed, to_place, nodes)
            if decision.nodes:
                try:
                    self.cluster.bind(pod.name, decision.nodes[0])
                    placed += 1
                    continue
                except NoRoom:
                    pass
            preempt = decider.preempt(bed, to_place, nodes)
            if preempt.node is None:
                continue
            for victim in [p for p in self.cluster.list_pods() if p.uid in preempt.victim_uids]:
                self.cluster.delete_pod(victim.name)
            self.cluster.bind(pod.name, preempt.node)
            placed += 1
        return placed


def world(store: EventStore, *, define: bool = True, jobs: tuple[str, ...] = ("j1", "j2")) -> World:
    clock = ManualClock(EPOCH)
    cluster = two_nodes()
    apps = FakeApplications(cluster)
    runtime = TestbedsRuntime(store, cluster, apps, clock=clock, threads=False)
    runtime.start()
    w = World(store, clock, cluster, apps, runtime)
    if define:
        w.service.define_testbed(
            BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
        )
        for job in jobs:
            w.service.define_job(job, kind="spark", image="spark:3.5", main_file=f"/{job}.py")
    return w


def stream_types(store: EventStore, stream_id: str) -> list[str]:
    return [r.type.split(".", 1)[1] for r in store.read_stream(stream_id)]
