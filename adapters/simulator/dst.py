"""Deterministic simulation testing: every capability's runtime on one log, under seeded faults.

``fleetledger simulate --scenario dst --seeds 200`` runs 200 seeds; ``--seed 1234`` runs one (the
command a failing seed prints). Each seed is one small world on virtual time
(:class:`~fleetledger.adapters.simulator.virtual_time.VirtualTime`) and one log:

- **controller processes**, each with its own store connection, a
  :class:`~fleetledger.adapters.runtime.Leadership` over a shared lease board, and the runtimes
  ``serve`` runs on that leadership: machines (:class:`~fleetledger.adapters.machines.
  MachinesRuntime`, batches on virtual time), node accounting
  (:class:`~fleetledger.adapters.nodes.NodesRuntime`) and pod IPs
  (:class:`~fleetledger.adapters.ipam.IpamRuntime`, fed each node's demand on every cluster sync
  pass) and workload placement (:class:`~fleetledger.adapters.placement.PlacementRuntime`, built
  as the ``burst-workloads`` scenario builds it, :func:`.placement.placement_runtime`, with the
  process's leadership: fenced appends, placements recorded on the workloads' streams; its
  batches run every second on the leader, its overflow asks the leader's Grouper for workers).
  One leads at a time; a crash or a leader change brings up the next one, which rebuilds from
  the log;
- the **fake cloud** (:class:`~fleetledger.adapters.cloud.FakeCloud`) behind
  :class:`~fleetledger.adapters.simulator.faults.FaultyCloud`, and a **fake cluster** seen, as a
  controller sees the real one, through an informer's cache fed by a watch
  (:class:`WatchedCluster`), whose deliveries the faults duplicate and reorder;
- **clients**: machine requests arriving over the first seconds (a client whose request got no
  answer sends it again with the same request id, as the API tells it to), workload submissions
  for placement (small workloads and large ones, some beyond any worker: the same retry), and
  autoscaler agents asking for their VM pods' resources every couple of seconds. The workers
  placement asks for join the cluster (and so the node accounting) once the log shows their
  machines created; the cluster sync and the batches go on past the tail while placement has
  work queued or a worker still coming;
- the **faults** of :mod:`~fleetledger.adapters.simulator.faults`, drawn from the seed;
- every ``testbed_every``-th seed, the **slot testbeds**: the ``testbed`` scenario
  (:mod:`~fleetledger.adapters.simulator.testbed`: jobs on slots through the extender) runs on the
  same log afterwards, its controller as processes on a lease that crash inside group commits and
  between passes and lose their lease to another process, and its commits under lost replies
  (drawn from the seed; it drives its processes on a manual clock of its own).

After the run the log is checked from position 0 (:func:`check_log`): every acknowledged request
has exactly one outcome (none: ``lost`` if the log never had it, ``stalled`` if it is still
without one; ``duplicated`` if more), and so has every acknowledged workload (placed or
rejected; waiting counts only for a worker still pending at the end, see
:func:`check_workload_outcomes`), no machine was created twice, no grant reserved a node beyond
``total − system``, no slot was held by two pods (in the log or in the cluster), the read models,
the node accounting, the subnets and placement's workloads rebuilt from position 0 equal the live
ones (the dumpstate's
SHA-256), and the hash chain verifies (``audit verify``).

The sweep found two placement bugs, both fixed and each pinned by a seed in the tests: a worker
whose machine failed stranded the workloads waiting for it (seed 11), and a process elected again
knew none of the workloads submitted to another leader meanwhile (seed 132).

Everything but wall time is a function of the seed: the same seed gives the same faults, the same
log (up to its recorded wall-clock times) and the same result.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from random import Random

import structlog

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.cluster import FakeCluster, Node, Pod, PodSpec
from fleetledger.adapters.ipam import InMemoryAllocator, IpamError
from fleetledger.adapters.machines import MachineRequest, MachinesError
from fleetledger.adapters.machines.streams import batch_stream_prefix, grouper_stream_id
from fleetledger.adapters.nodes import NodesError, NodeService, vm_annotations
from fleetledger.adapters.placement import (
    LogUnavailable,
    PlacementError,
    PlacementRuntime,
    PlacementService,
    RuntimeStopped,
    UnknownWorkload,
)
from fleetledger.adapters.placement.workloads import read_workloads
from fleetledger.adapters.runtime import RetryPolicy
from fleetledger.adapters.testbeds.aggregates import TESTBED
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.nodes import Bounds, ComputeUnit, NodeConfig
from fleetledger.domain.placement import Pool, WorkloadRequest
from fleetledger.domain.template import MachineTemplate
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore, EventStoreError, RecordedEvent, open_store
from fleetledger.projections import nodes as node_projection
from fleetledger.projections.dumpstate import dumpstate_at, dumpstate_of
from fleetledger.projections.machine_requests import MachineRequestsProjection
from fleetledger.projections.nodes import dump_json

from .controller import controller_runtimes
from .faults import (
    CommitFault,
    ControllerCrashed,
    FaultKind,
    FaultSchedule,
    FaultyBackend,
    FaultyCloud,
    draw_schedule,
)
from .logs import simulation_store
from .node_checks import NodeLogChecks
from .placement import placement_runtime, small_workloads
from .testbed import ControllerFaults, double_reservations, run_testbed_scenario
from .virtual_time import VirtualTime

__all__ = [
    "EXCLUDED_FAULTS",
    "INVARIANTS",
    "DstReport",
    "LiveState",
    "DstSettings",
    "SeedResult",
    "Violation",
    "WatchedCluster",
    "check_chain",
    "check_grants",
    "check_log",
    "check_machines_created_once",
    "check_replay",
    "check_request_outcomes",
    "check_workload_outcomes",
    "replayed_state",
    "repro_command",
    "run_seed",
    "run_seeds",
]

log = structlog.get_logger(__name__)

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
GIB = 1 << 30
GROUPER = "dst"
INVARIANTS = (
    "lost",
    "duplicated",
    "stalled",
    "machine_created_twice",
    "grant_beyond_capacity",
    "slot_held_twice",
    "replay_mismatch",
    "hash_chain",
    "error",
)
"""The invariants a seed is checked for; ``error`` is an exception the runtime let escape."""

EXCLUDED_FAULTS: tuple[FaultKind, ...] = ()
"""Fault kinds left out of every schedule (each with the bug it waits for); none today."""

_CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=500), max_timeout=timedelta(seconds=3), max_batch_size=8
)
_NODE_CONFIG = NodeConfig(
    cpu_system_milli=1000,
    memory_system_slots=2,
    cpu_watermark=0.9,
    memory_watermark=0.9,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=GIB,
)
_TEMPLATES = (
    MachineTemplate(vm_size="Standard_D4s_v5", orchestrator_version="1.31.2"),
    MachineTemplate(vm_size="Standard_D8s_v5", orchestrator_version="1.31.2"),
)
_RETRY = RetryPolicy(backoff_seconds=0.0)
"""Re-send after an unknown commit outcome at once. A runtime re-sends while it leads its
stream's group, and the writers queued behind it wait on a real lock; virtual time runs one task
at a time, so a leader parked in a back-off would hold them (and the whole simulation) for ever."""
_CLIENT_RETRY_SECONDS = 1.0
_HEARTBEAT_SECONDS = 1.0
_SUBNET = "dst-pods"
_SUBNET_CAPACITY = 64
_STUCK_AFTER_SECONDS = 20.0
"""Wall seconds a task may run without parking before the seed is reported stuck (a seed's
whole run takes well under a second)."""
_RESTART_SECONDS = 2.0
_NODE_CPU_MILLI = 8000
_NODE_MEMORY_MIB = 16 * 1024
WORKER_POOL = Pool(
    name="node",
    template=MachineTemplate(vm_size="Standard_D8s_v5", orchestrator_version="1.31.2"),
    worker_cpu_milli=6000,
    worker_memory_bytes=12 * GIB,
)
"""The one placement pool: the cluster's ``node-<n>`` workers (``pool_by_prefix``), and the
``node-<digest>`` workers placement asks the Grouper for on overflow. A new worker is counted
below what a joined node offers (8 CPUs and 16 GiB less the system's share and the watermark),
so workloads planned onto it fit once it joins."""
_PLACEMENT_SECONDS = 1.0
_WORKER_REQUEST_PREFIX = "placement-"
"""Placement's machine request for worker ``W`` has the id ``placement-W``."""
_LARGE_CPU_MILLI = (4000, 5000, 6000, 7000)
"""The large workloads' CPU: enough to overflow the three nodes' room (new workers), and 7 CPUs,
beyond any worker of the pool (rejected)."""


def repro_command(seed: int) -> str:
    """The command that runs ``seed`` again, alone."""
    return f"fleetledger simulate --scenario dst --seed {seed}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DstSettings:
    """The size of each seed's world; small, so that hundreds of seeds run in minutes."""

    requests: tuple[int, int] = (4, 10)
    submissions: tuple[int, int] = (2, 5)
    """Workload submissions (of one to three workloads each) the clients send for placement."""
    nodes: int = 3
    pods: tuple[int, int] = (2, 4)
    horizon_seconds: float = 12.0
    """Requests arrive, pods come and go and faults strike within this many virtual seconds."""
    tail_seconds: float = 10.0
    """Agents and cluster sync go on this long after the horizon."""
    drain_seconds: float = 900.0
    """A seed ends at the latest this long after the horizon: what has no outcome then is
    stalled."""
    cloud_latency_seconds: float = 2.0
    agent_period_seconds: float = 4.0
    sync_seconds: float = 5.0
    excluded: tuple[FaultKind, ...] = EXCLUDED_FAULTS
    follower_catch_up: bool = True
    """Followers catch up with the log every heartbeat before they may be elected. ``False``
    elects them as they stand (a leader elected within its follower's lag): a stale grouper's
    first duty append then meets ``DuplicateEventId`` (seed 17), which the host does not treat
    as a version conflict — see the simulator's report."""
    testbed_every: int = 8
    """Every this many seeds (those divisible by it) also run the slot testbeds' scenario on
    the seed's log afterwards, under lost commit replies (0: never)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant a seed broke, with what shows it."""

    invariant: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"invariant": self.invariant, "detail": self.detail}


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedResult:
    """One seed's run: the faults it injected, what happened, and the invariants it broke."""

    seed: int
    schedule: tuple[str, ...]
    faults_injected: Mapping[str, int]
    requests: int
    acknowledged: int
    outcomes: Mapping[str, str]
    machines_created: int
    processes: int
    events: int
    violations: tuple[Violation, ...]
    workloads: int = 0
    workloads_acknowledged: int = 0
    wall_seconds: float = field(default=0.0, compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def repro(self) -> str:
        return repro_command(self.seed)

    def to_dict(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "schedule": list(self.schedule),
            "faults_injected": dict(sorted(self.faults_injected.items())),
            "requests": self.requests,
            "acknowledged": self.acknowledged,
            "outcomes": dict(Counter(self.outcomes.values())),
            "machines_created": self.machines_created,
            "workloads": self.workloads,
            "workloads_acknowledged": self.workloads_acknowledged,
            "processes": self.processes,
            "events": self.events,
            "violations": [v.to_dict() for v in self.violations],
            "repro": self.repro,
            "wall_seconds": round(self.wall_seconds, 3),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DstReport:
    """Many seeds' runs summed up: what ``bench reliability`` and the CLI report."""

    seeds_run: int
    first_seed: int
    faults_injected: Mapping[str, int]
    violations: Mapping[str, int]
    failing: tuple[SeedResult, ...]
    wall_seconds: float

    @property
    def lost(self) -> int:
        return self.violations.get("lost", 0)

    @property
    def duplicated(self) -> int:
        return self.violations.get("duplicated", 0)

    @property
    def stalled(self) -> int:
        return self.violations.get("stalled", 0)

    @property
    def ok(self) -> bool:
        return not self.failing

    def to_dict(self) -> dict[str, object]:
        return {
            "scenario": "dst",
            "seeds_run": self.seeds_run,
            "first_seed": self.first_seed,
            "faults_injected": dict(sorted(self.faults_injected.items())),
            "violations": {name: self.violations.get(name, 0) for name in INVARIANTS},
            "failing_seeds": [
                {
                    "seed": r.seed,
                    "repro": r.repro,
                    "violations": [v.to_dict() for v in r.violations],
                }
                for r in self.failing
            ],
            "wall_seconds": round(self.wall_seconds, 2),
        }

    def render(self) -> str:
        faults = ", ".join(f"{k} {n}" for k, n in sorted(self.faults_injected.items()))
        broken = {k: n for k, n in self.violations.items() if n}
        lines = [
            f"scenario dst: seeds {self.first_seed}..{self.first_seed + self.seeds_run - 1} "
            f"({self.seeds_run} run, {self.wall_seconds:.1f} s)",
            f"  faults injected: {sum(self.faults_injected.values())} ({faults or 'none'})",
            "  violations: "
            + (", ".join(f"{k} {n}" for k, n in sorted(broken.items())) if broken else "none"),
        ]
        for result in self.failing:
            first = result.violations[0]
            lines.append(
                f"  seed {result.seed} broke {first.invariant} ({first.detail}); "
                f"reproduce: {result.repro}"
            )
        return "\n".join(lines)


def run_seeds(
    n: int,
    *,
    start: int = 0,
    url: str | None = None,
    settings: DstSettings | None = None,
    on_seed: Callable[[SeedResult], None] | None = None,
) -> DstReport:
    """Run seeds ``start`` … ``start + n − 1``, each on a scratch SQLite log of its own (or, with
    ``url``, on that database: it must be empty, so only one seed can use it)."""
    if n < 1:
        raise ValueError(f"run at least one seed, got {n}")
    if url is not None and n > 1:
        raise ValueError(
            "each seed needs an empty log: give --url with one seed (--seed), or leave it out"
        )
    started = time.perf_counter()
    faults: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    failing: list[SeedResult] = []
    for seed in range(start, start + n):
        result = run_seed(seed, url=url, settings=settings)
        faults.update(result.faults_injected)
        violations.update(v.invariant for v in result.violations)
        if not result.ok:
            failing.append(result)
        if on_seed is not None:
            on_seed(result)
    return DstReport(
        seeds_run=n,
        first_seed=start,
        faults_injected=dict(faults),
        violations=dict(violations),
        failing=tuple(failing),
        wall_seconds=time.perf_counter() - started,
    )


def run_seed(
    seed: int, *, url: str | None = None, settings: DstSettings | None = None
) -> SeedResult:
    """Run one seed (see the module docstring) on ``url`` (empty) or a scratch SQLite log."""
    settings = settings or DstSettings()
    started = time.perf_counter()
    plan = _plan(Random(seed), seed, settings)
    with simulation_store(url, fresh=True) as first:
        log_url = first.engine.url.render_as_string(hide_password=False)
        world = _World(plan, settings, log_url, reader=first)
        live: LiveState | None = None
        try:
            world.run()
            live = world.live_state(first)
            error: Violation | None = None
        except Exception as e:  # a bug the runtime let escape: the seed's finding, not ours
            log.exception("dst seed raised", seed=seed)
            error = Violation("error", f"{type(e).__name__}: {e}")
        finally:
            world.close()
        testbed: tuple[Violation, ...] = ()
        if error is None and settings.testbed_every and seed % settings.testbed_every == 0:
            testbed = _run_testbeds(seed, log_url, world.injected)
        violations = testbed + check_log(
            first,
            acknowledged=world.acknowledged,
            workloads=world.workloads_acknowledged,
            creations=world.fake.creations,
            deletions=world.fake.deletions,
            live=live,
        )
        outcomes = _outcomes(first)
        events = first.head()
    if error is not None:
        violations = (error, *violations)
    return SeedResult(
        seed=seed,
        schedule=plan.schedule.describe(),
        faults_injected=dict(world.injected),
        requests=len(plan.arrivals),
        acknowledged=len(world.acknowledged),
        outcomes=outcomes,
        machines_created=len(set(world.fake.creations)),
        processes=world.processes_started,
        events=events,
        violations=tuple(violations),
        workloads=sum(len(group) for _, group in plan.submissions),
        workloads_acknowledged=len(world.workloads_acknowledged),
        wall_seconds=time.perf_counter() - started,
    )


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PodPlan:
    name: str
    node: str
    cpu: Bounds
    memory: Bounds
    placed_at: float
    deleted_at: float | None


@dataclass(frozen=True, slots=True)
class _Plan:
    seed: int
    arrivals: tuple[tuple[float, MachineRequest], ...]
    pods: tuple[_PodPlan, ...]
    schedule: FaultSchedule
    agent_seed: int
    submissions: tuple[tuple[float, tuple[WorkloadRequest, ...]], ...] = ()


def _plan(rng: Random, seed: int, settings: DstSettings) -> _Plan:
    """Everything random about the seed, drawn up front."""
    count = rng.randint(*settings.requests)
    arrivals: list[tuple[float, MachineRequest]] = []
    at = 0.0
    for index in range(count):
        at += rng.expovariate(1 / 0.4)
        arrivals.append(
            (
                round(min(at, settings.horizon_seconds), 3),
                MachineRequest(
                    request_id=f"req-{index:03d}",
                    machine_name=f"dst-{index:03d}",
                    template=rng.choice(_TEMPLATES),
                    zones=(str(rng.randint(1, 3)),),
                ),
            )
        )
    nodes = [f"node-{n}" for n in range(settings.nodes)]
    unit = _NODE_CONFIG.compute_unit
    pods: list[_PodPlan] = []
    for index in range(rng.randint(*settings.pods)):
        cpu_max = rng.randrange(4, 17) * unit.cpu_milli
        memory_max = rng.randrange(2, 9) * unit.memory_slots
        placed = 0.0 if index < 2 else round(rng.uniform(0, settings.horizon_seconds), 3)
        deleted = (
            round(rng.uniform(placed, settings.horizon_seconds + 5), 3)
            if rng.random() < 0.25
            else None
        )
        pods.append(
            _PodPlan(
                f"vm-{index:02d}",
                rng.choice(nodes),
                Bounds(unit.cpu_milli, unit.cpu_milli, cpu_max),
                Bounds(unit.memory_slots, unit.memory_slots, memory_max),
                placed,
                deleted,
            )
        )
    schedule = draw_schedule(
        rng,
        seed=seed,
        machine_names=[request.machine_name for _, request in arrivals],
        horizon_seconds=settings.horizon_seconds,
    ).without(*settings.excluded)
    return _Plan(
        seed,
        tuple(arrivals),
        tuple(pods),
        schedule,
        rng.getrandbits(32),
        _submissions(Random(f"{seed}:workloads"), settings),
    )


def _submissions(
    rng: Random, settings: DstSettings
) -> tuple[tuple[float, tuple[WorkloadRequest, ...]], ...]:
    """The clients' workload submissions: small workloads (the ``burst-workloads`` scenario's)
    and large ones (:data:`_LARGE_CPU_MILLI`), one to three per submission, over the horizon.
    Drawn from a generator of their own, so that adding them left every seed's requests, pods
    and faults as they were."""
    count = rng.randint(*settings.submissions)
    small = iter(small_workloads(rng, count=3 * count, prefix="wl"))
    submissions = []
    for index in range(count):
        group: list[WorkloadRequest] = []
        for slot in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                group.append(
                    WorkloadRequest(
                        id=f"big-{index:02d}-{slot}",
                        cpu_milli=rng.choice(_LARGE_CPU_MILLI),
                        memory_bytes=rng.randint(2, 8) * GIB,
                    )
                )
            else:
                group.append(next(small))
        at = round(rng.uniform(0.2, settings.horizon_seconds), 3)
        submissions.append((at, tuple(group)))
    return tuple(sorted(submissions, key=lambda s: s[0]))


# -- the cluster as a controller sees it ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    kind: str  # node, pod
    name: str
    obj: Node | Pod | None


class WatchedCluster:
    """The cluster through an informer: ``list_*`` answer from a cache that a watch of the API
    server (a :class:`FakeCluster`) keeps, one delivery at a time.

    :meth:`record` turns what changed on the server since the last call into watch events, in
    order; :meth:`deliver` applies the events not delivered yet to the cache. Faults act on a
    delivery: :meth:`duplicate_next` replays the last few events already delivered before the new
    ones (a re-watch from an older ``resourceVersion``), :meth:`reorder_next` swaps adjacent
    events of different objects. Neither reorders one object's events: a watch never does.
    Writes (``create_pod``…) go to the server and show in the cache once delivered.
    """

    _REPLAYED = 3

    def __init__(self, server: FakeCluster, injected: Counter[str]) -> None:
        self.server = server
        self._injected = injected
        self._seen_nodes: dict[str, Node] = {}
        self._seen_pods: dict[str, Pod] = {}
        self._events: list[_WatchEvent] = []
        self._delivered = 0
        self._nodes: dict[str, Node] = {}
        self._pods: dict[str, Pod] = {}
        self._duplicate = False
        self._reorder = False

    # -- faults ----------------------------------------------------------------------------------

    def duplicate_next(self) -> None:
        self._duplicate = True

    def reorder_next(self) -> None:
        self._reorder = True

    # -- the watch -------------------------------------------------------------------------------

    def record(self) -> None:
        """Watch events for what changed on the server since the last call."""
        nodes = {n.name: n for n in self.server.list_nodes()}
        pods = {p.name: p for p in self.server.list_pods()}
        self._diff("node", self._seen_nodes, nodes)
        self._diff("pod", self._seen_pods, pods)
        self._seen_nodes, self._seen_pods = nodes, pods

    def _diff(self, kind: str, before: Mapping[str, object], after: Mapping[str, object]) -> None:
        for name in sorted(set(before) | set(after)):
            old, new = before.get(name), after.get(name)
            if old is None and new is not None:
                self._events.append(_WatchEvent("ADDED", kind, name, new))  # type: ignore[arg-type]
            elif old is not None and new is None:
                self._events.append(_WatchEvent("DELETED", kind, name, None))
            elif old != new:
                self._events.append(_WatchEvent("MODIFIED", kind, name, new))  # type: ignore[arg-type]

    def deliver(self) -> int:
        """Apply the undelivered events (as the delivery's faults shape them); returns how many
        were applied."""
        batch = self._events[self._delivered :]
        if self._duplicate and self._delivered:
            replay = self._events[max(0, self._delivered - self._REPLAYED) : self._delivered]
            batch = replay + batch
            self._injected["watch_duplicate"] += 1
            self._duplicate = False
        if self._reorder:
            swapped = _swap_first_pair_of_different_objects(batch)
            if swapped is not None:
                batch = swapped
                self._injected["watch_reorder"] += 1
                self._reorder = False
        for event in batch:
            self._apply(event)
        self._delivered = len(self._events)
        return len(batch)

    def _apply(self, event: _WatchEvent) -> None:
        items: dict[str, Node] | dict[str, Pod] = (
            self._nodes if event.kind == "node" else self._pods
        )
        if event.type == "DELETED":
            items.pop(event.name, None)
        else:
            items[event.name] = event.obj  # type: ignore[assignment]

    # -- ClusterGateway --------------------------------------------------------------------------

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        return [
            self._nodes[n]
            for n in sorted(self._nodes)
            if label is None or label in self._nodes[n].labels
        ]

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        wanted = dict(labels or {})
        return [
            pod
            for pod in (self._pods[n] for n in sorted(self._pods))
            if all(pod.labels.get(k) == v for k, v in wanted.items())
        ]

    def create_pod(self, spec: PodSpec) -> Pod:
        pod = self.server.create_pod(spec)
        self.record()
        return pod

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self.server.delete_pod(
            name, namespace=namespace, uid=uid, resource_version=resource_version
        )
        self.record()

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        self.server.ensure_priority_class(name, value, description=description)


def _swap_first_pair_of_different_objects(
    batch: list[_WatchEvent],
) -> list[_WatchEvent] | None:
    for i in range(len(batch) - 1):
        a, b = batch[i], batch[i + 1]
        if (a.kind, a.name) != (b.kind, b.name):
            return [*batch[:i], b, a, *batch[i + 2 :]]
    return None


# -- the world -----------------------------------------------------------------------------------


class _Process:
    """One controller process: its store connection, its leadership and its runtimes."""

    def __init__(self, world: _World, name: str) -> None:
        self.name = name
        backend = FaultyBackend(
            world.url, schedule=world.plan.schedule, injected=world.injected, counter=world.commits
        )
        backend.check_schema()
        runtimes = controller_runtimes(
            EventStore(backend),
            name=name,
            board=world.board,
            time=world.time,
            cloud=world.cloud,
            cluster=world.cluster,
            allocator=world.allocator,
            grouper=GROUPER,
            grouper_config=_CONFIG,
            node_config=_NODE_CONFIG,
            retry=_RETRY,
            snapshot_every=25,
        )
        self.store, self.lease, self.leadership = (
            runtimes.store,
            runtimes.lease,
            runtimes.leadership,
        )
        self.machines, self.nodes, self.ipam = runtimes.machines, runtimes.nodes, runtimes.ipam
        self._clock = world.time
        self.placement = self._new_placement()
        self.subnet_ready = False
        self.reported: dict[str, tuple[int, tuple[str, ...]]] = {}
        self.alive = True

    @property
    def leading(self) -> bool:
        return self.alive and self.leadership.term() is not None

    def _new_placement(self) -> PlacementRuntime:
        return placement_runtime(
            self.store,
            self.nodes.service,
            (WORKER_POOL,),
            machines=self.machines.service,
            clock=self._clock,
            leadership=self.leadership,
            retry=_RETRY,
        )

    def start(self) -> None:
        self.machines.start()
        self.nodes.start()
        self.ipam.start()
        # As ``serve`` runs it: started with the others, rebuilding its workloads from the log.
        self.placement.start()
        self.leadership.step()

    def follow(self) -> None:
        """What a follower's log follower thread does (threadless here): its grouper and read
        model catch up with what the leader appended, so that it leads from the log's present
        once elected."""
        self.machines.service.load()
        self.machines.projection.catch_up(self.store)

    def die(self) -> None:
        self.alive = False
        self.lease.expire()
        try:
            self.store.close()
        except Exception:  # a dead process's connection: nothing to do about it
            log.debug("closing a crashed process's store failed", process=self.name)


class _World:
    """One seed's discrete-event loop (see the module docstring)."""

    def __init__(self, plan: _Plan, settings: DstSettings, url: str, *, reader: EventStore) -> None:
        self.plan = plan
        self.settings = settings
        self.url = url
        self.time = VirtualTime(EPOCH, max_concurrent=8, stuck_after=_STUCK_AFTER_SECONDS)
        self.injected: Counter[str] = Counter()
        self.commits = [0]
        self.board: dict[str, str] = {}
        self.fake = FakeCloud(
            clock=self.time, latency=settings.cloud_latency_seconds, delete_failed=True
        )
        self.cloud = FaultyCloud(
            self.fake,
            plan.schedule,
            self.injected,
        )
        server = FakeCluster(
            [
                Node(f"node-{n}", cpu_millis=_NODE_CPU_MILLI, memory_mib=_NODE_MEMORY_MIB)
                for n in range(settings.nodes)
            ]
        )
        self.allocator = InMemoryAllocator()
        self.allocator.add_subnet(_SUBNET, _SUBNET_CAPACITY)
        self.cluster = WatchedCluster(server, self.injected)
        self.cluster.record()
        self.processes: list[_Process] = []
        self.processes_started = 0
        self.acknowledged: set[str] = set()
        self.workloads_acknowledged: set[str] = set()
        self._reader = reader
        self._read_machines_after = 0
        self._workers_made: list[str] = []
        self.queue: list[tuple[datetime, int, str, object]] = []
        self._order = 0
        self._agents = Random(plan.agent_seed)
        self._demand: dict[str, tuple[int, int]] = {}
        self._booting = False
        self.jumped = timedelta(0)
        """How far clock jumps moved time: the run's deadlines move with it."""

    # -- plumbing --------------------------------------------------------------------------------

    def at(self, seconds: float) -> datetime:
        return EPOCH + timedelta(seconds=seconds)

    def schedule(self, when: datetime, kind: str, payload: object = None) -> None:
        self._order += 1
        heapq.heappush(self.queue, (when, self._order, kind, payload))

    @property
    def leader(self) -> _Process | None:
        leaders = [p for p in self.processes if p.leading]
        return leaders[-1] if leaders else None

    def guarded(self, process: _Process, action: Callable[[], object]) -> bool:
        """Run ``action`` in ``process``; a crash there kills it. Whether it returned."""
        try:
            action()
            return True
        except ControllerCrashed as crash:
            self.crash(process, crash.kind)
            return False

    def crash(self, process: _Process, kind: str) -> None:
        if not process.alive:
            return
        log.info("dst: controller crashed", process=process.name, fault=kind)
        self.time.abandon(process.name)
        process.die()
        if self.leader is None and not self._booting:
            self._booting = True
            self.schedule(self.time.now() + timedelta(seconds=_RESTART_SECONDS), "boot")

    def boot(self) -> _Process:
        self._booting = False
        self.processes_started += 1
        process = _Process(self, f"p{self.processes_started}")
        self.processes.append(process)
        if not self.guarded(process, process.start):
            return process
        return process

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> None:
        s = self.settings
        self.boot()
        for at, request in self.plan.arrivals:
            self.schedule(self.at(at), "arrive", request)
        for pod in self.plan.pods:
            self.schedule(self.at(pod.placed_at), "place", pod)
            if pod.deleted_at is not None:
                self.schedule(self.at(pod.deleted_at), "remove", pod)
        for fault in self.plan.schedule.timed:
            self.schedule(self.at(fault.at_seconds), fault.kind, fault.amount)
        for at, group in self.plan.submissions:
            self.schedule(self.at(at), "submit", group)
        self.schedule(self.at(0.7), "placement")
        self.schedule(self.at(0.5), "agents")
        self.schedule(self.at(1.0), "sync")
        self.schedule(self.at(1.0), "heartbeat")
        self._loop(self.at(s.horizon_seconds + s.drain_seconds))

    def _loop(self, deadline: datetime) -> None:
        while True:
            self._settle()
            candidates: list[tuple[datetime, int]] = []
            wake = self.time.next_wakeup()
            if wake is not None:
                candidates.append((wake, 0))
            leader = self.leader
            due = leader.machines.service.next_deadline() if leader is not None else None
            if due is not None:
                candidates.append((due, 1))
            if self.queue:
                candidates.append((self.queue[0][0], 2))
            if not candidates:
                return
            when, kind = min(candidates)
            if when > deadline + self.jumped:
                return
            self.time.advance_to(when)
            if kind == 1 and leader is not None:
                self.guarded(leader, leader.machines.driver.step)
            elif kind == 2:
                _, _, what, payload = heapq.heappop(self.queue)
                self._do(what, payload)

    def _settle(self) -> None:
        while True:
            try:
                self.time.settle()
                return
            except ControllerCrashed as crash:
                owner = self.time.failed_owner
                process = next(p for p in self.processes if p.name == owner)
                self.crash(process, crash.kind)

    def _do(self, what: str, payload: object) -> None:
        if what == "arrive":
            assert isinstance(payload, MachineRequest)
            self._send(payload)
        elif what == "boot":
            self.boot()
        elif what == "place":
            assert isinstance(payload, _PodPlan)
            self._place(payload)
        elif what == "remove":
            assert isinstance(payload, _PodPlan)
            self._remove(payload)
        elif what == "submit":
            assert isinstance(payload, tuple)
            self._submit(payload)
        elif what == "placement":
            self._placement_round()
        elif what == "agents":
            self._agents_round()
        elif what == "sync":
            self._sync()
        elif what == "heartbeat":
            self._heartbeat()
        elif what == "crash":
            leader = self.leader
            if leader is not None:
                self.injected["crash"] += 1
                self.crash(leader, "crash")
        elif what == "leader_change":
            self._leader_change()
        elif what == "clock_jump":
            assert isinstance(payload, float)
            self.injected["clock_jump"] += 1
            self.jumped += timedelta(seconds=payload)
            self.time.advance_to(self.time.now() + timedelta(seconds=payload))
        elif what == "watch_duplicate":
            self.cluster.duplicate_next()
        elif what == "watch_reorder":
            self.cluster.reorder_next()

    def _recurring_until(self) -> datetime:
        s = self.settings
        return self.at(s.horizon_seconds + s.tail_seconds) + self.jumped

    # -- clients ---------------------------------------------------------------------------------

    def _send(self, request: MachineRequest) -> None:
        """A client sends its request; without an answer it sends it again (same id) later."""
        leader = self.leader
        answered = False
        if leader is not None:
            try:
                answered = self.guarded(leader, lambda: leader.machines.machines.enqueue(request))
            except MachinesError as e:
                log.info("dst: request not accepted; sending again", error=str(e))
        if answered:
            assert request.request_id is not None
            self.acknowledged.add(request.request_id)
        else:
            self.schedule(
                self.time.now() + timedelta(seconds=_CLIENT_RETRY_SECONDS), "arrive", request
            )

    def _submit(self, workloads: tuple[WorkloadRequest, ...]) -> None:
        """A client submits workloads for placement; without an answer (the log unreachable,
        the process dead or deposed) it sends the same ones again (same ids) later."""
        leader = self.leader
        answered = False
        if leader is not None:
            try:
                answered = self.guarded(leader, lambda: leader.placement.submit(workloads))
            except (LogUnavailable, RuntimeStopped) as e:
                log.info("dst: workloads not accepted; sending again", error=str(e))
        if answered:
            self.workloads_acknowledged.update(w.id for w in workloads)
        else:
            self.schedule(
                self.time.now() + timedelta(seconds=_CLIENT_RETRY_SECONDS), "submit", workloads
            )

    def _placement_round(self) -> None:
        """The leader's placement batches, as its batching thread runs them: what is queued,
        then what waits for workers that joined since. A failed batch is back in the queue."""
        leader = self.leader
        if leader is not None:
            try:
                self.guarded(leader, leader.placement.step)
            except PlacementError as e:
                log.info("dst: placement batch failed; the next round retries", error=str(e))
        if self.time.now() < self._recurring_until() or self._placement_open():
            self.schedule(self.time.now() + timedelta(seconds=_PLACEMENT_SECONDS), "placement")

    def _placement_open(self) -> bool:
        """Whether placement still has work the run should wait for: workloads queued, or
        waiting for workers (one whose machine failed is noticed by the next batch round, which
        plans its workloads again). Until the drain deadline."""
        leader = self.leader
        if leader is None:
            return bool(self.workloads_acknowledged)
        try:
            placement = leader.placement
        except ControllerCrashed as crash:
            self.crash(leader, crash.kind)
            return True
        return bool(len(placement.collector) or placement.service.pending_workers())

    def _join_workers(self) -> None:
        """Workers placement asked for join the cluster once the log shows their machines
        created (the kubelet registers a node when its VM has booted)."""
        for record in self._reader.read_all(
            after=self._read_machines_after, types=("vm.MachineCreated",)
        ):
            self._read_machines_after = record.global_position
            request_id = record.data["request_id"]
            if request_id.startswith(_WORKER_REQUEST_PREFIX):
                name = request_id.removeprefix(_WORKER_REQUEST_PREFIX)
                self.cluster.server.add_node(
                    Node(name, cpu_millis=_NODE_CPU_MILLI, memory_mib=_NODE_MEMORY_MIB)
                )
                self._workers_made.append(name)
        self.cluster.record()

    def _agents_round(self) -> None:
        leader = self.leader
        live = {p.name for p in self.cluster.server.list_pods()}
        for pod in self.plan.pods:
            if pod.name not in live:
                continue
            cpu, memory = self._demand.get(pod.name, (pod.cpu.use, pod.memory.use))
            unit = _NODE_CONFIG.compute_unit
            cpu = max(
                pod.cpu.min, min(pod.cpu.max, cpu + unit.cpu_milli * self._agents.randint(-2, 3))
            )
            memory = max(
                pod.memory.min,
                min(pod.memory.max, memory + unit.memory_slots * self._agents.randint(-1, 2)),
            )
            self._demand[pod.name] = (cpu, memory)
            if leader is None or not leader.alive:
                continue
            ask = partial(
                leader.nodes.service.request_resources, pod.name, cpu_milli=cpu, memory_slots=memory
            )

            try:
                if not self.guarded(leader, ask):
                    leader = self.leader
            except NodesError as e:
                log.debug("dst: agent request refused", pod=pod.name, error=str(e))
        if self.time.now() < self._recurring_until():
            self.schedule(
                self.time.now() + timedelta(seconds=self.settings.agent_period_seconds), "agents"
            )

    # -- the cluster -----------------------------------------------------------------------------

    def _place(self, pod: _PodPlan) -> None:
        self.cluster.server.create_pod(
            PodSpec(pod.name, node=pod.node, annotations=vm_annotations(pod.cpu, pod.memory))
        )
        self.cluster.record()

    def _remove(self, pod: _PodPlan) -> None:
        self.cluster.server.delete_pod(pod.name)
        self.cluster.record()

    def _sync(self) -> None:
        self._join_workers()
        self.cluster.deliver()
        leader = self.leader
        if leader is not None:
            try:
                if self.guarded(leader, leader.nodes.step):
                    self.guarded(leader, lambda: self._pod_ips(leader))
            except (NodesError, IpamError, EventStoreError) as e:
                log.info("dst: cluster sync pass failed; the next one retries", error=str(e))
        if self.time.now() < self._recurring_until() or self._placement_open():
            self.schedule(self.time.now() + timedelta(seconds=self.settings.sync_seconds), "sync")

    def _pod_ips(self, process: _Process) -> None:
        """The pod-IP side of a sync pass: the subnet and its nodes (once per process; again
        changes nothing), each node's demand as the cluster shows it, then the allocator calls
        the log asks for."""
        service = process.ipam.service
        nodes = [n.name for n in self.cluster.server.list_nodes()]
        if not process.subnet_ready:
            service.create(_SUBNET, _SUBNET_CAPACITY)
            service.join(_SUBNET, nodes)
            process.subnet_ready = True
        pods = Counter(p.node for p in self.cluster.server.list_pods())
        pools = service.stream(_SUBNET).state.nodes
        for node in nodes:
            pool = pools.get(node)
            held = pool.held if pool is not None else ()
            # A node's pods use the IPs it holds, up to their number (the rest stay spare).
            seen = (2 + pods[node], held[: 2 + pods[node]])
            if process.reported.get(node) != seen:
                service.report_demand(_SUBNET, node, *seen)
                process.reported[node] = seen
        process.ipam.step()

    def _heartbeat(self) -> None:
        """Each live process's leadership round, as its thread runs one every second: a leader
        renews its lease (or finds it gone and steps down), a follower catches up with the log
        and takes a free lease — the way out when an election could not be recorded."""
        for process in list(self.processes):
            if process.alive and not process.leading and self.settings.follower_catch_up:
                self.guarded(process, process.follow)
            if process.alive:
                self.guarded(process, process.leadership.step)
        if self.time.now() < self._recurring_until() or self.leader is None:
            self.schedule(self.time.now() + timedelta(seconds=_HEARTBEAT_SECONDS), "heartbeat")

    # -- leadership ------------------------------------------------------------------------------

    def _leader_change(self) -> None:
        """The leader's lease lapses (it stalled past the lease time): another process is
        elected before the old one notices, then the old one's heartbeat finds the lease gone."""
        old = self.leader
        if old is None:
            return
        self.injected["leader_change"] += 1
        old.lease.expire()
        self.boot()
        self.guarded(old, old.leadership.step)

    # -- the end ---------------------------------------------------------------------------------

    def live_state(self, store: EventStore) -> LiveState | None:
        """What the last leader holds in memory, caught up with the log, for the replay check."""
        leader = self.leader
        if leader is None:
            return None
        position = store.head()
        leader.machines.projection.catch_up(store)
        leader.ipam.projection.catch_up(store)
        # Placement appends its reservations to the node streams itself: the node service's
        # hosted streams fold them when they next load (as before any decision on them).
        for node in leader.nodes.service.hosted():
            leader.nodes.service.stream(node).load()
        subnets = leader.ipam.projection.dump()["subnets"]
        return LiveState(
            position=position,
            requests=dict(leader.machines.projection.views()),
            nodes_projection={**leader.nodes.dump(), "subnets": subnets},
            nodes_hosted=dumpstate_of(leader.nodes.service.hosted(), {}, position=position),
            workloads=_statuses(leader.placement.service, read_workloads(store)),
        )

    def close(self) -> None:
        for process in self.processes:
            if process.alive:
                self.time.abandon(process.name)
                process.alive = False
                try:
                    process.store.close()
                except Exception:
                    log.debug("closing a process's store failed", process=process.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveState:
    """What the live controller held at the end (``position``: the log's head then): its
    requests' read model, its node read model's dump and the dump of its hosted node states."""

    position: int
    requests: Mapping[str, object]
    nodes_projection: Mapping[str, object]
    nodes_hosted: Mapping[str, object]
    workloads: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)
    """Placement's read model: each workload in the log as ``status`` answers for it —
    ``(state, node, worker, reason)``, or ``("unknown",)`` when the controller does not know
    it."""


# -- the invariants ------------------------------------------------------------------------------


def check_log(
    store: EventStore,
    *,
    acknowledged: Iterable[str],
    workloads: Iterable[str] = (),
    creations: Sequence[str],
    deletions: Sequence[str],
    live: LiveState | None,
) -> tuple[Violation, ...]:
    """Every invariant of a seed, on its log read from position 0."""
    records = store.read_all(after=0)
    checks = NodeLogChecks()
    checks.replay(store)
    return (
        *check_request_outcomes(set(acknowledged), records),
        *check_workload_outcomes(set(workloads), records),
        *check_machines_created_once(creations, deletions),
        *check_grants(checks),
        *check_replay(store, live),
        *check_chain(store),
    )


def check_request_outcomes(
    acknowledged: set[str], records: Sequence[RecordedEvent]
) -> list[Violation]:
    """Each acknowledged request: in the log (else ``lost``), with exactly one outcome — one
    ``MachineCreated``/``MachineFailed`` and one mention in the grouper's recorded outcomes
    (none: ``stalled``; more: ``duplicated``)."""
    requested = {r.data["request_id"] for r in records if r.type == "vm.MachineRequested"}
    outcomes: Counter[str] = Counter()
    recorded: Counter[str] = Counter()
    for record in records:
        if record.type in ("vm.MachineCreated", "vm.MachineFailed"):
            outcomes[record.data["request_id"]] += 1
        elif record.type == "vm.BatchOutcomesRecorded":
            recorded.update(record.data["created_request_ids"])
            recorded.update(record.data["failed_request_ids"])
    violations: list[Violation] = []
    for request_id in sorted(acknowledged):
        if request_id not in requested:
            violations.append(Violation("lost", f"{request_id} was acknowledged but never logged"))
        elif outcomes[request_id] == 0 or recorded[request_id] == 0:
            violations.append(
                Violation(
                    "stalled",
                    f"{request_id} has {outcomes[request_id]} machine outcome(s) and "
                    f"{recorded[request_id]} recorded by the grouper at the end",
                )
            )
        elif outcomes[request_id] > 1 or recorded[request_id] > 1:
            violations.append(
                Violation(
                    "duplicated",
                    f"{request_id} has {outcomes[request_id]} machine outcomes and "
                    f"{recorded[request_id]} recorded by the grouper",
                )
            )
    return violations


_PLACED = "placement.WorkloadPlaced"
_ANSWERS = frozenset({_PLACED, "placement.WorkloadRejected", "placement.WorkloadReleased"})


def check_workload_outcomes(
    acknowledged: set[str], records: Sequence[RecordedEvent]
) -> list[Violation]:
    """Each acknowledged workload: in the log (``WorkloadSubmitted``, else ``lost``), with
    exactly one outcome on its ``workload-<id>`` stream — ``WorkloadPlaced`` (with its one
    reservation on a node's stream), ``WorkloadRejected`` (or ``WorkloadReleased``, which the
    clients here never ask for). A node's reservation of it with nothing on its stream counts
    as its placement, as placement's own recovery reads it (a placement made without
    ``record_placements``).

    A workload whose stream ends ``WorkloadWaiting`` for worker ``W`` has its outcome only if
    ``W`` is still *pending* when the run ends: its node never joined the node accounting (no
    ``NodeJoined`` on ``node-W``) and its machine request ``placement-W`` did not fail (no
    ``MachineFailed``). Waiting on a worker that joined, or whose machine failed and so never
    will, is no outcome. No outcome is ``stalled`` (as is a placement no node's stream
    reserves); two (or a workload reserved on two nodes, or both reserved and rejected) is
    ``duplicated``.
    """
    submitted: set[str] = set()
    answers: dict[str, list[str]] = {}
    reserved: Counter[str] = Counter()
    waiting: dict[str, str] = {}
    joined: set[str] = set()
    failed: set[str] = set()
    for record in records:
        data = record.data
        if record.type == "placement.WorkloadSubmitted":
            submitted.add(data["request"]["id"])
            waiting.pop(data["request"]["id"], None)
        elif record.type in _ANSWERS:
            answers.setdefault(data["workload_id"], []).append(record.type.split(".")[1])
            waiting.pop(data["workload_id"], None)
        elif record.type == "placement.WorkloadWaiting":
            waiting[data["workload_id"]] = data["worker"]
        elif record.type == "nodes.OtherPodReserved":
            reserved[data["pod"]] += 1
        elif record.type == "nodes.OtherPodsReserved":
            reserved.update(pod["pod"] for pod in data["pods"])
        elif record.type == "nodes.NodeJoined":
            joined.add(data["node"])
        elif record.type == "vm.MachineFailed":
            failed.add(data["request_id"])
    violations: list[Violation] = []
    for workload in sorted(acknowledged):
        found = answers.get(workload, [])
        placed = found.count(_PLACED.split(".")[1])
        if workload not in submitted:
            violations.append(
                Violation("lost", f"workload {workload} was acknowledged but never logged")
            )
        # Reserved on a node yet answered otherwise (rejected) is two outcomes as well.
        elif (
            len(found) > 1 or reserved[workload] > 1 or (reserved[workload] and placed < len(found))
        ):
            violations.append(
                Violation(
                    "duplicated",
                    f"workload {workload} has outcomes {found or 'none'} and "
                    f"{reserved[workload]} node reservation(s)",
                )
            )
        elif placed and not reserved[workload]:
            violations.append(
                Violation("stalled", f"workload {workload} is placed but no node reserves it")
            )
        elif not found and not reserved[workload]:
            worker = waiting.get(workload)
            pending = (
                worker is not None
                and worker not in joined
                and f"{_WORKER_REQUEST_PREFIX}{worker}" not in failed
            )
            if not pending:
                why = (
                    "queued"
                    if worker is None
                    else f"waiting for {worker}, which "
                    + ("joined" if worker in joined else "failed to be created")
                )
                violations.append(
                    Violation("stalled", f"workload {workload} has no outcome at the end ({why})")
                )
    return violations


def check_machines_created_once(
    creations: Sequence[str], deletions: Sequence[str]
) -> list[Violation]:
    """The cloud made no machine twice (a name made again after its failed machine was deleted
    is not a second machine)."""
    made, deleted = Counter(creations), Counter(deletions)
    return [
        Violation(
            "machine_created_twice", f"{name} was created {n} times ({deleted[name]} deleted)"
        )
        for name, n in sorted(made.items())
        if n - 1 - deleted[name] > 0
    ]


def check_grants(checks: NodeLogChecks) -> list[Violation]:
    """No grant reserved a node beyond ``total − system`` (and no amount went below zero)."""
    violations = [Violation("grant_beyond_capacity", d) for d in checks.beyond_capacity]
    if checks.negative_values:
        violations.append(
            Violation("grant_beyond_capacity", f"{checks.negative_values} amounts below zero")
        )
    return violations


def check_replay(store: EventStore, live: LiveState | None) -> list[Violation]:
    """The read models and node accounting rebuilt from position 0 equal the live ones."""
    if live is None:
        return []
    violations: list[Violation] = []
    fresh = _fresh_requests()
    fresh.catch_up(store)
    rebuilt = dict(fresh.views())
    if rebuilt != dict(live.requests):
        differing = sorted(
            k for k in set(rebuilt) | set(live.requests) if rebuilt.get(k) != live.requests.get(k)
        )
        violations.append(
            Violation("replay_mismatch", f"machine requests differ: {', '.join(differing[:5])}")
        )
    if live.workloads:
        rebuilt_workloads = _rebuilt_workloads(store)
        if rebuilt_workloads != dict(live.workloads):
            differing = sorted(
                k
                for k in set(rebuilt_workloads) | set(live.workloads)
                if rebuilt_workloads.get(k) != live.workloads.get(k)
            )
            violations.append(
                Violation(
                    "replay_mismatch",
                    "workloads differ: "
                    + ", ".join(
                        f"{k} live {live.workloads.get(k)} replay {rebuilt_workloads.get(k)}"
                        for k in differing[:3]
                    ),
                )
            )
    replayed = dumpstate_at(store, live.position)
    # The hosted states are the nodes' only (a subnet's hosted stream does not keep its last
    # batch change, which the dump shows): they are compared with the nodes' replay.
    nodes_only = node_projection.dumpstate_at(store, live.position)
    for label, held, rebuilt_dump in (
        ("read models", live.nodes_projection, replayed),
        ("hosted nodes", live.nodes_hosted, {**nodes_only, "subnets": {}}),
    ):
        if _sha(held) != _sha(rebuilt_dump):
            violations.append(
                Violation(
                    "replay_mismatch",
                    f"dumpstate ({label}) sha256 {_sha(held)[:12]} != replay "
                    f"{_sha(rebuilt_dump)[:12]} at position {live.position}",
                )
            )
    return violations


def replayed_state(store: EventStore) -> LiveState:
    """What a replay of the whole log rebuilds, in the form of a :class:`LiveState` (equal to
    a live controller's that holds what the log says)."""
    position = store.head()
    requests = _fresh_requests()
    requests.catch_up(store)
    return LiveState(
        position=position,
        requests=dict(requests.views()),
        nodes_projection=dumpstate_at(store, position),
        nodes_hosted=dumpstate_of(
            node_projection.fold_nodes(store, position), {}, position=position
        ),
        workloads=_rebuilt_workloads(store),
    )


def check_chain(store: EventStore) -> list[Violation]:
    """``audit verify``: the hash chain over the whole log."""
    report = store.verify(after=0)
    if report.ok:
        return []
    return [
        Violation(
            "hash_chain",
            f"first bad position {report.first_bad_position}: {report.reason}",
        )
    ]


def _sha(dump: Mapping[str, object]) -> str:
    return hashlib.sha256(dump_json(dict(dump)).encode("utf-8")).hexdigest()


def _outcomes(store: EventStore) -> dict[str, str]:
    """Each request's status at the end, from a fresh read of the log."""
    projection = _fresh_requests()
    projection.catch_up(store)
    return {k: v.status for k, v in sorted(projection.views().items())}


_TESTBED_SETUP_COMMITS = 10
"""Commits the testbed scenario's definitions take (a testbed, three jobs, a scheduling, with
room to spare): a client's requests, before the controller's own work the faults aim at."""


def _run_testbeds(seed: int, url: str, injected: Counter[str]) -> tuple[Violation, ...]:
    """The testbed scenario (:mod:`.testbed`: jobs on slots through the extender) on the seed's
    log, under faults drawn from the seed: lost commit replies and controller crashes inside a
    group commit (after the scenario's own definitions, which are a client's requests), and
    crashes and leader changes between the controller's passes. Its processes are driven pass
    by pass on a manual clock of the scenario's own."""
    rng = Random(f"{seed}:testbeds")
    commit_faults: tuple[CommitFault, ...] = (
        "commit_reply_lost",
        "crash_in_commit",
        "crash_after_commit",
    )
    schedule = FaultSchedule(
        seed=seed,
        cloud_calls={},
        commits={
            rng.randint(_TESTBED_SETUP_COMMITS + 1, 80): rng.choice(commit_faults)
            for _ in range(rng.randint(0, 3))
        },
        machines={},
        timed=(),
    )
    faults = ControllerFaults(
        crashes=frozenset(rng.sample(range(2, 30), rng.randint(0, 2))),
        leader_changes=frozenset(rng.sample(range(2, 30), rng.randint(0, 2))),
    )
    backend = FaultyBackend(url, schedule=schedule, injected=injected, counter=[0])
    backend.check_schema()
    store = EventStore(backend)
    # The scheduler's extender is a process of its own (``fleetledger extender``): the
    # controller's crashes do not reach its reservations, which go through its own store.
    extender_store = open_store(url)
    try:
        report = run_testbed_scenario(
            seed, store=store, faults=faults, extender_store=extender_store
        )
        injected["testbed_crash"] += report.controller_crashes
        injected["testbed_leader_change"] += report.leader_changes
        events = [TESTBED.codec.decode(r) for r in store.read_stream(testbed.stream_name("bed"))]
    except Exception as e:  # a bug the runtime let escape
        log.exception("dst testbeds raised", seed=seed)
        return (Violation("error", f"testbeds: {type(e).__name__}: {e}"),)
    finally:
        store.close()
        extender_store.close()
    violations = [Violation("slot_held_twice", d) for d in double_reservations(events)]
    if report.slots_held_by_two_pods > len(violations):
        violations.append(
            Violation(
                "slot_held_twice",
                f"{report.slots_held_by_two_pods - len(violations)} slot(s) had two pods in "
                "the cluster at once",
            )
        )
    if report.applications_leaked:
        violations.append(
            Violation(
                "leaked",
                f"{report.applications_leaked} application(s) left behind for jobs released or "
                "finished",
            )
        )
    if report.deadlocked_schedulings:
        violations.append(
            Violation(
                "stalled",
                f"{report.deadlocked_schedulings} testbed scheduling(s) unfinished though "
                "nothing blocked them",
            )
        )
    return tuple(violations)


def _rebuilt_workloads(store: EventStore) -> dict[str, tuple[str | None, ...]]:
    """Placement's read model as a controller started on the log now rebuilds it (its
    ``recover``, with no machine requester: a replay asks for nothing)."""
    clock = ManualClock(EPOCH)
    nodes = NodeService(store, clock=clock)
    for node in nodes.logged_nodes():
        nodes.stream(node)
    service = PlacementService(
        store, nodes, (WORKER_POOL,), clock=clock, machines=None, record_placements=True
    )
    service.recover()
    return _statuses(service, read_workloads(store))


def _statuses(
    service: PlacementService, workloads: Mapping[str, object]
) -> dict[str, tuple[str | None, ...]]:
    found: dict[str, tuple[str | None, ...]] = {}
    for workload in sorted(workloads):
        try:
            status = service.status(workload)
        except UnknownWorkload:
            found[workload] = ("unknown",)
            continue
        found[workload] = (status.state, status.node, status.worker, status.reason)
    return found


def _fresh_requests() -> MachineRequestsProjection:
    return MachineRequestsProjection(
        grouper_stream=grouper_stream_id(GROUPER), batch_stream_prefix=batch_stream_prefix(GROUPER)
    )
