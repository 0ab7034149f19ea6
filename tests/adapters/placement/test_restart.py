"""Acknowledged workloads survive a restart, on both backends: submissions are in the log before
they are answered, a batch records its waiting and rejected outcomes in its one append, and a new
runtime on the same log rebuilds the queue, the workers awaited and the answers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.nodes import NodeService
from fleetledger.adapters.placement import (
    LogUnavailable,
    PlacementRuntime,
    PlacementService,
    WorkloadConflict,
)
from fleetledger.adapters.runtime import Leadership, MemoryLease
from fleetledger.domain import nodes
from fleetledger.domain.placement import workloads
from fleetledger.eventstore import AppendResult, EventStore, StoreUnavailable, StreamAppend

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload


class _CountingAppends:
    """The store, counting the ``append_many`` calls that reach it."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.calls = 0

    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        self.calls += 1
        return self._store.append_many(appends)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def runtime_on(
    store: EventStore,
    *,
    machines: FakeMachines | None = None,
    joined: Sequence[str] = (),
    at: datetime = T0,
    record_placements: bool = False,
) -> tuple[PlacementRuntime, NodeService]:
    """A runtime as a fresh process builds it on ``store`` (nodes joined first), not started."""
    nodes_svc = node_service(store)
    for name in joined:
        join(nodes_svc, name)
    runtime = PlacementRuntime(
        store,
        nodes_svc,
        [CPU_POOL],
        machines=machines or FakeMachines(),
        clock=ManualClock(at),
        threads=False,
        record_placements=record_placements,
    )
    return runtime, nodes_svc


def types_after(store: EventStore, position: int) -> list[tuple[str, str]]:
    return [(r.stream_id, r.type) for r in store.read_all(after=position, limit=10_000)]


class TestSubmission:
    def test_acceptance_is_one_append_before_the_answer(self, store: EventStore) -> None:
        """All workloads of one submit land together, each on its own stream, with its request."""
        runtime, _ = runtime_on(store)
        before = store.head()
        with runtime:
            runtime.submit([workload("a", 500), workload("b", 700)])
            records = store.read_all(after=before, limit=100)
        assert [(r.stream_id, r.type) for r in records] == [
            ("workload-a", "placement.WorkloadSubmitted"),
            ("workload-b", "placement.WorkloadSubmitted"),
        ]
        assert records[1].data["request"]["cpu_milli"] == 700

    def test_a_resent_request_is_answered_by_the_first(self, store: EventStore) -> None:
        """The same id and request again — queued, or after a restart — records nothing."""
        first, _ = runtime_on(store)
        with first:
            first.submit([workload("a")])
            head = store.head()
            assert first.submit([workload("a"), workload("a")]) == ("a", "a")
        second, _ = runtime_on(store)
        with second:
            assert second.submit([workload("a")]) == ("a",)
        assert store.head() == head
        assert len(second.collector) == 1

    def test_a_conflicting_request_is_refused_with_nothing_appended(
        self, store: EventStore
    ) -> None:
        """A different request under a submitted id refuses the whole submission, naming it —
        also when the first was made by another process."""
        first, _ = runtime_on(store)
        with first:
            first.submit([workload("a", 1000)])
        second, _ = runtime_on(store)
        with second:
            head = store.head()
            with pytest.raises(WorkloadConflict, match="a was already submitted"):
                second.submit([workload("fresh"), workload("a", 2000)])
            with pytest.raises(WorkloadConflict, match="given twice"):
                second.submit([workload("b", 1), workload("b", 2)])
        assert store.head() == head

    def test_a_rejected_workload_sent_again_unchanged_keeps_its_rejection(
        self, store: EventStore
    ) -> None:
        """A client retrying a submission whose answer it lost: nothing appended, the same
        rejection."""
        runtime, _ = runtime_on(store, joined=["cpu-000"])
        with runtime:
            runtime.submit([workload("a", 64_000)])
            runtime.step()
            head = store.head()
            runtime.submit([workload("a", 64_000)])
            runtime.step()
            assert runtime.status("a").state == "rejected"
        assert store.head() == head

    def test_a_rejected_workload_may_be_sent_again(self, store: EventStore) -> None:
        """After its rejection the id is free for a request that fits."""
        runtime, _ = runtime_on(store, joined=["cpu-000"])
        with runtime:
            runtime.submit([workload("a", 64_000)])
            runtime.step()
            runtime.submit([workload("a", 1000)])
            runtime.step()
            assert runtime.status("a").node == "cpu-000"


