"""``GET /metrics`` on the API and on the extender: every promised family, from the log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.extender.server import create_extender_app
from fleetledger.adapters.http import create_app
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.metrics.http import metrics_registry, runtime_metrics
from fleetledger.adapters.simulator import run_scenario
from fleetledger.adapters.simulator.subnet import run_subnet_scenario
from fleetledger.adapters.testbeds import TestbedsService
from fleetledger.domain.machines import ERROR_CODES
from fleetledger.eventstore import EventStore, open_store
from fleetledger.projections.nodes import fold_nodes
from fleetledger.projections.subnets import dump_at

from .world import EXTRA_NODES, families, total, value

TOKEN = "metrics-test-token-0123456789"

PROMISED = {
    # VM batching: batch sizes and seal reasons, cloud calls and errors by code, throttling.
    "fleetledger_vm_requests": "counter",
    "fleetledger_vm_batches_sealed": "counter",
    "fleetledger_vm_batch_size": "histogram",
    "fleetledger_vm_batch_duration_seconds": "histogram",
    "fleetledger_cloud_calls": "counter",
    "fleetledger_vm_machines": "counter",
    "fleetledger_vm_machine_errors": "counter",
    "fleetledger_cloud_throttle_wait_seconds": "histogram",
    # Placement: batch latency; workers requested (unnecessary ones: see test_live).
    "fleetledger_placement_workloads_submitted": "counter",
    "fleetledger_placement_decisions": "counter",
    "fleetledger_placement_batch_latency_seconds": "histogram",
    "fleetledger_placement_workers_requested": "counter",
    # Node accounting per node.
    "fleetledger_nodes": "gauge",
    "fleetledger_node_cpu_reservable_cores": "gauge",
    "fleetledger_node_cpu_reserved_cores": "gauge",
    "fleetledger_node_cpu_buffer_cores": "gauge",
    "fleetledger_node_cpu_pressure_cores": "gauge",
    "fleetledger_node_memory_reservable_bytes": "gauge",
    "fleetledger_node_memory_reserved_bytes": "gauge",
    "fleetledger_node_memory_buffer_bytes": "gauge",
    "fleetledger_node_memory_pressure_bytes": "gauge",
    # Subnets (values: TestSubnets), testbeds, the log, leadership.
    "fleetledger_subnet_utilization_ratio": "gauge",
    "fleetledger_subnet_batch_size_ips": "gauge",
    "fleetledger_subnet_batch_size_changes": "counter",
    "fleetledger_testbed_slots": "gauge",
    "fleetledger_log_append_duration_seconds": "histogram",
    "fleetledger_log_head_position": "gauge",
    "fleetledger_subscription_lag_events": "gauge",
    "fleetledger_leader_term": "gauge",
    "fleetledger_leader_elections": "counter",
    "fleetledger_leader_role": "gauge",
}


def _count(store: EventStore, kind: str) -> int:
    counted, after = 0, 0
    while page := store.read_all(after=after, limit=1000, types=[kind]):
        counted += len(page)
        after = page[-1].global_position
    return counted


def _data(store: EventStore, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = 0
    while page := store.read_all(after=after, limit=1000, types=[kind]):
        found.extend(dict(r.data) for r in page)
        after = page[-1].global_position
    return found


@contextlib.contextmanager
def api(
    store: EventStore,
    *,
    api_tokens: list[str] | None = None,
    metrics: CollectorRegistry | None = None,
) -> Iterator[TestClient]:
    runtime = MachinesRuntime(store, FakeCloud(), clock=SystemClock())
    yield TestClient(create_app(runtime, api_tokens=api_tokens, metrics=metrics))


@pytest.fixture(scope="module")
def scraped(world_url: str) -> Iterator[tuple[str, EventStore]]:
    """The API's ``/metrics`` over the world log, scraped once, with the log."""
    with contextlib.closing(open_store(world_url)) as store, api(store) as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        yield response.text, store


