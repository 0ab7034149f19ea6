"""``fleetledger bench placement``: batches of workloads planned on 1,000 nodes, then committed.

Two figures, both in placements per second:

``planning``
    The pure planner alone (:func:`fleetledger.domain.placement.plan`): ``batches`` batches of
    ``batch`` requests, each planned on a snapshot of ``nodes`` workers whose free capacity
    carries what the earlier batches took. Only ``plan`` is timed. Like ``timeit``, the headline
    is the best of ``repeat`` runs (other processes only ever slow a run down), the median beside
    it. Target: 20,000/s.
``overflow``
    The same batches planned on the same number of workers with no room left: every request
    overflows and is packed into new workers, first-fit decreasing then the exact search (its
    default step budget), the way a burst on a full fleet is planned. Best and median of
    ``repeat`` like ``planning``, with the workers asked for and the optimality gap the plans
    report (0: every batch's workers proven the fewest). Target: 20,000/s.
``end_to_end``
    The same batches through :class:`~fleetledger.adapters.placement.PlacementService` on the
    database at ``url``: snapshot from the hosted node streams, plan, the node aggregate's
    decisions, one ``append_many`` per batch (one reservation event per touched node stream,
    carrying all the workloads placed on it, beside one event per waiting or rejected
    workload). Wall clock over all batches. Target: 5,000/s on Postgres.
``recorded``
    The same again (new workloads on the same nodes) with ``record_placements``: each
    placement also a ``WorkloadPlaced`` on its workload's stream, as several controllers on
    one log run. No target of its own.
``accepted``
    Before its batch, each batch's workloads are accepted as a submission is: one
    ``append_many`` recording a ``WorkloadSubmitted`` per workload on its own stream. Timed
    apart (workloads accepted per second), and with the batches (``with_acceptance``: what a
    workload costs from its submission to its placement). No target of its own.

The nodes are joined first (not timed) under a fresh name prefix, so runs can share a database.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.nodes import DEFAULT_NODE_CONFIG, NodeService
from fleetledger.adapters.placement import BatchReport, PlacementService
from fleetledger.domain.nodes import JoinNode, NodeCommand
from fleetledger.domain.placement import (
    DEFAULT_SEARCH_STEPS,
    Pool,
    Snapshot,
    Worker,
    WorkloadRequest,
    plan,
)
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import migrate, open_store

__all__ = [
    "TARGET_END_TO_END_PER_SECOND",
    "TARGET_PLANNING_PER_SECOND",
    "PlacementBenchReport",
    "run_placement_bench",
]

TARGET_PLANNING_PER_SECOND = 20_000
TARGET_END_TO_END_PER_SECOND = 5_000

_GIB = 1 << 30
_NODE_CPU = 16_000
_NODE_MEMORY = 64 * _GIB
_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PlacementBenchReport:
    """The figures of one run."""

    url_scheme: str
    nodes: int
    batch: int
    batches: int
    repeat: int
    planning_per_second: float
    planning_median_per_second: float
    overflow_per_second: float
    overflow_median_per_second: float
    overflow_workers: int
    overflow_gap: int
    end_to_end_per_second: float
    end_to_end_seconds: float
    recorded_per_second: float
    accept_seconds: float
    placed: int
    accepted: int
    appends_per_batch: float
    snapshot_reads_per_batch: float
    conflicts: int

    @property
    def accepted_per_second(self) -> float:
        return self.accepted / self.accept_seconds if self.accept_seconds > 0 else math.inf

    @property
    def with_acceptance_per_second(self) -> float:
        total = self.accept_seconds + self.end_to_end_seconds
        return self.placed / total if total > 0 else math.inf

    @property
    def meets_targets(self) -> bool:
        return (
            self.planning_per_second >= TARGET_PLANNING_PER_SECOND
            and self.overflow_per_second >= TARGET_PLANNING_PER_SECOND
            and self.end_to_end_per_second >= TARGET_END_TO_END_PER_SECOND
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``."""
        return {
            "backend": self.url_scheme,
            "nodes": self.nodes,
            "batch": self.batch,
            "batches": self.batches,
            "repeat": self.repeat,
            "planning": {
                "placements_per_second": round(self.planning_per_second, 1),
                "median_placements_per_second": round(self.planning_median_per_second, 1),
                "target_per_second": TARGET_PLANNING_PER_SECOND,
                "meets_target": self.planning_per_second >= TARGET_PLANNING_PER_SECOND,
            },
            "overflow": {
                "placements_per_second": round(self.overflow_per_second, 1),
                "median_placements_per_second": round(self.overflow_median_per_second, 1),
                "workers_requested": self.overflow_workers,
                "optimality_gap": self.overflow_gap,
                "search_steps": DEFAULT_SEARCH_STEPS,
                "target_per_second": TARGET_PLANNING_PER_SECOND,
                "meets_target": self.overflow_per_second >= TARGET_PLANNING_PER_SECOND,
            },
            "end_to_end": {
                "placements_per_second": round(self.end_to_end_per_second, 1),
                "seconds": round(self.end_to_end_seconds, 4),
                "recorded_placements_per_second": round(self.recorded_per_second, 1),
                "placed": self.placed,
                "appends_per_batch": round(self.appends_per_batch, 3),
                "snapshot_reads_per_batch": round(self.snapshot_reads_per_batch, 3),
                "conflicts": self.conflicts,
                "target_per_second": TARGET_END_TO_END_PER_SECOND,
                "meets_target": self.end_to_end_per_second >= TARGET_END_TO_END_PER_SECOND,
            },
            "accepted": {
                "workloads": self.accepted,
                "per_second": round(self.accepted_per_second, 1),
                "seconds": round(self.accept_seconds, 4),
                "with_acceptance_placements_per_second": round(self.with_acceptance_per_second, 1),
            },
        }

    def render(self) -> str:
        """The figures as text, each beside its target."""
        return "\n".join(
            [
                f"bench placement: {self.batches} batches of {self.batch} on {self.nodes} nodes "
                f"({self.url_scheme})",
                f"  planning (pure):  {self.planning_per_second:>10,.0f} placements/s best, "
                f"{self.planning_median_per_second:,.0f} median "
                f"(target {TARGET_PLANNING_PER_SECOND:,})",
                f"  overflow (pure):  {self.overflow_per_second:>10,.0f} placements/s best, "
                f"{self.overflow_median_per_second:,.0f} median (target "
                f"{TARGET_PLANNING_PER_SECOND:,}); every request packed into new workers: "
                f"{self.overflow_workers} asked for, optimality gap {self.overflow_gap}",
                f"  end to end:       {self.end_to_end_per_second:>10,.0f} placements/s "
                f"(target {TARGET_END_TO_END_PER_SECOND:,}); {self.placed} placed, "
                f"{self.appends_per_batch:.2f} appends and {self.snapshot_reads_per_batch:.2f} "
                f"snapshots per batch, {self.conflicts} conflicts",
                f"  recorded:         {self.recorded_per_second:>10,.0f} placements/s end to "
                "end with each placement also on its workload's stream (several controllers)",
                f"  accepted:         {self.accepted_per_second:>10,.0f} workloads/s "
                f"({self.accepted} in the log before their batch); with acceptance "
                f"{self.with_acceptance_per_second:,.0f} placements/s",
            ]
        )


