"""The Subnet aggregate: per-node pod-IP pools sized by the settled batch rule (seed 03).

One stream per subnet (``subnet-<id>``); every command names the subnet and touches only its
stream. The sizing rules live in :mod:`~fleetledger.domain.ipam.sizing` and are re-exported here,
so this module is the capability's one public surface; the rule and its proof are in that
module's docstring.

After each fact the aggregate re-plans, in this order, and records each change as an event:

1. the exhaustion flag, fed the subnet's *floor* (every pool at ``B = 1``, buffer 1) so that it
   depends on demand only (:class:`ExhaustionChanged`);
2. the batch: 1 while exhausted, else :func:`subnet_batch_size` of the nodes' demands and
   maxima (:class:`BatchSizeChanged`, with the inputs that caused it), never above the largest
   node maximum;
3. each node's pool: the target ``pool_size(demand, min(B, m), buffer, max_ips=m)`` for the
   node's maximum ``m`` (buffer 1 while exhausted) and which held IPs not in use are pending
   release (:class:`PoolResized`, with the node's own batch ``min(B, m)``);
4. what to ask the allocator for: one :class:`IpsRequested` per node short of its target, within
   what the subnet has left (held and in-flight IPs both count), nodes with the largest
   shortfall of usable IPs first.

A node's maximum (``m``) is what it was joined with (:class:`JoinNodes` ``max_ips``, its max pods —
nodes of different sizes differ), capped by the configured ``max_ips`` (at most 250), which is
also the maximum of a node joined without one.

Because the batch and the flag are functions of the demands (the flag with hysteresis), a subnet
whose demands stay put reaches its plan in one decision and then emits nothing more — allocations
landing or IPs being released never change the batch.

What the runtime does (reactors): on :class:`IpsRequested`, call the subnet's allocator for
``count`` IPs and send :class:`RecordAllocation` with the same ``request`` number (fewer IPs than
asked is fine: the remainder is asked again); on :class:`PoolResized` with ``pending_release``,
tell the node (its NodeNetworkConfig) to give those IPs back and send :class:`RecordRelease` once
they are free. Node agents send :class:`ReportDemand` (pods needing an IP, and the IPs in use)
whenever it changes; node informers send :class:`JoinNodes` / :class:`LeaveNode`. After a restart,
:func:`outstanding_requests` and :func:`pending_releases` say which calls may not have completed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Literal, TypeAlias

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.frozen import positional
from fleetledger.domain.ipam.sizing import (
    BATCH_EXPONENTS,
    DEFAULT_BUFFER,
    DEFAULT_LOWER_THRESHOLD,
    DEFAULT_MAX_IPS,
    DEFAULT_UPPER_THRESHOLD,
    DEFAULT_X_NSF,
    DEFAULT_X_SSF,
    batch_ceiling,
    batch_terms,
    check_max_ips,
    crossed,
    exact_pool_size,
    floor_term,
    next_exhausted,
    plan_release,
    pool_size,
    settled_batch,
    subnet_batch_size,
)

__all__ = [
    "BatchSizeChanged",
    "CreateSubnet",
    "DemandReported",
    "Direction",
    "ExhaustionChanged",
    "IpamConfig",
    "IpsAllocated",
    "IpsReleased",
    "IpsRequested",
    "JoinNodes",
    "LeaveNode",
    "NodeJoined",
    "NodeLeft",
    "NodePool",
    "PoolResized",
    "RecordAllocation",
    "RecordRelease",
    "ReportDemand",
    "SubnetCommand",
    "SubnetCreated",
    "SubnetEvent",
    "SubnetState",
    "allocated",
    "decide",
    "evolve",
    "initial_state",
    "outstanding_requests",
    "pending_releases",
    "to_data",
]

Direction = Literal["rising", "falling", "steady"]


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IpamConfig:
    """Sizing policy for every subnet. Validated once, here (a bad value raises
    :class:`InvalidCommand` naming the field and its range, and no configuration exists);
    events never depend on it except through the decisions they record.

    ``buffer`` is the spare fraction of a batch each pool keeps; ``x_nsf ≥ 1`` the node safety
    factor and ``0 < x_ssf ≤ 1`` the subnet safety factor of seed 03 (see
    :mod:`~fleetledger.domain.ipam.sizing`); ``max_ips`` in ``[1, 250]`` the most IPs a node
    holds (and the maximum of a node joined without its own); ``upper`` and ``lower`` the
    exhaustion thresholds.
    """

    buffer: float = DEFAULT_BUFFER
    x_nsf: float = DEFAULT_X_NSF
    x_ssf: float = DEFAULT_X_SSF
    max_ips: int = DEFAULT_MAX_IPS
    upper: float = DEFAULT_UPPER_THRESHOLD
    lower: float = DEFAULT_LOWER_THRESHOLD

    def __post_init__(self) -> None:
        # Each sizing function validates its own inputs with an actionable message.
        check_max_ips("max_ips", self.max_ips)
        pool_size(0, 1, buffer=self.buffer, max_ips=self.max_ips)
        batch_ceiling(1, 1, x_nsf=self.x_nsf, x_ssf=self.x_ssf)
        next_exhausted(False, 0, 1, upper=self.upper, lower=self.lower)


_DEFAULT_CONFIG = IpamConfig()


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateSubnet:
    """Start managing a subnet of ``capacity`` assignable pod IPs."""

    subnet_id: str
    capacity: int
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class JoinNodes:
    """Nodes now take their pod IPs from this subnet (an informer's first list names them all).

    Joined together, they are planned together: nodes joined one by one would each be asked a
    pool sized for a subnet with fewer nodes, only to release most of it a moment later.

    ``max_ips`` gives a node its own maximum IP count (its max pods, 1 to 250); a node not named
    there has the configured one. A node already in the subnet keeps the maximum it joined with.
    """

    subnet_id: str
    nodes: tuple[str, ...]
    _: KW_ONLY
    at: datetime
    max_ips: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaveNode:
    """A node is gone: every IP it held returns to the subnet."""

    subnet_id: str
    node: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReportDemand:
    """A node's agent reports ``demand`` (pods that need an IP, waiting ones included) and the
    IPs its pods hold (``in_use``, all held by the node)."""

    subnet_id: str
    node: str
    demand: int
    in_use: tuple[str, ...] = ()
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordAllocation:
    """The allocator answered request ``request`` of ``node`` with ``ips`` (maybe fewer than
    asked, maybe none)."""

    subnet_id: str
    node: str
    request: int
    ips: tuple[str, ...]
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordRelease:
    """``ips`` of ``node`` went back to the subnet."""

    subnet_id: str
    node: str
    ips: tuple[str, ...]
    _: KW_ONLY
    at: datetime


SubnetCommand: TypeAlias = (
    CreateSubnet | JoinNodes | LeaveNode | ReportDemand | RecordAllocation | RecordRelease
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubnetCreated:
    """The subnet's first event."""

    subnet_id: str
    capacity: int
    batch_size: int
    at: datetime


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node joined; ``max_ips`` is its own maximum IP count, ``None`` for the configured one
    (and in events recorded before nodes had their own)."""

    subnet_id: str
    node: str
    at: datetime
    max_ips: int | None = None


@dataclass(frozen=True, slots=True)
class NodeLeft:
    """The node left; ``released`` are the IPs it held, free again."""

    subnet_id: str
    node: str
    released: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class DemandReported:
    subnet_id: str
    node: str
    demand: int
    in_use: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class ExhaustionChanged:
    """The exhaustion flag flipped because the floor crossed a threshold."""

    subnet_id: str
    exhausted: bool
    floor: int
    capacity: int
    at: datetime


@dataclass(frozen=True, slots=True)
class BatchSizeChanged:
    """The batch changed from ``previous``; the rest are the inputs that decided it.

    ``direction`` is how total demand moved with the fact that triggered the change, named by
    ``cause`` (e.g. ``"demand node-3"``); ``allocated`` is what the subnet held just before.
    """

    subnet_id: str
    batch_size: int
    previous: int
    exhausted: bool
    capacity: int
    node_count: int
    total_demand: int
    floor: int
    allocated: int
    direction: Direction
    cause: str
    at: datetime


@dataclass(frozen=True, slots=True)
class PoolResized:
    """A node's pool target changed, or which of its IPs are pending release. ``batch_size`` is
    the node's own: the subnet's, clamped to the node's maximum."""

    subnet_id: str
    node: str
    requested: int
    pending_release: tuple[str, ...]
    batch_size: int
    buffer: float
    demand: int
    at: datetime


@dataclass(frozen=True, slots=True)
class IpsRequested:
    """Ask the allocator for ``count`` more IPs for ``node``; ``request`` numbers the call."""

    subnet_id: str
    node: str
    request: int
    count: int
    at: datetime


@dataclass(frozen=True, slots=True)
class IpsAllocated:
    subnet_id: str
    node: str
    request: int
    ips: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class IpsReleased:
    subnet_id: str
    node: str
    ips: tuple[str, ...]
    at: datetime


SubnetEvent: TypeAlias = (
    SubnetCreated
    | NodeJoined
    | NodeLeft
    | DemandReported
    | ExhaustionChanged
    | BatchSizeChanged
    | PoolResized
    | IpsRequested
    | IpsAllocated
    | IpsReleased
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePool:
    """One node's pool. ``held`` is in allocation order and includes IPs pending release;
    ``in_flight`` maps each unanswered allocator request to the count asked; ``max_ips`` is the
    node's own maximum (``None``: the configured one)."""

    demand: int = 0
    in_use: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    pending_release: tuple[str, ...] = ()
    requested: int = 0
    in_flight: Mapping[int, int] = field(default_factory=dict)
    requests_made: int = 0
    max_ips: int | None = None

    @property
    def usable(self) -> int:
        """Held IPs a new pod could take now."""
        return len(self.held) - len(self.in_use) - len(self.pending_release)


@dataclass(frozen=True, slots=True)
class SubnetState:
    """A subnet: its nodes' pools, who holds each IP, the batch and the exhaustion flag."""

    subnet_id: str | None = None
    capacity: int = 0
    nodes: Mapping[str, NodePool] = field(default_factory=dict)
    owners: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 1
    exhausted: bool = False
    # Sums over the nodes that a decision needs, kept by evolve as single pools change and built
    # by decide when missing (see _Index): what lets a decision cost what changed rather than
    # the subnet's size. Derived from the fields above, so it is no part of the value (equality,
    # repr), and replace() leaves it behind.
    _index: _Index | None = field(default=None, init=False, repr=False, compare=False)


def initial_state() -> SubnetState:
    """A subnet stream with no events."""
    return SubnetState()


# -- evolve --------------------------------------------------------------------------------------


_pool = positional(NodePool)
_subnet = positional(SubnetState)


def evolve(state: SubnetState, event: SubnetEvent) -> SubnetState:
    """Apply one event. Events are facts: nothing here refuses them."""
    after = _apply(state, event)
    index = state._index
    if index is not None and not isinstance(event, SubnetCreated):
        object.__setattr__(after, "_index", _followed(index, state, after, event))
    return after


def _apply(state: SubnetState, event: SubnetEvent) -> SubnetState:
    # States and pools are built field by field, by writing their slots (see
    # fleetledger.domain.frozen): dataclasses.replace and the classes' __init__ cost several
    # times more, and a subnet folds an event per node per pass.
    if isinstance(event, SubnetCreated):
        return SubnetState(event.subnet_id, event.capacity, batch_size=event.batch_size)
    if isinstance(event, NodeJoined):
        nodes = {**state.nodes, event.node: NodePool(max_ips=event.max_ips)}
        return _with(state, nodes, state.owners)
    if isinstance(event, NodeLeft):
        nodes = dict(state.nodes)
        nodes.pop(event.node, None)
        return _with(state, nodes, _Owners.of(state.owners).without(event.released))
    if isinstance(event, ExhaustionChanged):
        return replace(state, exhausted=event.exhausted)
    if isinstance(event, BatchSizeChanged):
        return replace(state, batch_size=event.batch_size)
    node = event.node
    p = state.nodes[node]
    owners = state.owners
    if isinstance(event, DemandReported):
        pool = _pool(
            event.demand,
            event.in_use,
            p.held,
            p.pending_release,
            p.requested,
            p.in_flight,
            p.requests_made,
            p.max_ips,
        )
    elif isinstance(event, PoolResized):
        pool = _pool(
            p.demand,
            p.in_use,
            p.held,
            event.pending_release,
            event.requested,
            p.in_flight,
            p.requests_made,
            p.max_ips,
        )
    elif isinstance(event, IpsRequested):
        pool = _pool(
            p.demand,
            p.in_use,
            p.held,
            p.pending_release,
            p.requested,
            {**p.in_flight, event.request: event.count},
            max(p.requests_made, event.request),
            p.max_ips,
        )
    elif isinstance(event, IpsAllocated):
        pool = _pool(
            p.demand,
            p.in_use,
            (*p.held, *event.ips),
            p.pending_release,
            p.requested,
            {r: c for r, c in p.in_flight.items() if r != event.request},
            p.requests_made,
            p.max_ips,
        )
        owners = _Owners.of(owners).given(event.ips, node)
    elif isinstance(event, IpsReleased):
        gone = set(event.ips)
        pool = _pool(
            p.demand,
            p.in_use,
            tuple(ip for ip in p.held if ip not in gone),
            tuple(ip for ip in p.pending_release if ip not in gone),
            p.requested,
            p.in_flight,
            p.requests_made,
            p.max_ips,
        )
        owners = _Owners.of(owners).without(event.ips)
    else:
        raise TypeError(f"not a subnet event: {event!r}")
    nodes = dict(state.nodes)
    nodes[node] = pool
    return _with(state, nodes, owners)


def _with(
    state: SubnetState, nodes: Mapping[str, NodePool], owners: Mapping[str, str]
) -> SubnetState:
    return _subnet(
        state.subnet_id, state.capacity, nodes, owners, state.batch_size, state.exhausted
    )


class _Owners(Mapping[str, str]):
    """Who holds each IP of a subnet: a read-only mapping whose changed copies share most of
    their entries with the original.

    A subnet holds thousands of IPs and an event names a few, yet every state is a value of its
    own; copying a whole dict per allocation made folding a subnet cost its size per event. The
    entries are spread over buckets by the address's hash, and a changed copy copies only the
    buckets it touches. Iteration order is unspecified.
    """

    __slots__ = ("_buckets", "_size")

    # About as many buckets as a subnet has nodes: an event's few IPs touch as many small
    # buckets, and the copy of the bucket list is cheap.
    _BUCKETS = 1024

    def __init__(self, entries: Mapping[str, str] | None = None) -> None:
        buckets: list[dict[str, str]] = [{} for _ in range(self._BUCKETS)]
        for ip, node in (entries or {}).items():
            buckets[hash(ip) % self._BUCKETS][ip] = node
        self._buckets: tuple[dict[str, str], ...] = tuple(buckets)
        self._size = sum(len(bucket) for bucket in buckets)

    @classmethod
    def of(cls, owners: Mapping[str, str]) -> _Owners:
        """``owners`` itself if it is one, else a copy."""
        return owners if isinstance(owners, _Owners) else cls(owners)

    def __getitem__(self, ip: str) -> str:
        return self._buckets[hash(ip) % self._BUCKETS][ip]

    def __contains__(self, ip: object) -> bool:
        return ip in self._buckets[hash(ip) % self._BUCKETS]

    def get(self, ip: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return self._buckets[hash(ip) % self._BUCKETS].get(ip, default)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[str]:
        for bucket in self._buckets:
            yield from bucket

    def __repr__(self) -> str:
        return f"_Owners({dict(self)!r})"

    def given(self, ips: Sequence[str], node: str) -> _Owners:
        """A copy where ``node`` holds ``ips``."""
        buckets, size = self._changed(ips), self._size
        for ip in ips:
            bucket = buckets[hash(ip) % self._BUCKETS]
            size += ip not in bucket
            bucket[ip] = node
        return self._made(buckets, size)

    def without(self, ips: Sequence[str]) -> _Owners:
        """A copy where nobody holds ``ips``."""
        buckets, size = self._changed(ips), self._size
        for ip in ips:
            bucket = buckets[hash(ip) % self._BUCKETS]
            if ip in bucket:
                del bucket[ip]
                size -= 1
        return self._made(buckets, size)

    def _changed(self, ips: Sequence[str]) -> list[dict[str, str]]:
        buckets = list(self._buckets)
        for index in {hash(ip) % self._BUCKETS for ip in ips}:
            buckets[index] = dict(buckets[index])
        return buckets

    @classmethod
    def _made(cls, buckets: list[dict[str, str]], size: int) -> _Owners:
        made = cls.__new__(cls)
        made._buckets = tuple(buckets)
        made._size = size
        return made


# -- the index: what a decision needs of every node, kept as nodes change -------------------------


@dataclass(frozen=True, slots=True)
class _Index:
    """Sums over a subnet's nodes for one configuration, so that a decision looks only at the
    nodes it changes: re-planning every node on every command made a subnet's decision cost
    its size (250 nodes: milliseconds per agent report).

    Each field is a function of the state's fields, kept exact by :func:`evolve` (one pool in,
    one pool out per event) and rebuilt from the nodes by :func:`_index_of` when missing; a test
    compares the decisions against a re-computation from every node.
    """

    config: IpamConfig
    buffer: Fraction
    x_nsf: Fraction
    x_ssf: Fraction
    upper: Fraction
    lower: Fraction
    floor: int
    """Σ of :func:`floor_term` (the subnet's floor, which drives the exhaustion flag)."""
    totals: tuple[int, ...]
    """Σ of :func:`batch_terms`: ``A(2^k)`` for each candidate batch."""
    maxima: Mapping[int, int]
    """How many nodes have each maximum (the largest clamps the batch)."""
    demand: int
    in_flight: int
    """IPs asked of the allocator and not answered."""
    short: frozenset[str]
    """Nodes whose target exceeds what they hold and have asked for."""
    off_plan: frozenset[str] | None
    """Nodes whose recorded target or pending release is not their plan at the state's batch
    and flag; ``None`` after the batch or the flag changed, until the next decision plans every
    node again (once per change of either)."""


def _index_of(state: SubnetState, config: IpamConfig) -> _Index:
    """The state's index for ``config``, built from every node (and kept on the state) if it
    has none yet — once per stream load, or per configuration."""
    index = state._index
    if index is not None and (index.config is config or index.config == config):
        if index.off_plan is None:
            index = replace(index, off_plan=_off_plan(state, index))
            object.__setattr__(state, "_index", index)
        return index
    index = _Index(
        config,
        Fraction(config.buffer),
        Fraction(config.x_nsf),
        Fraction(config.x_ssf),
        Fraction(config.upper),
        Fraction(config.lower),
        floor=0,
        totals=(0,) * len(BATCH_EXPONENTS),
        maxima={},
        demand=0,
        in_flight=0,
        short=frozenset(),
        off_plan=frozenset(),
    )
    for name, pool in state.nodes.items():
        index = _moved(index, state, name, None, pool)
    # The index is a cache of the state's own fields, so the frozen state may carry it.
    object.__setattr__(state, "_index", index)
    return index


def _off_plan(state: SubnetState, index: _Index) -> frozenset[str]:
    """The nodes whose recorded plan is not their plan at the state's batch and flag."""
    fraction = _ONE if state.exhausted else index.buffer
    off = set()
    for name, pool in state.nodes.items():
        _, target, pending = _plan(pool, state.batch_size, fraction, _node_max(pool, index.config))
        if (target, pending) != (pool.requested, pool.pending_release):
            off.add(name)
    return frozenset(off)


def _followed(index: _Index, before: SubnetState, after: SubnetState, event: SubnetEvent) -> _Index:
    """``index`` after ``event`` took ``before`` to ``after``."""
    if isinstance(event, ExhaustionChanged | BatchSizeChanged):
        return replace(index, off_plan=None)
    if isinstance(event, SubnetCreated):  # pragma: no cover - evolve starts a new state instead
        raise TypeError("a created subnet has no index yet")
    node = event.node
    return _moved(index, after, node, before.nodes.get(node), after.nodes.get(node))


def _moved(
    index: _Index, state: SubnetState, name: str, old: NodePool | None, new: NodePool | None
) -> _Index:
    """``index`` with node ``name``'s pool going from ``old`` to ``new`` (``None``: absent) in
    ``state`` (the state after the change)."""
    config = index.config
    floor, totals, maxima, demand = index.floor, index.totals, index.maxima, index.demand
    if old is None or new is None or old.demand != new.demand or old.max_ips != new.max_ips:
        counts = dict(maxima)
        if old is not None:
            most = _node_max(old, config)
            floor -= floor_term(old.demand, most)
            totals = tuple(
                t - x
                for t, x in zip(totals, batch_terms(old.demand, most, index.buffer), strict=True)
            )
            counts[most] -= 1
            if not counts[most]:
                del counts[most]
            demand -= old.demand
        if new is not None:
            most = _node_max(new, config)
            floor += floor_term(new.demand, most)
            totals = tuple(
                t + x
                for t, x in zip(totals, batch_terms(new.demand, most, index.buffer), strict=True)
            )
            counts[most] = counts.get(most, 0) + 1
            demand += new.demand
        maxima = counts
    in_flight = index.in_flight
    if old is not None:
        in_flight -= sum(old.in_flight.values())
    if new is not None:
        in_flight += sum(new.in_flight.values())
    short = _marked(index.short, name, new is not None and _want(new) > 0)
    off_plan = index.off_plan
    if off_plan is not None:
        if new is None:
            off_plan = _marked(off_plan, name, False)
        elif old is None or not _same_plan_inputs(old, new):
            batch, fraction = state.batch_size, _ONE if state.exhausted else index.buffer
            _, target, pending = _plan(new, batch, fraction, _node_max(new, config))
            off_plan = _marked(
                off_plan, name, (target, pending) != (new.requested, new.pending_release)
            )
    return _Index(
        config,
        index.buffer,
        index.x_nsf,
        index.x_ssf,
        index.upper,
        index.lower,
        floor=floor,
        totals=totals,
        maxima=maxima,
        demand=demand,
        in_flight=in_flight,
        short=short,
        off_plan=off_plan,
    )


_ONE = Fraction(1)


def _marked(names: frozenset[str], name: str, member: bool) -> frozenset[str]:
    if (name in names) == member:
        return names
    return names | {name} if member else names - {name}


def _same_plan_inputs(old: NodePool, new: NodePool) -> bool:
    """Whether a pool's plan and its record of it are unchanged (``replace`` keeps the fields
    it is not given, so identity says it)."""
    return (
        old.demand == new.demand
        and old.max_ips == new.max_ips
        and old.requested == new.requested
        and old.held is new.held
        and old.in_use is new.in_use
        and old.pending_release is new.pending_release
    )


def _want(pool: NodePool) -> int:
    """IPs the pool still lacks beyond what it holds and has asked for."""
    return pool.requested - len(pool.held) - sum(pool.in_flight.values())


def _plan(
    pool: NodePool, batch: int, buffer: Fraction, most: int
) -> tuple[int, int, tuple[str, ...]]:
    """The node's own batch, its pool target and the IPs pending release at subnet batch
    ``batch`` and ``buffer``, for the node's maximum ``most``."""
    # The original clamps each node's batch to its maxIPCount (Azure CNS clampScaler).
    own = min(batch, most)
    target = exact_pool_size(pool.demand, own, buffer, most)
    surplus = len(pool.held) - target
    pending = (
        plan_release(pool.held, pool.in_use, pool.pending_release, surplus) if surplus > 0 else ()
    )
    return own, target, pending


# -- queries -------------------------------------------------------------------------------------


def allocated(state: SubnetState) -> int:
    """IPs the subnet's nodes hold (pending release included: they are not free yet)."""
    return len(state.owners)


def outstanding_requests(state: SubnetState) -> tuple[tuple[str, int, int], ...]:
    """Allocator calls asked for and not answered: ``(node, request, count)``, by node."""
    return tuple(
        (node, request, count)
        for node, pool in sorted(state.nodes.items())
        for request, count in sorted(pool.in_flight.items())
    )


def pending_releases(state: SubnetState) -> Mapping[str, tuple[str, ...]]:
    """IPs each node should give back, for nodes with any."""
    return {n: p.pending_release for n, p in sorted(state.nodes.items()) if p.pending_release}


def to_data(state: SubnetState) -> dict[str, object]:
    """The subnet as JSON-ready data, for the API and dumpstate."""
    return {
        "subnet_id": state.subnet_id,
        "capacity": state.capacity,
        "allocated": allocated(state),
        "batch_size": state.batch_size,
        "exhausted": state.exhausted,
        "nodes": {
            node: {
                "demand": pool.demand,
                "in_use": len(pool.in_use),
                "held": list(pool.held),
                "requested": pool.requested,
                "pending_release": list(pool.pending_release),
                "in_flight": {str(r): c for r, c in sorted(pool.in_flight.items())},
                "max_ips": pool.max_ips,
            }
            for node, pool in sorted(state.nodes.items())
        },
    }


# -- decide --------------------------------------------------------------------------------------


def decide(
    state: SubnetState, command: SubnetCommand, *, config: IpamConfig = _DEFAULT_CONFIG
) -> list[SubnetEvent]:
    """Decide what ``command`` means for this subnet: its fact, then the re-plan it causes.

    Raises :class:`Rejected` / :class:`InvalidCommand` with a reason that says what to do.
    """
    at = _utc(command.at)
    if not isinstance(command.subnet_id, str) or not command.subnet_id:
        raise InvalidCommand("subnet_id must be a non-empty string")
    if isinstance(command, CreateSubnet):
        return _decide_create(state, command, config, at)
    if state.subnet_id is None:
        raise Rejected(f"subnet {command.subnet_id} does not exist; create it first")
    if command.subnet_id != state.subnet_id:
        raise InvalidCommand(
            f"command for subnet {command.subnet_id} sent to the stream of subnet {state.subnet_id}"
        )
    facts: list[SubnetEvent]
    if isinstance(command, JoinNodes):
        joined = _decide_join(state, command, at)
        facts = [*joined]
        cause = f"join {joined[0].node}" if len(joined) == 1 else f"join {len(joined)} nodes"
    elif not isinstance(command.node, str) or not command.node:
        raise InvalidCommand("node must be a non-empty node name")
    elif isinstance(command, LeaveNode):
        facts = _decide_leave(state, command, at)
        cause = f"leave {command.node}"
    elif isinstance(command, ReportDemand):
        facts = _decide_demand(state, command, at)
        cause = f"demand {command.node}"
    elif isinstance(command, RecordAllocation):
        facts = _decide_allocation(state, command, at)
        cause = f"allocation {command.node}"
    elif isinstance(command, RecordRelease):
        facts = _decide_release(state, command, at)
        cause = f"release {command.node}"
    else:
        raise InvalidCommand(f"a subnet does not handle {type(command).__name__}")
    _index_of(state, config)  # evolve keeps it through the facts
    after = state
    for event in facts:
        after = evolve(after, event)
    return [*facts, *_replan(state, after, config, cause, at)]


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC)


def _decide_create(
    state: SubnetState, command: CreateSubnet, config: IpamConfig, at: datetime
) -> list[SubnetEvent]:
    if type(command.capacity) is not int or command.capacity < 1:
        raise InvalidCommand(
            f"capacity must be the number of assignable IPs (e.g. 1024 for a /22), "
            f"got {command.capacity!r}"
        )
    if state.subnet_id is not None:
        if (state.subnet_id, state.capacity) == (command.subnet_id, command.capacity):
            return []
        raise Rejected(
            f"subnet {state.subnet_id} already exists with capacity {state.capacity}; "
            "a subnet's capacity does not change — create a new subnet instead"
        )
    first = subnet_batch_size(
        command.capacity,
        [],
        buffer=config.buffer,
        x_nsf=config.x_nsf,
        x_ssf=config.x_ssf,
        max_ips=config.max_ips,
    )
    return [SubnetCreated(command.subnet_id, command.capacity, first, at)]


def _known(state: SubnetState, node: str, what: str) -> NodePool:
    pool = state.nodes.get(node)
    if pool is None:
        raise Rejected(f"node {node} is not in subnet {state.subnet_id}; join it before {what}")
    return pool


def _check_ips(ips: object) -> tuple[str, ...]:
    if not isinstance(ips, tuple) or not all(isinstance(ip, str) and ip for ip in ips):
        raise InvalidCommand("ips must be a tuple of non-empty addresses")
    if len(set(ips)) != len(ips):
        raise InvalidCommand("ips lists an address twice")
    return ips


def _decide_join(state: SubnetState, command: JoinNodes, at: datetime) -> list[NodeJoined]:
    nodes = command.nodes
    if (
        not isinstance(nodes, tuple)
        or not nodes
        or not all(isinstance(n, str) and n for n in nodes)
    ):
        raise InvalidCommand("nodes must be a non-empty tuple of node names")
    if len(set(nodes)) != len(nodes):
        raise InvalidCommand("nodes names a node twice")
    maxima = _check_node_maxima(command.max_ips, nodes)
    assert state.subnet_id is not None
    return [
        NodeJoined(state.subnet_id, n, at, maxima.get(n)) for n in nodes if n not in state.nodes
    ]


def _check_node_maxima(max_ips: object, nodes: Sequence[str]) -> dict[str, int]:
    if not isinstance(max_ips, Mapping):
        raise InvalidCommand(
            f"max_ips must map node names to their maximum IP count, got {max_ips!r}"
        )
    strangers = sorted(str(n) for n in max_ips if n not in nodes)
    if strangers:
        raise InvalidCommand(
            f"max_ips names {', '.join(strangers[:3])}, not among the nodes joining; give a "
            "maximum only for a node being joined"
        )
    return {n: check_max_ips(f"max_ips of node {n}", m) for n, m in max_ips.items()}


def _decide_leave(state: SubnetState, command: LeaveNode, at: datetime) -> list[SubnetEvent]:
    pool = state.nodes.get(command.node)
    if pool is None:
        return []  # already gone (or never joined): leaving twice changes nothing
    assert state.subnet_id is not None
    return [NodeLeft(state.subnet_id, command.node, pool.held, at)]


def _decide_demand(state: SubnetState, command: ReportDemand, at: datetime) -> list[SubnetEvent]:
    pool = _known(state, command.node, "reporting its demand")
    in_use = _check_ips(command.in_use)
    if type(command.demand) is not int or command.demand < len(in_use):
        raise InvalidCommand(
            f"demand counts the pods needing an IP, those holding one included: it must be an "
            f"integer of at least {len(in_use)} (the IPs in use), got {command.demand!r}"
        )
    foreign = sorted(set(in_use) - set(pool.held))
    if foreign:
        raise Rejected(
            f"node {command.node} reports IPs it does not hold ({', '.join(foreign[:3])}); "
            "record their allocation first"
        )
    if (pool.demand, set(pool.in_use)) == (command.demand, set(in_use)):
        return []
    assert state.subnet_id is not None
    ordered = tuple(ip for ip in pool.held if ip in set(in_use))
    return [DemandReported(state.subnet_id, command.node, command.demand, ordered, at)]


def _decide_allocation(
    state: SubnetState, command: RecordAllocation, at: datetime
) -> list[SubnetEvent]:
    ips = _check_ips(command.ips)
    pool = state.nodes.get(command.node)
    if pool is None:
        raise Rejected(
            f"node {command.node} has left subnet {state.subnet_id}; return the IPs of request "
            f"{command.request} to the allocator"
        )
    asked = pool.in_flight.get(command.request)
    if asked is None:
        if type(command.request) is int and 1 <= command.request <= pool.requests_made:
            if all(state.owners.get(ip) == command.node for ip in ips):
                return []  # the same answer again
            raise Rejected(
                f"request {command.request} of node {command.node} was already answered with "
                "other IPs; return these to the allocator"
            )
        raise InvalidCommand(f"node {command.node} has no allocator request {command.request!r}")
    if len(ips) > asked:
        raise InvalidCommand(
            f"request {command.request} of node {command.node} asked for {asked} IPs, "
            f"the allocator answered {len(ips)}; record at most {asked}"
        )
    taken = sorted(ip for ip in ips if ip in state.owners)
    if taken:
        raise Rejected(
            f"IPs {', '.join(taken[:3])} are already held in subnet {state.subnet_id}; "
            "the allocator handed out an address twice"
        )
    if allocated(state) + len(ips) > state.capacity:
        raise Rejected(
            f"subnet {state.subnet_id} has {state.capacity - allocated(state)} IPs left and "
            f"{len(ips)} were recorded; check the subnet's capacity"
        )
    assert state.subnet_id is not None
    return [IpsAllocated(state.subnet_id, command.node, command.request, ips, at)]


def _decide_release(state: SubnetState, command: RecordRelease, at: datetime) -> list[SubnetEvent]:
    ips = _check_ips(command.ips)
    pool = _known(state, command.node, "releasing its IPs")
    others = sorted(ip for ip in ips if state.owners.get(ip, command.node) != command.node)
    if others:
        raise Rejected(f"IPs {', '.join(others[:3])} are held by another node, not {command.node}")
    busy = sorted(set(ips) & set(pool.in_use))
    if busy:
        raise Rejected(
            f"IPs {', '.join(busy[:3])} of node {command.node} are in use by pods; "
            "a node releases only IPs not in use"
        )
    held = [ip for ip in ips if ip in state.owners]
    if not held:
        return []  # released already
    assert state.subnet_id is not None
    return [IpsReleased(state.subnet_id, command.node, tuple(held), at)]


# -- re-planning ---------------------------------------------------------------------------------


def _replan(
    before: SubnetState, state: SubnetState, config: IpamConfig, cause: str, at: datetime
) -> list[SubnetEvent]:
    assert state.subnet_id is not None
    subnet = state.subnet_id
    index = _index_of(state, config)
    floor = index.floor
    events: list[SubnetEvent] = []
    exhausted = crossed(state.exhausted, floor, state.capacity, high=index.upper, low=index.lower)
    if exhausted != state.exhausted:
        events.append(ExhaustionChanged(subnet, exhausted, floor, state.capacity, at))
    if exhausted:
        batch, buffer, fraction = 1, 1.0, _ONE
    else:
        batch = settled_batch(
            state.capacity,
            len(state.nodes),
            max(index.maxima, default=config.max_ips),
            index.totals,
            x_nsf=index.x_nsf,
            x_ssf=index.x_ssf,
        )
        buffer, fraction = config.buffer, index.buffer
    if batch != state.batch_size:
        total, previous_total = index.demand, _index_of(before, config).demand
        direction: Direction = (
            "rising"
            if total > previous_total
            else "falling"
            if total < previous_total
            else "steady"
        )
        events.append(
            BatchSizeChanged(
                subnet,
                batch,
                state.batch_size,
                exhausted,
                state.capacity,
                len(state.nodes),
                total,
                floor,
                allocated(before),
                direction,
                cause,
                at,
            )
        )
    # Every other node's recorded plan is its plan at this batch and flag: only the nodes the
    # index lists can change, unless the batch or the flag did.
    if index.off_plan is not None and (batch, exhausted) == (state.batch_size, state.exhausted):
        names = sorted(index.off_plan)
    else:
        names = sorted(state.nodes)
    resized: dict[str, NodePool] = {}
    for name in names:
        pool = state.nodes[name]
        own, target, pending = _plan(pool, batch, fraction, _node_max(pool, config))
        if (target, pending) != (pool.requested, pool.pending_release):
            events.append(PoolResized(subnet, name, target, pending, own, buffer, pool.demand, at))
            resized[name] = replace(pool, requested=target, pending_release=pending)
    events.extend(_requests(subnet, state, index, resized, at))
    return events


def _node_max(pool: NodePool, config: IpamConfig) -> int:
    """The most IPs the node may hold: its own maximum, capped by the configured one."""
    return config.max_ips if pool.max_ips is None else min(pool.max_ips, config.max_ips)


def _requests(
    subnet: str,
    state: SubnetState,
    index: _Index,
    resized: Mapping[str, NodePool],
    at: datetime,
) -> list[SubnetEvent]:
    budget = state.capacity - allocated(state) - index.in_flight
    # Only a node short of its target is asked for: those the index lists, as re-planned.
    pools = {name: state.nodes[name] for name in index.short if name not in resized}
    pools.update((name, pool) for name, pool in resized.items() if _want(pool) > 0)
    # Nodes with pods waiting for an IP first: they are the ones a short subnet should serve.
    order = sorted(
        pools, key=lambda n: (pools[n].usable - pools[n].demand + len(pools[n].in_use), n)
    )
    events: list[SubnetEvent] = []
    for name in order:
        pool = pools[name]
        count = min(_want(pool), budget)
        if count > 0:
            events.append(IpsRequested(subnet, name, pool.requests_made + 1, count, at))
            budget -= count
    return events
