"""``GET /v1/subnets/{id}``: the subnet, its batch with the inputs of its last change, its pools."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.http.subnets import subnets_router
from fleetledger.adapters.ipam import IpamRuntime
from fleetledger.eventstore import EventStore
from tests.adapters.ipam.support import EPOCH, SUBNET, allocator


@pytest.fixture
def runtime(store: EventStore) -> Iterator[IpamRuntime]:
    ipam = IpamRuntime(store, allocator(), clock=ManualClock(EPOCH), threads=False).start()
    yield ipam
    ipam.stop()


def client_of(runtime: IpamRuntime) -> TestClient:
    app = FastAPI()
    app.include_router(subnets_router(runtime))
    return TestClient(app)


class TestGetSubnet:
    def test_a_subnet_with_its_pools(self, runtime: IpamRuntime) -> None:
        """Capacity, nodes, IPs used, batch and flag, and each node's pool, as of the latest
        command (the read model catches up before answering). A /24, so that two nodes move
        the batch below the 250 IPs a node may hold (a /22's stays clamped there)."""
        runtime.service.create(SUBNET, 256)
        runtime.service.join(SUBNET, ["node-a", "node-b"])
        runtime.service.report_demand(SUBNET, "node-a", 20)
        runtime.step()

        response = client_of(runtime).get(f"/v1/subnets/{SUBNET}")

        body = response.json()
        assert response.status_code == 200
        assert body["capacity"] == 256 and body["node_count"] == 2
        assert body["exhausted"] is False
        assert list(body["nodes"]) == ["node-a", "node-b"]
        assert body["nodes"]["node-a"]["demand"] == 20
        assert body["used"] == sum(len(p["held"]) for p in body["nodes"].values()) > 0
        assert body["last_batch_change"]["batch_size"] == body["batch_size"]

    def test_a_subnet_just_created_has_no_batch_change_yet(self, runtime: IpamRuntime) -> None:
        """The first batch comes with the subnet; ``last_batch_change`` is null until it moves."""
        runtime.service.create(SUBNET, 1024)

        body = client_of(runtime).get(f"/v1/subnets/{SUBNET}").json()

        assert body["last_batch_change"] is None and body["nodes"] == {}

    def test_an_unknown_subnet_is_404(self, runtime: IpamRuntime) -> None:
        """With a detail saying so."""
        response = client_of(runtime).get("/v1/subnets/nowhere")

        assert response.status_code == 404
        assert "nowhere" in response.json()["detail"]

    def test_a_stopped_runtime_is_503(self, runtime: IpamRuntime) -> None:
        """Not running: try again shortly (Retry-After)."""
        runtime.stop()

        response = client_of(runtime).get(f"/v1/subnets/{SUBNET}")

        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
