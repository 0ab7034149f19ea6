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
from collections.abc import Container, Sequence

from fleetledger.domain.placement.capacity import Capacity
from fleetledger.domain.placement.model import (
    PendingWorker,
    PlacementPlan,
    Pool,
    Snapshot,
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
    "plan_on",
]


def _tie_hash(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")


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
    return plan_on(
        requests,
        Capacity(pools, snapshot.workers),
        pending=snapshot.pending,
        retired=snapshot.retired,
        search_steps=search_steps,
    )


def plan_on(
    requests: Sequence[WorkloadRequest],
    capacity: Capacity,
    *,
    pending: Sequence[PendingWorker] = (),
    retired: Container[str] = frozenset(),
    search_steps: int = DEFAULT_SEARCH_STEPS,
) -> PlacementPlan:
    """:func:`plan` on a :class:`Capacity` kept between batches, with the workers still being
    provisioned (``pending``) and the names never to ask for again (``retired``): the same plan
    as :func:`plan` on a snapshot of the same workers, for the work of the batch alone (the
    capacity is as it was when it returns)."""
    check_search_steps(search_steps)
    pools = capacity.pools
    ordered, rejected = _admitted(requests, pools)
    by_name = {p.name: p for p in pools}
    spreading = {p.name for p in pools if p.strategy == "spread"}
    placed: dict[str, str] = {}
    reservations: dict[str, list[WorkloadRequest]] = {}
    with capacity.trial() as tracker:

        def place(name: str, request: WorkloadRequest) -> None:
            tracker.take(name, request)
            placed[request.id] = name
            reservations.setdefault(name, []).append(request)

        # A joined worker was requested for its waiting workloads: they go on it before
        # anything else.
        joined = [p for p in pending if tracker.tracks(p.name)]
        owner = {rid: p.name for p in joined for rid in p.request_ids}
        for request in ordered:
            name = owner.get(request.id)
            if name is None:
                continue
            worker = capacity.get(name)
            pool = by_name.get(worker.pool) if worker is not None else None
            if pool is not None and eligible(request, pool) and tracker.fits(name, request):
                place(name, request)

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
        still_pending = [p for p in pending if not tracker.tracks(p.name)]
    packed = (
        pack_overflow(overflow, pools, still_pending, search_steps=search_steps, retired=retired)
        if overflow
        else None
    )
    return PlacementPlan(
        placed=placed,
        reservations={node: tuple(placed) for node, placed in reservations.items()},
        versions={node: _version(capacity, node) for node in reservations},
        waiting=packed.waiting if packed else {},
        provisions=packed.provisions if packed else (),
        rejected=rejected,
        optimality_gap=packed.optimality_gap if packed else 0,
    )


def _version(capacity: Capacity, node: str) -> int:
    worker = capacity.get(node)
    assert worker is not None  # a worker the batch placed on is in the capacity
    return worker.version
