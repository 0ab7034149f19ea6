"""The workers' free capacity, kept between batches and changed one worker at a time.

A batch touches a handful of workers out of thousands: rebuilding the planner's index of every
worker's room for each batch would cost O(workers) where the batch itself costs O(its
requests). :class:`Capacity` is that index kept up to date instead — :meth:`Capacity.put` a
worker whose room changed, :meth:`Capacity.discard` one that left — and
:func:`~fleetledger.domain.placement.plan_on` plans a batch on it directly.

A batch plans by taking room from workers (:meth:`Capacity.take`) inside :meth:`Capacity.trial`,
which gives every bit of it back when the trial ends: what a batch planned reaches this index
only as the workers' new rooms once its reservations are in the log, like any other change.

The order of the index is the planner's rule, not an accident of it: each available pool's
available workers sorted by (free GPUs, milli-CPU, memory, name), so the tightest fit is a
bisection away and workers left equally tight are told apart by name; and each pool's workers
by name, for the ``spread`` strategy.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from fleetledger.domain.placement.model import Pool, Worker, WorkloadRequest

__all__ = ["Capacity"]

_Key = tuple[int, int, int, str]


class Capacity:
    """Every worker the planner may see, by name, with the room of those that take workloads
    (``available``, in an available pool) indexed for the planner. Not thread-safe."""

    __slots__ = ("_free", "_keys", "_members", "_pools", "_undo", "_workers")

    def __init__(self, pools: Sequence[Pool], workers: Iterable[Worker] = ()) -> None:
        self._pools = tuple(pools)
        available = [p.name for p in self._pools if p.status == "available"]
        self._workers: dict[str, Worker] = {}
        # The planner's view: each tracked worker's free (gpu, cpu, memory), and per pool the
        # keys sorted as the module docstring says, and the names sorted.
        self._free: dict[str, tuple[int, int, int]] = {}
        self._keys: dict[str, list[_Key]] = {name: [] for name in available}
        self._members: dict[str, list[str]] = {name: [] for name in available}
        # While a trial runs: (worker, its free room before) for each take, oldest first.
        self._undo: list[tuple[str, tuple[int, int, int]]] | None = None
        for worker in workers:
            self.put(worker)

    @property
    def pools(self) -> tuple[Pool, ...]:
        return self._pools

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, name: object) -> bool:
        return name in self._workers

    def get(self, name: str) -> Worker | None:
        """The worker as last put (whatever its status), or ``None``."""
        return self._workers.get(name)

    def workers(self) -> tuple[Worker, ...]:
        """Every worker, by name (O(workers): for reports, not for batches)."""
        return tuple(self._workers[name] for name in sorted(self._workers))

    def put(self, worker: Worker) -> None:
        """Count ``worker`` as it is now (replacing what was known of it)."""
        self._no_trial()
        self._untrack(worker.name)
        self._workers[worker.name] = worker
        keys = self._keys.get(worker.pool)
        if worker.status != "available" or keys is None:
            return
        # Values come from node states, which never go negative; clamp anyway, since a
        # negative free amount would let the planner hand out capacity that is not there.
        free = (
            max(0, worker.free_gpu),
            max(0, worker.free_cpu_milli),
            max(0, worker.free_memory_bytes),
        )
        self._free[worker.name] = free
        insort(keys, (*free, worker.name))
        insort(self._members[worker.pool], worker.name)

    def discard(self, name: str) -> None:
        """Forget the worker ``name`` (its node left); nothing if it was not there."""
        self._no_trial()
        self._untrack(name)
        self._workers.pop(name, None)

    def _untrack(self, name: str) -> None:
        free = self._free.pop(name, None)
        if free is None:
            return
        pool = self._workers[name].pool
        keys = self._keys[pool]
        del keys[bisect_left(keys, (*free, name))]
        members = self._members[pool]
        del members[bisect_left(members, name)]

    def _no_trial(self) -> None:
        if self._undo is not None:
            raise RuntimeError("a worker changed while a batch was planned on the capacity")

    # -- planning a batch -------------------------------------------------------------------------

    @contextmanager
    def trial(self) -> Iterator[Capacity]:
        """Plan one batch: the room it takes (:meth:`take`) is given back when the trial ends,
        however it ends."""
        self._no_trial()
        self._undo = []
        try:
            yield self
        finally:
            undo, self._undo = self._undo, None
            for name, before in reversed(undo):
                self._move(name, before)

    def tracks(self, name: str) -> bool:
        """Whether ``name`` takes workloads: an available worker of an available pool."""
        return name in self._free

    def fits(self, name: str, request: WorkloadRequest) -> bool:
        gpu, cpu, memory = self._free[name]
        return request.gpu <= gpu and request.cpu_milli <= cpu and request.memory_bytes <= memory

    def tightest(self, pool: str, request: WorkloadRequest, tie: int) -> str | None:
        """The worker of ``pool`` that ``request`` fits most tightly, ``tie`` choosing among
        those left equally tight in name order; or ``None``."""
        keys = self._keys[pool]
        gpu, cpu, memory = request.gpu, request.cpu_milli, request.memory_bytes
        start = bisect_left(keys, (gpu, cpu, memory, ""))
        for at in range(start, len(keys)):
            free_gpu, free_cpu, free_memory, _ = keys[at]
            if free_cpu >= cpu and free_memory >= memory:
                end = bisect_left(keys, (free_gpu, free_cpu, free_memory + 1), at)
                return keys[at + tie % (end - at)][3]
        return None

    def spread(self, pool: str, request: WorkloadRequest, tie: int) -> str | None:
        """Any worker of ``pool`` that ``request`` fits, chosen by ``tie`` among them in name
        order (beta9's ``applyWorkerAffinity``), or ``None``."""
        gpu, cpu, memory = request.gpu, request.cpu_milli, request.memory_bytes
        free = self._free
        fitting = [
            name
            for name in self._members[pool]
            if gpu <= free[name][0] and cpu <= free[name][1] and memory <= free[name][2]
        ]
        return fitting[tie % len(fitting)] if fitting else None

    def take(self, name: str, request: WorkloadRequest) -> None:
        """Set ``request``'s room aside on ``name`` for the rest of the trial."""
        if self._undo is None:
            raise RuntimeError("room is taken only within a trial (Capacity.trial)")
        before = self._free[name]
        self._undo.append((name, before))
        gpu, cpu, memory = before
        self._move(
            name, (gpu - request.gpu, cpu - request.cpu_milli, memory - request.memory_bytes)
        )

    def _move(self, name: str, free: tuple[int, int, int]) -> None:
        keys = self._keys[self._workers[name].pool]
        del keys[bisect_left(keys, (*self._free[name], name))]
        self._free[name] = free
        insort(keys, (*free, name))
