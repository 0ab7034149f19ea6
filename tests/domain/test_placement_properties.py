"""Planner invariants under random batches: no negative capacity, no double booking, filters
honoured, every request answered once, the same answer whatever the snapshot's order."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.adapters.placement import reservation, worker_of
from fleetledger.domain.errors import Rejected
from fleetledger.domain.nodes import (
    Bounds,
    ComputeUnit,
    ContainerResources,
    JoinNode,
    NodeConfig,
    NodeState,
    OtherPodSpec,
    ReservePod,
    VmPodSpec,
    decide,
    evolve,
    initial_state,
)
from fleetledger.domain.placement import (
    PendingWorker,
    PlacementPlan,
    Pool,
    Snapshot,
    Worker,
    WorkloadRequest,
    eligible,
    plan,
    worker_room,
)
from fleetledger.domain.template import MachineTemplate

AT = datetime(2025, 1, 1, tzinfo=UTC)
SLOT = 1 << 28
GPU_TYPES = ("t4", "a100")

POOLS = (
    Pool(
        name="cpu",
        template=MachineTemplate(vm_size="D4"),
        worker_cpu_milli=4000,
        worker_memory_bytes=16 * SLOT,
        memory_slot_bytes=SLOT,
    ),
    Pool(
        name="big",
        template=MachineTemplate(vm_size="D16"),
        worker_cpu_milli=16000,
        worker_memory_bytes=64 * SLOT,
        memory_slot_bytes=SLOT,
        requires_selector=True,
        priority=2,
    ),
    Pool(
        name="spot",
        template=MachineTemplate(vm_size="D4", priority="spot"),
        worker_cpu_milli=4000,
        worker_memory_bytes=16 * SLOT,
        memory_slot_bytes=SLOT,
        preemptible=True,
        priority=1,
        strategy="spread",
    ),
    Pool(
        name="t4",
        template=MachineTemplate(vm_size="NC4"),
        worker_cpu_milli=4000,
        worker_memory_bytes=16 * SLOT,
        memory_slot_bytes=SLOT,
        worker_gpu=2,
        gpu_type="t4",
    ),
    Pool(
        name="a100",
        template=MachineTemplate(vm_size="ND96"),
        worker_cpu_milli=8000,
        worker_memory_bytes=32 * SLOT,
        memory_slot_bytes=SLOT,
        worker_gpu=4,
        gpu_type="a100",
    ),
    Pool(
        name="old",
        template=MachineTemplate(vm_size="D2"),
        worker_cpu_milli=2000,
        worker_memory_bytes=8 * SLOT,
        memory_slot_bytes=SLOT,
        status="draining",
    ),
)
BY_NAME = {p.name: p for p in POOLS}


@st.composite
def workers(draw: st.DrawFn) -> tuple[Worker, ...]:
    count = draw(st.integers(0, 12))
    result = []
    for i in range(count):
        pool = draw(st.sampled_from(POOLS))
        result.append(
            Worker(
                name=f"w{i}",
                pool=pool.name,
                version=draw(st.integers(1, 5)),
                free_cpu_milli=draw(st.integers(0, pool.worker_cpu_milli)),
                free_memory_bytes=draw(st.integers(0, pool.worker_memory_bytes)),
                free_gpu=draw(st.integers(0, pool.worker_gpu)),
                status=draw(st.sampled_from(("available", "available", "draining", "disabled"))),
            )
        )
    return tuple(result)


@st.composite
def requests(draw: st.DrawFn) -> list[WorkloadRequest]:
    count = draw(st.integers(0, 30))
    result = []
    for i in range(count):
        gpu = draw(st.sampled_from((0, 0, 0, 1, 2, 5)))
        result.append(
            WorkloadRequest(
                id=f"r{draw(st.integers(0, 40))}" if draw(st.booleans()) else f"u{i}",
                cpu_milli=draw(st.integers(0, 20000)),
                memory_bytes=draw(st.integers(0, 70 * SLOT)),
                gpu=gpu,
                gpu_types=tuple(draw(st.lists(st.sampled_from((*GPU_TYPES, "any")), unique=True)))
                if gpu
                else (),
                selector=draw(st.sampled_from((None, None, "big", "cpu", "nope"))),
                preemptible=draw(st.booleans()),
                priority=draw(st.integers(0, 3)),
            )
        )
    return result


@st.composite
def pendings(draw: st.DrawFn) -> tuple[PendingWorker, ...]:
    result = []
    for i in range(draw(st.integers(0, 3))):
        pool = draw(st.sampled_from(POOLS[:5]))
        result.append(
            PendingWorker(
                name=f"p{i}",
                pool=pool.name,
                request_ids=(),
                free_cpu_milli=draw(st.integers(0, pool.worker_cpu_milli)),
                free_memory_bytes=draw(st.integers(0, pool.worker_memory_bytes)),
                free_gpu=draw(st.integers(0, pool.worker_gpu)),
            )
        )
    return tuple(result)


def _outcomes(result: PlacementPlan) -> list[str]:
    return [
        *result.placed,
        *result.waiting,
        *(r for n in result.provisions for r in n.request_ids),
        *result.rejected,
    ]


class TestInvariants:
    @settings(max_examples=150, deadline=None)
    @given(workers(), pendings(), requests())
    def test_never_more_than_free(
        self, ws: tuple[Worker, ...], ps: tuple[PendingWorker, ...], rs: list[WorkloadRequest]
    ) -> None:
        """No worker, pending worker or new worker is given more than it has: no capacity goes
        negative, nothing is double-booked inside a batch."""
        result = plan(rs, Snapshot(workers=ws, pending=ps), POOLS)
        by_id = {r.id: r for r in reversed(rs)}
        for w in ws:
            placed = result.reservations.get(w.name, ())
            assert sum(r.cpu_milli for r in placed) <= w.free_cpu_milli
            assert sum(r.memory_bytes for r in placed) <= w.free_memory_bytes
            assert sum(r.gpu for r in placed) <= w.free_gpu
            assert len({r.id for r in placed}) == len(placed)
        for p in ps:
            mine = [by_id[r] for r, name in result.waiting.items() if name == p.name]
            assert sum(r.cpu_milli for r in mine) <= p.free_cpu_milli
            assert sum(r.memory_bytes for r in mine) <= p.free_memory_bytes
            assert sum(r.gpu for r in mine) <= p.free_gpu
        for new in result.provisions:
            cpu, memory, gpu = worker_room(BY_NAME[new.pool])
            assert new.used_cpu_milli <= cpu
            assert new.used_memory_bytes <= memory
            assert new.used_gpu <= gpu

    @settings(max_examples=150, deadline=None)
    @given(workers(), pendings(), requests())
    def test_every_request_answered_once_within_its_filters(
        self, ws: tuple[Worker, ...], ps: tuple[PendingWorker, ...], rs: list[WorkloadRequest]
    ) -> None:
        """Each distinct request has exactly one outcome, and lands only where its filters allow."""
        result = plan(rs, Snapshot(workers=ws, pending=ps), POOLS)
        outcomes = _outcomes(result)
        assert sorted(outcomes) == sorted({r.id for r in rs})
        by_id = {r.id: r for r in reversed(rs)}
        by_worker = {w.name: w for w in ws}
        for rid, node in result.placed.items():
            w = by_worker[node]
            assert w.status == "available"
            assert eligible(by_id[rid], BY_NAME[w.pool])
        pending_pool = {p.name: p.pool for p in ps}
        for rid, name in result.waiting.items():
            assert eligible(by_id[rid], BY_NAME[pending_pool[name]])
        for new in result.provisions:
            assert all(eligible(by_id[r], BY_NAME[new.pool]) for r in new.request_ids)

    @settings(max_examples=100, deadline=None)
    @given(workers(), pendings(), requests(), st.randoms(use_true_random=False))
    def test_deterministic_whatever_the_snapshot_order(
        self,
        ws: tuple[Worker, ...],
        ps: tuple[PendingWorker, ...],
        rs: list[WorkloadRequest],
        rnd: object,
    ) -> None:
        """The same batch on the same capacity plans the same, however the snapshot is listed."""
        shuffled = list(ws)
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        first = plan(rs, Snapshot(workers=ws, pending=ps), POOLS)
        again = plan(rs, Snapshot(workers=tuple(shuffled), pending=ps[::-1]), POOLS)
        assert first == again


class TestExactOverflow:
    @settings(max_examples=200, deadline=None)
    @given(pendings(), requests(), st.integers(0, 3000))
    def test_never_more_workers_than_the_heuristic(
        self, ps: tuple[PendingWorker, ...], rs: list[WorkloadRequest], steps: int
    ) -> None:
        """Whatever the budget, the exact search never asks for more new workers than
        first-fit decreasing, never gives a new or pending worker more than it has, answers
        every request it was given, and its gap is within what the heuristic's was."""
        heuristic = plan(rs, Snapshot(pending=ps), POOLS, search_steps=0)
        exact = plan(rs, Snapshot(pending=ps), POOLS, search_steps=steps)
        assert len(exact.provisions) <= len(heuristic.provisions)
        assert 0 <= exact.optimality_gap <= heuristic.optimality_gap
        assert len(exact.provisions) - exact.optimality_gap <= len(heuristic.provisions)
        assert sorted(_outcomes(exact)) == sorted(_outcomes(heuristic))
        by_id = {r.id: r for r in reversed(rs)}
        for new in exact.provisions:
            cpu, memory, gpu = worker_room(BY_NAME[new.pool])
            taken = [by_id[r] for r in new.request_ids]
            assert sum(r.cpu_milli for r in taken) == new.used_cpu_milli <= cpu
            assert sum(r.memory_bytes for r in taken) == new.used_memory_bytes <= memory
            assert sum(r.gpu for r in taken) == new.used_gpu <= gpu
            assert all(eligible(r, BY_NAME[new.pool]) for r in taken)
        for p in ps:
            mine = [by_id[r] for r, name in exact.waiting.items() if name == p.name]
            assert sum(r.cpu_milli for r in mine) <= p.free_cpu_milli
            assert sum(r.memory_bytes for r in mine) <= p.free_memory_bytes
            assert sum(r.gpu for r in mine) <= p.free_gpu

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(st.integers(1, 4000), st.integers(1, 16), st.integers(0, 2)),
            min_size=1,
            max_size=7,
        )
    )
    def test_proven_minimal_is_the_minimum(self, shapes: list[tuple[int, int, int]]) -> None:
        """When the plan says it is proven minimal (gap 0), no packing of the same workloads
        into workers of the pool uses fewer: checked against every assignment."""
        gpu_pool = BY_NAME["t4"]
        rs = [
            WorkloadRequest(
                id=f"r{i}", cpu_milli=cpu, memory_bytes=slots * SLOT, gpu=gpu, gpu_types=("t4",)
            )
            if gpu
            else WorkloadRequest(id=f"r{i}", cpu_milli=cpu, memory_bytes=slots * SLOT)
            for i, (cpu, slots, gpu) in enumerate(shapes)
        ]
        gpu_rs = [r for r in rs if r.gpu]
        result = plan(gpu_rs, Snapshot(), (gpu_pool,))
        if result.optimality_gap == 0:
            assert len(result.provisions) == _fewest(gpu_rs, worker_room(gpu_pool))


