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
    Ours, run by the runtime ``serve`` runs: :class:`~fleetledger.adapters.ipam.IpamRuntime` (the
    Subnet aggregate on the decider host, its allocator reactor, the read model) on a manual
    clock, writing the scenario's log, with the in-memory allocator behind it.
    :func:`~fleetledger.domain.ipam.subnet_batch_size` of the demands, the flag fed the demand
    floor.

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
  ask the allocator for. For the feedback policies an allocator call lands
  ``allocator_latency_s`` later; a release call gives back, when it lands, the IPs still pending
  release then. For ``settled`` each node's agent reports its demand through the subnet service
  (``ReportDemand``: nothing when it did not change), and the runtime's reactor makes the calls
  the subnet asks for and records the answers at once; the IPs reach the node, usable by its
  pods, ``allocator_latency_s`` later, and the IPs it releases leave the node at once (they were
  pending release, so no pod could take them). The allocator never hands out more than the
  subnet has (it grants what is free), and every controller budgets its requests to the IPs
  neither held nor in flight, so no policy is handicapped by refusals.

Figures per policy: ``exhaustion_flips`` (changes of the flag), ``batch_changes`` (and
``steady_batch_changes``, those made in a second when no node's demand changed — oscillation
pure and simple), ``ip_requests`` (allocator calls: allocations plus releases),
``pod_ip_wait_p99_s`` and ``peak_utilization`` (most IPs held at once, over capacity).

The settled run leaves its log (``url``, which must hold no events yet; a scratch file when
``None``). ``checkpoints`` records the dumpstate its runtime held in memory at three positions —
the end of the rise, the end of the plateau and the end of the run — with its SHA-256, for
checking ``fleetledger dumpstate --as-of POSITION`` (a replay of that log) against it.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from random import Random
from typing import Literal, Protocol

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
from fleetledger.adapters.runtime import Folded
from fleetledger.domain import ipam
from fleetledger.eventstore import EventStore
from fleetledger.projections.dumpstate import dumpstate_of

from .logs import simulation_store
from .report import Checkpoint, Latency

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
_SUBNET = "pods"


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
    checkpoints: tuple[Checkpoint, ...] = ()

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
            "checkpoints": [c.to_dict() for c in self.checkpoints],
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
        lines.extend(
            f"  settled checkpoint {c.label}: position {c.position}, sha256 {c.sha256[:16]}…"
            for c in self.checkpoints
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
    """What a controller decided in one step: allocator requests and new pending-release sets
    (the feedback policies make those calls later); IPs the runtime was allocated for a node
    (``delivered``: usable there after the latency) and IPs it gave back (``released``)."""

    requests: list[tuple[str, int, int]] = field(default_factory=list)  # node, request, count
    pending: dict[str, tuple[str, ...]] = field(default_factory=dict)
    delivered: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    released: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)


class _Policy(Protocol):
    @property
    def batch(self) -> int: ...
    @property
    def flips(self) -> int: ...
    @property
    def batch_changes(self) -> int: ...

    def reconcile(self, t: int, nodes: Mapping[str, _Node]) -> _Plan: ...


class _Controller(_Policy, Protocol):
    """A feedback policy: the world makes its allocator calls and tells it the answers."""

    def allocated(self, t: int, node: str, request: int, ips: tuple[str, ...]) -> _Plan: ...
    def released(self, t: int, node: str, ips: tuple[str, ...]) -> _Plan: ...
    def still_pending(self, node: str) -> frozenset[str]: ...


# -- the settled controller: the runtime ------------------------------------------------------


