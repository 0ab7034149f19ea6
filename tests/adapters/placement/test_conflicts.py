"""Version conflicts with a concurrent writer on Postgres: only the requests on the node that
moved are planned again, from its fresh state, and no node is ever overbooked."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.placement import PlacementService, reservation
from fleetledger.domain.nodes import ReservePod
from fleetledger.domain.placement import plan
from fleetledger.eventstore import AppendResult, EventStore, StreamAppend, open_store

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload


class _WriterFirst:
    """The store, with another process's write landing just before this one's next appends:
    a concurrent writer, deterministically interleaved."""

    def __init__(self, store: EventStore, before: list[object]) -> None:
        self._store = store
        self._before = before

    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        while self._before:
            action = self._before.pop(0)
            assert callable(action)
            action()
        return self._store.append_many(appends)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


@pytest.fixture
def other_store(postgres_url: str) -> Iterator[EventStore]:
    with contextlib.closing(open_store(postgres_url)) as store:
        yield store


def _reserve_elsewhere(store: EventStore, node: str, pod: str, cpu: int) -> None:
    """Another controller (its own connection and node service) reserves on ``node``."""
    service = node_service(store)
    command = reservation(workload(pod, cpu), at=T0)
    service.execute(node, lambda at: [ReservePod(command.spec, at=at)], cause="elsewhere")


class TestConflicts:
    def test_only_the_conflicting_node_is_planned_again(
        self, postgres_store: EventStore, other_store: EventStore
    ) -> None:
        """A write to one node between snapshot and commit moves only that node's requests,
        onto fresh capacity; the other nodes' reservations commit as planned."""
        clock = ManualClock(T0)
        node_svc = node_service(postgres_store, clock)
        for name in ("cpu-000", "cpu-001", "cpu-002"):
            join(node_svc, name)
        batch = [workload("a", 3000), workload("b", 1000)]
        interleaved: list[object] = []
        service = PlacementService(
            _WriterFirst(postgres_store, interleaved),  # type: ignore[arg-type]
            node_svc,
            [CPU_POOL],
            clock=clock,
            machines=FakeMachines(),
        )
        # Best fit puts both on one node; another controller then takes half of that node.
        [target] = set(plan(batch, service.snapshot()[0], [CPU_POOL]).placed.values())
        interleaved.append(lambda: _reserve_elsewhere(other_store, target, "intruder", 2000))
        report = service.place_batch(batch)
        assert (report.conflicts, report.appends, report.snapshot_reads) == (1, 2, 2)
        assert (report.placed, report.workers_requested) == (2, ())
        moved_to = service.status("a").node
        assert moved_to not in (None, target)
        assert service.status("b").node == moved_to  # the tightest fit after a, not the target
        node_svc.stream(target).load()
        fresh = node_svc.stream(target).state
        assert set(fresh.other_pods) == {"intruder"}
        assert fresh.cpu.reserved <= fresh.cpu.total

    def test_retries_are_bounded(self, postgres_store: EventStore, other_store: EventStore) -> None:
        """A node that keeps moving exhausts the retries; its requests go back to the queue."""
        clock = ManualClock(T0)
        node_svc = node_service(postgres_store, clock)
        join(node_svc, "cpu-000")
        writes: list[object] = [
            (lambda i=i: _reserve_elsewhere(other_store, "cpu-000", f"x{i}", 1)) for i in range(3)
        ]
        requeued: list[str] = []
        service = PlacementService(
            _MovingAlways(postgres_store, writes),  # type: ignore[arg-type]
            node_svc,
            [CPU_POOL],
            clock=clock,
            machines=FakeMachines(),
            max_conflict_retries=2,
        )
        service.requeue = lambda requests: requeued.extend(r.id for r in requests)
        report = service.place_batch([workload("a", 1000)])
        assert (report.conflicts, report.appends, report.requeued) == (3, 3, 1)
        assert requeued == ["a"]
        assert service.status("a").state == "queued"

    def test_concurrent_placers_never_overbook(
        self, postgres_store: EventStore, other_store: EventStore
    ) -> None:
        """Two placers on two connections place at once on the same nodes: every node ends
        within its capacity and every workload has exactly one answer."""
        names = [f"cpu-{i:03}" for i in range(4)]
        setup = node_service(postgres_store)
        for name in names:
            join(setup, name)
        services = []
        for store in (postgres_store, other_store):
            svc = node_service(store)
            for name in names:
                svc.stream(name)
            services.append(PlacementService(store, svc, [CPU_POOL], clock=ManualClock(T0)))
        errors: list[BaseException] = []

        def run(index: int) -> None:
            try:
                for batch in range(4):
                    service = services[index]
                    service.place_batch([workload(f"p{index}-{batch}-{i}", 500) for i in range(5)])
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        check = node_service(postgres_store)
        held = 0
        for name in names:
            state = check.stream(name).state
            assert state.other_raw_cpu_milli <= state.cpu.total
            held += len(state.other_pods)
        statuses = [
            services[i].status(f"p{i}-{b}-{k}").state
            for i in range(2)
            for b in range(4)
            for k in range(5)
        ]
        assert held == statuses.count("placed") == 32  # 4 nodes × 8 of 500 milli-CPU
        assert statuses.count("placed") + statuses.count("pending-provisioning") == 40


class _MovingAlways(_WriterFirst):
    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        if self._before:
            action = self._before.pop(0)
            assert callable(action)
            action()
        return self._store.append_many(appends)
