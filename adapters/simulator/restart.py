"""The ``restart`` scenario: a fleet under agent traffic, its controller restarted mid-run.

Autoscaler agents keep scaling their VMs while no controller answers, bounded by the last permit
they were given (seed 04, "Startup uncertainty"). When a controller comes back it must hold some
capacity as *buffer* until each agent reports its real use. The seed holds every VM pod at its
max; we hold it at the last permit the log recorded. This scenario runs the same traffic under
both rules, side by side, through the real :mod:`fleetledger.domain.nodes` decider, and reports
the capacity held as buffer right after the restart and the virtual time until every buffer is
back to zero.

Everything is a function of the seed: one ``random.Random`` lays out the fleet, and each agent
draws its demand and timing from its own generator seeded from the run's seed and its name, so
both rules see exactly the same agent behaviour even where their answers differ. Time is
virtual seconds; no store is involved (the decider's events are kept per node in memory and
replayed at the end to check that the log rebuilds the live state).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from random import Random

from fleetledger.domain.errors import Rejected
from fleetledger.domain.nodes import (
    AgentResourcesRequest,
    Bounds,
    ComputeUnit,
    DeletePod,
    JoinNode,
    MigrationStarted,
    NodeCommand,
    NodeConfig,
    NodeEvent,
    NodeState,
    ReservePod,
    ResourcesGranted,
    RestartController,
    StartupRule,
    Unschedulable,
    VmPodSpec,
    decide,
    evolve,
    initial_state,
)

__all__ = [
    "RestartReport",
    "RestartSettings",
    "RuleOutcome",
    "run_restart_scenario",
]

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
"""Virtual time zero (fixed, so every event time is a function of the seed)."""
GIB = 1 << 30


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
    restart_at_seconds: float = 120.0
    downtime_seconds: float = 30.0
    reconnect_spread_seconds: float = 60.0
    run_after_restart_seconds: float = 180.0
    pods_placed_while_down: int = 3
    migration_seconds: float = 20.0

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.pods_per_node < 1:
            raise ValueError("the restart scenario needs at least 2 nodes and 1 pod per node")
        if self.run_after_restart_seconds <= self.reconnect_spread_seconds:
            raise ValueError(
                "run_after_restart_seconds must exceed reconnect_spread_seconds, or some agents "
                "never reconnect within the run"
            )


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
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartReport:
    """Both rules on the same seed. Top-level figures are ours (log-bound); safety sums both."""

    seed: int
    settings: RestartSettings
    vm_pods: int
    log_bound: RuleOutcome
    assume_max: RuleOutcome

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
        return "\n".join(lines)


def _cpu(milli: int) -> str:
    return f"{milli / 1000:g} CPU"


def _seconds(value: float | None) -> str:
    return "not in the run" if value is None else f"{value:.1f} s"


def run_restart_scenario(seed: int = 1, settings: RestartSettings | None = None) -> RestartReport:
    """Run the scenario under both startup rules with ``seed``."""
    settings = settings or RestartSettings()
    fleet = _layout(Random(seed), settings)
    ours = _Run(seed, settings, fleet, "log_bound").run()
    seeds = _Run(seed, settings, fleet, "assume_max").run()
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
    nodes = tuple(f"node-{n:02d}" for n in range(settings.nodes))

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
        for n, node in enumerate(nodes)
        for p in range(settings.pods_per_node)
    )
    down = settings.restart_at_seconds
    late = tuple(
        plan(
            f"vm-late-{k:02d}", rng.choice(nodes), down + rng.uniform(0, settings.downtime_seconds)
        )
        for k in range(settings.pods_placed_while_down)
    )
    return _Fleet(nodes, pods, late)


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
    reconnect_at: float = 0.0
    gone: bool = False


def _walk(rng: Random, value: int, baseline: int, bounds: Bounds, step: int) -> int:
    """A bounded random walk in compute units, pulled back towards the pod's usual demand."""
    value += step * rng.choice((-2, -1, -1, 0, 0, 1, 1, 2))
    if rng.random() < 0.3:
        value += step if value < baseline else -step
    return max(bounds.min, min(bounds.max, value))


