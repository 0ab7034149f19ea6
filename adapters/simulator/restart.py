"""The ``restart`` scenario: a fleet under agent traffic, its controller restarted mid-run.

Autoscaler agents keep scaling their VMs while no controller answers, bounded by the last permit
they were given (seed 04, "Startup uncertainty"). When a controller comes back it must hold some
capacity as *buffer* until each agent reports its real use. The seed holds every VM pod at its
max; we hold it at the last permit the log recorded. This scenario runs the same traffic under
both rules, side by side, and reports the capacity held as buffer right after the restart and
the virtual time until every buffer is back to zero.

**It runs the runtime ``serve`` runs.** Each rule's run drives
:class:`~fleetledger.adapters.nodes.NodesRuntime` (the node service on the decider host, cluster
sync, the migration reactor, the read model) on a manual clock, against a fake cluster:

- the cluster holds the nodes and the VM pods, whose annotations show each VM's bounds and its
  current use (NeonVM's ``VirtualMachine``); the runtime joins the nodes and reserves the pods
  through cluster sync, as it would on Kubernetes;
- agents ask through :meth:`~fleetledger.adapters.nodes.NodeService.arequest_resources`, the
  path of the agents' HTTP API. Requests are taken in rounds of one virtual second (each agent
  asks on the first whole second at or after its tick): those of one round are in flight
  together, so the store's group commit joins them, as it joins a real burst;
- a migration the nodes decide reaches the migration reactor, which asks the cluster's
  :class:`~fleetledger.adapters.nodes.Migrations` port to move the VM; the move finishes
  ``migration_seconds`` later (on the node with the most free CPU that fits it, asked of the
  node accounting the way a scheduler's filter would) and cluster sync records it;
- **the restart is real**: at ``restart_at_seconds`` the runtime is stopped; agents scale within
  their last permit and other schedulers place a few VM pods; ``downtime_seconds`` later a *new*
  runtime object starts on the same store. It rebuilds every node from the log — each node's
  latest snapshot (the node streams snapshot every ``snapshot_every`` events) plus the events
  after it — and takes the nodes over as a new incarnation with the cluster's listing
  (``RestartController``), which is where it must assume what the log cannot tell.

The log-bound run appends to the scenario's log (``url``, else a scratch file); the assume-max
run, for comparison, to a scratch log of its own, so each log holds one controller's history.

What the restart reports (for each rule; the top level is the log-bound run's):

``rebuilt_from_position``
    The log's head when the new runtime started: its rebuild read each node's stream up to this
    global position (from the node's latest snapshot on), and nothing after it had happened yet.
``rebuild_seconds``
    Wall-clock seconds of the new runtime's ``start()``: loading every node (snapshot and
    tail), catching its read model up and taking the nodes over. The one figure that is not a
    function of the seed.
``rebuild``
    How many nodes started from a snapshot, and how many events were folded on top of them.
``assumed``
    What the takeover had to assume: VM pods bounded by their last logged permit, and pods the
    log never saw (placed while no controller ran), held at their max. ``buffer_after_restart``
    is the capacity those assumptions hold back.
``checkpoints``
    The dumpstate the live runtime held at three log positions — before the restart, right
    after the takeover (buffers held) and at the end — with its SHA-256, for checking
    ``fleetledger dumpstate --as-of POSITION`` (a replay of the log) against it.

Everything else is a function of the seed: one ``random.Random`` lays out the fleet, and each
agent draws its demand and timing from its own generator seeded from the run's seed and its name,
so both rules see exactly the same agent behaviour even where their answers differ.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from random import Random

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node, Pod, PodSpec
from fleetledger.adapters.nodes import (
    Grant,
    MigratingPodMismatch,
    NodesRuntime,
    vm_annotations,
)
from fleetledger.domain import nodes
from fleetledger.domain.nodes import (
    Bounds,
    ComputeUnit,
    NodeConfig,
    NodeState,
    ReservePod,
    StartupRule,
    Unschedulable,
    VmPod,
    VmPodSpec,
)
from fleetledger.eventstore import EventStore
from fleetledger.projections.dumpstate import dumpstate_of

from .logs import simulation_store
from .node_checks import NodeLogChecks
from .report import Checkpoint

__all__ = [
    "RestartReport",
    "RestartSettings",
    "RuleOutcome",
    "run_restart_scenario",
]

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
"""Virtual time zero (fixed, so every event time is a function of the seed)."""
GIB = 1 << 30
_ROUND_SECONDS = 1
_PAGE = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartSettings:
    """The fleet, its traffic and the restart. The defaults are the CLI's scenario."""

    nodes: int = 10
    pods_per_node: int = 12
    node_cpu_milli: int = 32_000
    node_memory_slots: int = 128
    watermark: float = 0.85
    compute_unit: ComputeUnit = field(default_factory=lambda: ComputeUnit(250, 1))
    agent_period_seconds: float = 5.0
    restart_at_seconds: float = 60.0
    downtime_seconds: float = 30.0
    reconnect_spread_seconds: float = 60.0
    run_after_restart_seconds: float = 90.0
    pods_placed_while_down: int = 3
    migration_seconds: float = 20.0
    snapshot_every: int = 100

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.pods_per_node < 1:
            raise ValueError("the restart scenario needs at least 2 nodes and 1 pod per node")
        if self.run_after_restart_seconds <= self.reconnect_spread_seconds:
            raise ValueError(
                "run_after_restart_seconds must exceed reconnect_spread_seconds, or some agents "
                "never reconnect within the run"
            )
        if self.snapshot_every < 1:
            raise ValueError(f"snapshot_every must be at least 1 event, got {self.snapshot_every}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleOutcome:
    """One rule's run: what the restart held and what followed."""

    rule: StartupRule
    buffer_cpu_milli: int
    buffer_memory_slots: int
    reserved_cpu_milli: int
    reserved_memory_slots: int
    pods_with_buffer: int
    seconds_until_buffers_zero: float | None
    buffer_cpu_seconds: float
    buffer_memory_slot_seconds: float
    requests: int
    grants_short: int
    migrations_started: int
    migrations_unplaced: int
    negative_values: int
    grants_beyond_capacity: int
    replay_mismatches: int
    rebuilt_from_position: int
    rebuild_seconds: float
    nodes_from_snapshots: int
    events_after_snapshots: int
    pods_bounded_by_last_permit: int
    pods_never_seen: int
    checkpoints: tuple[Checkpoint, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures."""
        return {
            "buffer_after_restart": {
                "cpu_milli": self.buffer_cpu_milli,
                "memory_slots": self.buffer_memory_slots,
            },
            "reserved_after_restart": {
                "cpu_milli": self.reserved_cpu_milli,
                "memory_slots": self.reserved_memory_slots,
            },
            "pods_with_buffer": self.pods_with_buffer,
            "seconds_until_buffers_zero": self.seconds_until_buffers_zero,
            "buffer_held": {
                "cpu_seconds": self.buffer_cpu_seconds,
                "memory_slot_seconds": self.buffer_memory_slot_seconds,
            },
            "requests": self.requests,
            "grants_short": self.grants_short,
            "migrations_started": self.migrations_started,
            "migrations_unplaced": self.migrations_unplaced,
            "negative_values": self.negative_values,
            "grants_beyond_capacity": self.grants_beyond_capacity,
            "replay_mismatches": self.replay_mismatches,
            "rebuilt_from_position": self.rebuilt_from_position,
            "rebuild_seconds": round(self.rebuild_seconds, 3),
            "rebuild": self.rebuild_dict(),
            "assumed": self.assumed_dict(),
        }

    def rebuild_dict(self) -> dict[str, int]:
        return {
            "nodes_from_snapshots": self.nodes_from_snapshots,
            "events_after_snapshots": self.events_after_snapshots,
        }

    def assumed_dict(self) -> dict[str, int]:
        return {
            "pods_bounded_by_last_permit": self.pods_bounded_by_last_permit,
            "pods_never_seen_held_at_max": self.pods_never_seen,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartReport:
    """Both rules on the same seed. Top-level figures are ours (log-bound); safety sums both."""

    seed: int
    settings: RestartSettings
    vm_pods: int
    log_bound: RuleOutcome
    assume_max: RuleOutcome

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """The log-bound run's checkpoints: positions of the log this run leaves."""
        return self.log_bound.checkpoints

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``."""
        s = self.settings
        ours, seeds = self.log_bound, self.assume_max
        return {
            "scenario": "restart",
            "seed": self.seed,
            "config": {
                "nodes": s.nodes,
                "vm_pods": self.vm_pods,
                "node_cpu_milli": s.node_cpu_milli,
                "node_memory_slots": s.node_memory_slots,
                "agent_period_seconds": s.agent_period_seconds,
                "restart_at_seconds": s.restart_at_seconds,
                "downtime_seconds": s.downtime_seconds,
                "reconnect_spread_seconds": s.reconnect_spread_seconds,
                "snapshot_every": s.snapshot_every,
            },
            "buffer_after_restart": {
                "log_bound": ours.to_dict()["buffer_after_restart"],
                "assume_max": seeds.to_dict()["buffer_after_restart"],
            },
            "seconds_until_buffers_zero": ours.seconds_until_buffers_zero,
            "negative_values": ours.negative_values + seeds.negative_values,
            "grants_beyond_capacity": ours.grants_beyond_capacity + seeds.grants_beyond_capacity,
            "requests": ours.requests,
            "migrations_started": ours.migrations_started,
            "rebuilt_from_position": ours.rebuilt_from_position,
            "rebuild_seconds": round(ours.rebuild_seconds, 3),
            "rebuild": ours.rebuild_dict(),
            "assumed": ours.assumed_dict(),
            "checkpoints": [c.to_dict() for c in ours.checkpoints],
            "by_rule": {"log_bound": ours.to_dict(), "assume_max": seeds.to_dict()},
        }

    def render(self) -> str:
        """A readable side-by-side report."""
        s, ours, seeds = self.settings, self.log_bound, self.assume_max
        rows = [
            (
                "buffer after restart, CPU",
                _cpu(ours.buffer_cpu_milli),
                _cpu(seeds.buffer_cpu_milli),
            ),
            (
                "buffer after restart, memory",
                f"{ours.buffer_memory_slots} slots",
                f"{seeds.buffer_memory_slots} slots",
            ),
            (
                "reserved after restart, CPU",
                _cpu(ours.reserved_cpu_milli),
                _cpu(seeds.reserved_cpu_milli),
            ),
            ("pods holding a buffer", str(ours.pods_with_buffer), str(seeds.pods_with_buffer)),
            (
                "  bounded by the last permit",
                str(ours.pods_bounded_by_last_permit),
                str(seeds.pods_bounded_by_last_permit),
            ),
            (
                "  never seen: held at max",
                str(ours.pods_never_seen),
                str(seeds.pods_never_seen),
            ),
            (
                "until buffers are zero",
                _seconds(ours.seconds_until_buffers_zero),
                _seconds(seeds.seconds_until_buffers_zero),
            ),
            (
                "buffer held until then, CPU·s",
                f"{ours.buffer_cpu_seconds:.0f}",
                f"{seeds.buffer_cpu_seconds:.0f}",
            ),
            (
                "buffer held until then, slot·s",
                f"{ours.buffer_memory_slot_seconds:.0f}",
                f"{seeds.buffer_memory_slot_seconds:.0f}",
            ),
            ("agent requests", str(ours.requests), str(seeds.requests)),
            ("grants short of the request", str(ours.grants_short), str(seeds.grants_short)),
            ("migrations started", str(ours.migrations_started), str(seeds.migrations_started)),
            ("negative values", str(ours.negative_values), str(seeds.negative_values)),
            (
                "grants beyond capacity",
                str(ours.grants_beyond_capacity),
                str(seeds.grants_beyond_capacity),
            ),
            (
                "replays differing from live",
                str(ours.replay_mismatches),
                str(seeds.replay_mismatches),
            ),
            (
                "rebuilt from log position",
                str(ours.rebuilt_from_position),
                str(seeds.rebuilt_from_position),
            ),
            (
                "  nodes from a snapshot",
                f"{ours.nodes_from_snapshots}/{s.nodes}",
                f"{seeds.nodes_from_snapshots}/{s.nodes}",
            ),
            (
                "  events after the snapshots",
                str(ours.events_after_snapshots),
                str(seeds.events_after_snapshots),
            ),
            (
                "  rebuild wall time",
                f"{ours.rebuild_seconds * 1000:.0f} ms",
                f"{seeds.rebuild_seconds * 1000:.0f} ms",
            ),
        ]
        width = max(len(row[0]) for row in rows)
        lines = [
            f"scenario restart (seed {self.seed}): {s.nodes} nodes, {self.vm_pods} VM pods; "
            f"controller down at {s.restart_at_seconds:g} s for {s.downtime_seconds:g} s; "
            f"agents reconnect within {s.reconnect_spread_seconds:g} s",
            f"  {'':<{width}}  {'log-bound':>14}  {'assume-max':>14}",
        ]
        lines.extend(f"  {name:<{width}}  {left:>14}  {right:>14}" for name, left, right in rows)
        freed_cpu = seeds.buffer_cpu_milli - ours.buffer_cpu_milli
        freed_memory = seeds.buffer_memory_slots - ours.buffer_memory_slots
        lines.append(
            f"  the log-bound rule frees {_cpu(freed_cpu)} and {freed_memory} memory slots "
            "right after the restart"
        )
        lines.extend(
            f"  checkpoint {c.label}: position {c.position}, sha256 {c.sha256[:16]}…"
            for c in ours.checkpoints
        )
        return "\n".join(lines)


def _cpu(milli: int) -> str:
    return f"{milli / 1000:g} CPU"


def _seconds(value: float | None) -> str:
    return "not in the run" if value is None else f"{value:.1f} s"


def run_restart_scenario(
    seed: int = 1, settings: RestartSettings | None = None, *, url: str | None = None
) -> RestartReport:
    """Run the scenario under both startup rules with ``seed``: the log-bound run on the log at
    ``url`` (which must hold no events yet; a scratch SQLite file when ``None``), the assume-max
    run on a scratch log."""
    settings = settings or RestartSettings()
    fleet = _layout(Random(seed), settings)
    with simulation_store(url, fresh=True) as store:
        ours = _Run(seed, settings, fleet, "log_bound", store).run()
    with simulation_store(None) as scratch:
        seeds = _Run(seed, settings, fleet, "assume_max", scratch).run()
    return RestartReport(
        seed=seed,
        settings=settings,
        vm_pods=len(fleet.pods) + len(fleet.late_pods),
        log_bound=ours,
        assume_max=seeds,
    )


# -- the fleet -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PodPlan:
    name: str
    node: str
    cpu: Bounds
    memory: Bounds
    placed_at: float


@dataclass(frozen=True, slots=True)
class _Fleet:
    nodes: tuple[str, ...]
    pods: tuple[_PodPlan, ...]
    late_pods: tuple[_PodPlan, ...]


def _layout(rng: Random, settings: RestartSettings) -> _Fleet:
    """Nodes and VM pods; a few pods are placed by another scheduler while ours is down."""
    unit = settings.compute_unit
    names = tuple(f"node-{n:02d}" for n in range(settings.nodes))

    def plan(name: str, node: str, placed_at: float) -> _PodPlan:
        cpu_max = rng.randrange(8, 33) * unit.cpu_milli
        cpu_min = rng.randrange(1, 4) * unit.cpu_milli
        cpu_use = rng.randrange(cpu_min, cpu_max // 2 + 1, unit.cpu_milli)
        memory_max = rng.randrange(4, 17) * unit.memory_slots
        memory_min = unit.memory_slots
        memory_use = rng.randrange(memory_min, memory_max // 2 + 1, unit.memory_slots)
        return _PodPlan(
            name,
            node,
            Bounds(cpu_min, cpu_use, cpu_max),
            Bounds(memory_min, memory_use, memory_max),
            placed_at,
        )

    pods = tuple(
        plan(f"vm-{n:02d}-{p:02d}", node, 0.0)
        for n, node in enumerate(names)
        for p in range(settings.pods_per_node)
    )
    down = settings.restart_at_seconds
    late = tuple(
        plan(
            f"vm-late-{k:02d}", rng.choice(names), down + rng.uniform(0, settings.downtime_seconds)
        )
        for k in range(settings.pods_placed_while_down)
    )
    return _Fleet(names, pods, late)


@dataclass(slots=True)
class _Agent:
    """One autoscaler agent: its VM's bounds, its use, its last permit and its own randomness."""

    name: str
    node: str
    cpu: Bounds
    memory: Bounds
    rng: Random
    baseline_cpu: int
    baseline_memory: int
    use_cpu: int
    use_memory: int
    permit_cpu: int
    permit_memory: int
    demand_cpu: int
    demand_memory: int
    next_tick: float = 0.0
    reconnect_at: float = 0.0
    gone: bool = False


def _walk(rng: Random, value: int, baseline: int, bounds: Bounds, step: int) -> int:
    """A bounded random walk in compute units, pulled back towards the pod's usual demand."""
    value += step * rng.choice((-2, -1, -1, 0, 0, 1, 1, 2))
    if rng.random() < 0.3:
        value += step if value < baseline else -step
    return max(bounds.min, min(bounds.max, value))


def _round_up(seconds: float) -> float:
    """The request round an agent's tick falls in: the first whole second at or after it."""
    return float(math.ceil(seconds / _ROUND_SECONDS) * _ROUND_SECONDS)


# -- the world around the runtime ----------------------------------------------------------------


class _VmCluster:
    """The scenario's cluster: a :class:`FakeCluster` whose VM pods show their VM's use now.

    A VM pod's annotations carry its VM's min, use and max (NeonVM's ``VirtualMachine``); an
    agent scaling the VM changes the use, which a controller taking a node over reads. The fake
    cluster's pods do not change once created, so listing shows each VM's current use, read from
    ``use_of``.
    """

    def __init__(self, nodes: Sequence[Node], use_of: Callable[[str], tuple[int, int]]) -> None:
        self._cluster = FakeCluster(nodes)
        self._use_of = use_of
        self._bounds: dict[str, tuple[Bounds, Bounds]] = {}

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        return self._cluster.list_nodes(label=label)

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        return [self._showing_use(pod) for pod in self._cluster.list_pods(labels=labels)]

    def create_pod(self, spec: PodSpec) -> Pod:
        return self._cluster.create_pod(spec)

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self._cluster.delete_pod(
            name, namespace=namespace, uid=uid, resource_version=resource_version
        )
        self._bounds.pop(name, None)

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        self._cluster.ensure_priority_class(name, value, description=description)

    def place(self, name: str, node: str, cpu: Bounds, memory: Bounds) -> None:
        """A scheduler binds the VM pod ``name`` to ``node``."""
        self._cluster.create_pod(PodSpec(name, node=node, annotations=vm_annotations(cpu, memory)))
        self._bounds[name] = (cpu, memory)

    def _showing_use(self, pod: Pod) -> Pod:
        bounds = self._bounds.get(pod.name)
        if bounds is None:
            return pod
        cpu, memory = bounds
        use_cpu, use_memory = self._use_of(pod.name)
        annotations = vm_annotations(
            Bounds(cpu.min, use_cpu, cpu.max), Bounds(memory.min, use_memory, memory.max)
        )
        return replace(pod, annotations=annotations)


class _Migrations:
    """The cluster's side of migrations (the runtime's ``Migrations`` port): a start is noted,
    and the scenario finishes the move later; a repeat for a VM already moving changes nothing.
    Called on the scenario's thread (the reactor runs in :meth:`NodesRuntime.step`)."""

    def __init__(self) -> None:
        self._moving: set[str] = set()
        self._new: list[tuple[str, str]] = []

    def start_migration(self, *, node: str, pod: str) -> None:
        if pod in self._moving:
            return
        self._moving.add(pod)
        self._new.append((node, pod))

    def take_started(self) -> list[tuple[str, str]]:
        """The migrations started since the last call, as ``(node, pod)`` in name order (the
        reactor's order within one commit of several nodes is the store's, not the seed's)."""
        started, self._new = sorted(self._new), []
        return started

    def moving(self, pod: str) -> bool:
        return pod in self._moving

    def finished(self, pod: str) -> None:
        self._moving.discard(pod)


# -- one run -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rebuild:
    from_position: int
    seconds: float
    nodes_from_snapshots: int
    events_after_snapshots: int


class _Run:
    """The discrete-event loop for one startup rule, around the node accounting runtime."""

    def __init__(
        self,
        seed: int,
        settings: RestartSettings,
        fleet: _Fleet,
        rule: StartupRule,
        store: EventStore,
    ) -> None:
        self.seed = seed
        self.settings = settings
        self.fleet = fleet
        self.rule: StartupRule = rule
        self.store = store
        self.clock = ManualClock(EPOCH)
        self.config = NodeConfig(
            cpu_system_milli=1000,
            memory_system_slots=4,
            cpu_watermark=settings.watermark,
            memory_watermark=settings.watermark,
            compute_unit=settings.compute_unit,
            memory_slot_bytes=GIB,
        )
        self.cluster = _VmCluster(
            [
                Node(
                    name,
                    cpu_millis=settings.node_cpu_milli,
                    memory_mib=settings.node_memory_slots * (GIB >> 20),
                )
                for name in fleet.nodes
            ],
            self._use_of,
        )
        self.migrations = _Migrations()
        self.runtime = self._runtime()
        self.agents: dict[str, _Agent] = {}
        self.asks: list[tuple[_Agent, int, int]] = []
        self.queue: list[tuple[float, int, str, str]] = []
        self.sequence = 0
        self.controller_up = True
        self.restart_done_at: float | None = None
        self.buffers_zero_at: float | None = None
        self.held = (0, 0)
        self.buffer_cpu_seconds = 0.0
        self.buffer_memory_slot_seconds = 0.0
        self.requests = 0
        self.migrations_unplaced = 0
        self.after_restart: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        self.rebuild = _Rebuild(0, 0.0, 0, 0)
        self.checkpoints: list[Checkpoint] = []
        self.deferred: list[str] = []
        self.now = 0.0

    def _runtime(self) -> NodesRuntime:
        """A runtime as ``serve`` builds it, threadless: the scenario calls ``step``."""
        return NodesRuntime(
            self.store,
            self.cluster,
            migrations=self.migrations,
            clock=self.clock,
            config=self.config,
            rule=self.rule,
            threads=False,
            snapshot_every=self.settings.snapshot_every,
        )

    # -- plumbing --------------------------------------------------------------------------------

    def schedule(self, at: float, kind: str, subject: str) -> None:
        self.sequence += 1
        heapq.heappush(self.queue, (at, self.sequence, kind, subject))

    def _use_of(self, pod: str) -> tuple[int, int]:
        agent = self.agents[pod]
        return agent.use_cpu, agent.use_memory

    def _advance(self, seconds: float) -> None:
        ahead = EPOCH + timedelta(seconds=seconds) - self.clock.now()
        if ahead > timedelta(0):
            self.clock.advance(ahead)

    def _pod(self, agent: _Agent) -> VmPod:
        return self.runtime.service.stream(agent.node).state.vm_pods[agent.name]

    def _checkpoint(self, label: str) -> None:
        """What the live runtime holds now, as the dump a replay to the head must equal."""
        position = self.store.head()
        states = self.runtime.service.hosted()
        self.checkpoints.append(
            Checkpoint(label, position, dumpstate_of(states, {}, position=position))
        )

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> RuleOutcome:
        s = self.settings
        self.runtime.start()  # joins the cluster's nodes: incarnation 1, no pods yet
        for plan in self.fleet.pods:
            self._start_agent(plan)
            self.cluster.place(plan.name, plan.node, plan.cpu, plan.memory)
        self.runtime.step()  # cluster sync reserves the running pods
        for plan in self.fleet.late_pods:
            self.schedule(plan.placed_at, "late", plan.name)
        self.schedule(s.restart_at_seconds, "down", "")
        self.schedule(s.restart_at_seconds + s.downtime_seconds, "up", "")
        end = s.restart_at_seconds + s.downtime_seconds + s.run_after_restart_seconds
        while self.queue and self.queue[0][0] <= end:
            when = self.queue[0][0]
            self._hold_buffers_until(when)
            self.now = when
            self._advance(when)
            while self.queue and self.queue[0][0] == when:
                _, _, kind, subject = heapq.heappop(self.queue)
                if kind == "tick":
                    self._tick(self.agents[subject])
                else:
                    self._flush()
                    self._step(kind, subject)
            self._flush()
            self._watch_buffers()
        self._checkpoint("end")
        outcome = self._outcome()
        self.runtime.stop()
        return outcome

    def _hold_buffers_until(self, when: float) -> None:
        """Add the buffers held since the last step to the capacity-seconds they cost."""
        cpu, memory = self.held
        self.buffer_cpu_seconds += cpu / 1000 * (when - self.now)
        self.buffer_memory_slot_seconds += memory * (when - self.now)

    def _watch_buffers(self) -> None:
        if self.restart_done_at is None or self.buffers_zero_at is not None:
            return
        states = self.runtime.service.hosted().values()
        self.held = (sum(st.cpu.buffer for st in states), sum(st.memory.buffer for st in states))
        if self.held == (0, 0):
            self.buffers_zero_at = self.now

    def _step(self, kind: str, subject: str) -> None:
        if kind == "migrated":
            if self.controller_up:
                self._migrated(subject)
            else:
                self.deferred.append(subject)
        elif kind == "late":
            plan = next(p for p in self.fleet.late_pods if p.name == subject)
            self._start_agent(plan)
            self.cluster.place(plan.name, plan.node, plan.cpu, plan.memory)
        elif kind == "down":
            self._checkpoint("before the restart")
            self.runtime.stop()
            self.controller_up = False
        elif kind == "up":
            self._restart()

    def _start_agent(self, plan: _PodPlan) -> None:
        rng = Random(f"{self.seed}:{plan.name}")
        agent = _Agent(
            plan.name,
            plan.node,
            plan.cpu,
            plan.memory,
            rng,
            baseline_cpu=plan.cpu.use,
            baseline_memory=plan.memory.use,
            use_cpu=plan.cpu.use,
            use_memory=plan.memory.use,
            permit_cpu=plan.cpu.use,
            permit_memory=plan.memory.use,
            demand_cpu=plan.cpu.use,
            demand_memory=plan.memory.use,
        )
        self.agents[plan.name] = agent
        agent.next_tick = self.now + rng.uniform(0, self.settings.agent_period_seconds)
        self.schedule(_round_up(agent.next_tick), "tick", plan.name)

    # -- agents ----------------------------------------------------------------------------------

    def _tick(self, agent: _Agent) -> None:
        if agent.gone:
            return
        s, unit = self.settings, self.settings.compute_unit
        agent.demand_cpu = _walk(
            agent.rng, agent.demand_cpu, agent.baseline_cpu, agent.cpu, unit.cpu_milli
        )
        agent.demand_memory = _walk(
            agent.rng, agent.demand_memory, agent.baseline_memory, agent.memory, unit.memory_slots
        )
        # The agent keeps its own period; only its request waits for the round.
        ticked = agent.next_tick
        agent.next_tick += s.agent_period_seconds * agent.rng.uniform(0.8, 1.2)
        self.schedule(_round_up(agent.next_tick), "tick", agent.name)
        if not self.controller_up or ticked < agent.reconnect_at:
            # No one answers: scale within the last permit, as agents do (seed 04).
            agent.use_cpu = min(agent.demand_cpu, agent.permit_cpu)
            agent.use_memory = min(agent.demand_memory, agent.permit_memory)
            return
        self._ask(agent, agent.demand_cpu, agent.demand_memory)

    def _ask(self, agent: _Agent, cpu: int, memory: int) -> None:
        """Queue ``agent``'s request for this round (what it may ask depends on its pod)."""
        pod = self._pod(agent)
        if pod.migrating:
            cpu, memory = _while_migrating(agent, pod)
        # Decreases happen on the VM before the agent reports them; increases wait for a permit.
        agent.use_cpu = min(agent.use_cpu, cpu)
        agent.use_memory = min(agent.use_memory, memory)
        self.asks.append((agent, cpu, memory))

    def _flush(self) -> None:
        """Send this round's requests together and hand each agent its permit."""
        asks, self.asks = self.asks, []
        if not asks:
            return
        answers = asyncio.run(self._send(asks))
        self.requests += len(asks)
        told_migrating: list[_Agent] = []
        for (agent, cpu, memory), answer in zip(asks, answers, strict=True):
            if isinstance(answer, MigratingPodMismatch):
                # Another pod's request in the same round started this pod's migration.
                told_migrating.append(agent)
                continue
            if isinstance(answer, BaseException):
                raise answer
            # None: a pod this process has not indexed; the blocking call reads where it is.
            grant = answer or self.runtime.service.request_resources(
                agent.name, cpu_milli=cpu, memory_slots=memory
            )
            self._granted(agent, cpu, memory, grant)
        for agent in told_migrating:
            cpu, memory = _while_migrating(agent, self._pod(agent))
            self.requests += 1
            grant = self.runtime.service.request_resources(
                agent.name, cpu_milli=cpu, memory_slots=memory
            )
            self._granted(agent, cpu, memory, grant)
        self._decided()

    async def _send(
        self, asks: list[tuple[_Agent, int, int]]
    ) -> list[Grant | BaseException | None]:
        # Node by node, each node's requests together, through the async path the agent
        # endpoint takes: a node's requests are decided in the order sent on its stream's
        # committer, while requests to several nodes at once would reach the log in whatever
        # order those committers finish, and the same seed must write the same log.
        service = self.runtime.service
        answers: list[Grant | BaseException | None] = [None] * len(asks)
        by_node: dict[str | None, list[int]] = {}
        for index, (agent, _, _) in enumerate(asks):
            by_node.setdefault(service.node_of(agent.name), []).append(index)
        for indexes in by_node.values():
            decided = await asyncio.gather(
                *(
                    service.arequest_resources(
                        asks[i][0].name, cpu_milli=asks[i][1], memory_slots=asks[i][2]
                    )
                    for i in indexes
                ),
                return_exceptions=True,
            )
            for i, answer in zip(indexes, decided, strict=True):
                answers[i] = answer
        return answers

    def _granted(self, agent: _Agent, cpu: int, memory: int, grant: Grant) -> None:
        agent.permit_cpu, agent.permit_memory = grant.cpu_milli, grant.memory_slots
        agent.use_cpu, agent.use_memory = min(cpu, grant.cpu_milli), min(memory, grant.memory_slots)

    def _decided(self) -> None:
        """After decisions: if they started migrations, the migration reactor hears of them
        (as it would at once in ``serve``) and the cluster starts moving those VMs."""
        states = self.runtime.service.hosted().values()
        if any(
            pod.migrating and not self.migrations.moving(pod.name)
            for state in states
            for pod in state.vm_pods.values()
        ):
            self.runtime.step()
        for _, pod in self.migrations.take_started():
            self.schedule(self.now + self.settings.migration_seconds, "migrated", pod)

    # -- migrations and the restart --------------------------------------------------------------

    def _migrated(self, name: str) -> None:
        """The VM's move finishes: it lands on the node with the most free CPU that fits it, or
        leaves the scenario when none does (a real fleet would add a node)."""
        self.migrations.finished(name)
        agent = self.agents[name]
        source = agent.node
        self.cluster.delete_pod(name)
        spec = VmPodSpec(
            name=name,
            cpu=Bounds(agent.cpu.min, agent.use_cpu, agent.cpu.max),
            memory=Bounds(agent.memory.min, agent.use_memory, agent.memory.max),
        )
        states = self.runtime.service.hosted()
        targets = sorted(
            (node for node in self.fleet.nodes if node != source),
            key=lambda node: (-states[node].cpu.remaining, node),
        )
        target = next((node for node in targets if _fits(states[node], spec, self.now)), None)
        if target is None:
            self.migrations_unplaced += 1
            agent.gone = True
        else:
            self.cluster.place(name, target, agent.cpu, agent.memory)
            agent.node = target
            agent.permit_cpu, agent.permit_memory = agent.use_cpu, agent.use_memory
        self.runtime.step()  # cluster sync: the target reserves the pod, the source lets it go
        self._decided()

    def _restart(self) -> None:
        """A new runtime object on the same store: it rebuilds from the log and takes over."""
        s = self.settings
        self.controller_up = True
        for agent in self.agents.values():
            if not agent.gone:
                agent.reconnect_at = self.now + agent.rng.uniform(0, s.reconnect_spread_seconds)
        position = self.store.head()
        from_snapshots, after_snapshots = self._snapshots()
        started = time.perf_counter()
        self.runtime = self._runtime()
        self.runtime.start()
        self.rebuild = _Rebuild(
            position, time.perf_counter() - started, from_snapshots, after_snapshots
        )
        states = self.runtime.service.hosted().values()
        self.after_restart = (
            sum(st.cpu.buffer for st in states),
            sum(st.memory.buffer for st in states),
            sum(st.cpu.reserved for st in states),
            sum(st.memory.reserved for st in states),
            sum(1 for st in states for p in st.vm_pods.values() if p.cpu.buffer or p.memory.buffer),
        )
        self._checkpoint("after the restart")
        self.restart_done_at = self.now
        deferred, self.deferred = self.deferred, []
        for name in deferred:
            self._migrated(name)

    def _snapshots(self) -> tuple[int, int]:
        """What a rebuild reads now: nodes with a snapshot, and events after the snapshots."""
        from_snapshots = after = 0
        for name, stream_version in sorted(self._versions().items()):
            snapshot = self.store.load_snapshot(nodes.stream_id(name))
            if snapshot is not None:
                from_snapshots += 1
            after += stream_version - (snapshot.version if snapshot is not None else 0)
        return from_snapshots, after

    def _versions(self) -> dict[str, int]:
        service = self.runtime.service
        return {name: service.stream(name).version for name in service.hosted()}

    def _outcome(self) -> RuleOutcome:
        buffer_cpu, buffer_memory, reserved_cpu, reserved_memory, with_buffer = self.after_restart
        zero = (
            None
            if self.buffers_zero_at is None or self.restart_done_at is None
            else round(self.buffers_zero_at - self.restart_done_at, 3)
        )
        checks = NodeLogChecks()
        checks.replay(self.store)
        replayed, live = checks.states, self.runtime.service.hosted()
        # The first incarnation took the nodes over before any pod ran: nothing to assume then.
        bounds = [b for e in checks.restarts if e.incarnation > 1 for b in e.bounds]
        return RuleOutcome(
            rule=self.rule,
            buffer_cpu_milli=buffer_cpu,
            buffer_memory_slots=buffer_memory,
            reserved_cpu_milli=reserved_cpu,
            reserved_memory_slots=reserved_memory,
            pods_with_buffer=with_buffer,
            seconds_until_buffers_zero=zero,
            buffer_cpu_seconds=round(self.buffer_cpu_seconds, 1),
            buffer_memory_slot_seconds=round(self.buffer_memory_slot_seconds, 1),
            requests=self.requests,
            grants_short=checks.grants_short,
            migrations_started=checks.migrations_started,
            migrations_unplaced=self.migrations_unplaced,
            negative_values=checks.negative_values,
            grants_beyond_capacity=checks.grants_beyond_capacity,
            replay_mismatches=sum(
                1 for name in set(replayed) | set(live) if replayed.get(name) != live.get(name)
            ),
            rebuilt_from_position=self.rebuild.from_position,
            rebuild_seconds=self.rebuild.seconds,
            nodes_from_snapshots=self.rebuild.nodes_from_snapshots,
            events_after_snapshots=self.rebuild.events_after_snapshots,
            pods_bounded_by_last_permit=sum(1 for b in bounds if b.known),
            pods_never_seen=sum(1 for b in bounds if not b.known),
            checkpoints=tuple(self.checkpoints),
        )


def _while_migrating(agent: _Agent, pod: VmPod) -> tuple[int, int]:
    """What a migrating pod may ask: its reservation — or, first after a restart (its buffer
    still held), the use it really has."""
    if pod.cpu.buffer > 0 or pod.memory.buffer > 0:
        return agent.use_cpu, agent.use_memory
    return pod.cpu.reserved, pod.memory.reserved


def _fits(state: NodeState, spec: VmPodSpec, now: float) -> bool:
    """Whether node accounting would reserve ``spec`` on the node (a scheduler's filter)."""
    try:
        nodes.decide(state, ReservePod(spec, at=EPOCH + timedelta(seconds=now)))
    except Unschedulable:
        return False
    return state.present