class TestRestart:
    def test_a_queued_workload_is_placed_by_the_next_runtime(self, store: EventStore) -> None:
        """Submitted, then the process stops before its batch: a new runtime places it."""
        first, _ = runtime_on(store, joined=["cpu-000"])
        with first:
            first.submit([workload("a"), workload("b")])
        second, nodes_svc = runtime_on(store)
        with second:
            assert second.status("a").state == "queued"
            second.step()
            assert {second.status(rid).node for rid in ("a", "b")} == {"cpu-000"}
        nodes_svc.stream("cpu-000").load()
        assert set(nodes_svc.stream("cpu-000").state.other_pods) == {"a", "b"}

    def test_a_waiting_workload_keeps_its_worker_and_is_placed_when_it_joins(
        self, store: EventStore
    ) -> None:
        """Overflow, restart: still waiting for the same worker, whose remaining room is counted
        (no second machine for what fits on it), then placed on it once it joins."""
        asked_first = FakeMachines()
        first, _ = runtime_on(store, machines=asked_first)
        with first:
            first.submit([workload("a", 3000)])
            first.step()
            worker = first.status("a").worker
        assert worker is not None
        assert [r.machine_name for r in asked_first.requests] == [worker]

        asked = FakeMachines()
        second, nodes_svc = runtime_on(store, machines=asked)
        with second:
            assert second.status("a").state == "pending-provisioning"
            assert second.status("a").worker == worker
            [pending] = second.service.pending_workers()
            assert (pending.name, pending.request_ids, pending.free_cpu_milli) == (
                worker,
                ("a",),
                1000,
            )
            second.submit([workload("b", 1000)])
            second.step()
            assert second.status("b").worker == worker
            # The machine is asked for again under its request id (a repeat for the Grouper),
            # never another one.
            assert {r.machine_name for r in asked.requests} == {worker}
            assert {r.request_id for r in asked.requests} == {f"placement-{worker}"}
            join(nodes_svc, worker)
            second.step()
            assert (second.status("a").node, second.status("b").node) == (worker, worker)

    def test_a_placed_workload_waiting_in_the_log_is_placed_after_a_restart(
        self, store: EventStore
    ) -> None:
        """Its stream last says waiting, its node says placed: the node's stream answers."""
        first, nodes_svc = runtime_on(store)
        with first:
            first.submit([workload("a", 4000)])
            first.step()
            worker = first.status("a").worker
            assert worker is not None
            join(nodes_svc, worker)
            first.step()
        second, _ = runtime_on(store)
        with second:
            assert second.status("a").node == worker
            assert (second.service.pending_workers(), len(second.collector)) == ((), 0)

    def test_a_rejected_workload_stays_rejected_with_its_reason(self, store: EventStore) -> None:
        """The rejection and its reason come back from the log."""
        first, _ = runtime_on(store, joined=["cpu-000"])
        with first:
            first.submit([workload("huge", 64_000)])
            first.step()
            reason = first.status("huge").reason
        second, _ = runtime_on(store)
        with second:
            status = second.status("huge")
            assert (status.state, status.reason) == ("rejected", reason)
            assert len(second.collector) == 0
        assert reason is not None and "more than any worker" in reason

    @pytest.mark.parametrize("placed", [True, False], ids=["placed", "queued"])
    def test_a_released_workload_stays_released(self, store: EventStore, placed: bool) -> None:
        """Released from its node (or from the queue): a restart neither queues nor places it,
        and a placed one's PodDeleted and release land in one append."""
        counting = _CountingAppends(store)
        first, _ = runtime_on(counting, joined=["cpu-000"])  # type: ignore[arg-type]
        with first:
            first.submit([workload("a")])
            if placed:
                first.step()
            before, calls = store.head(), counting.calls
            first.release("a")
        assert counting.calls - calls == 1
        expected = [("workload-a", "placement.WorkloadReleased")]
        if placed:
            expected.insert(0, (nodes.stream_id("cpu-000"), "nodes.PodDeleted"))
        assert types_after(store, before) == expected
        second, _ = runtime_on(store)
        with second:
            assert second.status("a").state == "released"
            assert (len(second.collector), second.step()) == (0, [])