# -- one run -------------------------------------------------------------------------------------


class _Run:
    """The discrete-event loop for one startup rule."""

    def __init__(self, seed: int, settings: RestartSettings, fleet: _Fleet, rule: StartupRule):
        self.seed = seed
        self.settings = settings
        self.fleet = fleet
        self.rule: StartupRule = rule
        self.states: dict[str, NodeState] = {}
        self.logs: dict[str, list[NodeEvent]] = {}
        self.agents: dict[str, _Agent] = {}
        self.queue: list[tuple[float, int, str, str]] = []
        self.sequence = 0
        self.controller_up = True
        self.restart_done_at: float | None = None
        self.buffers_zero_at: float | None = None
        self.held = (0, 0)
        self.buffer_cpu_seconds = 0.0
        self.buffer_memory_slot_seconds = 0.0
        self.requests = 0
        self.grants_short = 0
        self.migrations_started = 0
        self.migrations_unplaced = 0
        self.negative_values = 0
        self.grants_beyond_capacity = 0
        self.after_restart: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        self.deferred: list[str] = []
        self.now = 0.0

    # -- plumbing --------------------------------------------------------------------------------

    def schedule(self, at: float, kind: str, subject: str) -> None:
        self.sequence += 1
        heapq.heappush(self.queue, (at, self.sequence, kind, subject))

    def handle(self, node: str, command: NodeCommand) -> list[NodeEvent]:
        """Decide and apply one command on ``node``, checking the invariants on the way."""
        state = self.states[node]
        events = decide(state, command)
        for event in events:
            before = state
            state = evolve(state, event)
            if isinstance(event, ResourcesGranted):
                self._check_grant(before, state, event)
            elif isinstance(event, MigrationStarted):
                self.migrations_started += 1
                self.schedule(self.now + self.settings.migration_seconds, "migrated", event.pod)
        self.negative_values += _negatives(state, _touched(events))
        self.states[node] = state
        self.logs[node].extend(events)
        return events

    def _check_grant(self, before: NodeState, after: NodeState, event: ResourcesGranted) -> None:
        pod = before.vm_pods[event.pod]
        if event.cpu_milli > pod.cpu.reserved and after.cpu.reserved > after.cpu.reservable:
            self.grants_beyond_capacity += 1
        if event.memory_slots > pod.memory.reserved and (
            after.memory.reserved > after.memory.reservable
        ):
            self.grants_beyond_capacity += 1
        if event.cpu_pressure or event.memory_pressure:
            self.grants_short += 1

    def at(self, seconds: float) -> datetime:
        return EPOCH + timedelta(seconds=seconds)

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> RuleOutcome:
        s = self.settings
        config = NodeConfig(
            cpu_system_milli=1000,
            memory_system_slots=4,
            cpu_watermark=s.watermark,
            memory_watermark=s.watermark,
            compute_unit=s.compute_unit,
            memory_slot_bytes=GIB,
        )
        for node in self.fleet.nodes:
            self.states[node] = initial_state()
            self.logs[node] = []
            self.handle(
                node,
                JoinNode(node, s.node_cpu_milli, s.node_memory_slots * GIB, 0, config, at=EPOCH),
            )
            self.handle(node, RestartController(1, at=EPOCH))
        for plan in self.fleet.pods:
            self._place(plan)
        for plan in self.fleet.late_pods:
            self.schedule(plan.placed_at, "late", plan.name)
        self.schedule(s.restart_at_seconds, "down", "")
        self.schedule(s.restart_at_seconds + s.downtime_seconds, "up", "")
        end = s.restart_at_seconds + s.downtime_seconds + s.run_after_restart_seconds
        while self.queue and self.queue[0][0] <= end:
            when, _, kind, subject = heapq.heappop(self.queue)
            self._hold_buffers_until(when)
            self.now = when
            self._step(kind, subject)
            self._watch_buffers()
        return self._outcome()

    def _hold_buffers_until(self, when: float) -> None:
        """Add the buffers held since the last step to the capacity-seconds they cost."""
        cpu, memory = self.held
        self.buffer_cpu_seconds += cpu / 1000 * (when - self.now)
        self.buffer_memory_slot_seconds += memory * (when - self.now)

    def _watch_buffers(self) -> None:
        if self.restart_done_at is None or self.buffers_zero_at is not None:
            return
        states = self.states.values()
        self.held = (sum(st.cpu.buffer for st in states), sum(st.memory.buffer for st in states))
        if self.held == (0, 0):
            self.buffers_zero_at = self.now

    def _step(self, kind: str, subject: str) -> None:
        if kind == "tick":
            self._tick(self.agents[subject])
        elif kind == "migrated":
            if self.controller_up:
                self._migrated(subject)
            else:
                self.deferred.append(subject)
        elif kind == "late":
            plan = next(p for p in self.fleet.late_pods if p.name == subject)
            self._start_agent(plan)
        elif kind == "down":
            self.controller_up = False
        elif kind == "up":
            self._restart()

    def _place(self, plan: _PodPlan) -> None:
        spec = VmPodSpec(name=plan.name, cpu=plan.cpu, memory=plan.memory)
        self.handle(plan.node, ReservePod(spec, at=self.at(self.now), already_running=True))
        self._start_agent(plan)

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
        self.schedule(
            self.now + rng.uniform(0, self.settings.agent_period_seconds), "tick", plan.name
        )

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
        self.schedule(
            self.now + s.agent_period_seconds * agent.rng.uniform(0.8, 1.2), "tick", agent.name
        )
        if not self.controller_up or self.now < agent.reconnect_at:
            # No one answers: scale within the last permit, as agents do (seed 04).
            agent.use_cpu = min(agent.demand_cpu, agent.permit_cpu)
            agent.use_memory = min(agent.demand_memory, agent.permit_memory)
            return
        self._ask(agent, agent.demand_cpu, agent.demand_memory)

    def _ask(self, agent: _Agent, cpu: int, memory: int) -> None:
        pod = self.states[agent.node].vm_pods[agent.name]
        if pod.migrating:
            # Held until the migration ends; right after a restart it reports its use instead.
            uncertain = pod.cpu.buffer > 0 or pod.memory.buffer > 0
            cpu, memory = (
                (agent.use_cpu, agent.use_memory)
                if uncertain
                else (pod.cpu.reserved, pod.memory.reserved)
            )
        # Decreases happen on the VM before the agent reports them; increases wait for a permit.
        agent.use_cpu = min(agent.use_cpu, cpu)
        agent.use_memory = min(agent.use_memory, memory)
        command = AgentResourcesRequest(agent.name, cpu, memory, at=self.at(self.now))
        self.requests += 1
        events = self.handle(agent.node, command)
        grant = next(e for e in events if isinstance(e, ResourcesGranted))
        agent.permit_cpu, agent.permit_memory = grant.cpu_milli, grant.memory_slots
        agent.use_cpu, agent.use_memory = min(cpu, grant.cpu_milli), min(memory, grant.memory_slots)

    def _migrated(self, name: str) -> None:
        agent = self.agents[name]
        source = agent.node
        self.handle(source, DeletePod(name, at=self.at(self.now)))
        spec = VmPodSpec(
            name=name,
            cpu=Bounds(agent.cpu.min, agent.use_cpu, agent.cpu.max),
            memory=Bounds(agent.memory.min, agent.use_memory, agent.memory.max),
        )
        targets = sorted(
            (node for node in self.fleet.nodes if node != source),
            key=lambda node: (-self.states[node].cpu.remaining, node),
        )
        for node in targets:
            try:
                self.handle(node, ReservePod(spec, at=self.at(self.now)))
            except Unschedulable:
                continue
            agent.node = node
            agent.permit_cpu, agent.permit_memory = agent.use_cpu, agent.use_memory
            return
        # Nowhere to go: a real fleet would add a node; here the VM leaves the scenario.
        self.migrations_unplaced += 1
        agent.gone = True

    def _restart(self) -> None:
        """A new controller incarnation: every node gets the cluster's listing of its VM pods."""
        s = self.settings
        self.controller_up = True
        when = self.at(self.now)
        listings: dict[str, list[VmPodSpec]] = {node: [] for node in self.fleet.nodes}
        for agent in self.agents.values():
            if agent.gone:
                continue
            agent.reconnect_at = self.now + agent.rng.uniform(0, s.reconnect_spread_seconds)
            listings[agent.node].append(
                VmPodSpec(
                    name=agent.name,
                    cpu=Bounds(agent.cpu.min, agent.use_cpu, agent.cpu.max),
                    memory=Bounds(agent.memory.min, agent.use_memory, agent.memory.max),
                )
            )
        pods_with_buffer = 0
        for node in self.fleet.nodes:
            listed = tuple(sorted(listings[node], key=lambda spec: spec.name))
            try:
                self.handle(node, RestartController(2, listed, self.rule, at=when))
            except Rejected as e:  # pragma: no cover - a bug in the scenario, not a figure
                raise AssertionError(f"restart refused on {node}: {e.reason}") from e
            pods = self.states[node].vm_pods.values()
            pods_with_buffer += sum(1 for p in pods if p.cpu.buffer or p.memory.buffer)
        states = self.states.values()
        self.after_restart = (
            sum(st.cpu.buffer for st in states),
            sum(st.memory.buffer for st in states),
            sum(st.cpu.reserved for st in states),
            sum(st.memory.reserved for st in states),
            pods_with_buffer,
        )
        self.restart_done_at = self.now
        for name in self.deferred:
            self._migrated(name)
        self.deferred.clear()

    def _outcome(self) -> RuleOutcome:
        buffer_cpu, buffer_memory, reserved_cpu, reserved_memory, with_buffer = self.after_restart
        zero = (
            None
            if self.buffers_zero_at is None or self.restart_done_at is None
            else round(self.buffers_zero_at - self.restart_done_at, 3)
        )
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
            grants_short=self.grants_short,
            migrations_started=self.migrations_started,
            migrations_unplaced=self.migrations_unplaced,
            negative_values=self.negative_values,
            grants_beyond_capacity=self.grants_beyond_capacity,
            replay_mismatches=sum(
                1 for node, log in self.logs.items() if _replay(log) != self.states[node]
            ),
        )


