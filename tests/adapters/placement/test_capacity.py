"""Placement meets node accounting: node states read as workers, placements written as node
commands the node aggregate accepts."""

from __future__ import annotations

from datetime import UTC, datetime

from fleetledger.adapters.placement import reservation, worker_of
from fleetledger.domain.nodes import (
    ComputeUnit,
    ContainerResources,
    JoinNode,
    NodeConfig,
    NodeState,
    OtherPodSpec,
    ReservePod,
    decide,
    evolve,
    initial_state,
)
from fleetledger.domain.placement import Pool, Snapshot, Worker, WorkloadRequest, plan
from fleetledger.domain.template import MachineTemplate

AT = datetime(2025, 1, 1, tzinfo=UTC)
GIB = 1 << 30
POOL = Pool(
    name="cpu",
    template=MachineTemplate(vm_size="Standard_D4s_v5"),
    worker_cpu_milli=4000,
    worker_memory_bytes=16 * GIB,
)


def request(rid: str, cpu: int = 1000, memory: int = GIB, **overrides: object) -> WorkloadRequest:
    return WorkloadRequest(id=rid, cpu_milli=cpu, memory_bytes=memory, **overrides)  # type: ignore[arg-type]


def worker(name: str) -> Worker:
    return Worker(
        name=name,
        pool="cpu",
        version=3,
        free_cpu_milli=4000,
        free_memory_bytes=16 * GIB,
        free_gpu=0,
    )


class TestCommit:
    def test_reservations_are_node_commands(self) -> None:
        """Each placement is the node's ReservePod of a non-VM pod requesting the workload."""
        result = plan(
            [request("a", 1500, 3 * GIB, gpu=0)], Snapshot(workers=(worker("w1"),)), [POOL]
        )
        container = ContainerResources(cpu_request_milli=1500, memory_request_bytes=3 * GIB)
        commands = {
            node: tuple(reservation(r, at=AT) for r in placed)
            for node, placed in result.reservations.items()
        }
        assert commands == {
            "w1": (ReservePod(OtherPodSpec(name="a", containers=(container,)), at=AT),)
        }

    def test_worker_room_counts_the_node_rounding(self) -> None:
        """The room is what the raw sums may grow by while their rounded-up totals still fit:
        two 300 milli-CPU workloads share one rounded CPU."""
        state = joined_node()
        for event in decide(state, reservation(request("a", 300, GIB // 2, gpu=1), at=AT)):
            state = evolve(state, event)
        assert worker_of(state, version=2, pool="gpu") == Worker(
            name="n1",
            pool="gpu",
            version=2,
            free_cpu_milli=3000 - 300,
            free_memory_bytes=15 * GIB - GIB // 2,
            free_gpu=1,
        )

    def test_the_node_accepts_everything_the_room_allows(self) -> None:
        """Filling a worker's room exactly with odd sizes is accepted by the node, command by
        command: the planner never asks a node for more than it grants."""
        state = joined_node()
        sizes = [(700, GIB // 3), (1100, GIB // 3), (1200, 7 * GIB), (0, 7 * GIB + GIB // 3)]
        reqs = [request(f"r{i}", cpu, memory) for i, (cpu, memory) in enumerate(sizes)]
        room = worker_of(state, version=1, pool="cpu")
        assert (room.free_cpu_milli, room.free_memory_bytes) == (3000, 15 * GIB)
        result = plan(reqs, Snapshot(workers=(room,)), [POOL])
        assert set(result.placed) == {r.id for r in reqs}
        for placed in result.reservations["n1"]:
            for event in decide(state, reservation(placed, at=AT)):
                state = evolve(state, event)
        assert worker_of(state, version=5, pool="cpu").free_cpu_milli == 0


def joined_node() -> NodeState:
    config = NodeConfig(
        cpu_system_milli=500,
        memory_system_slots=1,
        cpu_watermark=0.9,
        memory_watermark=0.9,
        compute_unit=ComputeUnit(250, 1),
        memory_slot_bytes=GIB,
    )
    state = initial_state()
    for event in decide(state, JoinNode("n1", 3600, 16 * GIB, 2, config, at=AT)):
        state = evolve(state, event)
    return state
