"""Overflow: the workloads no current worker can take, packed into the fewest new workers.

Two passes, both deterministic:

1. **First-fit decreasing** (seed 02, "``scheduleWithNewWorker`` only for requests that truly
   don't fit"): the largest workloads first — size being the largest share of a worker they
   take, on any resource — each into the first worker with room: workers already requested and
   not yet joined first (their capacity is on its way), then the new ones opened so far, and only
   then a new worker of the first pool that can hold it. FFD uses at most 11/9·OPT + 6/9 bins in
   one dimension, but it is not minimal: six workloads of 2000, 1600, 1600, 1200, 800 and 800
   milli-CPU take three 4,000m workers by FFD and fit on two.
2. **An exact search** when FFD's plan asks for more new workers than a lower bound proves
   necessary: branch and bound over the workloads, largest first, each tried on every worker it
   fits (cpu, memory and GPUs together) and on a new worker of its first pool. A branch is cut
   when the new workers it has opened plus a lower bound on those the rest still need (per
   resource, what is left to place beyond the room of the open workers, over a new worker's
   room; and the workloads above half a worker on a resource, no two of which share one) reach
   the best plan's. Two symmetries are cut: workers left with equal room are tried once, and
   identical workloads take workers in order. FFD's plan is the first incumbent, so the search
   only ever replaces it with one asking for fewer new workers, and it stops as soon as a plan
   meets the lower bound.

The lower bound that decides whether to search and proves a plan minimal is Martello and
Toth's L2 (1990), per resource: for every threshold ``k ≤ C/2``, workloads above ``C − k`` and
those above ``C/2`` each need a worker of their own, and workloads of at least ``k`` fill the
room the latter leave before asking for more. Workers already requested count as workers
holding a workload of the room they no longer have.

The search reads no clock: its budget is a count of search steps (one per node of the search
tree), so the same overflow gives the same plan on any machine. When the budget runs out the
best plan found so far stands — FFD's unless the search improved on it — and
:attr:`Packed.optimality_gap` says by how many workers it may exceed the minimum: the workers it
asks for minus the best lower bound proven (0 when the plan is proven minimal).

"Fewest" is counted among the plans that keep pool priority and GPU type preference: a workload
may share any worker of a pool it allows, but every new worker must hold a workload whose first
pool is the worker's — no worker is asked for in a pool no workload in it prefers. (FFD's plans
are such plans.) Workloads whose pools are disjoint are packed apart: a CPU burst and a GPU
burst share no worker.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from fleetledger.domain.placement.model import (
    NewWorker,
    PendingWorker,
    Pool,
    WorkloadRequest,
)
from fleetledger.domain.placement.pools import pool_order, worker_room

__all__ = ["DEFAULT_SEARCH_STEPS", "Packed", "check_search_steps", "pack_overflow"]

DEFAULT_SEARCH_STEPS = 1_000
"""Search steps one batch's overflow may spend improving on FFD's plan or proving it minimal.