def _fewest(rs: list[WorkloadRequest], room: tuple[int, int, int]) -> int:
    """The fewest workers of ``room`` holding ``rs``, by trying every assignment."""
    best = len(rs)

    def go(i: int, bins: list[list[int]]) -> None:
        nonlocal best
        if len(bins) >= best:
            return
        if i == len(rs):
            best = len(bins)
            return
        need = (rs[i].cpu_milli, rs[i].memory_bytes, rs[i].gpu)
        for b in bins:
            if all(need[d] <= b[d] for d in range(3)):
                for d in range(3):
                    b[d] -= need[d]
                go(i + 1, bins)
                for d in range(3):
                    b[d] += need[d]
        go(i + 1, [*bins, [room[d] - need[d] for d in range(3)]])

    go(0, [])
    return best


CONFIGS = st.builds(
    NodeConfig,
    cpu_system_milli=st.integers(0, 1500),
    memory_system_slots=st.integers(0, 2),
    cpu_watermark=st.sampled_from((0.5, 0.9, 1.0)),
    memory_watermark=st.sampled_from((0.5, 0.9, 1.0)),
    compute_unit=st.just(ComputeUnit(250, 1)),
    memory_slot_bytes=st.sampled_from((SLOT, 3 * SLOT)),
)


@st.composite
def node_states(draw: st.DrawFn, name: str) -> NodeState:
    """A node that joined and holds some VM and non-VM pods already."""
    config = draw(CONFIGS)
    state = initial_state()
    join = JoinNode(
        name,
        draw(st.integers(0, 8000)),
        draw(st.integers(0, 24)) * SLOT,
        draw(st.integers(0, 4)),
        config,
        at=AT,
    )
    for event in decide(state, join):
        state = evolve(state, event)
    for i in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            use = draw(st.integers(0, 2000))
            slots = draw(st.integers(0, 3))
            spec: VmPodSpec | OtherPodSpec = VmPodSpec(
                name=f"{name}-vm{i}",
                cpu=Bounds(0, use, use + 1000),
                memory=Bounds(0, slots, slots + 2),
            )
        else:
            spec = OtherPodSpec(
                name=f"{name}-pod{i}",
                containers=(
                    ContainerResources(
                        cpu_request_milli=draw(st.integers(0, 1700)),
                        memory_request_bytes=draw(st.integers(0, 2 * SLOT)),
                        gpu=draw(st.integers(0, 1)),
                    ),
                ),
            )
        running = draw(st.booleans())
        try:
            events = decide(state, ReservePod(spec, at=AT, already_running=running))
        except Rejected:
            continue
        for event in events:
            state = evolve(state, event)
    return state


class TestAgainstTheNodeAggregate:
    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.integers(0, 3), min_size=1, max_size=4).flatmap(
            lambda ids: st.tuples(*(node_states(f"cpu-{i}") for i in sorted(set(ids))))
        ),
        requests(),
    )
    def test_the_node_accepts_every_reservation_planned(
        self, states: tuple[NodeState, ...], rs: list[WorkloadRequest]
    ) -> None:
        """Whatever nodes already hold (VM pods, non-VM pods, rounding, system reserve, pods
        counted beyond capacity), the node aggregate accepts every reservation the planner
        makes on the room worker_of reads: capacity never goes negative."""
        cpu_only = [replace(r, gpu=0, gpu_types=(), selector=None) for r in rs]
        workers = tuple(worker_of(s, version=1, pool="cpu") for s in states)
        result = plan(cpu_only, Snapshot(workers=workers), POOLS)
        by_name = {s.name: s for s in states}
        for node, placed in result.reservations.items():
            state = by_name[node]
            for workload in placed:
                # decide raises Unschedulable if the node is overbooked
                for event in decide(state, reservation(workload, at=AT)):
                    state = evolve(state, event)
            assert state.cpu.reserved <= max(state.cpu.reservable, by_name[node].cpu.reserved)
