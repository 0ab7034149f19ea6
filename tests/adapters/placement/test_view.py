"""The snapshot kept between batches: a batch reads only the nodes that changed since the last,
and still plans on every change the node service folded."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.nodes import NodeService
from fleetledger.adapters.nodes.port import NodeStream
from fleetledger.adapters.placement import PlacementService, reservation
from fleetledger.domain.nodes import NodeState, ReservePod
from fleetledger.eventstore import EventStore

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload


class _Counted:
    """The node service, counting what placement reads of it."""

    def __init__(self, service: NodeService) -> None:
        self.service = service
        self.hosted_calls = 0
        self.streams_read: list[str] = []

    def stream(self, node: str) -> NodeStream:
        self.streams_read.append(node)
        return self.service.stream(node)

    def logged_nodes(self) -> list[str]:
        return self.service.logged_nodes()

    def hosted(self) -> dict[str, NodeState]:
        self.hosted_calls += 1
        return self.service.hosted()

    def node_of(self, pod: str) -> str | None:
        return self.service.node_of(pod)


class _Watched(_Counted):
    def watch(self, observer: Callable[[str], None]) -> None:
        self.service.watch(observer)


def _fleet(store: EventStore, workers: int) -> NodeService:
    nodes = node_service(store, ManualClock(T0))
    for i in range(workers):
        join(nodes, f"cpu-{i:03}")
    return nodes


def _service(store: EventStore, nodes: _Counted) -> PlacementService:
    return PlacementService(
        store,
        nodes,
        [CPU_POOL],
        clock=ManualClock(T0),
        machines=FakeMachines(),
    )


class TestOnlyWhatChanged:
    def test_a_batch_reads_only_the_nodes_that_changed(self, store: EventStore) -> None:
        """The first batch reads every hosted node; the next reads only the nodes the first
        reserved on, not the fleet."""
        counted = _Watched(_fleet(store, 30))
        service = _service(store, counted)
        first = service.place_batch([workload("a", 3000), workload("b", 3000)])
        assert (counted.hosted_calls, len(set(counted.streams_read))) == (1, 30)
        touched = {service.status("a").node, service.status("b").node}
        counted.hosted_calls, counted.streams_read = 0, []
        second = service.place_batch([workload("c", 500)])
        assert counted.hosted_calls == 0
        assert set(counted.streams_read) == touched
        assert (first.placed, second.placed, second.conflicts) == (2, 1, 0)

    def test_a_quiet_fleet_is_not_read_at_all(self, store: EventStore) -> None:
        """Nothing changed since the last look: looking again reads no node."""
        counted = _Watched(_fleet(store, 10))
        service = _service(store, counted)
        service.place_batch([workload("a")])
        assert service.joined_waiting() == []  # reads the node the batch reserved on
        counted.streams_read = []
        assert service.joined_waiting() == []
        assert (counted.streams_read, counted.hosted_calls) == ([], 1)

    def test_a_change_the_node_service_folds_is_planned_on(self, store: EventStore) -> None:
        """A reservation made through the node service between batches (not by placement) is
        in the next batch's snapshot: nothing is planned on the full node, and no conflict is
        needed to find out."""
        nodes = _fleet(store, 2)
        service = _service(store, _Watched(nodes))
        service.place_batch([workload("a", 1000)])
        target = service.status("a").node
        assert target is not None
        filler = reservation(workload("filler", 3000), at=T0)
        nodes.execute(target, lambda at: [ReservePod(filler.spec, at=at)], cause="test")
        report = service.place_batch([workload("b", 1000)])
        assert report.conflicts == 0
        assert service.status("b").node not in (None, target)

    def test_a_worker_drained_between_batches_takes_nothing_more(self, store: EventStore) -> None:
        service = _service(store, _Watched(_fleet(store, 2)))
        service.place_batch([workload("a", 1000)])
        busy = service.status("a").node
        service.set_worker_status(str(busy), "draining")
        service.place_batch([workload(f"w{i}", 500) for i in range(3)])
        assert {service.status(f"w{i}").node for i in range(3)} == {"cpu-000", "cpu-001"} - {busy}

    def test_a_node_joining_between_batches_is_planned_on(self, store: EventStore) -> None:
        """A node hosted after the first batch is in the next one."""
        nodes = _fleet(store, 1)
        service = _service(store, _Watched(nodes))
        service.place_batch([workload("a", 4000)])
        join(nodes, "cpu-001")
        report = service.place_batch([workload("b", 4000)])
        assert (report.placed, report.workers_requested) == (1, ())
        assert service.status("b").node == "cpu-001"


class _Flaky(_Watched):
    """The node service, failing to read ``fail`` once."""

    fail: str | None = None

    def stream(self, node: str) -> NodeStream:
        if node == self.fail:
            self.fail = None
            raise RuntimeError("the log is unreachable")
        return super().stream(node)


class TestReadFailures:
    def test_a_node_not_read_is_read_by_the_next_batch(self, store: EventStore) -> None:
        """A batch that failed to read a changed node leaves it to be read by the next: a node
        that joined meanwhile is not lost to the batches."""
        nodes = _fleet(store, 2)
        flaky = _Flaky(nodes)
        service = _service(store, flaky)
        service.place_batch([workload("a", 4000), workload("b", 4000)])
        join(nodes, "cpu-002")
        flaky.fail = "cpu-002"
        with pytest.raises(RuntimeError, match="unreachable"):
            service.place_batch([workload("c", 4000)])
        report = service.place_batch([workload("c", 4000)])
        assert (report.placed, report.workers_requested) == (1, ())
        assert service.status("c").node == "cpu-002"


class TestWithoutWatch:
    def test_every_batch_reads_every_node(self, store: EventStore) -> None:
        """A node service that does not name its changes is read whole for every batch, as a
        snapshot always was, and no node is overbooked: three batches fill three nodes."""
        counted = _Counted(_fleet(store, 3))
        service = _service(store, counted)
        for b in range(3):
            report = service.place_batch([workload(f"{b}-{i}", 1000) for i in range(4)])
            assert (report.placed, report.workers_requested) == (4, ())
        assert counted.hosted_calls == 3
        assert service.place_batch([workload("more", 250)]).workers_requested != ()
