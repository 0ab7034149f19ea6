"""The ``subnet`` scenario: pod-IP batch sizing on a /22 under rising then falling demand.

Seed 03 predicts that the naive policy — batch ``B0`` until the subnet is 90 % allocated, then 1
until it is below 50 % — flips for ever on a /22 with 28 or more nodes; the seed's own formula,
fed the utilization its last batch caused, cycles too (:mod:`fleetledger.domain.ipam.sizing`).
This scenario runs the same pods through three controllers and counts what each does:

``naive``
    ``B0 = 16`` (buffer 0.5) while not exhausted, ``B = 1`` (buffer 1) while exhausted; the flag
    has hysteresis (set above 90 %, cleared below 50 %) on the IPs *allocated*.
``formula``
    The seed's design as written: :func:`~fleetledger.domain.ipam.batch_size` of the allocated IPs
    with ``du = 1`` when they fell since the last reconcile, and the same allocation-driven flag
    (``B = 1``, buffer 1 while exhausted).
``settled``
    The real Subnet aggregate (:mod:`fleetledger.domain.ipam`) driven through ``decide`` and
    ``evolve``: :func:`~fleetledger.domain.ipam.subnet_batch_size` of the demands, the flag fed
    the demand floor.

The world, identical for all three (one seeded ``random.Random``, virtual time in seconds):

* ``nodes`` nodes share a subnet of ``capacity`` IPs. Each node has a peak pod count drawn once;
  its demand follows a ramp up, a plateau, a ramp down and a quiet tail. Pods arrive while demand
  rises and leave while it falls, at random instants inside each second — the pod script is drawn
  before any controller runs, so every policy sees the very same pods.
* **How a pod waits for an IP.** A pod arriving on a node that holds a usable IP (held, not in
  use, not pending release) takes it at once and waits 0 s. Otherwise it queues on its node
  (first come, first served) and takes an IP the moment one becomes usable there: an allocation
  landing, an IP freed by a departing pod, or a pending release called off. Its wait is that
  moment minus its arrival. ``pod_ip_wait_p99_s`` is the nearest-rank p99 over all pods.
* Every second the controller reconciles: it sees each node's demand (pods on it, queued ones
  included) and the IPs its pods hold, and decides pool targets, which IPs to release and what to
  ask the allocator for. Allocator calls land ``allocator_latency_s`` later; a release call gives
  back, when it lands, the IPs still pending release then. The allocator never hands out more than
  the subnet has (it grants what is free), and every controller budgets its requests to the IPs
  neither held nor in flight, so no policy is handicapped by refusals.

Figures per policy: ``exhaustion_flips`` (changes of the flag), ``batch_changes`` (and
``steady_batch_changes``, those made in a second when no node's demand changed — oscillation
pure and simple), ``ip_requests`` (allocator calls: allocations plus releases),
``pod_ip_wait_p99_s`` and ``peak_utilization`` (most IPs held at once, over capacity).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from random import Random
from typing import Literal, Protocol

from fleetledger.domain import ipam

from .report import Latency

__all__ = [
    "POLICIES",
    "PolicyFigures",
    "Policy",
    "SubnetReport",
    "run_subnet_scenario",
]

Policy = Literal["naive", "formula", "settled"]
POLICIES: tuple[Policy, ...] = ("naive", "formula", "settled")

_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_NAIVE_BATCH = 16


# -- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyFigures:
    """What one controller did with the scenario's pods."""

    policy: Policy
    exhaustion_flips: int
    batch_changes: int
    steady_batch_changes: int
    allocation_calls: int
    release_calls: int
    pods: int
    pods_waited: int
    pod_ip_wait: Latency
    peak_allocated: int
    capacity: int
    final_batch: int

    @property
    def ip_requests(self) -> int:
        """Calls to the subnet's allocator: allocations and releases."""
        return self.allocation_calls + self.release_calls

    @property
    def peak_utilization(self) -> float:
        """The most IPs held at once, as a fraction of the subnet."""
        return self.peak_allocated / self.capacity

    def to_dict(self) -> dict[str, object]:
        return {
            "exhaustion_flips": self.exhaustion_flips,
            "batch_changes": self.batch_changes,
            "steady_batch_changes": self.steady_batch_changes,
            "ip_requests": self.ip_requests,
            "allocation_calls": self.allocation_calls,
            "release_calls": self.release_calls,
            "pods": self.pods,
            "pods_waited": self.pods_waited,
            "pod_ip_wait_p50_s": round(self.pod_ip_wait.p50, 3),
            "pod_ip_wait_p99_s": round(self.pod_ip_wait.p99, 3),
            "pod_ip_wait_max_s": round(self.pod_ip_wait.max, 3),
            "peak_allocated": self.peak_allocated,
            "peak_utilization": round(self.peak_utilization, 4),
            "final_batch": self.final_batch,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SubnetReport:
    """The three policies on the same pods."""

    seed: int
    capacity: int
    nodes: int
    peak_demand: int
    duration_s: int
    allocator_latency_s: int
    policies: Mapping[Policy, PolicyFigures]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``."""
        return {
            "scenario": "subnet",
            "seed": self.seed,
            "config": {
                "capacity": self.capacity,
                "nodes": self.nodes,
                "peak_demand": self.peak_demand,
                "duration_s": self.duration_s,
                "allocator_latency_s": self.allocator_latency_s,
                "naive_batch": _NAIVE_BATCH,
            },
            "policies": {name: self.policies[name].to_dict() for name in POLICIES},
        }

    def render(self) -> str:
        """A readable side-by-side table."""
        rows: list[tuple[str, str, str, str]] = []

        def row(label: str, cell: str) -> None:
            rows.append(
                (label, *(cell.format(p=self.policies[name]) for name in POLICIES))  # type: ignore[arg-type]
            )

        row("exhaustion flips", "{p.exhaustion_flips}")
        row("batch changes", "{p.batch_changes}")
        row("  at steady demand", "{p.steady_batch_changes}")
        row("allocator calls", "{p.ip_requests}")
        row("  allocations", "{p.allocation_calls}")
        row("  releases", "{p.release_calls}")
        row("pods that waited", "{p.pods_waited}")
        row("pod IP wait p50", "{p.pod_ip_wait.p50:.2f} s")
        row("pod IP wait p99", "{p.pod_ip_wait.p99:.2f} s")
        row("pod IP wait max", "{p.pod_ip_wait.max:.2f} s")
        row("peak utilization", "{p.peak_utilization:.1%}")
        row("final batch", "{p.final_batch}")
        width = max(len(r[0]) for r in rows)
        any_policy = self.policies[POLICIES[0]]
        lines = [
            f"scenario subnet (seed {self.seed}): {self.nodes} nodes on {self.capacity} IPs, "
            f"{any_policy.pods} pods (peak demand {self.peak_demand}) over {self.duration_s} s; "
            f"allocator latency {self.allocator_latency_s} s",
            f"  {'':<{width}}  " + "  ".join(f"{name:>10}" for name in POLICIES),
        ]
        lines.extend(
            f"  {label:<{width}}  " + "  ".join(f"{cell:>10}" for cell in cells)
            for label, *cells in rows
        )
        return "\n".join(lines)


# -- the pods ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _PodEvent:
    at: float
    node: str
    pod: int
    arrives: bool


@dataclass(frozen=True, slots=True)
class _Script:
    nodes: tuple[str, ...]
    events: tuple[_PodEvent, ...]
    peak_demand: int
    duration: int


_BURST = (1, 6)
_ROLL_CHANCE = 0.05


@dataclass(frozen=True, slots=True)
class _Phases:
    """Demand as a fraction of each node's peak: ramp up, plateau, ramp down, a quiet tail."""

    rise: int
    hold: int
    fall: int
    tail: int

    @property
    def duration(self) -> int:
        return self.rise + self.hold + self.fall + self.tail

    def level(self, t: int) -> float:
        if t < self.rise:
            return t / self.rise
        if t < self.rise + self.hold:
            return 1.0
        if t < self.rise + self.hold + self.fall:
            return 1.0 - (t - self.rise - self.hold) / self.fall
        return 0.0

    def holding(self, t: int) -> bool:
        """On the plateau."""
        return self.rise <= t < self.rise + self.hold

    def turning(self, t: int) -> bool:
        """The last second of the ramp up or down."""
        return t in (self.rise - 1, self.rise + self.hold + self.fall - 1)


def _script(rng: Random, nodes: int, peak_range: tuple[int, int], phases: _Phases) -> _Script:
    names = tuple(f"node-{i:02d}" for i in range(nodes))
    peaks = [rng.randint(*peak_range) for _ in names]
    live: list[list[int]] = [[] for _ in names]
    bursts = [rng.randint(*_BURST) for _ in names]
    next_pod = 0
    events: list[_PodEvent] = []
    for t in range(1, phases.duration + 1):
        for i, name in enumerate(names):
            if phases.holding(t) and live[i] and rng.random() < _ROLL_CHANCE:
                next_pod = _roll(rng, t, name, live=live[i], next_pod=next_pod, events=events)
                continue
            change = round(peaks[i] * phases.level(t)) - len(live[i])
            # Pods come and go in bursts (a deployment scaling), all within ~50 ms; the last
            # burst of a phase may be smaller, so every node follows its curve to the end.
            size = min(bursts[i], abs(change))
            if size == 0 or (size < bursts[i] and not phases.turning(t)):
                continue
            bursts[i] = rng.randint(*_BURST)
            start = t - 1 + rng.random() * 0.95
            for k in range(size):
                at = start + k * 0.05 / size
                if change > 0:
                    live[i].append(next_pod)
                    events.append(_PodEvent(at, name, next_pod, True))
                    next_pod += 1
                else:
                    pod = live[i].pop(rng.randrange(len(live[i])))
                    events.append(_PodEvent(at, name, pod, False))
    events.sort(key=lambda e: (e.at, e.node, e.pod))
    return _Script(names, tuple(events), sum(peaks), phases.duration)


def _roll(
    rng: Random, t: int, node: str, *, live: list[int], next_pod: int, events: list[_PodEvent]
) -> int:
    """A rolling update: new pods start first, the pods they replace stop 0.3 s later — demand
    is back where it was by the end of the second, but the new pods needed spare IPs."""
    size = min(rng.randint(*_BURST), len(live))
    start = t - 1 + rng.random() * 0.6
    for k in range(size):
        old = live.pop(rng.randrange(len(live)))
        events.append(_PodEvent(start + k * 0.01, node, next_pod + k, True))
        events.append(_PodEvent(start + 0.3 + k * 0.01, node, old, False))
    live.extend(range(next_pod, next_pod + size))
    return next_pod + size


# -- the world: nodes and the allocator ----------------------------------------------------------


@dataclass(slots=True)
class _Node:
    held: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)
    pods: dict[int, str] = field(default_factory=dict)  # pod -> its IP
    queue: deque[tuple[int, float]] = field(default_factory=deque)  # pods waiting: (pod, since)

    @property
    def demand(self) -> int:
        return len(self.pods) + len(self.queue)

    def in_use(self) -> tuple[str, ...]:
        busy = set(self.pods.values())
        return tuple(ip for ip in self.held if ip in busy)

    def usable(self) -> list[str]:
        busy = set(self.pods.values())
        return [ip for ip in self.held if ip not in busy and ip not in self.pending]


