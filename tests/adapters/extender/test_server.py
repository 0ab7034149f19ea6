"""The extender over HTTP: golden JSON in and out, reservations in the log."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.extender.server import create_extender_app
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore
from tests.adapters.testbeds.support import BED, World, world


def pod_json(name: str, uid: str, slot_ids: str = "1,3") -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "jobs",
            "uid": uid,
            "annotations": {"fleetledger.io/testbed": BED, "fleetledger.io/slot-ids": slot_ids},
        },
        "spec": {"schedulerName": "fleetledger"},
    }


@pytest.fixture
def w(store: EventStore) -> World:
    """A testbed of 2 × 2 slots with its ghost pods running."""
    w = world(store)
    w.runtime.reconciler.reconcile(BED)
    return w


@pytest.fixture
def client(w: World) -> TestClient:
    return TestClient(create_extender_app(w.service))


def ghost_uid(w: World, node: str, position: int) -> str:
    pod = w.cluster.pod(f"bed-ghost-{node}-{position}-1000m-2048mi")
    assert pod is not None
    return pod.uid


class TestFilter:
    def test_node_cache_capable_golden(self, w: World, client: TestClient) -> None:
        """Node names in, node names out: the node of the first free slot of the pod's list,
        the other candidates failed with the reason."""
        body = {"Pod": pod_json("j1-app-exec-1", "u1"), "Nodes": None, "NodeNames": ["n1", "n2"]}

        response = client.post("/filter", json=body)

        assert response.status_code == 200
        assert response.json() == json.loads(
            """{"Nodes": null, "NodeNames": ["n2"],
                "FailedNodes": {"n1": "pod j1-app-exec-1 has slot 1, which is on node n2"},
                "FailedAndUnresolvableNodes": {}, "Error": ""}"""
        )
        reserved = testbed.reservation_of(w.service.testbed(BED).state, "j1-app-exec-1")
        assert reserved is not None and reserved.slot_id == 1

    def test_whole_nodes_golden(self, client: TestClient) -> None:
        """Whole nodes in, the passing node object out exactly as received."""
        n1 = {"metadata": {"name": "n1", "labels": {"testbed": "1"}}}
        n2 = {"metadata": {"name": "n2", "labels": {"testbed": "2"}}, "status": {"x": 1}}
        body = {"Pod": pod_json("p", "u1"), "Nodes": {"items": [n1, n2]}, "NodeNames": None}

        answer = client.post("/filter", json=body).json()

        assert answer["Nodes"] == {"items": [n2]}
        assert answer["NodeNames"] is None

    def test_asking_again_keeps_the_reservation(self, w: World, client: TestClient) -> None:
        """A pod asked about twice gets the same node and no second reservation."""
        body = {"Pod": pod_json("p", "u1"), "Nodes": None, "NodeNames": ["n1", "n2"]}
        client.post("/filter", json=body)
        version = w.service.testbed(BED).version

        assert client.post("/filter", json=body).json()["NodeNames"] == ["n2"]
        assert w.service.testbed(BED).version == version

    def test_pods_of_one_application_take_distinct_slots(self, client: TestClient) -> None:
        """Two pods with the same slot list get one slot each; a third finds none free and
        every candidate fails with the reason."""
        answers = [
            client.post(
                "/filter",
                json={"Pod": pod_json(f"p{i}", f"u{i}"), "Nodes": None, "NodeNames": ["n1", "n2"]},
            ).json()
            for i in range(3)
        ]

        assert [a["NodeNames"] for a in answers] == [["n2"], ["n2"], []]
        assert set(answers[2]["FailedNodes"]) == {"n1", "n2"}
        assert "no free slot for pod p2" in answers[2]["FailedNodes"]["n1"]

    def test_a_pod_without_slot_annotations_gets_an_error(self, client: TestClient) -> None:
        """Only a batch job's pods use this scheduler: others are answered with Error."""
        pod = {"metadata": {"name": "web", "namespace": "d", "uid": "u"}}
        answer = client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]}).json()

        assert answer["NodeNames"] == []
        assert "lacks the fleetledger.io/testbed" in answer["Error"]

    def test_an_unknown_testbed_fails_every_node(self, client: TestClient) -> None:
        """A pod naming a testbed that does not exist is placed nowhere, with the reason."""
        pod = pod_json("p", "u")
        pod["metadata"]["annotations"]["fleetledger.io/testbed"] = "other"  # type: ignore[index]
        answer = client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]}).json()

        assert answer["FailedNodes"] == {
            "n1": "no testbed named other; define it before scheduling its jobs' pods"
        }

    @pytest.mark.parametrize("body", ["[]", "{", '{"Pod": {"metadata": {}}, "NodeNames": []}'])
    def test_a_malformed_body_is_a_400(self, client: TestClient, body: str) -> None:
        """A body that is not ExtenderArgs is refused with the reason."""
        response = client.post("/filter", content=body)
        assert response.status_code == 400
        assert response.json()["detail"]


class TestPreempt:
    def test_meta_victims_golden(self, w: World, client: TestClient) -> None:
        """The pod's slot's node, with that slot's ghost pod as the only victim."""
        body = {
            "Pod": pod_json("p", "u1", "2"),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": "someone"}], "NumPDBViolations": 0},
                "n2": {"Pods": [], "NumPDBViolations": 0},
            },
        }

        response = client.post("/preempt", json=body)

        assert response.status_code == 200
        assert response.json() == {
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": ghost_uid(w, "n1", 1)}], "NumPDBViolations": 0}
            }
        }

    def test_whole_victims_are_answered_with_meta_victims(
        self, w: World, client: TestClient
    ) -> None:
        """Args with whole victim pods (not node-cache-capable) get the same answer."""
        body = {
            "Pod": pod_json("p", "u1", "0"),
            "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": "x"}}]}},
            "NodeNameToMetaVictims": None,
        }

        answer = client.post("/preempt", json=body).json()

        assert answer == {
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": ghost_uid(w, "n1", 0)}], "NumPDBViolations": 0}
            }
        }

    def test_no_free_slot_means_no_node(self, client: TestClient) -> None:
        """When every slot of the pod is taken there is nothing to preempt."""
        client.post("/preempt", json={"Pod": pod_json("a", "ua", "0")})

        answer = client.post("/preempt", json={"Pod": pod_json("b", "ub", "0")}).json()

        assert answer == {"NodeNameToMetaVictims": {}}


def test_health(client: TestClient) -> None:
    """The extender answers its liveness probe."""
    assert client.get("/healthz").json() == {"status": "ok"}