class _RuntimeController:
    """Ours: :class:`IpamRuntime` on the run's log, as ``serve`` builds it (threadless: the
    world calls :meth:`IpamRuntime.step` when the log has moved)."""

    def __init__(self, store: EventStore, capacity: int, names: Sequence[str]) -> None:
        self.store = store
        self.clock = ManualClock(_EPOCH)
        self.allocator = InMemoryAllocator()
        self.allocator.add_subnet(_SUBNET, capacity)
        self.runtime = IpamRuntime(store, self.allocator, clock=self.clock, threads=False)
        self.batch_changes = 0
        self.flips = 0
        self.last_change: ipam.BatchSizeChanged | None = None
        self._stream = self.runtime.service.stream(_SUBNET)
        self._stream.on_events(self._heard)
        self._reported: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._known: dict[str, tuple[str, ...]] = {}
        self._pending: dict[str, tuple[str, ...]] = {}
        self._stepped = 0
        self.runtime.start()
        self.runtime.service.create(_SUBNET, capacity)
        self.runtime.service.join(_SUBNET, names)
        self._step()
        self._startup = self._effects()
        # Counted from the moment every node has joined, as for the other policies, which start
        # at B0: the subnet's first batch (sized for no nodes) is not a change under load.
        self.batch_changes = 0
        self.flips = 0

    @property
    def state(self) -> ipam.SubnetState:
        """The subnet as the runtime's hosted stream holds it."""
        return self._stream.state

    @property
    def batch(self) -> int:
        return self.state.batch_size

    def startup(self) -> _Plan:
        return self._startup

    def _heard(self, folded: Sequence[Folded[ipam.SubnetEvent]]) -> None:
        for item in folded:
            if isinstance(item.event, ipam.BatchSizeChanged):
                self.batch_changes += 1
                self.last_change = item.event
            elif isinstance(item.event, ipam.ExhaustionChanged):
                self.flips += 1

    def reconcile(self, t: int, nodes: Mapping[str, _Node]) -> _Plan:
        ahead = _at(t) - self.clock.now()
        if ahead > timedelta(0):
            self.clock.advance(ahead)
        for name, node in nodes.items():
            seen = (node.demand, node.in_use())
            if self._reported.get(name) != seen:
                self._reported[name] = seen
                self.runtime.service.report_demand(_SUBNET, name, *seen)
        self._step()
        return self._effects()

    def _step(self) -> None:
        """The reactor makes the allocator calls the new events ask for (nothing new: no call)."""
        head = self.store.head()
        if head != self._stepped:
            self.runtime.step()
            self._stepped = self.store.head()

    def _effects(self) -> _Plan:
        """What changed at the nodes since the last look: IPs allocated to them and given back,
        and which IPs are pending release."""
        plan = _Plan()
        for name, pool in self.state.nodes.items():
            known = self._known.get(name, ())
            held = set(pool.held)
            gone = tuple(ip for ip in known if ip not in held)
            new = tuple(ip for ip in pool.held if ip not in set(known))
            self._known[name] = pool.held
            if gone:
                plan.released.append((name, gone))
            if new:
                plan.delivered.append((name, new))
            if pool.pending_release != self._pending.get(name, ()):
                self._pending[name] = pool.pending_release
                plan.pending[name] = pool.pending_release
        return plan

    def holds(self, node: str) -> frozenset[str]:
        pool = self.state.nodes.get(node)
        return frozenset(pool.held) if pool is not None else frozenset()

    def checkpoint(self, label: str) -> Checkpoint:
        """The dumpstate the runtime holds now (its hosted stream, its last batch change)."""
        position = self.store.head()
        subnets = {_SUBNET: (self.state, self.last_change)}
        return Checkpoint(label, position, dumpstate_of({}, subnets, position=position))


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


