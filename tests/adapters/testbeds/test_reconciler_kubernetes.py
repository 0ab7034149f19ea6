"""The ghost-pod reconciler on KubernetesCluster, through the real ``kubernetes`` client against
the fake API server on loopback: deletes that the API server refuses as stale."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from fleetledger.adapters.kubernetes import KubernetesCluster
from fleetledger.adapters.testbeds import GhostPodReconciler
from fleetledger.eventstore import EventStore
from tests.adapters.kubernetes.fake_api import FakeApiServer, fake_api_server, node_object

from .support import BED, world

STALE = "bed-ghost-n1-0-1000m-2048mi"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        for name, slot in (("n1", "1"), ("n2", "2")):
            server.put("nodes", node_object(name, cpu="2", memory="4Gi", testbed=slot))
        yield server


def _deletes_of(api: FakeApiServer, name: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/default/pods/{name}"
    return [
        body["preconditions"] for method, p, body in api.bodies if (method, p) == ("DELETE", path)
    ]


def test_a_delete_refused_as_stale_is_decided_again_on_what_is_read(
    api: FakeApiServer, store: EventStore
) -> None:
    """A ghost re-created behind the cache's back: the API server refuses the delete of the
    uid the reconciler observed (409); the pass reads the pod again and deletes the newer one
    by its own uid and version."""
    w = world(store)
    cluster = KubernetesCluster(client.ApiClient(client.Configuration(host=api.url)))
    reconciler = GhostPodReconciler(w.service, cluster)
    cluster.sync()
    reconciler.reconcile(BED)
    cluster.sync()
    old = api.get("pods", STALE)
    assert old is not None
    w.service.define_testbed(
        BED, node_label="testbed", slots_per_node=2, cpu_millis=500, memory_mib=1024
    )
    api.delete("pods", STALE)
    api.put("pods", {**old, "metadata": {k: v for k, v in old["metadata"].items() if k != "uid"}})
    newer = api.get("pods", STALE)
    assert newer is not None

    reconciler.reconcile(BED)

    assert _deletes_of(api, STALE) == [
        {"uid": old["metadata"]["uid"], "resourceVersion": old["metadata"]["resourceVersion"]},
        {"uid": newer["metadata"]["uid"], "resourceVersion": newer["metadata"]["resourceVersion"]},
    ]
    assert api.get("pods", STALE) is None