class _Allocator:
    """The subnet's addresses: hands out the lowest free ones, never more than exist."""

    def __init__(self, capacity: int) -> None:
        self._free = [i for i in range(capacity)]
        heapq.heapify(self._free)

    def allocate(self, count: int) -> tuple[str, ...]:
        n = min(count, len(self._free))
        return tuple(_address(heapq.heappop(self._free)) for _ in range(n))

    def release(self, ips: Sequence[str]) -> None:
        for ip in ips:
            heapq.heappush(self._free, _index(ip))


def _address(i: int) -> str:
    return f"10.0.{i >> 8}.{i & 255}"


def _index(ip: str) -> int:
    _, _, third, fourth = ip.split(".")
    return (int(third) << 8) | int(fourth)


@dataclass(slots=True)
class _Plan:
    """What a controller decided in one step: allocator requests and new pending-release sets."""

    requests: list[tuple[str, int, int]] = field(default_factory=list)  # node, request, count
    pending: dict[str, tuple[str, ...]] = field(default_factory=dict)


class _Controller(Protocol):
    @property
    def batch(self) -> int: ...
    @property
    def flips(self) -> int: ...
    @property
    def batch_changes(self) -> int: ...

    def reconcile(self, t: int, nodes: Mapping[str, _Node]) -> _Plan: ...
    def allocated(self, t: int, node: str, request: int, ips: tuple[str, ...]) -> _Plan: ...
    def released(self, t: int, node: str, ips: tuple[str, ...]) -> _Plan: ...
    def still_pending(self, node: str) -> frozenset[str]: ...


