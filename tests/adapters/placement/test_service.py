"""PlacementService on both backends: one snapshot and one append per batch, overflow into
machine requests, joined workers first, release through the node's stream."""

from __future__ import annotations

import dataclasses

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.nodes import NodeService
from fleetledger.adapters.placement import (
    PlacementService,
    UnknownWorkload,
    WorkloadStatus,
    pool_by_prefix,
)
from fleetledger.domain import nodes
from fleetledger.eventstore import EventStore
from tests.counting_store import CountingStore

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload


@pytest.fixture
def machines() -> FakeMachines:
    return FakeMachines()


def service_on(store: EventStore, machines: FakeMachines, workers: int) -> PlacementService:
    clock = ManualClock(T0)
    node_svc = node_service(store, clock)
    for i in range(workers):
        join(node_svc, f"cpu-{i:03}")
    return PlacementService(store, node_svc, [CPU_POOL], clock=clock, machines=machines)


class TestBatch:
    def test_a_burst_that_fits_is_one_snapshot_and_one_append(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """100 requests on 20 workers with room: all placed, no worker requested, one snapshot
        read and one append carrying one event per touched node stream, which reserves every
        workload placed on that node."""
        service = service_on(store, machines, 20)
        before = store.read_all(after=0, limit=10_000)
        report = service.place_batch([workload(f"w{i}", 500) for i in range(100)])
        assert (report.placed, report.workers_requested, machines.requests) == (100, (), [])
        assert (report.snapshot_reads, report.appends, report.conflicts) == (1, 1, 0)
        after = store.read_all(after=before[-1].global_position, limit=10_000)
        assert {r.type for r in after} == {"nodes.OtherPodsReserved"}
        assert after[-1].global_position - after[0].global_position == len(after) - 1
        placed_on: dict[str, set[str]] = {}
        for i in range(100):
            placed_on.setdefault(nodes.stream_id(str(service.status(f"w{i}").node)), set()).add(
                f"w{i}"
            )
        assert sorted(r.stream_id for r in after) == sorted(placed_on)
        pods = {r.stream_id: {p["pod"] for p in r.data["pods"]} for r in after}
        assert pods == placed_on

    def test_placements_are_in_the_node_streams(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """A placed workload is a pod of its node's stream, found again after a restart."""
        service = service_on(store, machines, 2)
        service.place_batch([workload("w1", 3000)])
        node = service.status("w1").node
        assert node is not None
        restarted = node_service(store)
        for name in restarted.logged_nodes():
            restarted.stream(name)
        fresh = PlacementService(
            store, restarted, [CPU_POOL], clock=ManualClock(T0), machines=machines
        )
        assert fresh.status("w1") == WorkloadStatus("w1", "placed", node=node)

    def test_overflow_becomes_machine_requests_with_the_pool_template(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """What fits nowhere waits for the minimum of new workers, requested from the Grouper."""
        service = service_on(store, machines, 1)
        report = service.place_batch([workload(f"w{i}", 3000) for i in range(4)])
        assert report.placed == 1
        assert len(report.workers_requested) == 3
        assert [r.machine_name for r in machines.requests] == list(report.workers_requested)
        assert {r.template for r in machines.requests} == {CPU_POOL.template}
        waiting = [service.status(f"w{i}") for i in range(4)]
        assert sorted(s.state for s in waiting) == ["pending-provisioning"] * 3 + ["placed"]

    def test_overflow_is_packed_exactly_and_reports_its_gap(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """Six requests that first-fit decreasing would spread over three workers are asked
        two, and the batch reports the plan proven minimal; without search steps the service
        falls back to the heuristic's three and reports a gap of one."""
        sizes = [2000, 1600, 1600, 1200, 800, 800]
        service = service_on(store, machines, 0)
        report = service.place_batch([workload(f"w{i}", cpu) for i, cpu in enumerate(sizes)])
        assert (len(report.workers_requested), report.optimality_gap) == (2, 0)
        clock = ManualClock(T0)
        heuristic = PlacementService(
            store, node_service(store, clock), [CPU_POOL], clock=clock, search_steps=0
        )
        report = heuristic.place_batch([workload(f"h{i}", cpu) for i, cpu in enumerate(sizes)])
        assert (len(report.workers_requested), report.optimality_gap) == (3, 1)

    def test_a_bad_search_budget_is_refused(self, store: EventStore) -> None:
        """The step budget is checked once, at construction."""
        with pytest.raises(ValueError, match="search_steps"):
            PlacementService(
                store, node_service(store), [CPU_POOL], clock=ManualClock(T0), search_steps=-5
            )

    def test_capacity_on_its_way_is_counted(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """A second batch fills the worker already requested before asking for another."""
        service = service_on(store, machines, 0)
        service.place_batch([workload("a", 2000)])
        report = service.place_batch([workload("b", 2000)])
        assert report.workers_requested == ()
        assert service.status("b").worker == service.status("a").worker

    def test_a_joined_worker_takes_its_waiting_workloads_first(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """Once the requested node joins, the next batch places its workloads on it, before the
        batch's own requests."""
        service = service_on(store, machines, 0)
        service.place_batch([workload("a", 4000)])
        worker = service.status("a").worker
        assert worker is not None
        nodes = service.nodes_service
        assert isinstance(nodes, NodeService)
        join(nodes, worker)
        service.place_batch([workload("b", 4000, priority=9)])
        assert service.status("a").node == worker
        assert service.status("b").state == "pending-provisioning"
        assert [p.name for p in service.pending_workers()] == [service.status("b").worker]

    def test_never_fits_is_rejected_with_the_reason(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """A request larger than any worker is rejected at once, not left pending."""
        service = service_on(store, machines, 1)
        report = service.place_batch([workload("huge", 64_000)])
        status = service.status("huge")
        assert (report.rejected, status.state, machines.requests) == (1, "rejected", [])
        assert status.reason is not None and "more than any worker" in status.reason

    def test_draining_workers_are_left_alone(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """A worker marked draining takes no new workload."""
        service = service_on(store, machines, 2)
        service.set_worker_status("cpu-000", "draining")
        service.place_batch([workload(f"w{i}") for i in range(3)])
        assert {service.status(f"w{i}").node for i in range(3)} == {"cpu-001"}


class TestRelease:
    def test_release_returns_capacity_through_the_node_stream(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """Releasing a placed workload appends PodDeleted to its node, and the room is reused."""
        service = service_on(store, machines, 1)
        service.place_batch([workload("a", 4000)])
        service.release("a")
        [last] = store.read_stream(nodes.stream_id("cpu-000"), backwards=True, limit=1)
        assert last.type == "nodes.PodDeleted"
        assert service.status("a").state == "released"
        report = service.place_batch([workload("b", 4000)])
        assert (report.placed, report.workers_requested) == (1, ())

    def test_releasing_a_waiting_workload_frees_the_worker_on_its_way(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """A workload waiting for a worker gives its share back to later overflow."""
        service = service_on(store, machines, 0)
        service.place_batch([workload("a", 4000)])
        service.release("a")
        report = service.place_batch([workload("b", 4000)])
        assert report.workers_requested == ()

    def test_release_each_releases_many_nodes_workloads_in_one_append(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """Placed workloads on three nodes and one waiting for a worker: the placed ones leave
        in one append, their nodes' PodDeleted together, the waiting one gives its share of the
        worker back (it has nothing in the log to release: it was never submitted through the
        log); an unknown id is reported, not raised, and stops nothing."""
        counting = CountingStore(store)
        service = service_on(counting, machines, 3)  # type: ignore[arg-type]
        service.place_batch([workload(f"w{i}", 2000) for i in range(6)])
        service.set_worker_status("cpu-000", "draining")
        service.set_worker_status("cpu-001", "draining")
        service.set_worker_status("cpu-002", "draining")
        service.place_batch([workload("waiting", 3000)])
        assert service.status("waiting").state == "pending-provisioning"
        head, commits = store.head(), counting.commits

        errors = service.release_each([f"w{i}" for i in range(6)] + ["waiting", "nope"])

        assert list(errors) == ["nope"] and isinstance(errors["nope"], UnknownWorkload)
        assert counting.commits - commits == 1
        released = store.read_all(after=head, limit=100)
        deleted = [r for r in released if r.type == "nodes.PodDeleted"]
        assert sorted(r.data["pod"] for r in deleted) == [f"w{i}" for i in range(6)]
        assert {r.stream_id for r in deleted} == {nodes.stream_id(f"cpu-{i:03}") for i in range(3)}
        for workload_id in [*(f"w{i}" for i in range(6)), "waiting"]:
            assert service.status(workload_id).state == "released"

    def test_a_release_after_a_batch_reads_no_node_stream(
        self, store: EventStore, machines: FakeMachines
    ) -> None:
        """The batch's reservations are handed to the hosted node streams as committed, so a
        release decides on them without reading the node back, and hands its PodDeleted on
        the same way: the stream then equals one read from the log."""
        counting = CountingStore(store)
        service = service_on(counting, machines, 1)  # type: ignore[arg-type]
        service.place_batch([workload("a", 2000), workload("b", 2000)])
        node = service.status("a").node
        assert node is not None
        reads = counting.stream_reads

        service.release_each(["a"])

        assert counting.stream_reads == reads
        hosted = service.nodes_service.stream(node)
        fresh = node_service(store).stream(node)
        assert (hosted.version, hosted.state) == (fresh.version, fresh.state)
        assert "a" not in hosted.state.other_pods and "b" in hosted.state.other_pods

    def test_unknown(self, store: EventStore, machines: FakeMachines) -> None:
        """An id never submitted is UnknownWorkload."""
        service = service_on(store, machines, 0)
        with pytest.raises(UnknownWorkload):
            service.status("nope")


class TestConfig:
    def test_pool_by_prefix_takes_the_longest_pool_name(self) -> None:
        """Node names map to the longest pool name they start with."""
        pool_of = pool_by_prefix([CPU_POOL, dataclasses.replace(CPU_POOL, name="cpu-big")])
        assert (pool_of("cpu-big-1"), pool_of("cpu-1"), pool_of("gpu-1")) == (
            "cpu-big",
            "cpu",
            None,
        )