def _replay(log: list[NodeEvent]) -> NodeState:
    state = initial_state()
    for event in log:
        state = evolve(state, event)
    return state


def _touched(events: list[NodeEvent]) -> set[str] | None:
    """The pods some events are about, or ``None`` if one of them is about the whole node."""
    pods = set()
    for event in events:
        pod = getattr(event, "pod", None)
        if not isinstance(pod, str):
            return None
        pods.add(pod)
    return pods


def _negatives(state: NodeState, touched: set[str] | None) -> int:
    """How many amounts of the node, or of its ``touched`` pods, are below zero.

    The decider must never produce one; pods a decision did not touch cannot have changed.
    """
    amounts = [state.gpu_total, state.gpu_reserved, state.other_raw_cpu_milli]
    amounts.append(state.other_raw_memory_bytes)
    for resource in (state.cpu, state.memory):
        amounts.extend(
            (
                resource.total,
                resource.system,
                resource.reserved,
                resource.buffer,
                resource.capacity_pressure,
                resource.pressure_accounted_for,
            )
        )
    pods = state.vm_pods.values() if touched is None else (state.vm_pods.get(n) for n in touched)
    for pod in pods:
        if pod is None:
            continue
        amounts.extend((pod.gpu, pod.cpu_accounted, pod.memory_accounted))
        for held in (pod.cpu, pod.memory):
            amounts.extend(
                (held.min, held.use, held.max, held.reserved, held.buffer, held.capacity_pressure)
            )
    return sum(1 for amount in amounts if amount < 0)