# -- the settled controller: the real aggregate --------------------------------------------------


class _AggregateController:
    """Drives :mod:`fleetledger.domain.ipam` through decide/evolve, as the decider host would."""

    def __init__(self, capacity: int, names: Sequence[str]) -> None:
        self._state = ipam.initial_state()
        self._reported: dict[str, tuple[int, tuple[str, ...]]] = {}
        self.batch_changes = 0
        self.flips = 0
        commands: list[ipam.SubnetCommand] = [ipam.CreateSubnet("s", capacity, at=_EPOCH)]
        commands.append(ipam.JoinNodes("s", tuple(names), at=_EPOCH))
        self._startup = self._merge([self._collect(self._run(c)) for c in commands])
        # Counted from the moment every node has joined, as for the other policies, which start
        # at B0: the subnet's first batch (sized for no nodes) is not a change under load.
        self.batch_changes = 0
        self.flips = 0

    @property
    def batch(self) -> int:
        return self._state.batch_size

    def startup(self) -> _Plan:
        return self._startup

    def _run(self, command: ipam.SubnetCommand) -> list[ipam.SubnetEvent]:
        events = ipam.decide(self._state, command)
        for event in events:
            self._state = ipam.evolve(self._state, event)
        return events

    def _collect(self, events: Sequence[ipam.SubnetEvent]) -> _Plan:
        plan = _Plan()
        for event in events:
            if isinstance(event, ipam.IpsRequested):
                plan.requests.append((event.node, event.request, event.count))
            elif isinstance(event, ipam.PoolResized):
                plan.pending[event.node] = event.pending_release
            elif isinstance(event, ipam.BatchSizeChanged):
                self.batch_changes += 1
            elif isinstance(event, ipam.ExhaustionChanged):
                self.flips += 1
        return plan

    def _merge(self, plans: Sequence[_Plan]) -> _Plan:
        merged = _Plan()
        for plan in plans:
            merged.requests.extend(plan.requests)
            merged.pending.update(plan.pending)
        return merged

    def reconcile(self, t: int, nodes: Mapping[str, _Node]) -> _Plan:
        plans = []
        for name, node in nodes.items():
            seen = (node.demand, node.in_use())
            if self._reported.get(name) != seen:
                self._reported[name] = seen
                command = ipam.ReportDemand("s", name, *seen, at=_at(t))
                plans.append(self._collect(self._run(command)))
        return self._merge(plans)

    def allocated(self, t: int, node: str, request: int, ips: tuple[str, ...]) -> _Plan:
        return self._collect(self._run(ipam.RecordAllocation("s", node, request, ips, at=_at(t))))

    def released(self, t: int, node: str, ips: tuple[str, ...]) -> _Plan:
        return self._collect(self._run(ipam.RecordRelease("s", node, ips, at=_at(t))))

    def still_pending(self, node: str) -> frozenset[str]:
        return frozenset(self._state.nodes[node].pending_release)