def run_placement_bench(
    url: str,
    *,
    nodes: int = 1000,
    batch: int = 100,
    batches: int = 50,
    repeat: int = 3,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> PlacementBenchReport:
    """Measure planning and end-to-end placement; see the module docstring."""
    if min(nodes, batch, batches, repeat) < 1:
        raise ValueError("nodes, batch, batches and repeat must all be at least 1")
    say = progress or _stderr
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    pool = Pool(
        name=prefix,
        template=MachineTemplate(vm_size="Standard_D16s_v5"),
        worker_cpu_milli=_NODE_CPU,
        worker_memory_bytes=_NODE_MEMORY,
    )
    work = _batches(random.Random(seed), prefix, batch, batches)
    say(f"planning {batches} batches of {batch} on {nodes} nodes, best of {repeat}")
    timings = [_time_planning(work, nodes, pool) for _ in range(repeat)]
    total = batch * batches
    best, median = min(timings), statistics.median(timings)
    say(f"  planning: {total / best:,.0f} placements/s")
    say(f"planning the same batches as overflow on {nodes} full nodes, best of {repeat}")
    overflows = [_time_overflow(work, nodes, pool) for _ in range(repeat)]
    overflow_seconds = [seconds for seconds, _, _ in overflows]
    _, overflow_workers, overflow_gap = overflows[0]
    overflow_best = min(overflow_seconds)
    overflow_median = statistics.median(overflow_seconds)
    say(f"  overflow: {total / overflow_best:,.0f} placements/s")

    migrate.upgrade(url)
    with open_store(url) as store:
        clock = SystemClock()
        service = NodeService(store, clock=clock)
        say(f"joining {nodes} nodes")
        for i in range(nodes):
            name = f"{prefix}-{i:04}"
            service.execute(name, partial(_join, name), cause="bench")
        placer = PlacementService(store, service, [pool], clock=clock)
        say(f"placing {batches} batches end to end")
        reports, accepted, accepting, seconds = _place_all(placer, work)
        placed = sum(r.placed for r in reports)
        say(f"  end to end: {placed / seconds:,.0f} placements/s")
        for name in service.hosted():
            service.stream(name).load()  # what the first placer appended, before the clock
        recorder = PlacementService(store, service, [pool], clock=clock, record_placements=True)
        again = _batches(random.Random(seed), f"{prefix}r", batch, batches)
        say(f"placing {batches} batches again, each placement recorded on its workload too")
        recorded, _, _, recorded_seconds = _place_all(recorder, again)
        recorded_placed = sum(r.placed for r in recorded)
    return PlacementBenchReport(
        url_scheme=url.split(":", 1)[0],
        nodes=nodes,
        batch=batch,
        batches=batches,
        repeat=repeat,
        planning_per_second=total / best if best > 0 else math.inf,
        planning_median_per_second=total / median if median > 0 else math.inf,
        overflow_per_second=total / overflow_best if overflow_best > 0 else math.inf,
        overflow_median_per_second=total / overflow_median if overflow_median > 0 else math.inf,
        overflow_workers=overflow_workers,
        overflow_gap=overflow_gap,
        end_to_end_per_second=placed / seconds if seconds > 0 else math.inf,
        end_to_end_seconds=seconds,
        recorded_per_second=(
            recorded_placed / recorded_seconds if recorded_seconds > 0 else math.inf
        ),
        accept_seconds=accepting,
        placed=placed,
        accepted=accepted,
        appends_per_batch=sum(r.appends for r in reports) / len(reports),
        snapshot_reads_per_batch=sum(r.snapshot_reads for r in reports) / len(reports),
        conflicts=sum(r.conflicts for r in reports),
    )


def _place_all(
    placer: PlacementService, work: list[list[WorkloadRequest]]
) -> tuple[list[BatchReport], int, float, float]:
    """Each batch accepted, then placed: the reports, how many were accepted, and the seconds
    spent accepting and placing."""
    reports = []
    accepted, accepting, placing = 0, 0.0, 0.0
    for requests in work:
        began = time.perf_counter()
        accepted += len(placer.accept(requests))
        accepted_at = time.perf_counter()
        reports.append(placer.place_batch(requests))
        accepting += accepted_at - began
        placing += time.perf_counter() - accepted_at
    return reports, accepted, accepting, placing


def _batches(
    rng: random.Random, prefix: str, batch: int, batches: int
) -> list[list[WorkloadRequest]]:
    return [
        [
            WorkloadRequest(
                id=f"{prefix}-w{b:04}-{i:03}",
                cpu_milli=rng.choice((100, 250, 500, 1000, 2000)),
                memory_bytes=rng.choice((256, 512, 1024, 4096)) << 20,
                priority=rng.choice((0, 0, 1, 2)),
            )
            for i in range(batch)
        ]
        for b in range(batches)
    ]


def _time_planning(work: list[list[WorkloadRequest]], nodes: int, pool: Pool) -> float:
    rng = random.Random(nodes)
    workers = {
        f"{pool.name}-{i:04}": Worker(
            name=f"{pool.name}-{i:04}",
            pool=pool.name,
            version=1,
            free_cpu_milli=rng.randrange(0, _NODE_CPU + 1, 250),
            free_memory_bytes=rng.randrange(0, _NODE_MEMORY + 1, _GIB),
            free_gpu=0,
        )
        for i in range(nodes)
    }
    by_id = {r.id: r for requests in work for r in requests}
    seconds = 0.0
    for requests in work:
        snapshot = Snapshot(workers=tuple(workers.values()))
        started = time.perf_counter()
        result = plan(requests, snapshot, [pool])
        seconds += time.perf_counter() - started
        for rid, node in result.placed.items():
            w, r = workers[node], by_id[rid]
            workers[node] = replace(
                w,
                version=w.version + 1,
                free_cpu_milli=w.free_cpu_milli - r.cpu_milli,
                free_memory_bytes=w.free_memory_bytes - r.memory_bytes,
            )
    return seconds


def _time_overflow(
    work: list[list[WorkloadRequest]], nodes: int, pool: Pool
) -> tuple[float, int, int]:
    """Seconds spent planning each batch on ``nodes`` workers without room (all of it
    overflow), the new workers the plans ask for and their summed optimality gap."""
    full = Snapshot(
        workers=tuple(
            Worker(
                name=f"{pool.name}-{i:04}",
                pool=pool.name,
                version=1,
                free_cpu_milli=0,
                free_memory_bytes=0,
                free_gpu=0,
            )
            for i in range(nodes)
        )
    )
    seconds, workers, gap = 0.0, 0, 0
    for requests in work:
        started = time.perf_counter()
        result = plan(requests, full, [pool])
        seconds += time.perf_counter() - started
        workers += len(result.provisions)
        gap += result.optimality_gap
    return seconds, workers, gap


def _join(name: str, at: datetime) -> list[NodeCommand]:
    return [JoinNode(name, _NODE_CPU, _NODE_MEMORY, 0, DEFAULT_NODE_CONFIG, at=at)]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
