"""KubernetesCluster against a fake API server on loopback: informers, 410 Gone, namespaces,
pod writes and their preconditions, staleness."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
from kubernetes import client

from fleetledger.adapters.cluster import (
    ClusterError,
    ClusterHealth,
    PodExists,
    PodSpec,
    PriorityClassConflict,
    StalePod,
    UnknownPod,
    UnknownPriorityClass,
)
from fleetledger.adapters.kubernetes import KubernetesCluster
from fleetledger.adapters.nodes import NodesRuntime, vm_annotations
from fleetledger.domain.nodes import Bounds
from fleetledger.eventstore import EventStore

from .fake_api import FakeApiServer, fake_api_server, node_object, pod_object


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        yield server


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(api: FakeApiServer, clock: Clock) -> KubernetesCluster:
    configuration = client.Configuration(host=api.url)
    return KubernetesCluster(client.ApiClient(configuration), stale_after_seconds=30, clock=clock)


class TestInformers:
    def test_a_first_sync_lists_nodes_and_pods(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """Allocatable quantities and pod requests arrive in the port's units."""
        api.put("nodes", node_object("n1", cpu="3800m", memory="15Gi", pool="vms"))
        api.put("pods", pod_object("p1", node="n1", cpu="250m", memory="512Mi"))
        cluster.sync()
        [node] = cluster.list_nodes()
        assert (node.name, node.cpu_millis, node.memory_mib) == ("n1", 3800, 15 * 1024)
        assert cluster.list_nodes(label="pool") == [node]
        [pod] = cluster.list_pods()
        assert (pod.name, pod.node, pod.phase, pod.cpu_millis, pod.memory_mib) == (
            "p1",
            "n1",
            "Running",
            250,
            512,
        )

    def test_changes_after_the_list_arrive_by_watch(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """Added, modified and deleted objects are applied from the watch, not a new list."""
        api.put("nodes", node_object("n1"))
        api.put("pods", pod_object("gone", node="n1"))
        cluster.sync()
        api.put("nodes", node_object("n2"))
        api.put("nodes", node_object("n1", cpu="8"))
        api.delete("pods", "gone")
        cluster.sync()
        assert [(n.name, n.cpu_millis) for n in cluster.list_nodes()] == [
            ("n1", 8000),
            ("n2", 4000),
        ]
        assert cluster.list_pods() == []
        assert cluster.nodes.relists == cluster.pods.relists == 1

    def test_the_watch_resumes_from_the_last_resource_version(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """Each watch asks for the changes after the version the cache last saw."""
        api.put("nodes", node_object("n1"))
        cluster.sync()
        api.put("nodes", node_object("n2"))
        cluster.sync()
        cluster.sync()
        watches = [r for r in api.requests if r.startswith("GET /api/v1/nodes?") and "watch" in r]
        assert ["resourceVersion=1" in w for w in watches] == [True, True, False]
        assert "resourceVersion=2" in watches[-1]
        assert cluster.nodes.resource_version == "2"

    def test_410_gone_lists_again(self, api: FakeApiServer, cluster: KubernetesCluster) -> None:
        """Once the server compacted the version, the informer lists afresh."""
        api.put("nodes", node_object("n1"))
        cluster.sync()
        api.put("nodes", node_object("n2"))
        api.delete("nodes", "n1")
        api.compact()
        cluster.sync()
        assert [n.name for n in cluster.list_nodes()] == ["n2"]
        assert cluster.nodes.relists == 2

    def test_terminating_and_owned_pods_are_shown_as_such(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """A deletion timestamp marks a pod terminating; its first owner is its owner."""
        pod = pod_object("p", node="n1")
        pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        pod["metadata"]["ownerReferences"] = [{"name": "rs-1", "kind": "ReplicaSet"}]
        api.put("pods", pod)
        cluster.sync()
        [found] = cluster.list_pods()
        assert (found.terminating, found.owner) == (True, "rs-1")

    def test_a_missing_request_counts_its_limit(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """A container without a request counts its limit, as the scheduler plugin does."""
        pod = pod_object("p")
        pod["spec"]["containers"] = [
            {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "100m"}}},
        ]
        api.put("pods", pod)
        cluster.sync()
        [found] = cluster.list_pods()
        assert (found.cpu_millis, found.memory_mib) == (2100, 1024)


class TestNamespaces:
    def test_one_pod_name_in_two_namespaces_stays_two_pods(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """Both pods are listed; deleting one in its namespace leaves the other, in the API and
        in the cache."""
        api.put("pods", pod_object("vm", namespace="a", node="n1"))
        api.put("pods", pod_object("vm", namespace="b", node="n1"))
        cluster.sync()
        assert [(p.namespace, p.name) for p in cluster.list_pods()] == [("a", "vm"), ("b", "vm")]
        cluster.delete_pod("vm", namespace="a")
        cluster.sync()
        assert [(p.namespace, p.name) for p in cluster.list_pods()] == [("b", "vm")]
        assert api.get("pods", "vm", namespace="b") is not None

    def test_a_pod_is_created_in_its_namespace(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """A spec naming a namespace is posted there; one naming none to the default."""
        assert cluster.create_pod(PodSpec("g", namespace="jobs")).namespace == "jobs"
        assert cluster.create_pod(PodSpec("g")).namespace == "default"
        assert len(_posted(api, "/api/v1/namespaces/jobs/pods")) == 1
        assert len(_posted(api, "/api/v1/namespaces/default/pods")) == 1


class TestWrites:
    def test_a_created_pod_is_in_the_api(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """create_pod posts the pod with its requests, labels and node."""
        pod = cluster.create_pod(
            PodSpec("g1", node="n1", cpu_millis=300, memory_mib=64, labels={"a": "b"})
        )
        assert (pod.name, pod.node, pod.cpu_millis, pod.memory_mib) == ("g1", "n1", 300, 64)
        cluster.sync()
        assert [p.name for p in cluster.list_pods(labels={"a": "b"})] == ["g1"]

    def test_creating_a_taken_name_is_pod_exists(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """409 Conflict from the API is PodExists."""
        cluster.create_pod(PodSpec("g1"))
        with pytest.raises(PodExists):
            cluster.create_pod(PodSpec("g1"))

    def test_deleting_a_missing_pod_is_unknown_pod(self, cluster: KubernetesCluster) -> None:
        """404 from the API is UnknownPod."""
        with pytest.raises(UnknownPod):
            cluster.delete_pod("nobody")

    def test_an_unreachable_api_is_a_cluster_error(self) -> None:
        """A refused connection is translated into ClusterError."""
        configuration = client.Configuration(host="http://127.0.0.1:9")
        configuration.retries = 0
        cluster = KubernetesCluster(client.ApiClient(configuration))
        with pytest.raises(ClusterError):
            cluster.sync()


class TestNodeAccounting:
    def test_the_node_runtime_accounts_what_the_api_shows(
        self, api: FakeApiServer, cluster: KubernetesCluster, sqlite_store: EventStore
    ) -> None:
        """Nodes and VM pods read through the informers join the node accounting."""
        annotations = vm_annotations(Bounds(1000, 2000, 4000), Bounds(1, 2, 4))
        api.put("nodes", node_object("n1", cpu="8", memory="16Gi"))
        api.put("pods", pod_object("vm", node="n1", annotations=annotations))
        cluster.sync()
        runtime = NodesRuntime(sqlite_store, cluster, threads=False).start()
        state = runtime.service.stream("n1").state
        assert (state.cpu.total, set(state.vm_pods)) == (8000, {"vm"})


def _posted(api: FakeApiServer, path: str) -> list[Any]:
    return [body for method, p, body in api.bodies if method == "POST" and p == path]


PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
PRIORITY_CLASS_SCHEMA = (
    Path(__file__).parent.parent / "testbeds" / "schemas" / "priorityclass-scheduling-v1.json"
)


class TestPriority:
    def test_a_pod_names_its_class_and_never_a_priority(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """The pod sent carries priorityClassName only; admission fills the priority in."""
        cluster.ensure_priority_class("fleetledger-ghost", -1000, description="ghosts")
        pod = cluster.create_pod(PodSpec("g1", node="n1", priority_class_name="fleetledger-ghost"))
        [sent] = _posted(api, "/api/v1/namespaces/default/pods")
        assert sent["spec"]["priorityClassName"] == "fleetledger-ghost"
        assert "priority" not in sent["spec"]
        assert (pod.priority_class_name, pod.priority) == ("fleetledger-ghost", -1000)

    def test_a_pod_without_a_class_sends_neither(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """No class, no priority: the cluster's default applies."""
        cluster.create_pod(PodSpec("p"))
        [sent] = _posted(api, "/api/v1/namespaces/default/pods")
        assert {"priority", "priorityClassName"} & set(sent["spec"]) == set()

    def test_a_pod_naming_a_missing_class_is_refused(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """403 from the priority admission plugin is UnknownPriorityClass; nothing exists."""
        with pytest.raises(UnknownPriorityClass, match="no PriorityClass with name nope"):
            cluster.create_pod(PodSpec("g1", priority_class_name="nope"))
        assert api.get("pods", "g1") is None

    def test_the_class_sent_is_a_valid_priority_class(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """The PriorityClass object passes the scheduling.k8s.io/v1 schema: int32 value,
        boolean globalDefault (never the default), a known preemption policy."""
        cluster.ensure_priority_class("fleetledger-ghost", -1000, description="ghosts")
        [sent] = _posted(api, PRIORITY_CLASSES)
        validator = jsonschema.Draft202012Validator(
            json.loads(PRIORITY_CLASS_SCHEMA.read_text(encoding="utf-8"))
        )
        assert list(validator.iter_errors(sent)) == []
        assert (sent["value"], sent["globalDefault"]) == (-1000, False)
        for field, bad in (
            ("value", "-1000"),
            ("value", 2**31),
            ("globalDefault", "false"),
            ("preemptionPolicy", "Sometimes"),
        ):
            broken = copy.deepcopy(sent)
            broken[field] = bad
            assert list(validator.iter_errors(broken)) != [], (field, bad)
        del broken["value"]
        assert list(validator.iter_errors(broken)) != []

    def test_ensuring_a_class_twice_is_a_no_op(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """409 AlreadyExists with the same value is fine."""
        cluster.ensure_priority_class("fleetledger-ghost", -1000, description="ghosts")
        cluster.ensure_priority_class("fleetledger-ghost", -1000, description="ghosts")
        assert len(_posted(api, PRIORITY_CLASSES)) == 2
        stored = api.get("priorityclasses", "fleetledger-ghost")
        assert stored is not None and stored["value"] == -1000

    def test_a_class_of_another_value_conflicts(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """Someone else's class of that name and another value is reported, not used."""
        cluster.ensure_priority_class("fleetledger-ghost", 7, description="theirs")
        with pytest.raises(PriorityClassConflict, match="7"):
            cluster.ensure_priority_class("fleetledger-ghost", -1000, description="ghosts")

    def test_the_api_refuses_a_pod_setting_another_priority(self, api: FakeApiServer) -> None:
        """Why pods never set spec.priority: admission refuses one that differs from its
        class's value (403), as the fake API server models."""
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}], "priority": 5},
        }
        with pytest.raises(client.ApiException) as refused:
            core.create_namespaced_pod("default", cast(Any, body))
        assert refused.value.status == 403
        assert "must not be provided in pod spec" in str(refused.value.body)

    def test_a_class_the_api_refuses_is_a_cluster_error(self, cluster: KubernetesCluster) -> None:
        """422 (a reserved name) is ClusterError."""
        with pytest.raises(ClusterError, match="422"):
            cluster.ensure_priority_class("system-mine", 1, description="no")


class TestDeletePreconditions:
    def test_a_delete_carries_the_uid_and_version_preconditions(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """DeleteOptions.preconditions carries both and the pod they match is deleted."""
        created = cluster.create_pod(PodSpec("g1"))
        cluster.delete_pod("g1", uid=created.uid, resource_version=created.resource_version)
        [(_, _, options)] = [b for b in api.bodies if b[0] == "DELETE"]
        assert options["preconditions"] == {
            "uid": created.uid,
            "resourceVersion": created.resource_version,
        }
        assert api.get("pods", "g1") is None

    def test_a_delete_of_a_changed_pod_is_stale_and_read_again(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """The pod changed since the cache saw it: 409, StalePod with the pod as it is now,
        which the cache shows before any watch delivers it."""
        api.put("pods", pod_object("g1", phase="Pending"))
        cluster.sync()
        [seen] = cluster.list_pods()
        api.put("pods", pod_object("g1", phase="Running"))
        with pytest.raises(StalePod) as refused:
            cluster.delete_pod("g1", uid=seen.uid, resource_version=seen.resource_version)
        current = refused.value.current
        assert current is not None and (current.uid, current.phase) == (seen.uid, "Running")
        assert cluster.list_pods() == [current]
        assert api.get("pods", "g1") is not None
        assert "GET /api/v1/namespaces/default/pods/g1" in api.requests

    def test_the_conflict_is_a_status_as_the_server_sends(self, api: FakeApiServer) -> None:
        """A failed precondition is 409 with a Status body: reason Conflict, the object named."""
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
        api.put("pods", pod_object("p"))
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-it"))
        with pytest.raises(client.ApiException) as refused:
            core.delete_namespaced_pod("p", "default", body=options)
        status = json.loads(str(refused.value.body))
        assert (refused.value.status, status["kind"], status["reason"]) == (
            409,
            "Status",
            "Conflict",
        )
        assert status["details"] == {"name": "p", "kind": "pods"}
        assert "Precondition failed: UID in precondition: not-it" in status["message"]

    def test_a_stale_delete_leaves_the_newer_pod(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """409 Conflict on the precondition is StalePod: the pod of the name now stays."""
        old = cluster.create_pod(PodSpec("g1"))
        cluster.delete_pod("g1")
        newer = cluster.create_pod(PodSpec("g1"))
        with pytest.raises(StalePod) as refused:
            cluster.delete_pod("g1", uid=old.uid)
        stored = api.get("pods", "g1")
        assert stored is not None and stored["metadata"]["uid"] == newer.uid
        assert refused.value.current is not None and refused.value.current.uid == newer.uid

    def test_an_evicted_pod_shows_its_reason(
        self, api: FakeApiServer, cluster: KubernetesCluster
    ) -> None:
        """status.reason reaches the port (the reconciler tells an eviction by it)."""
        pod = pod_object("g1", node="n1", phase="Failed")
        pod["status"]["reason"] = "Evicted"
        api.put("pods", pod)
        cluster.sync()
        [found] = cluster.list_pods()
        assert (found.phase, found.reason) == ("Failed", "Evicted")


class TestStaleness:
    def test_caches_never_listed_are_problems(self, cluster: KubernetesCluster) -> None:
        """Before the first list, both caches are named."""
        assert isinstance(cluster, ClusterHealth)
        assert cluster.problems() == [
            "the Node cache has not listed the cluster yet",
            "the Pod cache has not listed the cluster yet",
        ]

    def test_silence_past_the_limit_is_a_problem_until_the_server_is_heard(
        self, cluster: KubernetesCluster, clock: Clock
    ) -> None:
        """Staleness by kind; past stale_after_seconds a cache is named, and a watch round the
        server ends clears it."""
        cluster.sync()
        assert (cluster.staleness_seconds(), cluster.problems()) == ({"Node": 0, "Pod": 0}, [])
        clock.now += 31
        assert cluster.staleness_seconds() == {"Node": 31, "Pod": 31}
        assert cluster.problems() == [
            "the Node cache is stale: nothing from the API server for 31 s (limit 30 s)",
            "the Pod cache is stale: nothing from the API server for 31 s (limit 30 s)",
        ]
        cluster.sync()
        assert cluster.problems() == []

    def test_a_limit_that_is_not_positive_is_refused(self, api: FakeApiServer) -> None:
        """Configuration is checked at construction."""
        with pytest.raises(ValueError, match="stale_after_seconds"):
            KubernetesCluster(
                client.ApiClient(client.Configuration(host=api.url)), stale_after_seconds=0
            )