class _World(ABC):
    """The pods, the nodes and the clock of one run; the policy's allocator calls are its
    subclasses' business."""

    def __init__(
        self, policy: Policy, script: _Script, capacity: int, latency: int, controller: _Policy
    ) -> None:
        self.policy = policy
        self.script = script
        self.capacity = capacity
        self.latency = latency
        self.controller = controller
        self.nodes = {name: _Node() for name in script.nodes}
        self.calls: list[_Call] = []
        self._order = itertools.count(1)
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
            self.peak = max(self.peak, self.holding())
            self.reconciled(t)
        end = float(self.script.duration + 4 * self.latency)
        for node in self.nodes.values():
            # Pods still without an IP at the end waited the whole rest of the run.
            self.waits.extend(end - since for _, since in node.queue)
        allocations, releases = self.calls_made()
        return PolicyFigures(
            policy=self.policy,
            exhaustion_flips=self.controller.flips,
            batch_changes=self.controller.batch_changes,
            steady_batch_changes=self.steady_changes,
            allocation_calls=allocations,
            release_calls=releases,
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

    def _call(self, call: _Call) -> None:
        heapq.heappush(
            self.calls,
            _Call(call.due, next(self._order), call.node, call.request, call.count, call.ips),
        )

    # -- what each kind of controller does -----------------------------------------------------

    @abstractmethod
    def apply(self, t: int, plan: _Plan) -> None:
        """Carry out what the controller decided at second ``t``."""

    @abstractmethod
    def land(self, t: int, call: _Call) -> None:
        """A call made ``latency`` seconds ago lands."""

    @abstractmethod
    def calls_made(self) -> tuple[int, int]:
        """Allocator calls made: allocations and releases."""

    @abstractmethod
    def reconciled(self, t: int) -> None:
        """Second ``t`` is over."""

    def holding(self) -> int:
        """IPs the subnet has handed to nodes right now."""
        return sum(len(n.held) for n in self.nodes.values())


class _FeedbackWorld(_World):
    """The naive and formula policies: the world makes their allocator calls, which land
    ``latency`` seconds after they were decided."""

    def __init__(
        self,
        policy: Policy,
        script: _Script,
        capacity: int,
        latency: int,
        controller: _Controller,
    ) -> None:
        super().__init__(policy, script, capacity, latency, controller)
        self.feedback = controller
        self.allocator = _Allocator(capacity)
        self.allocation_calls = 0
        self.release_calls = 0

    def land(self, t: int, call: _Call) -> None:
        node = self.nodes[call.node]
        if call.count:
            granted = self.allocator.allocate(call.count)
            node.held.extend(granted)
            self.apply(t, self.feedback.allocated(t, call.node, call.request, granted))
        else:
            still = self.feedback.still_pending(call.node)
            busy = set(node.pods.values())
            back = tuple(ip for ip in call.ips if ip in still and ip not in busy)
            if back:
                node.held = [ip for ip in node.held if ip not in set(back)]
                node.pending -= set(back)
                self.allocator.release(back)
                self.apply(t, self.feedback.released(t, call.node, back))
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

    def calls_made(self) -> tuple[int, int]:
        return self.allocation_calls, self.release_calls

    def reconciled(self, t: int) -> None:
        del t  # the feedback policies keep no log: nothing to check a replay against


class _RuntimeWorld(_World):
    """The settled policy: the runtime calls the allocator and records the answers at once; a
    node can use its new IPs ``latency`` seconds later."""

    def __init__(
        self,
        script: _Script,
        capacity: int,
        latency: int,
        controller: _RuntimeController,
        *,
        checkpoint_at: Mapping[int, str],
    ) -> None:
        super().__init__("settled", script, capacity, latency, controller)
        self.runtime = controller
        self.checkpoint_at = dict(checkpoint_at)
        self.checkpoints: list[Checkpoint] = []

    def apply(self, t: int, plan: _Plan) -> None:
        for name, gone in plan.released:
            node = self.nodes[name]
            back = set(gone)
            node.held = [ip for ip in node.held if ip not in back]
            node.pending -= back
        for name, pending in plan.pending.items():
            node = self.nodes[name]
            node.pending = set(pending)
            self.serve(node, t)
        for name, ips in plan.delivered:
            self._call(_Call(t + self.latency, 0, name, ips=ips))

    def land(self, t: int, call: _Call) -> None:
        """IPs allocated ``latency`` ago reach the node (those it still holds: some may have
        been given back meanwhile)."""
        node = self.nodes[call.node]
        holds = self.runtime.holds(call.node)
        node.held.extend(ip for ip in call.ips if ip in holds and ip not in node.held)
        self.serve(node, t)

    def holding(self) -> int:
        return ipam.allocated(self.runtime.state)

    def calls_made(self) -> tuple[int, int]:
        return self.runtime.allocator.allocate_calls, self.runtime.allocator.release_calls

    def reconciled(self, t: int) -> None:
        label = self.checkpoint_at.get(t)
        if label is not None:
            self.checkpoints.append(self.runtime.checkpoint(label))


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
    url: str | None = None,
) -> SubnetReport:
    """Run the three policies on the same seeded pods; see the module docstring. The settled
    policy's runtime writes to the log at ``url`` (which must hold no events yet; a scratch
    SQLite file when ``None``)."""
    if nodes < 1 or capacity < 1 or allocator_latency_s < 1:
        raise ValueError("nodes, capacity and allocator_latency_s must be at least 1")
    if not 0 <= peak_range[0] <= peak_range[1]:
        raise ValueError(f"peak_range must be (low, high) with 0 <= low <= high, got {peak_range}")
    phases = _Phases(rise_s, hold_s, fall_s, tail_s)
    script = _script(Random(seed), nodes, peak_range, phases)
    figures: dict[Policy, PolicyFigures] = {}
    for policy in POLICIES:
        if policy != "settled":
            feedback = _FeedbackController(policy, capacity, script.nodes)
            world = _FeedbackWorld(policy, script, capacity, allocator_latency_s, feedback)
            figures[policy] = world.run(_Plan())
    checkpoint_at = {
        rise_s: "end of the rise",
        rise_s + hold_s: "end of the plateau",
        script.duration + 4 * allocator_latency_s: "end",
    }
    with simulation_store(url, fresh=True) as store:
        runtime = _RuntimeController(store, capacity, script.nodes)
        settled = _RuntimeWorld(
            script, capacity, allocator_latency_s, runtime, checkpoint_at=checkpoint_at
        )
        try:
            figures["settled"] = settled.run(runtime.startup())
        finally:
            runtime.runtime.stop()
    return SubnetReport(
        seed=seed,
        capacity=capacity,
        nodes=nodes,
        peak_demand=script.peak_demand,
        duration_s=script.duration,
        allocator_latency_s=allocator_latency_s,
        policies=figures,
        checkpoints=tuple(settled.checkpoints),
    )
