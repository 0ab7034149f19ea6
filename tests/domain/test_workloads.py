"""Workload streams: idempotent submissions, outcomes, releases, and what a restart rebuilds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.domain.errors import Rejected
from fleetledger.domain.placement import (
    Pool,
    RecordPlacement,
    RecordRejection,
    RecordWaiting,
    ReleaseWorkload,
    SubmitWorkload,
    Workload,
    WorkloadCommand,
    WorkloadPlaced,
    WorkloadRejected,
    WorkloadReleased,
    WorkloadRequest,
    WorkloadSubmitted,
    WorkloadWaiting,
    workloads,
)
from fleetledger.domain.template import MachineTemplate

T0 = datetime(2025, 1, 1, tzinfo=UTC)
GIB = 1 << 30
POOL = Pool(
    name="cpu",
    template=MachineTemplate(vm_size="Standard_D4s_v5"),
    worker_cpu_milli=4000,
    worker_memory_bytes=16 * GIB,
)


def request(rid: str = "w1", cpu: int = 1000) -> WorkloadRequest:
    return WorkloadRequest(id=rid, cpu_milli=cpu, memory_bytes=GIB)


def run(*commands: WorkloadCommand) -> Workload:
    state = workloads.initial_state()
    for command in commands:
        for event in workloads.decide(state, command):
            state = workloads.evolve(state, event)
    return state


class TestSubmit:
    def test_a_new_workload_is_submitted_with_its_request(self) -> None:
        """The event carries the whole request."""
        events = workloads.decide(workloads.initial_state(), SubmitWorkload(request(), T0))
        assert events == [WorkloadSubmitted(request(), T0)]
        assert events[0].workload_id == "w1"

    @pytest.mark.parametrize(
        "before",
        [(), (RecordWaiting("w1", "cpu-a", "cpu", T0),)],
        ids=["submitted", "waiting"],
    )
    def test_the_same_request_again_is_a_repeat(self, before: tuple[WorkloadCommand, ...]) -> None:
        """Sent again with the same request, the first submission answers: nothing to record."""
        state = run(SubmitWorkload(request(), T0), *before)
        assert workloads.decide(state, SubmitWorkload(request(), T0)) == []

    def test_a_different_request_under_the_same_id_is_refused(self) -> None:
        """The refusal names the id and says what to do."""
        state = run(SubmitWorkload(request(cpu=1000), T0))
        with pytest.raises(Rejected, match="w1 was already submitted with a different request"):
            workloads.decide(state, SubmitWorkload(request(cpu=2000), T0))

    def test_a_rejected_request_sent_again_keeps_its_rejection(self) -> None:
        """A retry of the same request (its answer lost) is not judged a second time."""
        state = run(SubmitWorkload(request(cpu=1000), T0), RecordRejection("w1", "too big", T0))
        assert workloads.decide(state, SubmitWorkload(request(cpu=1000), T0)) == []

    @pytest.mark.parametrize(
        "end",
        [RecordRejection("w1", "too big", T0), ReleaseWorkload("w1", T0)],
        ids=["rejected", "released"],
    )
    def test_a_finished_workload_may_be_submitted_again(self, end: WorkloadCommand) -> None:
        """After a rejection or a release, even a different request opens the workload again."""
        state = run(SubmitWorkload(request(cpu=1000), T0), end)
        events = workloads.decide(state, SubmitWorkload(request(cpu=2000), T0))
        assert events == [WorkloadSubmitted(request(cpu=2000), T0)]


class TestOutcomes:
    def test_waiting_then_rejected_then_released(self) -> None:
        """Each outcome is one event, and the fold keeps the request."""
        state = run(SubmitWorkload(request(), T0))
        assert workloads.decide(state, RecordWaiting("w1", "cpu-a", "cpu", T0)) == [
            WorkloadWaiting("w1", "cpu-a", "cpu", T0)
        ]
        state = run(SubmitWorkload(request(), T0), RecordWaiting("w1", "cpu-a", "cpu", T0))
        assert (state.phase, state.worker, state.pool, state.request) == (
            "waiting",
            "cpu-a",
            "cpu",
            request(),
        )
        assert workloads.decide(state, RecordRejection("w1", "r", T0)) == [
            WorkloadRejected("w1", "r", T0)
        ]
        assert workloads.decide(state, ReleaseWorkload("w1", T0)) == [WorkloadReleased("w1", T0)]

    def test_placed_once(self) -> None:
        """A queued or waiting workload is placed; placed already — by another batch, even on
        the same node — or released, it is refused, so a second placer leaves it alone."""
        for before in ((), (RecordWaiting("w1", "cpu-a", "cpu", T0),)):
            state = run(SubmitWorkload(request(), T0), *before)
            assert workloads.decide(state, RecordPlacement("w1", "n1", T0)) == [
                WorkloadPlaced("w1", "n1", T0)
            ]
        placed = run(SubmitWorkload(request(), T0), RecordPlacement("w1", "n1", T0))
        assert (placed.phase, placed.node) == ("placed", "n1")
        for node in ("n1", "n2"):
            with pytest.raises(Rejected, match="is placed on n1"):
                workloads.decide(placed, RecordPlacement("w1", node, T0))
        released = run(SubmitWorkload(request(), T0), ReleaseWorkload("w1", T0))
        with pytest.raises(Rejected, match="is released"):
            workloads.decide(released, RecordPlacement("w1", "n1", T0))
        assert workloads.decide(placed, RecordWaiting("w1", "w", "cpu", T0)) == []
        assert workloads.decide(placed, SubmitWorkload(request(), T0)) == []

    def test_an_outcome_repeated_records_nothing(self) -> None:
        """Waiting for the same worker again, or rejected again for the same reason, is known."""
        waiting = run(SubmitWorkload(request(), T0), RecordWaiting("w1", "cpu-a", "cpu", T0))
        assert workloads.decide(waiting, RecordWaiting("w1", "cpu-a", "cpu", T0)) == []
        rejected = run(SubmitWorkload(request(), T0), RecordRejection("w1", "r", T0))
        assert workloads.decide(rejected, RecordRejection("w1", "r", T0)) == []

    def test_an_outcome_for_a_workload_never_submitted_is_refused(self) -> None:
        """Outcomes belong to submitted workloads only."""
        with pytest.raises(Rejected, match="never submitted"):
            workloads.decide(workloads.initial_state(), RecordWaiting("w1", "x", "cpu", T0))

    def test_a_released_workload_keeps_no_late_outcome(self) -> None:
        """Released while its batch was planned: the batch's outcome is moot."""
        state = run(SubmitWorkload(request(), T0), ReleaseWorkload("w1", T0))
        assert workloads.decide(state, RecordRejection("w1", "r", T0)) == []
        assert workloads.decide(state, ReleaseWorkload("w1", T0)) == []


