"""KubernetesCluster against a fake API server on loopback: informers, 410 Gone, pod writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from fleetledger.adapters.cluster import ClusterError, PodExists, PodSpec, UnknownPod
from fleetledger.adapters.kubernetes import KubernetesCluster
from fleetledger.adapters.nodes import NodesRuntime, vm_annotations
from fleetledger.domain.nodes import Bounds
from fleetledger.eventstore import EventStore

from .fake_api import FakeApiServer, fake_api_server, node_object, pod_object


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        yield server


@pytest.fixture
def cluster(api: FakeApiServer) -> KubernetesCluster:
    configuration = client.Configuration(host=api.url)
    return KubernetesCluster(client.ApiClient(configuration))


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
