"""POST /v1/agent/resources and GET /v1/dumpstate over a node runtime."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fleetledger.adapters.cli import main
from fleetledger.adapters.cluster import FakeCluster
from fleetledger.adapters.http.agents import agents_router
from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.eventstore import EventStore
from fleetledger.projections.dumpstate import dumpstate_at
from fleetledger.projections.nodes import dump_json
from tests.adapters.nodes.support import cluster, manual_runtime, node, vm_pod


@pytest.fixture
def runtime(store: EventStore) -> NodesRuntime:
    fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1"),))
    return manual_runtime(store, fleet)


@pytest.fixture
def client(runtime: NodesRuntime) -> TestClient:
    app = FastAPI()
    app.include_router(agents_router(runtime))
    return TestClient(app)


def _ask(client: TestClient, **fields: object) -> tuple[int, dict[str, object]]:
    body = {"pod": "vm", "protocol_version": 3, "cpu": 2.5, "memory": 3} | fields
    response = client.post("/v1/agent/resources", json=body)
    return response.status_code, response.json()


class TestAgentResources:
    def test_a_request_is_answered_with_the_permit_and_compute_unit(
        self, client: TestClient
    ) -> None:
        """200: the permit (CPUs and milli-CPU, memory slots) and the node's compute unit."""
        code, body = _ask(client, metrics={"load_average_1min": 0.5})
        assert code == 200
        assert body["permit"] == {"cpu": 2.5, "cpu_milli": 2500, "memory": 3}
        assert body["compute_unit"] == {"cpu": 0.25, "cpu_milli": 250, "memory": 1}
        assert body["node"] == "n1"

    def test_an_unsupported_protocol_version_is_400(self, client: TestClient) -> None:
        """A protocol version the controller does not speak is a 400 naming the supported ones."""
        code, body = _ask(client, protocol_version=99)
        assert code == 400
        assert "1, 2, 3" in str(body["detail"])

    def test_fractional_cpu_on_an_old_protocol_is_400(self, client: TestClient) -> None:
        """Protocol 1 scales whole CPUs only: 2.5 CPUs is a 400."""
        code, body = _ask(client, protocol_version=1)
        assert code == 400
        assert "whole CPUs" in str(body["detail"])

    def test_an_unknown_pod_is_404(self, client: TestClient) -> None:
        """A pod no node accounts is a 404."""
        code, _ = _ask(client, pod="nobody")
        assert code == 404

    def test_a_migrating_pod_asking_for_something_else_is_409(
        self, client: TestClient, runtime: NodesRuntime
    ) -> None:
        """Once its migration started, any amount but the pod's reservation is a 409."""
        fleet = runtime.cluster
        assert isinstance(fleet, FakeCluster)
        fleet.create_pod(vm_pod("hog", "n1", cpu=(1000, 9000, 9000), memory=(1, 1, 1)))
        runtime.step()
        code, _ = _ask(client, cpu=4, memory=4)
        assert code == 200
        state = runtime.service.stream("n1").state
        [migrating] = [p for p in state.vm_pods.values() if p.migrating]
        other = migrating.cpu.min if migrating.cpu.reserved != migrating.cpu.min else 2000
        code, body = _ask(client, pod=migrating.name, cpu=other / 1000, memory=1)
        assert code == 409
        assert "migrating" in str(body["detail"])

    def test_amounts_outside_the_vm_bounds_are_400(self, client: TestClient) -> None:
        """Asking beyond the VM's max is invalid, not a grant."""
        code, _ = _ask(client, cpu=64)
        assert code == 400

    def test_a_malformed_body_is_422(self, client: TestClient) -> None:
        """A body missing fields does not validate."""
        response = client.post("/v1/agent/resources", json={"pod": "vm"})
        assert response.status_code == 422


class TestDumpstate:
    def test_the_live_dump_is_the_replayed_dump(
        self, client: TestClient, store: EventStore
    ) -> None:
        """GET /v1/dumpstate and a replay of the log to its position are the same bytes."""
        _ask(client)
        response = client.get("/v1/dumpstate")
        assert response.status_code == 200
        position = json.loads(response.content)["position"]
        assert response.content.decode() == dump_json(dumpstate_at(store, position))

    def test_as_of_replays_an_earlier_position(self, client: TestClient, store: EventStore) -> None:
        """?as_of=P shows the fleet at position P."""
        _ask(client, cpu=3)
        earlier = store.head()
        _ask(client, cpu=1)
        body = client.get("/v1/dumpstate", params={"as_of": earlier}).json()
        assert body["position"] == earlier
        assert body["nodes"]["n1"]["pods"]["vm"]["vm"]["cpu"]["reserved"] == 3000

    def test_as_of_beyond_the_log_is_400(self, client: TestClient, store: EventStore) -> None:
        """A position the log has not reached is a 400."""
        response = client.get("/v1/dumpstate", params={"as_of": store.head() + 10})
        assert response.status_code == 400


class TestDumpstateCommand:
    def test_the_command_prints_what_the_endpoint_serves(
        self,
        client: TestClient,
        store: EventStore,
        store_url: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """``fleetledger dumpstate --as-of P`` prints the same bytes as the live dump of P,
        subnets included."""
        live = client.get("/v1/dumpstate").content.decode()
        position = json.loads(live)["position"]

        assert main(["dumpstate", "--url", store_url, "--as-of", str(position)]) == 0

        printed = capsys.readouterr().out.strip()
        assert printed == live
        assert {"position", "config", "nodes", "migration_queue", "subnets"} <= set(
            json.loads(printed)
        )


class TestEdgeRule:
    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            ('"cpu": Infinity', "cpu"),
            ('"cpu": 1e308', "cpu"),
            ('"cpu": NaN', "cpu"),
            ('"cpu": 2, "metrics": {"load_average_1min": Infinity}', "load_average_1min"),
            ('"cpu": 2, "metrics": {"load_average_1min": 1e300}', "load_average_1min"),
            ('"cpu": 2, "memory": 18446744073709551616', "memory"),
        ],
    )
    def test_numbers_out_of_range_are_422_naming_the_field(
        self, client: TestClient, store: EventStore, fields: str, field: str
    ) -> None:
        """Non-finite or huge amounts are the request's fault: 422 at the field, nothing
        appended (they once overflowed into a 500, or an unencodable event into a 503)."""
        head = store.head()
        body = '{"pod": "vm", "protocol_version": 3, "memory": 3, ' + fields + "}"
        body = body.replace('"memory": 3, "cpu": 2, "memory"', '"cpu": 2, "memory"')

        response = client.post(
            "/v1/agent/resources", content=body, headers={"content-type": "application/json"}
        )

        assert response.status_code == 422
        assert field in [str(part) for error in response.json()["detail"] for part in error["loc"]]
        assert store.head() == head

    @pytest.mark.parametrize("pod", ["vm\x00", "vm\x1b", "VM/1", "x" * 254])
    def test_a_pod_name_that_is_no_kubernetes_name_is_422(
        self, client: TestClient, pod: str
    ) -> None:
        response = client.post(
            "/v1/agent/resources",
            json={"pod": pod, "protocol_version": 3, "cpu": 1, "memory": 1},
        )
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"][-1] == "pod"