class TestRecover:
    def test_each_workload_goes_where_its_stream_leaves_it(self) -> None:
        """Submitted → queued, unless placed (on its stream or by a node); rejected and
        released keep answers."""
        folded = {
            "q": run(SubmitWorkload(request("q"), T0)),
            "p": run(SubmitWorkload(request("p"), T0)),
            "s": run(SubmitWorkload(request("s"), T0), RecordPlacement("s", "n", T0)),
            "r": run(SubmitWorkload(request("r"), T0), RecordRejection("r", "too big", T0)),
            "x": run(SubmitWorkload(request("x"), T0), ReleaseWorkload("x", T0)),
        }
        recovery = workloads.recover(folded, placed={"p"}, pools=[POOL])
        assert recovery.queued == (request("q"),)
        assert recovery.rejected == {"r": "too big"}
        assert recovery.released == ("x",)
        assert (recovery.waiting, recovery.pending) == ({}, ())

    def test_waiting_workloads_take_their_share_of_their_worker(self) -> None:
        """A pending worker comes back as an empty worker of its pool less what waits for it."""
        folded = {
            rid: run(SubmitWorkload(request(rid, cpu), T0), RecordWaiting(rid, "cpu-a", "cpu", T0))
            for rid, cpu in (("a", 1000), ("b", 2000))
        }
        recovery = workloads.recover(folded, placed=(), pools=[POOL])
        [worker] = recovery.pending
        assert (worker.name, worker.pool, worker.request_ids) == ("cpu-a", "cpu", ("a", "b"))
        assert (worker.free_cpu_milli, worker.free_memory_bytes, worker.free_gpu) == (
            1000,
            14 * GIB,
            0,
        )
        assert set(recovery.waiting) == {"a", "b"}

    def test_a_waiting_workload_already_on_its_node_is_left_alone(self) -> None:
        """Its worker joined and a batch placed it: the node's stream is the answer."""
        folded = {"a": run(SubmitWorkload(request("a"), T0), RecordWaiting("a", "w", "cpu", T0))}
        recovery = workloads.recover(folded, placed={"a"}, pools=[POOL])
        assert (recovery.queued, recovery.pending, recovery.waiting) == ((), (), {})

    def test_a_worker_of_a_pool_no_longer_configured_is_planned_again(self) -> None:
        """Without its pool the worker's room is unknown: the workload is queued instead."""
        folded = {"a": run(SubmitWorkload(request("a"), T0), RecordWaiting("a", "w", "gpu", T0))}
        recovery = workloads.recover(folded, placed=(), pools=[POOL])
        assert (recovery.queued, recovery.pending) == ((request("a"),), ())

    def test_a_workload_waiting_for_a_failed_worker_is_planned_again(self) -> None:
        """Its worker's machine failed and will never join: it is queued, the worker gone."""
        folded = {"a": run(SubmitWorkload(request("a"), T0), RecordWaiting("a", "w", "cpu", T0))}
        recovery = workloads.recover(folded, placed=(), pools=[POOL], failed={"w"})
        assert (recovery.queued, recovery.pending, recovery.waiting) == ((request("a"),), (), {})

    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["submitted", "placed", "waiting", "rejected", "released"]),
                st.booleans(),
                st.sampled_from(["w-1", "w-2"]),
            ),
            max_size=12,
        )
    )
    def test_every_workload_has_exactly_one_place(
        self, shapes: list[tuple[str, bool, str]]
    ) -> None:
        """Queued, waiting, rejected, released or on a node: never two, never none."""
        folded: dict[str, Workload] = {}
        placed = set()
        for index, (phase, on_node, worker) in enumerate(shapes):
            rid = f"w{index}"
            commands: list[WorkloadCommand] = [SubmitWorkload(request(rid, 100), T0)]
            if phase == "waiting":
                commands.append(RecordWaiting(rid, worker, "cpu", T0))
            elif phase == "placed":
                commands.append(RecordPlacement(rid, "n", T0))
            elif phase == "rejected":
                commands.append(RecordRejection(rid, "no", T0))
            elif phase == "released":
                commands.append(ReleaseWorkload(rid, T0))
            folded[rid] = run(*commands)
            if (on_node and phase in ("submitted", "waiting")) or phase == "placed":
                placed.add(rid)
        recovery = workloads.recover(folded, placed=placed, pools=[POOL])
        places = [
            [r.id for r in recovery.queued],
            list(recovery.waiting),
            list(recovery.rejected),
            list(recovery.released),
            sorted(placed),
        ]
        everywhere = [rid for group in places for rid in group]
        assert sorted(everywhere) == sorted(folded)
        waiting_on_workers = [rid for p in recovery.pending for rid in p.request_ids]
        assert sorted(waiting_on_workers) == sorted(recovery.waiting)