class TestApiMetrics:
    def test_every_promised_family_is_served(self, scraped: tuple[str, EventStore]) -> None:
        """Each family the metrics promise is there, with its type."""
        text, _ = scraped
        found = {name: kind for name, kind in _types(text).items() if name in PROMISED}
        assert found == PROMISED

    def test_it_is_prometheus_text(self, world: EventStore) -> None:
        """The exposition's content type is Prometheus' text format 0.0.4."""
        with api(world) as client:
            response = client.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")

    def test_vm_batching_is_counted_from_the_log(self, scraped: tuple[str, EventStore]) -> None:
        """Requests, seals by reason, batch sizes, calls, outcomes and errors by code equal what
        the log holds."""
        text, store = scraped
        sealed = _data(store, "vm.BatchSealed")
        failed = _data(store, "vm.MachineFailed")
        dispatched = _data(store, "vm.BatchDispatched")
        assert value(text, "fleetledger_vm_requests_total") == _count(store, "vm.MachineRequested")
        for reason in {str(s["reason"]) for s in sealed}:
            expected = sum(1 for s in sealed if s["reason"] == reason)
            assert value(text, "fleetledger_vm_batches_sealed_total", reason=reason) == expected
        assert value(text, "fleetledger_vm_batch_size_count") == len(sealed)
        assert value(text, "fleetledger_vm_batch_size_sum") == sum(
            len(s["request_ids"]) for s in sealed
        )
        assert total(text, "fleetledger_cloud_calls_total") == sum(
            len(d["calls"]) for d in dispatched
        )
        assert value(text, "fleetledger_vm_machines_total", outcome="failed") == len(failed)
        assert value(text, "fleetledger_vm_machines_total", outcome="created") == _count(
            store, "vm.MachineCreated"
        )
        for code in ERROR_CODES:
            expected = sum(1 for f in failed if f["code"] == code)
            assert value(text, "fleetledger_vm_machine_errors_total", code=code) == expected
        assert failed, "the burst injects cloud faults: some machines fail"

    def test_throttling_waits_are_observed(self, scraped: tuple[str, EventStore]) -> None:
        """Each recorded throttle is one observation of its wait, by reason."""
        text, store = scraped
        throttled = _data(store, "vm.BatchThrottled")
        assert throttled, "the burst injects throttling"
        assert total(text, "fleetledger_cloud_throttle_wait_seconds_count") == len(throttled)
        assert total(text, "fleetledger_cloud_throttle_wait_seconds_sum") == pytest.approx(
            sum(float(t["wait_seconds"]) for t in throttled)
        )

    def test_placement_decisions_and_latency(self, scraped: tuple[str, EventStore]) -> None:
        """Every submitted workload is decided once (placed or waiting for a worker), each
        decision observed in the batch latency; each new worker counted once, under its pool."""
        text, store = scraped
        submitted = _count(store, "placement.WorkloadSubmitted")
        waiting = _data(store, "placement.WorkloadWaiting")
        assert value(text, "fleetledger_placement_workloads_submitted_total") == submitted
        assert total(text, "fleetledger_placement_decisions_total") == submitted
        assert value(text, "fleetledger_placement_decisions_total", outcome="waiting") == len(
            waiting
        )
        assert value(text, "fleetledger_placement_batch_latency_seconds_count") == submitted
        assert value(text, "fleetledger_placement_workers_requested_total", pool="cpu") == len(
            {w["worker"] for w in waiting}
        )

    def test_nodes_are_capped_with_the_rest_folded(self, scraped: tuple[str, EventStore]) -> None:
        """Every present node is counted; 100 have series of their own and the others are
        summed into ``_other``, so the sum over the series is the fleet's."""
        text, store = scraped
        states = fold_nodes(store, store.head())
        present = [s for s in states.values() if s.present]
        assert len(present) > 100 + EXTRA_NODES // 2
        assert value(text, "fleetledger_nodes") == len(present)
        series = [s for s in families(text)["fleetledger_node_cpu_reserved_cores"]]
        assert len(series) == 101
        assert "_other" in {s.labels["node"] for s in series}
        assert sum(s.value for s in series) == pytest.approx(
            sum(s.cpu.reserved for s in present) / 1000
        )

    def test_testbed_slots_by_state(self, scraped: tuple[str, EventStore]) -> None:
        """The testbed's slots, every one in exactly one state."""
        text, _ = scraped
        slots = families(text)["fleetledger_testbed_slots"]
        assert {s.labels["state"] for s in slots} == {
            "creating",
            "free",
            "reserved",
            "occupied",
            "error",
        }
        assert sum(s.value for s in slots) == 4  # two nodes of two slots
        assert value(text, "fleetledger_testbed_slots", testbed="bed", state="free") == 4

    def test_log_and_leadership(self, scraped: tuple[str, EventStore]) -> None:
        """The head, no lag once scraped, the log's latest term, and exactly one role."""
        text, store = scraped
        elected = _data(store, "leadership.LeaderElected")
        assert value(text, "fleetledger_log_head_position") == store.head()
        assert value(text, "fleetledger_subscription_lag_events", subscriber="metrics") == 0
        assert value(text, "fleetledger_leader_term") == max(int(e["term"]) for e in elected)
        assert value(text, "fleetledger_leader_elections_total") == len(elected)
        assert total(text, "fleetledger_leader_role") == 1

    def test_append_latency_is_measured(self, scraped: tuple[str, EventStore]) -> None:
        """The runtimes' appends in this process (the scenarios') were timed."""
        text, _ = scraped
        assert value(text, "fleetledger_log_append_duration_seconds_count") > 0

    def test_what_another_process_appends_is_counted(self, sqlite_url: str) -> None:
        """A scrape folds what the log gained since the last one, whoever appended it."""
        with contextlib.closing(open_store(sqlite_url)) as store, api(store) as client:
            before = client.get("/metrics").text
            run_scenario("burst-vms", seed=1, url=sqlite_url)
            after = client.get("/metrics").text
        assert value(before, "fleetledger_vm_requests_total") == 0
        assert value(after, "fleetledger_vm_requests_total") == 276
        assert value(after, "fleetledger_subscription_lag_events", subscriber="metrics") == 0

    def test_no_token_is_needed(self, world: EventStore) -> None:
        """Scrapers call without credentials, as for the probes; the API still needs one."""
        with api(world, api_tokens=[TOKEN]) as client:
            assert client.get("/metrics").status_code == 200
            assert client.get("/v1/machines/x").status_code == 401

    def test_it_is_not_in_the_openapi_document(self, world: EventStore) -> None:
        """The route is not JSON: the document leaves it out."""
        with api(world) as client:
            assert "/metrics" not in client.get("/openapi.json").json()["paths"]


