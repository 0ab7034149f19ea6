"""The fake application operators: the pods they make of a manifest are those the real
operators would make (as derived in ``tests/adapters/kubernetes/operators.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.testbeds import APPLICATION_LABEL, Applications, FakeApplications
from fleetledger.adapters.testbeds.applications import InvalidApplication
from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION
from tests.adapters.kubernetes.operators import (
    flink_task_manager_pods,
    memory_mib,
    milli_cpu,
    spark_executor_pods,
)

from .test_manifests import job, manifest

KINDS = [
    ("spark", "/opt/job.py", spark_executor_pods, "spark-kubernetes-executor"),
    ("flink", "/opt/job.jar", flink_task_manager_pods, "flink-main-container"),
]


def cluster(*, batch_class: bool = True) -> FakeCluster:
    nodes = [Node(n, cpu_millis=4000, memory_mib=8192) for n in ("n1", "n2")]
    return FakeCluster(nodes, priority_classes={"fleetledger-batch": 1000} if batch_class else {})


@pytest.mark.parametrize(
    ("kind", "main_file", "derive", "container"), KINDS, ids=["spark", "flink"]
)
class TestOperatorPods:
    def test_the_fake_makes_the_pods_the_operator_would(
        self, kind: Any, main_file: str, derive: Any, container: str
    ) -> None:
        """Names, requests, annotations, scheduler and priority class as the operator's pods."""
        app = manifest(job(kind, main_file=main_file))
        c = cluster()
        FakeApplications(c).create(app)

        expected = derive(app)
        made = c.list_pods()
        assert [p.name for p in made] == [p["metadata"]["name"] for p in expected]
        for pod, want in zip(made, expected, strict=True):
            requests = next(x for x in want["spec"]["containers"] if x["name"] == container)[
                "resources"
            ]["requests"]
            assert (pod.cpu_millis, pod.memory_mib) == (
                milli_cpu(requests["cpu"]),
                memory_mib(requests["memory"]),
            )
            assert (pod.scheduler_name, pod.priority_class_name) == (
                want["spec"]["schedulerName"],
                want["spec"]["priorityClassName"],
            )
            assert pod.annotations == want["metadata"]["annotations"]
            assert pod.labels[APPLICATION_LABEL] == app["metadata"]["name"]

    def test_the_pods_fill_their_slots_and_wait_for_the_scheduler(
        self, kind: Any, main_file: str, derive: Any, container: str
    ) -> None:
        """One pending pod per slot, of the slot's size, with its class's priority."""
        c = cluster()
        FakeApplications(c).create(manifest(job(kind, main_file=main_file)))
        pods = c.list_pods()
        assert {(p.cpu_millis, p.memory_mib, p.node, p.priority) for p in pods} == {
            (1000, 2048, None, 1000)
        }
        assert len(pods) == 2
        assert {p.annotations[SLOT_IDS_ANNOTATION] for p in pods} == {"0,3"}
        assert {p.annotations[TESTBED_ANNOTATION] for p in pods} == {"bed"}


class TestLifecycle:
    def test_the_fake_is_an_applications_port(self) -> None:
        """The fake satisfies the port the process is written against."""
        apps: Applications = FakeApplications(cluster())
        assert apps.phase("nobody") == "absent"

    def test_creating_twice_makes_the_pods_once(self) -> None:
        """A repeated create is a no-op."""
        c = cluster()
        apps = FakeApplications(c)
        apps.create(manifest(job()))
        apps.create(manifest(job()))
        assert (apps.created, c.creations) == (["wordcount-app"], 2)

    def test_phases_follow_the_pods_and_the_simulator(self) -> None:
        """pending until every pod is bound, scheduled, then what the simulator says."""
        c = cluster()
        apps = FakeApplications(c)
        apps.create(manifest(job()))
        name = "wordcount-app"
        assert apps.phase(name) == "pending"
        for pod, node in zip(apps.pods(name), ("n1", "n2"), strict=True):
            c.bind(pod, node)
        assert apps.phase(name) == "scheduled"
        apps.start(name)
        assert apps.phase(name) == "running"
        apps.finish(name)
        assert (apps.phase(name), c.list_pods()) == ("completed", [])
        apps.delete(name)
        assert apps.phase(name) == "absent"

    def test_pods_refused_by_admission_fail_the_application(self) -> None:
        """Without the jobs' priority class, admission refuses the pods: the application
        fails, and says why."""
        c = cluster(batch_class=False)
        apps = FakeApplications(c)
        apps.create(manifest(job()))
        assert apps.phase("wordcount-app") == "failed"
        assert "no PriorityClass with name fleetledger-batch" in apps.message("wordcount-app")
        assert c.list_pods() == []

    @pytest.mark.parametrize(
        "bad",
        [
            {"apiVersion": "flinkoperator.k8s.io/v1beta1", "kind": "FlinkCluster"},
            {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication"},
        ],
        ids=["old kind", "no spec"],
    )
    def test_a_manifest_no_operator_takes_is_invalid(self, bad: dict[str, Any]) -> None:
        """Nothing is created for it."""
        c = cluster()
        with pytest.raises(InvalidApplication):
            FakeApplications(c).create(bad)
        assert c.list_pods() == []
