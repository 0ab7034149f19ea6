"""Where placement meets node accounting: a node's state read as a placement :class:`Worker`, and a
placed workload written as the node command that sets its resources aside.

The two domain packages know nothing of each other; this module is the one translation between
them, so a change to either model shows up here and nowhere else.
"""

from __future__ import annotations

from datetime import datetime

from fleetledger.domain.nodes import (
    MILLI_PER_CPU,
    ContainerResources,
    NodeState,
    OtherPodSpec,
    ReservePod,
    other_reserved,
)
from fleetledger.domain.placement import Worker, WorkerStatus, WorkloadRequest

__all__ = ["reservation", "worker_of"]


def worker_of(
    state: NodeState, *, version: int, pool: str, status: WorkerStatus = "available"
) -> Worker:
    """What the node in ``state`` (at stream ``version``) can still take, as a worker of ``pool``.

    Workloads are non-VM pods, whose raw sums count toward the node rounded up to whole CPUs and
    slots; so the node takes a workload while the rounded-up sums stay within what remains plus
    what those sums hold already. The room is given in raw amounts: exact, and additive within a
    batch. A node not (or no longer) present offers nothing.
    """
    if not state.present or state.config is None:
        return Worker(
            name=state.name,
            pool=pool,
            version=version,
            free_cpu_milli=0,
            free_memory_bytes=0,
            free_gpu=0,
            status=status,
        )
    slot = max(1, state.config.memory_slot_bytes)
    other_cpu, other_slots = other_reserved(state)
    cpu_room = (state.cpu.remaining + other_cpu) // MILLI_PER_CPU * MILLI_PER_CPU
    memory_room = (state.memory.remaining + other_slots) * slot
    return Worker(
        name=state.name,
        pool=pool,
        version=version,
        free_cpu_milli=max(0, cpu_room - state.other_raw_cpu_milli),
        free_memory_bytes=max(0, memory_room - state.other_raw_memory_bytes),
        free_gpu=max(0, state.gpu_total - state.gpu_reserved),
        status=status,
    )


def reservation(request: WorkloadRequest, *, at: datetime) -> ReservePod:
    """The node command that sets ``request``'s resources aside: a non-VM pod named by the
    workload id, with one container requesting the workload's amounts. (Not a VM pod: those are
    scaled by agents and chosen for migration, which a batch workload is not.)"""
    return ReservePod(
        OtherPodSpec(
            name=request.id,
            containers=(
                ContainerResources(
                    cpu_request_milli=request.cpu_milli,
                    memory_request_bytes=request.memory_bytes,
                    gpu=request.gpu,
                ),
            ),
        ),
        at=at,
    )
