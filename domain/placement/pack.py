"""Overflow: the workloads no current worker can take, packed into the fewest new workers.

First-fit decreasing (seed 02, "``scheduleWithNewWorker`` only for requests that truly don't
fit"): the largest workloads first — size being the largest share of a worker they take, on any
resource — each into the first worker with room: workers already requested and not yet joined
first (their capacity is on its way), then the new ones opened so far, and only then a new worker
of the first pool that can hold it. FFD uses at most 11/9·OPT + 6/9 bins in one dimension and
reaches the minimum on the usual bursts of a few sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetledger.domain.placement.model import (
    NewWorker,
    PendingWorker,
    Pool,
    WorkloadRequest,
)
from fleetledger.domain.placement.pools import holds, pool_order, worker_room

__all__ = ["Packed", "pack_overflow"]


@dataclass(frozen=True, slots=True)
class Packed:
    """Where overflow went: onto workers already requested (``waiting``), or new ones."""

    waiting: dict[str, str] = field(default_factory=dict)
    provisions: tuple[NewWorker, ...] = ()


@dataclass(slots=True)
class _Bin:
    pool: Pool
    name: str
    cpu: int
    memory: int
    gpu: int
    ids: list[str]
    pending: bool

    def fits(self, request: WorkloadRequest) -> bool:
        return (
            request.cpu_milli <= self.cpu
            and request.memory_bytes <= self.memory
            and request.gpu <= self.gpu
        )

    def take(self, request: WorkloadRequest) -> None:
        self.cpu -= request.cpu_milli
        self.memory -= request.memory_bytes
        self.gpu -= request.gpu
        self.ids.append(request.id)


def _share(request: WorkloadRequest, pool: Pool) -> float:
    cpu, memory, gpu = worker_room(pool)
    return max(
        request.cpu_milli / cpu if cpu else 0.0,
        request.memory_bytes / memory if memory else 0.0,
        request.gpu / gpu if gpu else 0.0,
    )


def pack_overflow(
    requests: Sequence[WorkloadRequest],
    pools: Sequence[Pool],
    pending: Sequence[PendingWorker],
) -> Packed:
    """Pack ``requests`` (each held by some pool's empty worker) into pending and new workers."""
    by_name = {pool.name: pool for pool in pools}
    bins: dict[str, list[_Bin]] = {pool.name: [] for pool in pools}
    for worker in sorted(pending, key=lambda w: w.name):
        pool = by_name.get(worker.pool)
        if pool is not None:
            bins[pool.name].append(
                _Bin(
                    pool,
                    worker.name,
                    worker.free_cpu_milli,
                    worker.free_memory_bytes,
                    worker.free_gpu,
                    [],
                    pending=True,
                )
            )
    orders = {r.id: [p for p in pool_order(r, pools) if holds(p, r)] for r in requests}
    # Largest share first; the planning position breaks ties, so equal sizes keep their order.
    decreasing = sorted(
        range(len(requests)),
        key=lambda i: (-_share(requests[i], orders[requests[i].id][0]), i),
    )
    opened: list[_Bin] = []
    for index in decreasing:
        request = requests[index]
        target = next(
            (b for pool in orders[request.id] for b in bins[pool.name] if b.fits(request)), None
        )
        if target is None:
            pool = orders[request.id][0]
            target = _Bin(pool, "", *worker_room(pool), [], pending=False)
            bins[pool.name].append(target)
            opened.append(target)
        target.take(request)
    waiting = {
        request_id: b.name
        for pool_bins in bins.values()
        for b in pool_bins
        if b.pending
        for request_id in b.ids
    }
    return Packed(waiting, tuple(_new_worker(b) for b in opened))


def _new_worker(opened: _Bin) -> NewWorker:
    pool = opened.pool
    cpu, memory, gpu = worker_room(pool)
    # Named from its workloads, so planning the same overflow again names the same machine.
    digest = hashlib.blake2b("\n".join(sorted(opened.ids)).encode(), digest_size=5).hexdigest()
    return NewWorker(
        name=f"{pool.name}-{digest}",
        pool=pool.name,
        request_ids=tuple(opened.ids),
        used_cpu_milli=cpu - opened.cpu,
        used_memory_bytes=memory - opened.memory,
        used_gpu=gpu - opened.gpu,
    )
