"""The capacity kept between batches: changed one worker at a time, planned on in trials that
give their room back, and planning exactly as a snapshot of the same workers plans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.placement import (
    Capacity,
    PendingWorker,
    Pool,
    Snapshot,
    Worker,
    WorkloadRequest,
    plan,
    plan_on,
)
from fleetledger.domain.template import MachineTemplate

GIB = 1 << 30
POOLS = (
    Pool(
        name="cpu",
        template=MachineTemplate(vm_size="D4"),
        worker_cpu_milli=4000,
        worker_memory_bytes=16 * GIB,
    ),
    Pool(
        name="spot",
        template=MachineTemplate(vm_size="D4"),
        worker_cpu_milli=4000,
        worker_memory_bytes=16 * GIB,
        preemptible=True,
        strategy="spread",
        priority=1,
    ),
    Pool(
        name="gpu",
        template=MachineTemplate(vm_size="NC"),
        worker_cpu_milli=8000,
        worker_memory_bytes=32 * GIB,
        worker_gpu=4,
        gpu_type="t4",
    ),
    Pool(
        name="old",
        template=MachineTemplate(vm_size="D2"),
        worker_cpu_milli=2000,
        worker_memory_bytes=8 * GIB,
        status="draining",
    ),
)


def worker(name: str, pool: str = "cpu", cpu: int = 4000, **fields: object) -> Worker:
    values: dict[str, object] = {
        "name": name,
        "pool": pool,
        "version": 1,
        "free_cpu_milli": cpu,
        "free_memory_bytes": 16 * GIB,
        "free_gpu": 0,
    }
    values.update(fields)
    return Worker(**values)  # type: ignore[arg-type]


def request(rid: str, cpu: int = 1000, **fields: object) -> WorkloadRequest:
    return WorkloadRequest(id=rid, cpu_milli=cpu, memory_bytes=GIB, **fields)  # type: ignore[arg-type]


class TestCapacity:
    def test_put_replaces_and_discard_forgets(self) -> None:
        """A worker put again is counted as it is now; a discarded one is gone."""
        capacity = Capacity(POOLS, [worker("a"), worker("b")])
        capacity.put(worker("a", cpu=500))
        capacity.discard("b")
        capacity.discard("never-there")
        assert capacity.workers() == (worker("a", cpu=500),)
        assert ("a" in capacity, "b" in capacity, len(capacity)) == (True, False, 1)

    def test_only_available_workers_of_available_pools_take_workloads(self) -> None:
        """A draining worker, or a worker of a draining pool, is in the capacity but takes
        nothing; made available again, it does."""
        capacity = Capacity(POOLS, [worker("a", status="draining"), worker("o", pool="old")])
        assert not capacity.tracks("a") and not capacity.tracks("o")
        assert plan_on([request("r")], capacity).placed == {}
        capacity.put(worker("a"))
        assert plan_on([request("r")], capacity).placed == {"r": "a"}

    def test_a_trial_gives_its_room_back_however_it_ends(self) -> None:
        """Room taken in a trial is back once it ends, by return or by error."""
        capacity = Capacity(POOLS, [worker("a")])
        with capacity.trial() as trial:
            trial.take("a", request("r", cpu=3000))
            assert trial.tightest("cpu", request("s", cpu=2000), 0) is None
        with pytest.raises(KeyError), capacity.trial() as trial:
            trial.take("a", request("r", cpu=3000))
            raise KeyError("planning failed")
        assert capacity.tightest("cpu", request("s", cpu=4000), 0) == "a"

    def test_room_is_taken_only_within_a_trial(self) -> None:
        capacity = Capacity(POOLS, [worker("a")])
        with pytest.raises(RuntimeError, match="within a trial"):
            capacity.take("a", request("r"))

    def test_workers_do_not_change_while_a_batch_is_planned(self) -> None:
        capacity = Capacity(POOLS, [worker("a")])
        with pytest.raises(RuntimeError, match="while a batch"), capacity.trial():
            capacity.put(worker("b"))

    def test_plan_on_leaves_the_capacity_as_it_was(self) -> None:
        """A batch planned on the capacity reaches it only when the caller puts the workers'
        new rooms: planned twice, it plans the same."""
        capacity = Capacity(POOLS, [worker("a"), worker("b", cpu=2000)])
        batch = [request("r", cpu=1500), request("s", cpu=2500)]
        first = plan_on(batch, capacity)
        assert first.placed == {"r": "b", "s": "a"}
        assert plan_on(batch, capacity) == first
        assert capacity.workers() == (worker("a"), worker("b", cpu=2000))


_NAMES = [f"n{i}" for i in range(12)]


@st.composite
def workers(draw: st.DrawFn) -> Worker:
    pool = draw(st.sampled_from(POOLS))
    return worker(
        draw(st.sampled_from(_NAMES)),
        pool=pool.name,
        cpu=draw(st.sampled_from((0, 500, 1000, 2500, 4000, 8000))),
        free_memory_bytes=draw(st.sampled_from((0, GIB, 4 * GIB, 16 * GIB))),
        free_gpu=draw(st.integers(0, 4)) if pool.gpu_type else 0,
        status=draw(st.sampled_from(("available", "available", "draining"))),
        version=draw(st.integers(0, 5)),
    )


@st.composite
def requests(draw: st.DrawFn) -> list[WorkloadRequest]:
    count = draw(st.integers(0, 12))
    batch = []
    for index in range(count):
        gpu = draw(st.booleans()) and draw(st.booleans())
        batch.append(
            request(
                f"r{index}",
                cpu=draw(st.sampled_from((250, 500, 1000, 3000))),
                gpu=draw(st.integers(1, 2)) if gpu else 0,
                preemptible=draw(st.booleans()),
                priority=draw(st.integers(0, 1)),
            )
        )
    return batch


class TestLikeASnapshot:
    @settings(max_examples=150, deadline=None)
    @given(
        history=st.lists(st.tuples(workers(), st.booleans()), max_size=30),
        batches=st.lists(requests(), min_size=1, max_size=3),
        joined=st.sampled_from(_NAMES),
    )
    def test_plans_as_a_snapshot_of_the_same_workers_plans(
        self,
        history: list[tuple[Worker, bool]],
        batches: list[list[WorkloadRequest]],
        joined: str,
    ) -> None:
        """However the capacity got where it is (workers put, replaced, discarded, batches
        planned on it in between), a batch plans on it exactly as on a snapshot of the
        workers it holds."""
        capacity = Capacity(POOLS)
        for step, (changed, leaves) in enumerate(history):
            if leaves:
                capacity.discard(changed.name)
            else:
                capacity.put(changed)
            if step % 7 == 0:
                plan_on(batches[step % len(batches)], capacity)
        for batch in batches:
            pending = (
                PendingWorker(
                    name=joined,
                    pool="cpu",
                    request_ids=tuple(r.id for r in batch[:2]),
                    free_cpu_milli=2000,
                    free_memory_bytes=8 * GIB,
                    free_gpu=0,
                ),
            )
            snapshot = Snapshot(workers=capacity.workers(), pending=pending)
            assert plan_on(batch, capacity, pending=pending) == plan(batch, snapshot, POOLS)