class TestSubnets:
    def test_utilization_and_batch_size(self, sqlite_url: str) -> None:
        """The subnet's capacity, IPs used, utilization and batch size are its state's."""
        run_subnet_scenario(1, nodes=8, url=sqlite_url)
        with contextlib.closing(open_store(sqlite_url)) as store, api(store) as client:
            text = client.get("/metrics").text
            subnets = dump_at(store)["subnets"]
            changes = _count(store, "ipam.BatchSizeChanged")
        assert isinstance(subnets, dict)
        assert changes > 0, "the demand curve changes the batch size"
        (subnet_id, subnet), *rest = subnets.items()
        assert rest == []
        assert (
            value(text, "fleetledger_subnet_capacity_ips", subnet=subnet_id) == subnet["capacity"]
        )
        assert value(text, "fleetledger_subnet_used_ips", subnet=subnet_id) == subnet["used"]
        assert value(text, "fleetledger_subnet_utilization_ratio", subnet=subnet_id) == (
            pytest.approx(subnet["utilization"])
        )
        assert (
            value(text, "fleetledger_subnet_batch_size_ips", subnet=subnet_id)
            == subnet["batch_size"]
        )
        assert total(text, "fleetledger_subnet_batch_size_changes_total") == changes


class TestExtender:
    def test_the_extender_serves_the_log_metrics(self, world: EventStore) -> None:
        """``/metrics`` on the extender's listener, in the same text format, beside its
        routes."""
        app = create_extender_app(TestbedsService(world, clock=SystemClock()))
        with TestClient(app) as client:
            response = client.get("/metrics")
            health = client.get("/healthz")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert value(response.text, "fleetledger_testbed_slots", testbed="bed", state="free") == 4
        assert health.json() == {"status": "ok"}

    def test_it_needs_no_token_but_the_routes_do(self, world: EventStore) -> None:
        """With extender tokens, ``/metrics`` stays open like the probes; ``/filter`` does not."""
        app = create_extender_app(TestbedsService(world, clock=SystemClock()), tokens=[TOKEN])
        with TestClient(app) as client:
            assert client.get("/metrics").status_code == 200
            assert client.post("/filter", content=b"{}").status_code == 401

    def test_only_get_is_answered(self, world: EventStore) -> None:
        """Any other method is 405 naming GET."""
        app = create_extender_app(TestbedsService(world, clock=SystemClock()))
        with TestClient(app) as client:
            response = client.post("/metrics")
        assert (response.status_code, response.headers["allow"]) == (405, "GET")

    def test_serve_shares_one_registry(self, world: EventStore) -> None:
        """Given the API's registry, the extender serves the very same collectors (one fold
        of the log per process)."""
        registry = runtime_metrics(MachinesRuntime(world, FakeCloud(), clock=SystemClock()))
        extender = TestClient(
            create_extender_app(TestbedsService(world, clock=SystemClock()), metrics=registry)
        )
        with api(world, metrics=registry) as client:
            first = client.get("/metrics").text
        second = extender.get("/metrics").text
        folded = "fleetledger_metrics_events_folded_total"
        # The second scrape folded nothing new: it read the same collector the first filled.
        assert value(second, folded) == value(first, folded) > 0
        assert "fleetledger_leader_role" in second


def test_a_registry_without_live_sources_has_no_role(world: EventStore) -> None:
    """The extender on its own knows no leadership: no role is claimed."""
    registry: CollectorRegistry = metrics_registry(world)
    names = {m.name for m in registry.collect()}
    assert "fleetledger_leader_role" not in names
    assert "fleetledger_vm_requests" in names


def _types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}
