"""The runtime makes sure the job pods' PriorityClass exists before it creates applications."""

from __future__ import annotations

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.testbeds import FakeApplications, TestbedsRuntime
from fleetledger.adapters.testbeds.reconciler import GHOST_PRIORITY
from fleetledger.adapters.testbeds.runtime import JOB_PRIORITY, JOB_PRIORITY_CLASS
from fleetledger.eventstore import EventStore

from .support import EPOCH


def _runtime(store: EventStore, cluster: FakeCluster) -> TestbedsRuntime:
    return TestbedsRuntime(
        store, cluster, FakeApplications(cluster), clock=ManualClock(EPOCH), threads=False
    )


def _cluster(classes: dict[str, int] | None = None) -> FakeCluster:
    node = Node("n1", labels={"testbed": "1"}, cpu_millis=2000, memory_mib=4096)
    return FakeCluster([node], priority_classes=classes or {})


def test_the_job_class_is_created_above_the_ghosts(sqlite_store: EventStore) -> None:
    """Once there is a job, a pass creates the job pods' class, ranked above the ghost pods."""
    cluster = _cluster()
    with _runtime(sqlite_store, cluster) as runtime:
        runtime.step()
        assert JOB_PRIORITY_CLASS not in cluster.priority_classes()
        runtime.service.define_job("j1", kind="spark", image="i", main_file="local:///a.jar")
        runtime.step()
    assert cluster.priority_classes()[JOB_PRIORITY_CLASS] == JOB_PRIORITY > GHOST_PRIORITY


def test_an_administrators_class_is_kept(sqlite_store: EventStore) -> None:
    """A class of that name with another value is the administrator's: kept, not replaced."""
    cluster = _cluster({JOB_PRIORITY_CLASS: 50})
    with _runtime(sqlite_store, cluster) as runtime:
        runtime.service.define_job("j1", kind="spark", image="i", main_file="local:///a.jar")
        runtime.step()
    assert cluster.priority_classes()[JOB_PRIORITY_CLASS] == 50