def _at(t: int) -> datetime:
    return _EPOCH + timedelta(seconds=t)


# -- the feedback controllers: naive and the raw formula -----------------------------------------


@dataclass(slots=True)
class _FeedbackPool:
    requested: int = 0
    pending: tuple[str, ...] = ()
    in_flight: dict[int, int] = field(default_factory=dict)
    requests_made: int = 0


class _FeedbackController:
    """Sizes pools from the IPs allocated, as the seed's designs do; pools as the aggregate's."""

    def __init__(self, policy: Policy, capacity: int, names: Sequence[str]) -> None:
        self._policy = policy
        self._capacity = capacity
        self._pools = {name: _FeedbackPool() for name in names}
        self._held: dict[str, list[str]] = {name: [] for name in names}
        self._last_used = 0
        self._falling = False
        self.exhausted = False
        self.batch = _NAIVE_BATCH
        self.batch_changes = 0
        self.flips = 0

    def _used(self) -> int:
        return sum(len(h) for h in self._held.values())

    def reconcile(self, t: int, nodes: Mapping[str, _Node]) -> _Plan:
        used = self._used()
        exhausted = ipam.next_exhausted(self.exhausted, used, self._capacity)
        if exhausted != self.exhausted:
            self.flips += 1
            self.exhausted = exhausted
        if used != self._last_used:
            self._falling = used < self._last_used
            self._last_used = used
        if exhausted:
            batch, buffer = 1, 1.0
        elif self._policy == "naive":
            batch, buffer = _NAIVE_BATCH, ipam.DEFAULT_BUFFER
        else:
            batch = ipam.batch_size(self._capacity, len(nodes), used, falling=self._falling)
            buffer = ipam.DEFAULT_BUFFER
        if batch != self.batch:
            self.batch_changes += 1
            self.batch = batch
        plan = _Plan()
        for name, node in nodes.items():
            pool = self._pools[name]
            pool.requested = ipam.pool_size(node.demand, batch, buffer=buffer)
            surplus = len(node.held) - pool.requested
            pending = ipam.plan_release(node.held, node.in_use(), pool.pending, surplus)
            if pending != pool.pending:
                pool.pending = pending
                plan.pending[name] = pending
        budget = (
            self._capacity - used - sum(sum(p.in_flight.values()) for p in self._pools.values())
        )
        for name in sorted(nodes, key=lambda n: (len(nodes[n].usable()) - len(nodes[n].queue), n)):
            pool = self._pools[name]
            count = min(
                pool.requested - len(nodes[name].held) - sum(pool.in_flight.values()), budget
            )
            if count > 0:
                pool.requests_made += 1
                pool.in_flight[pool.requests_made] = count
                plan.requests.append((name, pool.requests_made, count))
                budget -= count
        return plan

    def allocated(self, t: int, node: str, request: int, ips: tuple[str, ...]) -> _Plan:
        del self._pools[node].in_flight[request]
        self._held[node].extend(ips)
        return _Plan()

    def released(self, t: int, node: str, ips: tuple[str, ...]) -> _Plan:
        gone = set(ips)
        self._held[node] = [ip for ip in self._held[node] if ip not in gone]
        pool = self._pools[node]
        pool.pending = tuple(ip for ip in pool.pending if ip not in gone)
        return _Plan()

    def still_pending(self, node: str) -> frozenset[str]:
        return frozenset(self._pools[node].pending)


