"""Workers requested for overflow and not yet joined, with the workloads waiting for them.

The book is what makes overflow count "capacity already requested": each pending worker keeps
what remains of it once its waiting workloads are counted, and the planner fills that before
asking for another. Not thread-safe: the placement service guards it with its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from fleetledger.domain.placement import (
    PendingWorker,
    PlacementPlan,
    Pool,
    WorkloadRequest,
    worker_room,
)

__all__ = ["WaitingBook"]


class WaitingBook:
    """Pending workers by name."""

    __slots__ = ("_pending", "_pools")

    def __init__(self, pools: Sequence[Pool]) -> None:
        self._pools = {p.name: p for p in pools}
        self._pending: dict[str, PendingWorker] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def workers(self) -> tuple[PendingWorker, ...]:
        return tuple(self._pending[name] for name in sorted(self._pending))

    def waiting(self) -> Iterator[tuple[str, str]]:
        """``(workload id, worker)`` for every waiting workload."""
        for name in sorted(self._pending):
            for rid in self._pending[name].request_ids:
                yield rid, name

    def joined(self, present: Callable[[str], bool]) -> list[str]:
        """The workloads waiting for workers now ``present`` as nodes."""
        return [
            rid
            for name in sorted(self._pending)
            if present(name)
            for rid in self._pending[name].request_ids
        ]

    def copy(self) -> WaitingBook:
        """The book as it stands, to go back to if a batch's outcomes never reach the log."""
        book = WaitingBook(())
        book._pools, book._pending = self._pools, dict(self._pending)
        return book

    def restore(self, workers: Iterable[PendingWorker]) -> None:
        """Count ``workers`` as on their way, with their waiting workloads (read back from the
        log at a restart); a worker already in the book is replaced."""
        for worker in workers:
            self._pending[worker.name] = worker

    def drop(self, names: Iterable[str]) -> None:
        """Forget workers that joined: their workloads were just planned."""
        for name in names:
            self._pending.pop(name, None)

    def record(self, result: PlacementPlan, requests: Mapping[str, WorkloadRequest]) -> None:
        """Count a plan's overflow: workloads onto pending workers, and the new workers."""
        for rid, name in result.waiting.items():
            current, request = self._pending.get(name), requests.get(rid)
            if current is not None and request is not None:
                self._pending[name] = _taken(current, request, +1)
        for new in result.provisions:
            cpu, memory, gpu = worker_room(self._pools[new.pool])
            self._pending[new.name] = PendingWorker(
                name=new.name,
                pool=new.pool,
                request_ids=new.request_ids,
                free_cpu_milli=cpu - new.used_cpu_milli,
                free_memory_bytes=memory - new.used_memory_bytes,
                free_gpu=gpu - new.used_gpu,
            )

    def unwait(self, request: WorkloadRequest) -> None:
        """``request`` no longer waits (released, or placed elsewhere): its share comes back."""
        for name, pending in list(self._pending.items()):
            if request.id in pending.request_ids:
                self._pending[name] = _taken(pending, request, -1)


def _taken(pending: PendingWorker, request: WorkloadRequest, sign: int) -> PendingWorker:
    ids = (
        (*pending.request_ids, request.id)
        if sign > 0
        else tuple(r for r in pending.request_ids if r != request.id)
    )
    return replace(
        pending,
        request_ids=ids,
        free_cpu_milli=pending.free_cpu_milli - sign * request.cpu_milli,
        free_memory_bytes=pending.free_memory_bytes - sign * request.memory_bytes,
        free_gpu=pending.free_gpu - sign * request.gpu,
    )
