"""POST, GET and DELETE /v1/workloads over a placement runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fleetledger.adapters.http.workloads import workloads_router
from fleetledger.adapters.placement import PlacementRuntime
from fleetledger.eventstore import EventStore
from tests.adapters.placement.support import CPU_POOL, GIB, FakeMachines, join, node_service


@pytest.fixture
def runtime(store: EventStore) -> Iterator[PlacementRuntime]:
    nodes = node_service(store)
    join(nodes, "cpu-000")
    with PlacementRuntime(store, nodes, [CPU_POOL], machines=FakeMachines()) as runtime:
        yield runtime


@pytest.fixture
def client(runtime: PlacementRuntime) -> TestClient:
    app = FastAPI()
    app.include_router(workloads_router(runtime))
    return TestClient(app)


def _one(**fields: object) -> dict[str, object]:
    return {"cpu_milli": 1000, "memory_bytes": GIB} | fields


class TestWorkloads:
    def test_one_workload_is_accepted_then_placed(self, client: TestClient) -> None:
        """POST one → 202 with its id; GET ?wait= answers with the node once placed."""
        response = client.post("/v1/workloads", json=_one(id="w1"))
        assert (response.status_code, response.json()) == (202, {"ids": ["w1"]})
        body = client.get("/v1/workloads/w1", params={"wait": 10}).json()
        assert (body["state"], body["node"]) == ("placed", "cpu-000")

    def test_many_at_once_get_fresh_ids(self, client: TestClient) -> None:
        """POST {"workloads": [...]} → one id each, fresh where none was given."""
        response = client.post("/v1/workloads", json={"workloads": [_one(), _one(id="x")]})
        ids = response.json()["ids"]
        assert response.status_code == 202
        assert len(ids) == 2 and ids[1] == "x" and ids[0]

    def test_overflow_is_pending_provisioning(self, client: TestClient) -> None:
        """A workload that fits no node waits for the worker requested for it."""
        client.post("/v1/workloads", json={"workloads": [_one(id="a", cpu_milli=4000)]})
        client.get("/v1/workloads/a", params={"wait": 10})
        client.post("/v1/workloads", json=_one(id="b", cpu_milli=4000))
        body = client.get("/v1/workloads/b", params={"wait": 10}).json()
        assert body["state"] == "pending-provisioning"
        assert str(body["worker"]).startswith("cpu-")

    def test_rejected_with_reason(self, client: TestClient) -> None:
        """A workload no pool can ever hold is rejected with the reason."""
        client.post("/v1/workloads", json=_one(id="huge", cpu_milli=64_000))
        body = client.get("/v1/workloads/huge", params={"wait": 10}).json()
        assert body["state"] == "rejected"
        assert "more than any worker" in str(body["reason"])

    def test_delete_releases(self, client: TestClient) -> None:
        """DELETE returns the capacity; the status says released."""
        client.post("/v1/workloads", json=_one(id="w1", cpu_milli=4000))
        client.get("/v1/workloads/w1", params={"wait": 10})
        response = client.delete("/v1/workloads/w1")
        assert (response.status_code, response.json()["state"]) == (200, "released")
        client.post("/v1/workloads", json=_one(id="w2", cpu_milli=4000))
        body = client.get("/v1/workloads/w2", params={"wait": 10}).json()
        assert (body["state"], body["node"]) == ("placed", "cpu-000")

    def test_unknown_is_404(self, client: TestClient) -> None:
        """An id never submitted is a 404."""
        assert client.get("/v1/workloads/nope").status_code == 404

    def test_malformed_is_400(self, client: TestClient) -> None:
        """GPU types without a GPU is a 400 saying what to fix."""
        response = client.post("/v1/workloads", json=_one(gpu_types=["t4"]))
        assert response.status_code == 400
        assert "asks for no GPU" in response.json()["detail"]

    def test_invalid_body_is_422(self, client: TestClient) -> None:
        """A negative amount does not validate."""
        assert client.post("/v1/workloads", json=_one(cpu_milli=-1)).status_code == 422

    def test_a_resent_workload_is_answered_by_the_first(
        self, client: TestClient, store: EventStore
    ) -> None:
        """The same id and request again is a 202 that records nothing new."""
        client.post("/v1/workloads", json=_one(id="w1"))
        client.get("/v1/workloads/w1", params={"wait": 10})  # its batch has committed
        head = store.head()
        response = client.post("/v1/workloads", json=_one(id="w1"))
        assert (response.status_code, response.json()) == (202, {"ids": ["w1"]})
        assert store.head() == head

    def test_a_conflicting_resubmission_is_409(self, client: TestClient, store: EventStore) -> None:
        """A different request under a submitted id is refused, naming it; nothing recorded."""
        client.post("/v1/workloads", json=_one(id="w1"))
        client.get("/v1/workloads/w1", params={"wait": 10})  # its batch has committed
        head = store.head()
        response = client.post(
            "/v1/workloads", json={"workloads": [_one(id="w2"), _one(id="w1", cpu_milli=2000)]}
        )
        assert response.status_code == 409
        assert "w1 was already submitted with a different request" in response.json()["detail"]
        assert store.head() == head

    def test_an_id_too_long_for_the_log_is_422(self, client: TestClient, store: EventStore) -> None:
        """An id whose stream name the log could not hold is refused at the edge, naming it."""
        head = store.head()
        response = client.post("/v1/workloads", json=_one(id="x" * 253))
        assert response.status_code == 422
        assert any(error["loc"][-1] == "id" for error in response.json()["detail"])
        assert store.head() == head


class TestEdgeRule:
    @pytest.mark.parametrize(
        ("fields", "loc"),
        [
            ({"selector": "general\x00"}, ["selector"]),
            ({"selector": "general\x1b[31m"}, ["selector"]),
            ({"gpu_types": ["a100\x00"]}, ["gpu_types", 0]),
            ({"gpu_types": ["a100\x1b"]}, ["gpu_types", 0]),
            ({"id": "a/b"}, ["id"]),
            ({"id": "a?b"}, ["id"]),
            ({"priority": 2**40}, ["priority"]),
        ],
    )
    def test_what_the_log_or_a_url_cannot_hold_is_422(
        self, client: TestClient, store: EventStore, fields: dict[str, object], loc: list[object]
    ) -> None:
        """Control characters in a selector or GPU type, ids that no URL can read back and
        numbers out of range are refused at the field, before anything is appended (a NUL once
        reached Postgres and came back as a 503; an id with / was accepted and then unreadable)."""
        head = store.head()

        response = client.post("/v1/workloads", json=_one(**fields))

        assert response.status_code == 422
        assert any(error["loc"][-len(loc) :] == loc for error in response.json()["detail"])
        assert store.head() == head

    @pytest.mark.parametrize("path", ["a%00b", "a%1Bb", "x" * 200])
    def test_an_id_no_workload_can_have_is_refused_when_read(
        self, client: TestClient, path: str
    ) -> None:
        assert client.get(f"/v1/workloads/{path}").status_code == 422
        assert client.delete(f"/v1/workloads/{path}").status_code == 422