# -- the run -------------------------------------------------------------------------------------


@dataclass(order=True, frozen=True, slots=True)
class _Call:
    """An allocator call in flight: an allocation of ``count`` IPs, or a release of ``ips``."""

    due: int
    order: int
    node: str = field(compare=False)
    request: int = field(compare=False, default=0)
    count: int = field(compare=False, default=0)
    ips: tuple[str, ...] = field(compare=False, default=())


class _World:
    def __init__(
        self, policy: Policy, script: _Script, capacity: int, latency: int, controller: _Controller
    ) -> None:
        self.policy = policy
        self.script = script
        self.capacity = capacity
        self.latency = latency
        self.controller = controller
        self.nodes = {name: _Node() for name in script.nodes}
        self.allocator = _Allocator(capacity)
        self.calls: list[_Call] = []
        self.allocation_calls = 0
        self.release_calls = 0
        self.waits: list[float] = []
        self.peak = 0
        self.steady_changes = 0

    def run(self, startup: _Plan) -> PolicyFigures:
        self.apply(0, startup)
        pods = deque(self.script.events)
        # A few latencies past the script so the last releases land and the pools come to rest.
        demands = [n.demand for n in self.nodes.values()]
        for t in range(1, self.script.duration + 4 * self.latency + 1):
            while pods and pods[0].at <= t:
                self.pod_event(pods.popleft())
            previous, demands = demands, [n.demand for n in self.nodes.values()]
            demand_changed = demands != previous
            while self.calls and self.calls[0].due <= t:
                self.land(t, heapq.heappop(self.calls))
            before = self.controller.batch
            self.apply(t, self.controller.reconcile(t, self.nodes))
            if self.controller.batch != before and not demand_changed:
                self.steady_changes += 1
            self.peak = max(self.peak, sum(len(n.held) for n in self.nodes.values()))
        end = float(self.script.duration + 4 * self.latency)
        for node in self.nodes.values():
            # Pods still without an IP at the end waited the whole rest of the run.
            self.waits.extend(end - since for _, since in node.queue)
        return PolicyFigures(
            policy=self.policy,
            exhaustion_flips=self.controller.flips,
            batch_changes=self.controller.batch_changes,
            steady_batch_changes=self.steady_changes,
            allocation_calls=self.allocation_calls,
            release_calls=self.release_calls,
            pods=len(self.waits),
            pods_waited=sum(1 for w in self.waits if w > 0),
            pod_ip_wait=Latency.of(self.waits),
            peak_allocated=self.peak,
            capacity=self.capacity,
            final_batch=self.controller.batch,
        )

    def pod_event(self, event: _PodEvent) -> None:
        node = self.nodes[event.node]
        if event.arrives:
            node.queue.append((event.pod, event.at))
        elif event.pod in node.pods:
            del node.pods[event.pod]
        else:
            # It leaves before getting an IP: it waited until then.
            since = next(s for p, s in node.queue if p == event.pod)
            node.queue = deque(q for q in node.queue if q[0] != event.pod)
            self.waits.append(event.at - since)
        self.serve(node, event.at)

    def serve(self, node: _Node, now: float) -> None:
        """Give queued pods the node's usable IPs, first come first served."""
        usable = node.usable()
        while node.queue and usable:
            pod, since = node.queue.popleft()
            node.pods[pod] = usable.pop(0)
            self.waits.append(now - since)

    def land(self, t: int, call: _Call) -> None:
        node = self.nodes[call.node]
        if call.count:
            granted = self.allocator.allocate(call.count)
            node.held.extend(granted)
            self.apply(t, self.controller.allocated(t, call.node, call.request, granted))
        else:
            still = self.controller.still_pending(call.node)
            busy = set(node.pods.values())
            back = tuple(ip for ip in call.ips if ip in still and ip not in busy)
            if back:
                node.held = [ip for ip in node.held if ip not in set(back)]
                node.pending -= set(back)
                self.allocator.release(back)
                self.apply(t, self.controller.released(t, call.node, back))
        self.serve(node, t)

    def apply(self, t: int, plan: _Plan) -> None:
        for name, request, count in plan.requests:
            self.allocation_calls += 1
            self._call(_Call(t + self.latency, 0, name, request=request, count=count))
        for name, pending in plan.pending.items():
            node = self.nodes[name]
            fresh = tuple(ip for ip in pending if ip not in node.pending)
            node.pending = set(pending)
            if fresh:
                self.release_calls += 1
                self._call(_Call(t + self.latency, 0, name, ips=fresh))
            self.serve(node, t)

    def _call(self, call: _Call) -> None:
        order = self.allocation_calls + self.release_calls
        heapq.heappush(
            self.calls, _Call(call.due, order, call.node, call.request, call.count, call.ips)
        )