class TestOneAppendPerBatch:
    @pytest.mark.parametrize("record_placements", [False, True], ids=["lone", "recorded"])
    def test_waiting_and_rejected_outcomes_ride_with_the_reservations(
        self, store: EventStore, record_placements: bool
    ) -> None:
        """A batch placing, overflowing and rejecting sends one append_many: one event per
        touched node and one per waiting or rejected workload (and per placed one, when
        placements are recorded)."""
        counting = _CountingAppends(store)
        clock = ManualClock(T0)
        nodes_svc = node_service(store, clock)
        join(nodes_svc, "cpu-000")
        service = PlacementService(
            counting,  # type: ignore[arg-type]
            nodes_svc,
            [CPU_POOL],
            clock=clock,
            machines=FakeMachines(),
            record_placements=record_placements,
        )
        batch = [workload("fits", 3000), workload("over", 3000), workload("huge", 64_000)]
        service.accept(batch)
        calls, before = counting.calls, store.head()
        report = service.place_batch(batch)
        assert (report.appends, report.snapshot_reads, counting.calls - calls) == (1, 1, 1)
        assert (report.placed, report.waiting, report.rejected) == (1, 1, 1)
        placed = [("workload-fits", "placement.WorkloadPlaced")] if record_placements else []
        assert sorted(types_after(store, before)) == [
            (nodes.stream_id("cpu-000"), "nodes.OtherPodsReserved"),
            *placed,
            ("workload-huge", "placement.WorkloadRejected"),
            ("workload-over", "placement.WorkloadWaiting"),
        ]
        [waiting] = store.read_stream("workload-over", from_version=2)
        assert waiting.data["worker"] == service.status("over").worker
        assert waiting.data["pool"] == CPU_POOL.name


class TestFailedAppend:
    def test_a_failed_append_answers_nothing_and_asks_for_no_machine(
        self, store: EventStore
    ) -> None:
        """The log refuses the batch's append: its workloads are all queued again and the book
        of pending workers is as before, so the retry asks for the machine once."""
        machines = FakeMachines()
        failing = _Unreachable(store)
        runtime, _ = runtime_on(failing, machines=machines)  # type: ignore[arg-type]
        with runtime:
            runtime.submit([workload("a", 3000), workload("huge", 64_000)])
            failing.down = True
            with pytest.raises(LogUnavailable, match="put back in the queue"):
                runtime.step()
            assert {runtime.status(r).state for r in ("a", "huge")} == {"queued"}
            assert (runtime.service.pending_workers(), machines.requests) == ((), [])
            failing.down = False
            runtime.step()
            assert runtime.status("a").state == "pending-provisioning"
            assert runtime.status("huge").state == "rejected"
        assert len(machines.requests) == 1
        assert workloads.stream_id("a") in {r.stream_id for r in store.read_all(limit=100)}


class TestSeveralControllers:
    @pytest.mark.parametrize("with_leadership", [True, False], ids=["leadership", "alone"])
    def test_controllers_sharing_a_log_record_placements(
        self, store: EventStore, with_leadership: bool
    ) -> None:
        """A runtime given a leadership (several controllers on one log) records each placement
        on its workload's stream; a lone one leaves it to the node's stream."""
        nodes_svc = node_service(store)
        join(nodes_svc, "cpu-000")
        lease = MemoryLease({}, holder="a")
        runtime = PlacementRuntime(
            store,
            nodes_svc,
            [CPU_POOL],
            clock=ManualClock(T0),
            threads=False,
            leadership=Leadership(store, lease, clock=ManualClock(T0), holder="a")
            if with_leadership
            else None,
        )
        with runtime:
            runtime.submit([workload("a")])
            runtime.step()
        recorded = [r.type for r in store.read_stream("workload-a")]
        assert ("placement.WorkloadPlaced" in recorded) is with_leadership

    def test_two_runtimes_recovering_one_workload_place_it_once(self, store: EventStore) -> None:
        """With placements recorded, both recover the same queued workload: the second to
        commit finds it placed on its stream and leaves it there — one node holds it, and both
        answer with that node."""
        first, _ = runtime_on(store, joined=["cpu-000", "cpu-001"])
        with first:
            first.submit([workload("a", 3000)])
        one, _ = runtime_on(store, record_placements=True)
        # A moment later: its decisions are its own (the same decision at the same time would
        # carry the same event ids, and the log would answer it as a replay of the first).
        other, nodes_svc = runtime_on(store, at=T0 + timedelta(seconds=1), record_placements=True)
        with one, other:
            [placed] = one.step()
            [second] = other.step()
            node = one.status("a").node
            assert (placed.placed, second.placed) == (1, 0)
            assert other.status("a") == one.status("a")
        holders = []
        for name in ("cpu-000", "cpu-001"):
            nodes_svc.stream(name).load()
            if "a" in nodes_svc.stream(name).state.other_pods:
                holders.append(name)
        assert holders == [node]
        assert [r.type for r in store.read_stream("workload-a")] == [
            "placement.WorkloadSubmitted",
            "placement.WorkloadPlaced",
        ]


