"""The collector's batching rules, and the runtime with and without its thread."""

from __future__ import annotations

import threading
import time

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.placement import (
    Collector,
    InvalidWorkload,
    PlacementRuntime,
    RuntimeStopped,
)
from fleetledger.eventstore import EventStore

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload


class TestCollector:
    def test_a_lone_request_is_a_batch_at_once(self) -> None:
        """With the backlog otherwise empty, one request is taken without waiting for company."""
        collector = Collector(max_batch=100)
        collector.put([workload("a")])
        started = time.monotonic()
        assert [r.id for r in collector.take(timeout=1.0)] == ["a"]
        assert time.monotonic() - started < 5.0

    def test_a_burst_fills_up_to_the_maximum(self) -> None:
        """A queued burst is taken in batches of at most ``max_batch``, in arrival order."""
        collector = Collector(max_batch=3)
        collector.put([workload(f"w{i}") for i in range(7)])
        sizes = [len(collector.take(timeout=0)) for _ in range(3)]
        assert sizes == [3, 3, 1]

    def test_a_drained_backlog_ends_the_batch_at_once(self) -> None:
        """Several queued requests are taken together and the batch returns as soon as the
        backlog is empty, without waiting for more (seed 02's collectRequestBatch: "stop if
        backlog is empty")."""
        collector = Collector(max_batch=100)
        collector.put([workload(f"w{i}") for i in range(3)])
        started = time.monotonic()
        batch = collector.take(timeout=1.0)
        assert [r.id for r in batch] == ["w0", "w1", "w2"]
        assert time.monotonic() - started < 1.0

    def test_requests_arriving_meanwhile_form_the_next_batch(self) -> None:
        """What arrives while a batch is being planned queues up and is taken whole by the next
        take: batches grow with the load by themselves."""
        collector = Collector(max_batch=10)
        collector.put([workload("a"), workload("b")])
        first = collector.take(timeout=1.0)
        collector.put([workload(f"c{i}") for i in range(8)])
        second = collector.take(timeout=1.0)
        assert (len(first), len(second)) == (2, 8)

    def test_a_waiting_take_wakes_for_the_first_request(self) -> None:
        """An empty backlog is waited on (up to the timeout) until a request arrives."""
        collector = Collector(max_batch=10)
        later = threading.Timer(0.05, lambda: collector.put([workload("late")]))
        later.start()
        batch = collector.take(timeout=5.0)
        later.join()
        assert [r.id for r in batch] == ["late"]

    def test_a_request_already_queued_is_not_queued_twice(self) -> None:
        """Its submission and the log read back may both bring it: it is queued once."""
        collector = Collector(max_batch=10)
        collector.put([workload("a"), workload("b")])
        collector.put([workload("b"), workload("c")], first=True)
        assert [r.id for r in collector.take_ready()] == ["c", "a", "b"]

    def test_requeued_requests_go_first(self) -> None:
        """Requests a batch could not commit are taken before newer ones."""
        collector = Collector(max_batch=2)
        collector.put([workload("new")])
        collector.put([workload("old")], first=True)
        assert [r.id for r in collector.take_ready()] == ["old", "new"]

    @pytest.mark.parametrize(
        ("kwargs", "words"),
        [({"max_batch": 0}, "max_batch"), ({"max_batch": 2.5}, "max_batch")],
    )
    def test_bad_settings(self, kwargs: dict[str, float], words: str) -> None:
        """Settings are checked once, naming the one to fix."""
        with pytest.raises(ValueError, match=words):
            Collector(**kwargs)  # type: ignore[arg-type]


class TestRuntime:
    def test_step_places_everything_queued(self, store: EventStore) -> None:
        """Without threads, step() places the backlog in batches of max_batch."""
        nodes_svc = node_service(store)
        for i in range(3):
            join(nodes_svc, f"cpu-{i:03}")
        runtime = PlacementRuntime(
            store, nodes_svc, [CPU_POOL], clock=ManualClock(T0), threads=False, max_batch=4
        )
        with runtime:
            ids = runtime.submit([workload(f"w{i}", 1000) for i in range(10)])
            reports = runtime.step()
        assert [r.requests for r in reports] == [4, 4, 2]
        assert {runtime.status(i).state for i in ids} == {"placed"}

    def test_the_thread_places_and_wait_returns(self, store: EventStore) -> None:
        """With its thread, a submitted workload is placed and wait() sees it."""
        nodes_svc = node_service(store)
        join(nodes_svc, "cpu-000")
        with PlacementRuntime(store, nodes_svc, [CPU_POOL], machines=FakeMachines()) as runtime:
            [wid] = runtime.submit([workload("w1")])
            status = runtime.wait(wid, timeout=10.0)
        assert (status.state, status.node) == ("placed", "cpu-000")

    def test_a_joined_worker_is_filled_without_new_requests(self, store: EventStore) -> None:
        """Once the node overflow asked for joins, step() places its waiting workloads."""
        nodes_svc = node_service(store)
        runtime = PlacementRuntime(
            store, nodes_svc, [CPU_POOL], clock=ManualClock(T0), threads=False
        )
        with runtime:
            runtime.submit([workload("w1", 4000)])
            runtime.step()
            worker = runtime.status("w1").worker
            assert worker is not None
            join(nodes_svc, worker)
            runtime.step()
            assert runtime.status("w1").node == worker

    def test_a_resent_workload_is_placed_once(self, store: EventStore) -> None:
        """Submitting an id again — queued or already placed — never reserves it twice."""
        nodes_svc = node_service(store)
        for i in range(2):
            join(nodes_svc, f"cpu-{i:03}")
        runtime = PlacementRuntime(
            store, nodes_svc, [CPU_POOL], clock=ManualClock(T0), threads=False
        )
        with runtime:
            runtime.submit([workload("w1", 3000), workload("w1", 3000)])
            runtime.step()
            runtime.submit([workload("w1", 3000)])
            assert runtime.step() == []
        for name in nodes_svc.hosted():
            nodes_svc.stream(name).load()  # the batch appended past the hosted streams
        held = [name for name, state in nodes_svc.hosted().items() if "w1" in state.other_pods]
        assert held == [runtime.status("w1").node]

    def test_malformed_requests_are_refused_whole(self, store: EventStore) -> None:
        """A malformed workload refuses the whole submission, naming it."""
        runtime = PlacementRuntime(store, node_service(store), [CPU_POOL], threads=False)
        with runtime:
            with pytest.raises(InvalidWorkload, match="workload 1"):
                runtime.submit([workload("ok"), workload("bad", -5)])
            assert len(runtime.collector) == 0

    def test_stopped(self, store: EventStore) -> None:
        """A stopped runtime takes no workload."""
        runtime = PlacementRuntime(store, node_service(store), [CPU_POOL], threads=False)
        with pytest.raises(RuntimeStopped):
            runtime.submit([workload("a")])
