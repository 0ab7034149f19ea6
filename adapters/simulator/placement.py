"""The ``burst-workloads`` scenario: seed 02's burst, placed in batches on one snapshot each.

The world (one seeded ``random.Random``, a manual clock, a scratch SQLite log unless ``url``):
20 workers of pool ``cpu`` (4 CPUs, 16 GiB), joined through the node accounting service.

``fits``
    100 workloads of 250–750 milli-CPU and 0.5–2 GiB arrive within 100 ms. They fit on the
    workers with room to spare (any fit does: a workload fails to fit only when every worker has
    under 750 milli-CPU free, i.e. more than 65 CPUs in use, and the burst asks for at most 75),
    so the bin-packing minimum of new workers is 0. The batch reads one snapshot and commits one
    append.
``overflow``
    The ``fits`` workloads are released (through their nodes' streams) and each worker takes one
    resident 4-CPU job, so the fleet is full. Then 100 workloads of 1, 2 or 3 CPUs arrive: they
    truly overflow. With sizes in quarters of a worker the optimum is known exactly — each 3
    takes a worker (and one 1 with it), the 2s and remaining 1s fill workers four quarters at a
    time: ``n3 + ⌈(2·n2 + max(0, n1 − n3)) / 4⌉`` — and the workers requested must equal it.
    The requested workers then join, and the batch after places their waiting workloads on them.

``compare_naive`` replays both bursts one request at a time against a cache refreshed every
500 ms of virtual time (seed 02's "before"): each request takes the first worker the cache shows
room on, appends its reservation alone, and when the node refuses (the cache was stale) asks for
a new worker of its own. Its ``workers_requested`` minus the minimum is its unnecessary workers.

Per phase: ``requests``, ``placed`` (at the end of the phase), ``workers_requested``,
``bin_packing_minimum``, ``snapshot_reads_per_batch`` (the batch runtime: snapshots planned on
per batch; naive: cache reads per request), ``appends_per_batch`` (per batch that committed
reservations; naive: per request). ``overcommitted_nodes`` counts nodes holding more than they
have, read from the log at the end (must be 0: the node aggregate refuses an overbooking).
``node_events_per_batch`` is the most reservation events any node stream got from one batch of
the runtime, read back from the log (must be 1: a batch decides a node's workloads together).
``optimality_gap`` sums, over the runtime's batches, how many more workers than the minimum each
batch's overflow plan may ask for (0: every plan proven minimal by the exact search).

``checkpoints`` records the dumpstate the batch runtime held in memory (the nodes as its last
snapshot saw them: the node service's streams and its own fold of what it committed) at three
log positions — the fits placed, the overflow's workers requested, the overflow placed — with
its SHA-256, for checking ``fleetledger dumpstate --as-of POSITION`` (a replay of the log)
against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from random import Random

from fleetledger.adapters.clock import Clock, ManualClock
from fleetledger.adapters.machines import MachineRequest
from fleetledger.adapters.nodes import DEFAULT_NODE_CONFIG, NodeService
from fleetledger.adapters.nodes.port import NodeStreams
from fleetledger.adapters.placement import (
    BatchReport,
    MachineRequester,
    PlacementRuntime,
    reservation,
)
from fleetledger.adapters.runtime import Leadership, RetryPolicy
from fleetledger.adapters.simulator.logs import simulation_store
from fleetledger.adapters.simulator.report import Checkpoint
from fleetledger.domain.nodes import (
    DeletePod,
    JoinNode,
    NodeCommand,
    NodeState,
    ReservePod,
    other_reserved,
)
from fleetledger.domain.placement import Pool, WorkloadRequest
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore
from fleetledger.projections.dumpstate import dumpstate_of

__all__ = [
    "PHASES",
    "PlacementSettings",
    "PhaseFigures",
    "PlacementReport",
    "placement_runtime",
    "run_placement_scenario",
    "small_workloads",
]

PHASES = ("fits", "overflow")
_GIB = 1 << 30
_MIB = 1 << 20
_BURST = 100
_CACHE_SECONDS = 0.5
_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_POOL = Pool(
    name="cpu",
    template=MachineTemplate(vm_size="Standard_D4s_v5"),
    worker_cpu_milli=4000,
    worker_memory_bytes=16 * _GIB,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementSettings:
    """The fleet and the bursts of ``burst-workloads``: ``workers`` joined workers of ``pool``,
    and bursts of ``burst`` workloads — the overflow ones take a quarter, a half or three
    quarters of a worker's CPU and 1 GiB, so CPU binds and the fewest workers is exact."""

    workers: int = 20
    burst: int = _BURST
    pool: Pool = _POOL

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 10_000 or not 1 <= self.burst <= 100_000:
            raise ValueError("workers must be 1-10000 and burst 1-100000")
        cpu, memory = self.pool.worker_cpu_milli, self.pool.worker_memory_bytes
        if cpu < 2000 or cpu % 4:
            raise ValueError(
                f"a worker's CPU must be a multiple of 4 milli-CPU, at least 2000, got {cpu}: "
                "the overflow burst is made of quarters of it"
            )
        if memory < 8 * _GIB:
            raise ValueError(
                f"a worker's memory must be at least 8 GiB, got {memory / _GIB:g} GiB: four "
                "overflow workloads of 1 GiB must fit on one by memory, so that CPU binds"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseFigures:
    """What one phase did (the JSON keys are a contract)."""

    name: str
    requests: int
    placed: int
    workers_requested: int
    bin_packing_minimum: int
    snapshot_reads_per_batch: float
    appends_per_batch: float
    batches: int

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "requests": self.requests,
            "placed": self.placed,
            "workers_requested": self.workers_requested,
            "bin_packing_minimum": self.bin_packing_minimum,
            "snapshot_reads_per_batch": round(self.snapshot_reads_per_batch, 3),
            "appends_per_batch": round(self.appends_per_batch, 3),
            "batches": self.batches,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementReport:
    """The batch runtime's phases, and the naive placer's when compared."""

    seed: int
    phases: tuple[PhaseFigures, ...]
    overcommitted_nodes: int
    settings: PlacementSettings = PlacementSettings()
    node_events_per_batch: int
    optimality_gap: int = 0
    naive: tuple[PhaseFigures, ...] | None = None
    naive_overcommitted_nodes: int | None = None
    checkpoints: tuple[Checkpoint, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``."""
        data: dict[str, object] = {
            "scenario": "burst-workloads",
            "seed": self.seed,
            "config": {
                "workers": self.settings.workers,
                "burst": self.settings.burst,
                "worker_cpu_milli": self.settings.pool.worker_cpu_milli,
                "worker_memory_bytes": self.settings.pool.worker_memory_bytes,
                "naive_cache_seconds": _CACHE_SECONDS,
            },
            "phases": [p.to_dict() for p in self.phases],
            "overcommitted_nodes": self.overcommitted_nodes,
            "node_events_per_batch": self.node_events_per_batch,
            "optimality_gap": self.optimality_gap,
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }
        if self.naive is not None:
            data["naive"] = {
                "phases": [p.to_dict() for p in self.naive],
                "overcommitted_nodes": self.naive_overcommitted_nodes,
                "unnecessary_workers": sum(
                    p.workers_requested - p.bin_packing_minimum for p in self.naive
                ),
            }
        return data

    def render(self) -> str:
        """A readable table, the naive placer beside the batches when compared."""
        settings = self.settings
        lines = [
            f"burst-workloads (seed {self.seed}): {settings.workers} workers, bursts of "
            f"{settings.burst}"
        ]
        header = f"  {'phase':<9} {'placer':<7} {'placed':>7} {'workers':>8} {'minimum':>8} "
        lines.append(header + f"{'snapshots/batch':>16} {'appends/batch':>14}")
        runs = [("batch", self.phases)]
        if self.naive is not None:
            runs.append(("naive", self.naive))
        for index, name in enumerate(PHASES):
            for placer, phases in runs:
                p = phases[index]
                lines.append(
                    f"  {name:<9} {placer:<7} {p.placed:>3}/{p.requests:<3} "
                    f"{p.workers_requested:>8} {p.bin_packing_minimum:>8} "
                    f"{p.snapshot_reads_per_batch:>16.2f} {p.appends_per_batch:>14.2f}"
                )
        lines.append(f"  overcommitted nodes: {self.overcommitted_nodes}")
        lines.append(f"  reservation events per node per batch: {self.node_events_per_batch}")
        lines.append(f"  optimality gap of the overflow plans: {self.optimality_gap}")
        if self.naive is not None:
            unnecessary = sum(p.workers_requested - p.bin_packing_minimum for p in self.naive)
            lines.append(
                f"  naive: {unnecessary} unnecessary workers, "
                f"{self.naive_overcommitted_nodes} overcommitted nodes"
            )
        lines.extend(
            f"  checkpoint {c.label}: position {c.position}, sha256 {c.sha256[:16]}…"
            for c in self.checkpoints
        )
        return "\n".join(lines)


def run_placement_scenario(
    seed: int,
    *,
    compare_naive: bool = False,
    url: str | None = None,
    settings: PlacementSettings | None = None,
) -> PlacementReport:
    """Run ``burst-workloads``; see the module docstring. ``url`` must name a database with no
    events yet (the batch runtime's fleet is named after its pool, the naive placer's, added
    after it, ``naive-*``); a scratch SQLite file when ``None``."""
    settings = settings or PlacementSettings()
    rng = Random(seed)
    fits = small_workloads(rng, count=settings.burst)
    quarter = settings.pool.worker_cpu_milli // 4
    sizes = [rng.choice((1, 2, 3)) * quarter for _ in range(settings.burst)]
    overflow = [
        WorkloadRequest(id=f"over-{i:03}", cpu_milli=cpu, memory_bytes=_GIB)
        for i, cpu in enumerate(sizes)
    ]
    minimum = _quarters_minimum(sizes, quarter)
    with simulation_store(url, fresh=True) as store:
        phases, overcommitted, node_events, gap, checkpoints = _batched(
            store, fits, overflow, minimum, settings
        )
    naive = naive_over = None
    if compare_naive:
        with simulation_store(url) as store:
            naive, naive_over = _naive(store, fits, overflow, minimum, settings)
    return PlacementReport(
        seed=seed,
        settings=settings,
        phases=phases,
        overcommitted_nodes=overcommitted,
        node_events_per_batch=node_events,
        optimality_gap=gap,
        naive=naive,
        naive_overcommitted_nodes=naive_over,
        checkpoints=checkpoints,
    )


# -- the bursts ----------------------------------------------------------------------------------


def small_workloads(
    rng: Random, *, count: int = _BURST, prefix: str = "fit"
) -> list[WorkloadRequest]:
    """``count`` workloads of 250–750 milli-CPU and 0.5–2 GiB, a quarter of them of priority 1,
    named ``<prefix>-000``…: the ``fits`` burst (also the small workloads of the ``dst``
    scenario's clients)."""
    return [
        WorkloadRequest(
            id=f"{prefix}-{i:03}",
            cpu_milli=rng.choice((250, 500, 750)),
            memory_bytes=rng.choice((512, 1024, 1536, 2048)) * _MIB,
            priority=rng.choice((0, 0, 0, 1)),
        )
        for i in range(count)
    ]


def _quarters_minimum(sizes: Sequence[int], quarter: int) -> int:
    """The fewest workers holding items of 1, 2 and 3 quarters of one (exact, see the
    docstring)."""
    n1, n2, n3 = (sum(1 for s in sizes if s == k * quarter) for k in (1, 2, 3))
    return n3 + -(-(2 * n2 + max(0, n1 - n3)) // 4)


def _residents(settings: PlacementSettings) -> list[WorkloadRequest]:
    cpu = settings.pool.worker_cpu_milli
    return [
        WorkloadRequest(id=f"resident-{i:03}", cpu_milli=cpu, memory_bytes=_GIB)
        for i in range(settings.workers)
    ]


# -- the batch runtime ---------------------------------------------------------------------------


class _Provisioner:
    """Overflow's machine requests, joined as nodes when the scenario says they are ready."""

    def __init__(self) -> None:
        self.requested: list[str] = []

    def request(self, requests: Sequence[MachineRequest]) -> object:
        self.requested.extend(r.machine_name for r in requests)
        return None

    def status(self, request_id: str) -> tuple[str, str] | None:
        # Every machine asked for joins when the scenario says it is ready: none fails.
        asked = any(f"placement-{name}" == request_id for name in self.requested)
        return ("sealed", "simulated") if asked else None


def _join(service: NodeService, name: str, pool: Pool) -> None:
    service.execute(
        name,
        lambda at: [
            JoinNode(
                name,
                pool.worker_cpu_milli,
                pool.worker_memory_bytes,
                pool.worker_gpu,
                DEFAULT_NODE_CONFIG,
                at=at,
            )
        ],
        cause="simulator:join",
    )


def _fleet(
    store: EventStore, clock: ManualClock, prefix: str, settings: PlacementSettings
) -> NodeService:
    service = NodeService(store, clock=clock)
    for i in range(settings.workers):
        _join(service, f"{prefix}-{i:03}", settings.pool)
    return service


def placement_runtime(
    store: EventStore,
    nodes: NodeStreams,
    pools: Sequence[Pool],
    *,
    machines: MachineRequester | None,
    clock: Clock,
    leadership: Leadership | None = None,
    retry: RetryPolicy | None = None,
) -> PlacementRuntime:
    """The placement runtime as the simulator drives it: threadless (the scenario calls
    ``step``), on the scenario's clock; with ``leadership`` its appends are fenced and its
    placements recorded on the workloads' streams, as ``serve`` runs it beside other
    controllers."""
    return PlacementRuntime(
        store,
        nodes,
        pools,
        machines=machines,
        clock=clock,
        threads=False,
        leadership=leadership,
        retry=retry,
    )


def _batched(
    store: EventStore,
    fits: list[WorkloadRequest],
    overflow: list[WorkloadRequest],
    minimum: int,
    settings: PlacementSettings,
) -> tuple[tuple[PhaseFigures, ...], int, int, int, tuple[Checkpoint, ...]]:
    clock = ManualClock(_EPOCH)
    pool = settings.pool
    nodes = _fleet(store, clock, pool.name, settings)
    machines = _Provisioner()
    runtime = placement_runtime(store, nodes, [pool], machines=machines, clock=clock)
    with runtime:
        start = store.head()
        runtime.submit(fits)
        clock.advance(timedelta(milliseconds=100))
        reports = runtime.step()
        node_events = _node_events_per_batch(store, start, reports)
        first = _phase(
            "fits",
            fits,
            runtime=runtime,
            reports=reports,
            workers=len(machines.requested),
            minimum=0,
        )
        checkpoints = [_checkpoint(store, runtime, "fits placed")]
        for request in fits:
            runtime.release(request.id)
        runtime.submit(_residents(settings))
        runtime.step()
        asked_before = len(machines.requested)
        start = store.head()
        runtime.submit(overflow)
        reports = runtime.step()
        checkpoints.append(_checkpoint(store, runtime, "overflow workers requested"))
        for name in machines.requested[asked_before:]:
            clock.advance(timedelta(seconds=1))
            _join(nodes, name, pool)
        reports += runtime.step()
        node_events = max(node_events, _node_events_per_batch(store, start, reports))
        second = _phase(
            "overflow",
            overflow,
            runtime=runtime,
            reports=reports,
            workers=len(machines.requested) - asked_before,
            minimum=minimum,
        )
        checkpoints.append(_checkpoint(store, runtime, "overflow placed"))
    gap = sum(report.optimality_gap for report in runtime.reports)
    overcommitted = _overcommitted(store, f"{pool.name}-")
    return (first, second), overcommitted, node_events, gap, tuple(checkpoints)


def _checkpoint(store: EventStore, runtime: PlacementRuntime, label: str) -> Checkpoint:
    """The nodes as the placement runtime holds them now (what its next batch would plan on)."""
    position = store.head()
    _, bases = runtime.service.snapshot()
    states = {name: base.state for name, base in bases.items()}
    return Checkpoint(label, position, dumpstate_of(states, {}, position=position))


def _phase(
    name: str,
    requests: Sequence[WorkloadRequest],
    *,
    runtime: PlacementRuntime,
    reports: Sequence[BatchReport],
    workers: int,
    minimum: int,
) -> PhaseFigures:
    placed = sum(1 for r in requests if runtime.status(r.id).state == "placed")
    committing = [r for r in reports if r.appends]
    return PhaseFigures(
        name=name,
        requests=len(requests),
        placed=placed,
        workers_requested=workers,
        bin_packing_minimum=minimum,
        snapshot_reads_per_batch=sum(r.snapshot_reads for r in reports) / max(1, len(reports)),
        appends_per_batch=sum(r.appends for r in committing) / max(1, len(committing)),
        batches=len(reports),
    )


# -- the naive placer ----------------------------------------------------------------------------


class _Naive:
    """One request at a time against a cache refreshed every 500 ms (seed 02's "before")."""

    def __init__(self, store: EventStore, clock: ManualClock, settings: PlacementSettings) -> None:
        self.clock = clock
        self.nodes = _fleet(store, clock, "naive", settings)
        self.cache: dict[str, tuple[int, int]] = {}
        self.cached_at: datetime | None = None
        self.cache_reads = 0
        self.appends = 0
        self.workers = 0
        self.placed: set[str] = set()

    def _room(self) -> dict[str, tuple[int, int]]:
        now = self.clock.now()
        if self.cached_at is None or (now - self.cached_at).total_seconds() >= _CACHE_SECONDS:
            self.cache = {
                name: _free(state) for name, state in self.nodes.hosted().items() if state.present
            }
            self.cached_at = now
        self.cache_reads += 1
        return self.cache

    def place(self, request: WorkloadRequest) -> None:
        room = self._room()
        target = next(
            (
                name
                for name, (cpu, memory) in sorted(room.items())
                if cpu >= request.cpu_milli and memory >= request.memory_bytes
            ),
            None,
        )
        if target is not None:
            self.appends += 1
            command = reservation(request, at=self.clock.now())
            try:
                self.nodes.execute(
                    target,
                    lambda at: [ReservePod(command.spec, at=at)],
                    cause=f"naive:{request.id}",
                )
                self.placed.add(request.id)
                return
            except Exception:
                pass
        # Seed 02: "everything appears full → add a new worker", one per request.
        self.workers += 1


def _release(pod: str, at: datetime) -> list[NodeCommand]:
    return [DeletePod(pod, at=at)]


def _free(state: NodeState) -> tuple[int, int]:
    other_cpu, other_slots = other_reserved(state)
    slot = state.config.memory_slot_bytes if state.config is not None else 1
    cpu = (state.cpu.remaining + other_cpu) // 1000 * 1000 - state.other_raw_cpu_milli
    memory = (state.memory.remaining + other_slots) * slot - state.other_raw_memory_bytes
    return cpu, memory


def _naive(
    store: EventStore,
    fits: list[WorkloadRequest],
    overflow: list[WorkloadRequest],
    minimum: int,
    settings: PlacementSettings,
) -> tuple[tuple[PhaseFigures, ...], int]:
    clock = ManualClock(_EPOCH)
    naive = _Naive(store, clock, settings)
    figures = []
    for name, burst, least in (("fits", fits, 0), ("overflow", overflow, minimum)):
        if name == "overflow":
            for request in fits:
                node = naive.nodes.node_of(request.id)
                if node is not None:
                    naive.nodes.execute(node, partial(_release, request.id), cause="naive:release")
            clock.advance(timedelta(seconds=1))
            for resident in _residents(settings):
                # Setup, not measured: a fresh cache for each, so the fleet is full as in the
                # batch run.
                clock.advance(timedelta(seconds=1))
                naive.place(resident)
            clock.advance(timedelta(seconds=1))
        reads, appends, workers = naive.cache_reads, naive.appends, naive.workers
        for request in burst:
            naive.place(request)
            clock.advance(timedelta(milliseconds=1))
        count = len(burst)
        figures.append(
            PhaseFigures(
                name=name,
                requests=count,
                placed=sum(1 for r in burst if r.id in naive.placed),
                workers_requested=naive.workers - workers,
                bin_packing_minimum=least,
                snapshot_reads_per_batch=(naive.cache_reads - reads) / count,
                appends_per_batch=(naive.appends - appends) / count,
                batches=count,
            )
        )
    return tuple(figures), _overcommitted(store, "naive-")


# -- checks and plumbing -------------------------------------------------------------------------


_RESERVATIONS = frozenset({"nodes.OtherPodReserved", "nodes.OtherPodsReserved"})


def _node_events_per_batch(store: EventStore, start: int, reports: Sequence[BatchReport]) -> int:
    """The most reservation events one node stream got from one committed batch; each batch's
    records are those after the previous commit (or ``start``) up to its own last position."""
    most = 0
    after = start
    for report in reports:
        if report.last_position is None:
            continue
        counts: dict[str, int] = {}
        for record in store.read_all(after=after, limit=report.last_position - after):
            if record.type in _RESERVATIONS and record.global_position <= report.last_position:
                counts[record.stream_id] = counts.get(record.stream_id, 0) + 1
        most = max(most, *counts.values(), 0)
        after = report.last_position
    return most


def _overcommitted(store: EventStore, prefix: str) -> int:
    """Nodes whose logged state holds more than they have (read back from the log)."""
    fresh = NodeService(store, clock=ManualClock(_EPOCH))
    count = 0
    for name in fresh.logged_nodes():
        if not name.startswith(prefix):
            continue
        state = fresh.stream(name).state
        if (
            state.cpu.reserved > state.cpu.reservable
            or state.memory.reserved > state.memory.reservable
            or state.gpu_reserved > state.gpu_total
        ):
            count += 1
    return count