class TestFollowingTheLog:
    def test_a_failed_worker_sends_its_workloads_to_a_worker_of_another_name(
        self, store: EventStore
    ) -> None:
        """The worker's machine failed: its workload waits for a new worker, whose machine is
        a new request, and the log records the move."""
        machines = FakeMachines()
        runtime, _ = runtime_on(store, machines=machines)
        with runtime:
            runtime.submit([workload("a", 3000)])
            runtime.step()
            failed = runtime.status("a").worker
            assert failed is not None
            machines.failed.add(failed)
            runtime.step()
            now = runtime.status("a")
        assert now.state == "pending-provisioning"
        assert now.worker not in (None, failed)
        assert [r.request_id for r in machines.requests] == [
            f"placement-{failed}",
            f"placement-{now.worker}",
        ]
        assert [(r.type, r.data.get("worker")) for r in store.read_stream("workload-a")] == [
            ("placement.WorkloadSubmitted", None),
            ("placement.WorkloadWaiting", failed),
            ("placement.WorkloadWaiting", now.worker),
        ]

    def test_a_restart_does_not_wait_for_a_failed_worker(self, store: EventStore) -> None:
        """Recorded waiting for a worker whose machine failed meanwhile: the restarted runtime
        plans the workload again."""
        first, _ = runtime_on(store)
        with first:
            first.submit([workload("a", 3000)])
            first.step()
            failed = first.status("a").worker
        asked = FakeMachines()
        asked.failed.add(str(failed))
        second, _ = runtime_on(store, machines=asked)
        with second:
            second.step()
            assert second.status("a").worker not in (None, failed)

    def test_a_leader_places_what_another_process_accepted(self, store: EventStore) -> None:
        """A workload accepted by another process (which never places it) is placed by the
        leader's next batch round."""
        leader, _ = _leading_runtime(store, joined=["cpu-000"])
        other, _ = runtime_on(store, at=T0 + timedelta(seconds=1), record_placements=True)
        with leader, other:
            other.submit([workload("b")])
            leader.step()
            assert leader.status("b").node == "cpu-000"

    def test_a_process_elected_after_it_started_catches_up(self, store: EventStore) -> None:
        """Started as a follower, elected once another process accepted workloads and made one
        wait for a worker: it places the first and counts the worker as pending."""
        board: dict[str, str] = {"leader": "other"}
        runtime, leadership = _leading_runtime(store, joined=["cpu-000"], board=board)
        other, _ = runtime_on(store, at=T0 + timedelta(seconds=1), record_placements=True)
        with runtime, other:
            other.submit([workload("a", 3000), workload("b", 3000)])
            other.step()
            waiting = other.status("b").worker or other.status("a").worker
            board.clear()
            leadership.step()
            runtime.step()
            assert [w.name for w in runtime.service.pending_workers()] == [waiting]
            assert {runtime.status(rid).state for rid in "ab"} == {"placed", "pending-provisioning"}


def _leading_runtime(
    store: EventStore, *, joined: Sequence[str], board: dict[str, str] | None = None
) -> tuple[PlacementRuntime, Leadership]:
    """A runtime with a leadership of its own (elected unless ``board`` names another holder)."""
    nodes_svc = node_service(store)
    for name in joined:
        join(nodes_svc, name)
    leadership = Leadership(
        store, MemoryLease({} if board is None else board, holder="a"), clock=ManualClock(T0),
        holder="a",
    )  # fmt: skip
    leadership.step()
    runtime = PlacementRuntime(
        store,
        nodes_svc,
        [CPU_POOL],
        machines=FakeMachines(),
        clock=ManualClock(T0),
        threads=False,
        leadership=leadership,
    )
    return runtime, leadership


class _Unreachable(_CountingAppends):
    """The store, unreachable for appends while ``down``."""

    down = False

    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        if self.down:
            raise StoreUnavailable("the network is down")
        return super().append_many(appends)