def run_subnet_scenario(
    seed: int = 1,
    *,
    nodes: int = 32,
    capacity: int = 1024,
    peak_range: tuple[int, int] = (8, 18),
    rise_s: int = 180,
    hold_s: int = 180,
    fall_s: int = 180,
    tail_s: int = 60,
    allocator_latency_s: int = 2,
) -> SubnetReport:
    """Run the three policies on the same seeded pods; see the module docstring."""
    if nodes < 1 or capacity < 1 or allocator_latency_s < 1:
        raise ValueError("nodes, capacity and allocator_latency_s must be at least 1")
    if not 0 <= peak_range[0] <= peak_range[1]:
        raise ValueError(f"peak_range must be (low, high) with 0 <= low <= high, got {peak_range}")
    script = _script(Random(seed), nodes, peak_range, _Phases(rise_s, hold_s, fall_s, tail_s))
    figures: dict[Policy, PolicyFigures] = {}
    for policy in POLICIES:
        if policy == "settled":
            aggregate = _AggregateController(capacity, script.nodes)
            world = _World(policy, script, capacity, allocator_latency_s, aggregate)
            figures[policy] = world.run(aggregate.startup())
        else:
            feedback = _FeedbackController(policy, capacity, script.nodes)
            world = _World(policy, script, capacity, allocator_latency_s, feedback)
            figures[policy] = world.run(_Plan())
    return SubnetReport(
        seed=seed,
        capacity=capacity,
        nodes=nodes,
        peak_demand=script.peak_demand,
        duration_s=script.duration,
        allocator_latency_s=allocator_latency_s,
        policies=figures,
    )
