"""Batch workload placement (docs/ARCHITECTURE.md, "Workload placement"): a batch on one snapshot.

Seed 02's scheduler placed requests one at a time against a cache it invalidated after each; by
the fiftieth request the cache showed every worker full and it asked for 50+ workers that were not
needed. :func:`plan` takes the batch and **one** :class:`Snapshot` of node capacity, keeps an
in-memory tracker per worker (so nothing in the batch is double-booked) and decides everything
before anything is written:

* requests go in a fixed order — priority (highest first), then arrival;
* a request may use the pools :func:`~fleetledger.domain.placement.eligible` allows: its
  selector's pool (no selector: only pools that require none), GPU workers of an accepted type for
  a GPU request and only non-GPU workers otherwise, never a preemptible worker for a
  non-preemptible request, never a draining or disabled pool or worker;
* it goes to the first pool, by pool priority then GPU type preference, with a worker it fits on
  cpu, memory and GPU; within a ``binpack`` pool (the default) to the worker it fits most
  tightly (fewest GPUs, then milli-CPU, then memory left) — best fit keeps whole workers free for
  large requests and lets empty ones drain. Workers left equally tight are chosen between by a
  hash of the request id: the same batch always lands the same way, and equal workers share the
  load. Within a ``spread`` pool a CPU-only request goes to any worker it fits, the same hash
  choosing among them in name order — beta9's worker affinity (``applyWorkerAffinity`` rotates
  the fitting workers by a hash of the container id), which spreads CPU work and its node
  contention across the pool; GPU requests are packed there too, as beta9 applies affinity to
  CPU-only work only;
* requests a worker already requested was meant for are placed on it first once it has joined;
* what fits no worker is packed (:func:`~fleetledger.domain.placement.pack_overflow`) into
  workers already requested and then into the fewest new ones — exactly, within a budget of
  ``search_steps`` (the plan's ``optimality_gap`` says how far from proven minimal it may be);
  a request no pool could ever hold is rejected at once, with the reason.

The plan names, per touched worker, the workloads placed on it and the snapshot version it was
planned on; turning those into the node aggregate's reservations, and node states into
:class:`Worker` rooms, is the placement adapter's work, so this package depends on no other
capability's model.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from operator import attrgetter

from fleetledger.domain.placement.model import (
    PlacementPlan,
    Pool,
    Snapshot,
    Worker,
    WorkloadRequest,
)
from fleetledger.domain.placement.pack import (
    DEFAULT_SEARCH_STEPS,
    check_search_steps,
    pack_overflow,
)
from fleetledger.domain.placement.pools import (
    check_request,
    eligible,
    never_fits,
    pool_order,
)

__all__ = [
    "plan",
]


def _tie_hash(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")


class _Tracker:
    """Free capacity per worker for one batch, each pool's workers sorted by (gpu, cpu, memory)
    free so the tightest fit is a bisection away."""

    __slots__ = ("cpu", "gpu", "index", "keys", "members", "memory", "pool_of", "workers")

    def __init__(self, workers: Iterable[Worker], pools: Sequence[Pool]) -> None:
        available = {p.name for p in pools if p.status == "available"}
        self.workers = sorted(
            (w for w in workers if w.status == "available" and w.pool in available),
            key=attrgetter("name"),
        )
        self.index: dict[str, int] = {}
        self.cpu: list[int] = []
        self.memory: list[int] = []
        self.gpu: list[int] = []
        self.pool_of: list[str] = []
        self.keys: dict[str, list[tuple[int, int, int, int]]] = {p: [] for p in available}
        # Each spreading pool's workers in name order, listed when first needed.
        self.members: dict[str, list[int]] = {}
        for i, w in enumerate(self.workers):
            # Values come from node states, which never go negative; clamp anyway, since a
            # negative free amount would let the tracker hand out capacity that is not there.
            cpu = w.free_cpu_milli if w.free_cpu_milli > 0 else 0
            memory = w.free_memory_bytes if w.free_memory_bytes > 0 else 0
            gpu = w.free_gpu if w.free_gpu > 0 else 0
            self.index[w.name] = i
            self.cpu.append(cpu)
            self.memory.append(memory)
            self.gpu.append(gpu)
            self.pool_of.append(w.pool)
            self.keys[w.pool].append((gpu, cpu, memory, i))
        for keys in self.keys.values():
            keys.sort()

    def _key(self, i: int) -> tuple[int, int, int, int]:
        return (self.gpu[i], self.cpu[i], self.memory[i], i)

    def fits(self, i: int, request: WorkloadRequest) -> bool:
        return (
            request.gpu <= self.gpu[i]
            and request.cpu_milli <= self.cpu[i]
            and request.memory_bytes <= self.memory[i]
        )

    def tightest(self, pool: str, request: WorkloadRequest, tie: int) -> int | None:
        """The worker of ``pool`` that ``request`` fits most tightly, or ``None``."""
        keys = self.keys[pool]
        gpu, cpu, memory = request.gpu, request.cpu_milli, request.memory_bytes
        start = bisect_left(keys, (gpu, cpu, memory, -1))
        for at in range(start, len(keys)):
            free_gpu, free_cpu, free_memory, _ = keys[at]
            if free_cpu >= cpu and free_memory >= memory:
                end = bisect_left(keys, (free_gpu, free_cpu, free_memory + 1), at)
                return keys[at + tie % (end - at)][3]
        return None

    def spread(self, pool: str, request: WorkloadRequest, tie: int) -> int | None:
        """Any worker of ``pool`` that ``request`` fits, chosen by ``tie`` among them in name
        order (beta9's ``applyWorkerAffinity``), or ``None``."""
        members = self.members.get(pool)
        if members is None:
            members = self.members[pool] = [
                i for i, name in enumerate(self.pool_of) if name == pool
            ]
        gpu, cpu, memory = request.gpu, request.cpu_milli, request.memory_bytes
        fitting = [
            i
            for i in members
            if gpu <= self.gpu[i] and cpu <= self.cpu[i] and memory <= self.memory[i]
        ]
        return fitting[tie % len(fitting)] if fitting else None

    def take(self, i: int, request: WorkloadRequest) -> None:
        keys = self.keys[self.pool_of[i]]
        del keys[bisect_left(keys, self._key(i))]
        self.gpu[i] -= request.gpu
        self.cpu[i] -= request.cpu_milli
        self.memory[i] -= request.memory_bytes
        insort(keys, self._key(i))


def _admitted(
    requests: Sequence[WorkloadRequest], pools: Sequence[Pool]
) -> tuple[list[WorkloadRequest], dict[str, str]]:
    """The requests to plan, once each, in planning order (priority, then arrival), and the
    ones refused with the reason."""
    rejected: dict[str, str] = {}
    valid: list[WorkloadRequest] = []
    seen: set[str] = set()
    for request in requests:
        if request.id in seen:
            continue  # the same workload sent twice: one answer for both
        seen.add(request.id)
        problem = check_request(request)
        if problem is None:
            problem = never_fits(request, pools)
        if problem is not None:
            rejected.setdefault(str(request.id), problem)
            continue
        valid.append(request)
    order = sorted(range(len(valid)), key=lambda i: (-valid[i].priority, i))
    return [valid[i] for i in order], rejected


def plan(
    requests: Sequence[WorkloadRequest],
    snapshot: Snapshot,
    pools: Sequence[Pool],
    *,
    search_steps: int = DEFAULT_SEARCH_STEPS,
) -> PlacementPlan:
    """Place ``requests`` on ``snapshot`` (read once for the batch); see the module docstring.

    ``search_steps`` bounds the exact search for the fewest new workers (0: first-fit
    decreasing alone); a negative or non-integer budget is a ``ValueError``.
    """
    check_search_steps(search_steps)
    ordered, rejected = _admitted(requests, pools)
    tracker = _Tracker(snapshot.workers, pools)
    by_name = {p.name: p for p in pools}
    spreading = {p.name for p in pools if p.strategy == "spread"}
    placed: dict[str, str] = {}
    reservations: dict[str, list[WorkloadRequest]] = {}

    def place(i: int, request: WorkloadRequest) -> None:
        tracker.take(i, request)
        worker = tracker.workers[i]
        placed[request.id] = worker.name
        reservations.setdefault(worker.name, []).append(request)

    # A joined worker was requested for its waiting workloads: they go on it before anything else.
    joined = [p for p in snapshot.pending if p.name in tracker.index]
    owner = {rid: p.name for p in joined for rid in p.request_ids}
    for request in ordered:
        name = owner.get(request.id)
        if name is None:
            continue
        i = tracker.index[name]
        pool = by_name.get(tracker.pool_of[i])
        if pool is not None and eligible(request, pool) and tracker.fits(i, request):
            place(i, request)

    orders: dict[tuple[object, ...], tuple[str, ...]] = {}
    overflow: list[WorkloadRequest] = []
    for request in ordered:
        if request.id in placed:
            continue
        shape = (request.selector, request.gpu > 0, request.gpu_types, request.preemptible)
        names = orders.get(shape)
        if names is None:
            names = orders[shape] = tuple(p.name for p in pool_order(request, pools))
        tie = _tie_hash(request.id)
        spread = request.gpu == 0 and bool(spreading)
        for pool_name in names:
            if spread and pool_name in spreading:
                chosen = tracker.spread(pool_name, request, tie)
            else:
                chosen = tracker.tightest(pool_name, request, tie)
            if chosen is not None:
                place(chosen, request)
                break
        else:
            overflow.append(request)

    still_pending = [p for p in snapshot.pending if p.name not in tracker.index]
    packed = (
        pack_overflow(
            overflow, pools, still_pending, search_steps=search_steps, retired=snapshot.retired
        )
        if overflow
        else None
    )
    return PlacementPlan(
        placed=placed,
        reservations={node: tuple(placed) for node, placed in reservations.items()},
        versions={node: tracker.workers[tracker.index[node]].version for node in reservations},
        waiting=packed.waiting if packed else {},
        provisions=packed.provisions if packed else (),
        rejected=rejected,
        optimality_gap=packed.optimality_gap if packed else 0,
    )