A step is one node of the search tree, some ten microseconds of work with a few dozen workers
open, so the search adds at most ~10–20 ms to a batch — only to one whose first-fit plan asks
for more workers than the lower bound proves necessary. Measured on random overflows of
0.1–4 CPUs and 0.5–4 GiB onto 4-CPU workers: overflows of 10 workloads are all settled (proven
minimal) within it; of 100, about one batch in five keeps a gap, of a worker."""

_Room = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Packed:
    """Where overflow went: onto workers already requested (``waiting``), or new ones; and how
    many more new workers than the minimum the plan may ask for (0: proven minimal)."""

    waiting: dict[str, str] = field(default_factory=dict)
    provisions: tuple[NewWorker, ...] = ()
    optimality_gap: int = 0


def check_search_steps(search_steps: object) -> int:
    """``search_steps`` if it is a valid budget (a non-negative integer), else ``ValueError``."""
    if type(search_steps) is not int or search_steps < 0:
        raise ValueError(
            "search_steps must be a non-negative integer, the exact search's budget in steps "
            f"({DEFAULT_SEARCH_STEPS} by default; 0 keeps first-fit decreasing), "
            f"got {search_steps!r}"
        )
    return search_steps


@dataclass(frozen=True, slots=True)
class _Item:
    """One overflowing request: what it takes, the pools that may hold it (best first) and its
    place in decreasing order."""

    request: WorkloadRequest
    need: _Room
    pools: tuple[str, ...]
    rank: int


def pack_overflow(
    requests: Sequence[WorkloadRequest],
    pools: Sequence[Pool],
    pending: Sequence[PendingWorker],
    *,
    search_steps: int = DEFAULT_SEARCH_STEPS,
    retired: Container[str] = frozenset(),
) -> Packed:
    """Pack ``requests`` (each held by some pool's empty worker) into pending and new workers,
    spending at most ``search_steps`` steps of exact search (0: first-fit decreasing alone).
    No new worker takes a ``retired`` name."""
    check_search_steps(search_steps)
    by_name = {pool.name: pool for pool in pools}
    rooms = {pool.name: worker_room(pool) for pool in pools}
    items = _items(requests, pools, rooms)
    workers = [w for w in sorted(pending, key=lambda w: w.name) if w.pool in by_name]
    budget, gap = search_steps, 0
    waiting: dict[str, str] = {}
    opened: list[tuple[int, Pool, list[_Item]]] = []
    for group, own in _groups(items, workers):
        problem = _Problem(group, own, rooms)
        plan = problem.first_fit_decreasing()
        floor = problem.lower_bound()
        if len(plan.new_pools) > floor and budget > 0:
            search = _Search(problem, plan, floor, budget)
            plan = search.run()
            budget -= search.steps
            gap += search.gap
        else:
            gap += len(plan.new_pools) - floor
        slots: list[list[_Item]] = [[] for _ in range(len(own) + len(plan.new_pools))]
        for item in group:
            slots[plan.where[item.request.id]].append(item)
        for worker, taken in zip(own, slots, strict=False):
            waiting.update(dict.fromkeys((i.request.id for i in taken), worker.name))
        for name, taken in zip(plan.new_pools, slots[len(own) :], strict=True):
            opened.append((taken[0].rank, by_name[name], taken))
    # New workers in the order first-fit decreasing opens them: by their largest workload.
    opened.sort(key=lambda new: new[0])
    return Packed(
        waiting, tuple(_new_worker(pool, taken, retired) for _, pool, taken in opened), gap
    )


def _items(
    requests: Sequence[WorkloadRequest], pools: Sequence[Pool], rooms: Mapping[str, _Room]
) -> list[_Item]:
    """``requests`` with the pools whose empty worker holds them, largest share of a worker
    first; the planning position breaks ties, so equal sizes keep their order."""
    orders: dict[tuple[object, ...], tuple[str, ...]] = {}
    found = []
    for index, request in enumerate(requests):
        shape = (request.selector, request.gpu > 0, request.gpu_types, request.preemptible)
        usable = orders.get(shape)
        if usable is None:
            usable = orders[shape] = tuple(p.name for p in pool_order(request, pools))
        need = (request.cpu_milli, request.memory_bytes, request.gpu)
        holding = tuple(name for name in usable if _fits(need, rooms[name]))
        found.append((-_share(need, rooms[holding[0]]), index, request, need, holding))
    found.sort(key=lambda f: (f[0], f[1]))
    return [
        _Item(request, need, holding, rank)
        for rank, (_, _, request, need, holding) in enumerate(found)
    ]


def _fits(need: _Room, room: Sequence[int]) -> bool:
    return need[0] <= room[0] and need[1] <= room[1] and need[2] <= room[2]


def _share(need: _Room, room: _Room) -> float:
    return max(need[d] / room[d] if room[d] else 0.0 for d in range(3))


def _groups(
    items: Sequence[_Item], workers: Sequence[PendingWorker]
) -> list[tuple[list[_Item], list[PendingWorker]]]:
    """``items`` in groups that share no pool (each in decreasing order; groups in the order
    of their largest item), each with the pending workers of its pools."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for item in items:
        first = root(item.pools[0])
        for other in item.pools[1:]:
            top = root(other)
            if top != first:
                parent[max(top, first)] = min(top, first)
                first = min(top, first)
    groups: dict[str, list[_Item]] = {}
    for item in items:
        groups.setdefault(root(item.pools[0]), []).append(item)
    return [
        (group, [w for w in workers if w.pool in parent and root(w.pool) == key])
        for key, group in groups.items()
    ]


# -- one group -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where each request goes: a worker slot — the group's pending workers first, then the new
    workers, whose pools ``new_pools`` names in slot order."""

    where: Mapping[str, int]
    new_pools: tuple[str, ...]


class _Problem:
    """One group of overflow: its items (decreasing), its pending workers, the pools' rooms."""

    __slots__ = ("cap", "items", "rooms", "workers")

    def __init__(
        self, items: Sequence[_Item], workers: Sequence[PendingWorker], rooms: Mapping[str, _Room]
    ) -> None:
        self.items = items
        self.workers = workers
        self.rooms = rooms
        # The room of the largest worker of the group per resource: every worker, new or
        # pending, holds at most that much (what the lower bounds divide by).
        names = {name for item in items for name in item.pools}
        largest = [rooms[name] for name in names]
        largest += [(w.free_cpu_milli, w.free_memory_bytes, w.free_gpu) for w in workers]
        self.cap = tuple(max(room[d] for room in largest) for d in range(3))

    def first_fit_decreasing(self) -> _Plan:
        """Each item, largest first, on the first worker of its first usable pool with room —
        pending ones, then new ones — else on a new worker of its first pool."""
        free = [[w.free_cpu_milli, w.free_memory_bytes, w.free_gpu] for w in self.workers]
        of_pool: dict[str, list[int]] = {}
        for slot, worker in enumerate(self.workers):
            of_pool.setdefault(worker.pool, []).append(slot)
        new_pools: list[str] = []
        where: dict[str, int] = {}
        for item in self.items:
            cpu, memory, gpu = item.need
            target = None
            for name in item.pools:
                for slot in of_pool.get(name, ()):
                    row = free[slot]
                    if cpu <= row[0] and memory <= row[1] and gpu <= row[2]:
                        target = slot
                        break
                if target is not None:
                    break
            if target is None:
                name = item.pools[0]
                target = len(free)
                free.append(list(self.rooms[name]))
                of_pool.setdefault(name, []).append(target)
                new_pools.append(name)
            row = free[target]
            row[0] -= cpu
            row[1] -= memory
            row[2] -= gpu
            where[item.request.id] = target
        return _Plan(where, tuple(new_pools))

    def lower_bound(self) -> int:
        """New workers the group needs at least: Martello and Toth's L2 per resource, the
        pending workers counted as workers already holding what they no longer have room for."""
        lower = 0
        for d in range(3):
            cap = self.cap[d]
            if cap <= 0:
                continue
            held = [cap - max(0, min(cap, w)) for w in self._free(d)]
            sizes = [item.need[d] for item in self.items] + held
            lower = max(lower, _l2(sizes, cap) - len(held))
        return lower

    def _free(self, d: int) -> list[int]:
        return [(w.free_cpu_milli, w.free_memory_bytes, w.free_gpu)[d] for w in self.workers]


def _l2(sizes: list[int], cap: int) -> int:
    """Martello and Toth's L2: a lower bound on the bins of room ``cap`` holding ``sizes``."""
    ordered = sorted(sizes)
    prefix = [0, *accumulate(ordered)]
    n = len(ordered)
    half = bisect_right(ordered, cap // 2)  # ordered[half:] take more than half a bin
    best = 0
    for k in {0, *ordered[:half]}:
        # J1: above cap − k; J2: above half and at most cap − k; J3: from k to half.
        j1_start = bisect_right(ordered, cap - k)
        j2 = j1_start - half if j1_start > half else 0
        j3_start = bisect_left(ordered, k)
        j3_sum = prefix[half] - prefix[j3_start] if half > j3_start else 0
        j2_room = j2 * cap - (prefix[j1_start] - prefix[half]) if j2 else 0
        spill = j3_sum - j2_room
        bound = (n - j1_start) + j2 + (-(-spill // cap) if spill > 0 else 0)
        best = max(best, bound)
    return best


class _OutOfSteps(Exception):
    pass


class _Search:
    """Branch and bound for one group's fewest new workers (see the module docstring).

    A plan may put a workload on any worker of a pool it allows, and asks for a new worker of a
    pool only for a workload whose first pool that is (the worker's *anchor*): a new worker
    opened by a workload for another of its pools is kept only if a later workload anchors it.
    That makes the plans searched those where every new worker holds a workload that prefers its
    pool, whatever order the workloads are taken in — FFD's plan is one of them.

    :meth:`run` returns the best plan found — the incumbent unless one with fewer new workers
    was found — and sets :attr:`steps` (spent) and :attr:`gap` (the plan's new workers minus
    ``floor``, or 0 when the search completed or met ``floor``).
    """

    def __init__(self, problem: _Problem, incumbent: _Plan, floor: int, budget: int) -> None:
        self.problem = problem
        self.floor = floor
        self.budget = budget
        self.steps = 0
        self.gap = len(incumbent.new_pools) - floor
        self.best = len(incumbent.new_pools)
        self.best_plan = incumbent
        # Identical items side by side (so that their order can be fixed), largest first.
        rooms = problem.rooms
        items = sorted(
            problem.items,
            key=lambda i: (
                -_share(i.need, rooms[i.pools[0]]),
                tuple(-x for x in i.need),
                i.pools,
                i.rank,
            ),
        )
        n = len(items)
        self.ids = [i.request.id for i in items]
        self.need = [i.need for i in items]
        self.order = [i.pools for i in items]
        self.pools = [frozenset(i.pools) for i in items]
        self.first = [i.pools[0] for i in items]
        self.same = [
            k > 0 and self.need[k] == self.need[k - 1] and self.pools[k] == self.pools[k - 1]
            for k in range(n)
        ]
        cap = self.cap = problem.cap
        # From item k on: what is left to place, how many take more than half a worker, and
        # how many have each pool first (the anchors still to come).
        self.left = [[0] * (n + 1) for _ in range(3)]
        self.large = [[0] * (n + 1) for _ in range(3)]
        self.anchors_left = {name: [0] * (n + 1) for name in self.first}
        for k in range(n - 1, -1, -1):
            for d in range(3):
                size = self.need[k][d]
                self.left[d][k] = self.left[d][k + 1] + size
                self.large[d][k] = self.large[d][k + 1] + (2 * size > cap[d])
            for name, counts in self.anchors_left.items():
                counts[k] = counts[k + 1] + (self.first[k] == name)
        self.room = [[w.free_cpu_milli, w.free_memory_bytes, w.free_gpu] for w in problem.workers]
        self.pool_of = [w.pool for w in problem.workers]
        self.pending = len(self.room)
        self.anchored = [1] * self.pending  # pending workers need no anchor
        self.unanchored = dict.fromkeys(self.anchors_left, 0)
        self.loose = 0
        # (A worker already requested may be owed more than it has: nothing fits it then.)
        self.free = [sum(max(0, row[d]) for row in self.room) for d in range(3)]
        # Open workers with room for more than half a worker, per resource.
        self.takers = [sum(1 for row in self.room if 2 * row[d] > cap[d]) for d in range(3)]
        self.new = 0

    def run(self) -> _Plan:
        try:
            self._explore()
            self.gap = 0
        except _OutOfSteps:
            self.gap = self.best - self.floor
        return self.best_plan

    def bound(self, k: int) -> int:
        """New workers the items from ``k`` on need at least, beyond the workers open."""
        lower = 0
        for d in range(3):
            short = self.left[d][k] - self.free[d]
            if short > 0:
                lower = max(lower, -(-short // self.cap[d]))
            lower = max(lower, self.large[d][k] - self.takers[d])
        return lower

    def _viable(self, k: int) -> bool:
        """Whether the items from ``k`` on can still anchor every new worker that needs it and
        the plan can still beat the best one."""
        if self.loose and any(
            count > self.anchors_left[name][k] for name, count in self.unanchored.items() if count
        ):
            return False
        return self.new + self.bound(k) < self.best

    def _explore(self) -> None:
        n = len(self.ids)
        where = [0] * n
        opened = [False] * n
        options: list[list[int | str]] = [[] for _ in range(n)]
        cursor = [0] * n
        self._step()
        options[0] = self._options(0, where)
        depth = 0
        while depth >= 0:
            if cursor[depth] == len(options[depth]):
                depth -= 1
                if depth >= 0:
                    self._undo(depth, where[depth], opened[depth])
                continue
            choice = options[depth][cursor[depth]]
            cursor[depth] += 1
            opened[depth] = isinstance(choice, str)
            if isinstance(choice, str):
                if self.new + 1 >= self.best:
                    continue
                slot = self._open(choice)
            else:
                slot = choice
            self._take(depth, slot)
            where[depth] = slot
            child = depth + 1
            self._step()
            if child == n:
                if not self.loose:
                    self._improved(where)
                    if self.best <= self.floor:
                        return
            elif self._viable(child):
                options[child] = self._options(child, where)
                cursor[child] = 0
                depth = child
                continue
            self._undo(depth, slot, opened[depth])

    def _step(self) -> None:
        if self.steps == self.budget:
            raise _OutOfSteps
        self.steps += 1

    def _options(self, k: int, where: Sequence[int]) -> list[int | str]:
        """Where item ``k`` may go: each worker it fits whose room was not tried yet, in slot
        order (from the slot of an identical item just before it), then a new worker of its
        first pool, then of its other pools that a later item could anchor."""
        cpu, memory, gpu = self.need[k]
        pools = self.pools[k]
        seen = set()
        choices: list[int | str] = []
        room, pool_of, anchored = self.room, self.pool_of, self.anchored
        for b in range(where[k - 1] if self.same[k] else 0, len(room)):
            row = room[b]
            if cpu <= row[0] and memory <= row[1] and gpu <= row[2] and pool_of[b] in pools:
                # Workers alike in pool, room and whether they still need an anchor are one.
                key = (pool_of[b], row[0], row[1], row[2], anchored[b] > 0)
                if key not in seen:
                    seen.add(key)
                    choices.append(b)
        first = self.first[k]
        choices.append(first)
        for name in self.order[k][1:]:
            later = self.anchors_left.get(name)
            if later is not None and later[k + 1] > self.unanchored[name]:
                choices.append(name)
        return choices

    def _open(self, name: str) -> int:
        room = list(self.problem.rooms[name])
        self.room.append(room)
        self.pool_of.append(name)
        self.anchored.append(0)
        self.unanchored[name] += 1
        self.loose += 1
        for d in range(3):
            self.free[d] += room[d]
            if 2 * room[d] > self.cap[d]:
                self.takers[d] += 1
        self.new += 1
        return len(self.room) - 1

    def _take(self, k: int, b: int) -> None:
        row, need, cap = self.room[b], self.need[k], self.cap
        for d in range(3):
            before = row[d]
            row[d] = before - need[d]
            self.free[d] -= need[d]
            if 2 * before > cap[d] >= 2 * row[d]:
                self.takers[d] -= 1
        if b >= self.pending and self.first[k] == self.pool_of[b]:
            self.anchored[b] += 1
            if self.anchored[b] == 1:
                self.unanchored[self.pool_of[b]] -= 1
                self.loose -= 1

    def _undo(self, k: int, b: int, opened: bool) -> None:
        row, need, cap = self.room[b], self.need[k], self.cap
        for d in range(3):
            before = row[d]
            row[d] = before + need[d]
            self.free[d] += need[d]
            if 2 * before <= cap[d] < 2 * row[d]:
                self.takers[d] += 1
        name = self.pool_of[b]
        if b >= self.pending and self.first[k] == name:
            self.anchored[b] -= 1
            if self.anchored[b] == 0:
                self.unanchored[name] += 1
                self.loose += 1
        if opened:
            self.room.pop()
            self.pool_of.pop()
            self.anchored.pop()
            self.unanchored[name] -= 1
            self.loose -= 1
            for d in range(3):
                self.free[d] -= row[d]
                if 2 * row[d] > cap[d]:
                    self.takers[d] -= 1
            self.new -= 1

    def _improved(self, where: Sequence[int]) -> None:
        self.best = self.new
        self.best_plan = _Plan(
            dict(zip(self.ids, where, strict=True)),
            tuple(self.pool_of[self.pending :]),
        )


def _new_worker(pool: Pool, taken: Sequence[_Item], retired: Container[str]) -> NewWorker:
    ids = [item.request.id for item in taken]
    # Named from its workloads, so planning the same overflow again names the same machine;
    # once that machine failed, the same workloads get the next name in a fixed sequence.
    key = "\n".join(sorted(ids))
    name, attempt = _worker_name(pool, key), 0
    while name in retired:
        attempt += 1
        name = _worker_name(pool, f"{key}\n#{attempt}")
    return NewWorker(
        name=name,
        pool=pool.name,
        request_ids=tuple(ids),
        used_cpu_milli=sum(item.need[0] for item in taken),
        used_memory_bytes=sum(item.need[1] for item in taken),
        used_gpu=sum(item.need[2] for item in taken),
    )


def _worker_name(pool: Pool, key: str) -> str:
    return f"{pool.name}-{hashlib.blake2b(key.encode(), digest_size=5).hexdigest()}"
