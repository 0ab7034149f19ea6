"""The Subnet aggregate decides from sums it keeps as nodes change: the same decisions as planning
every node of the subnet afresh on every command."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.ipam import (
    BatchSizeChanged,
    CreateSubnet,
    DemandReported,
    Direction,
    ExhaustionChanged,
    IpamConfig,
    IpsAllocated,
    IpsReleased,
    IpsRequested,
    JoinNodes,
    LeaveNode,
    NodeJoined,
    NodeLeft,
    NodePool,
    PoolResized,
    RecordAllocation,
    RecordRelease,
    ReportDemand,
    SubnetCommand,
    SubnetEvent,
    SubnetState,
    allocated,
    decide,
    evolve,
    initial_state,
    next_exhausted,
    outstanding_requests,
    pending_releases,
    plan_release,
    pool_size,
    subnet_batch_size,
    subnet_floor,
    to_data,
)
from fleetledger.domain.ipam.aggregate import _index_of

T0 = datetime(2025, 1, 1, tzinfo=UTC)
FACTS = (NodeJoined, NodeLeft, DemandReported, IpsAllocated, IpsReleased)


# -- the plan as first written: every node, every command ----------------------------------------


def replanned(
    before: SubnetState, state: SubnetState, config: IpamConfig, cause: str, at: datetime
) -> list[SubnetEvent]:
    """What a command's facts cause, planned from every node with the public sizing rules."""
    assert state.subnet_id is not None
    subnet = state.subnet_id
    names = sorted(state.nodes)
    demands = [state.nodes[n].demand for n in names]
    maxima = [
        config.max_ips if (m := state.nodes[n].max_ips) is None else min(m, config.max_ips)
        for n in names
    ]
    floor = subnet_floor(demands, max_ips=config.max_ips, node_max_ips=maxima)
    events: list[SubnetEvent] = []
    exhausted = next_exhausted(
        state.exhausted, floor, state.capacity, upper=config.upper, lower=config.lower
    )
    if exhausted != state.exhausted:
        events.append(ExhaustionChanged(subnet, exhausted, floor, state.capacity, at))
    batch, buffer = (1, 1.0) if exhausted else (0, config.buffer)
    if not exhausted:
        batch = subnet_batch_size(
            state.capacity,
            demands,
            buffer=config.buffer,
            x_nsf=config.x_nsf,
            x_ssf=config.x_ssf,
            max_ips=config.max_ips,
            node_max_ips=maxima,
        )
    if batch != state.batch_size:
        total, previous = sum(demands), sum(p.demand for p in before.nodes.values())
        direction: Direction = (
            "rising" if total > previous else "falling" if total < previous else "steady"
        )
        events.append(
            BatchSizeChanged(
                subnet,
                batch,
                state.batch_size,
                exhausted,
                state.capacity,
                len(names),
                total,
                floor,
                allocated(before),
                direction,
                cause,
                at,
            )
        )
    pools = dict(state.nodes)
    for name, most in zip(names, maxima, strict=True):
        pool = pools[name]
        own = min(batch, most)
        target = pool_size(pool.demand, own, buffer=buffer, max_ips=most)
        pending = plan_release(
            pool.held, pool.in_use, pool.pending_release, len(pool.held) - target
        )
        if (target, pending) != (pool.requested, pool.pending_release):
            events.append(PoolResized(subnet, name, target, pending, own, buffer, pool.demand, at))
            pools[name] = replace(pool, requested=target, pending_release=pending)
    in_flight = sum(sum(p.in_flight.values()) for p in pools.values())
    budget = state.capacity - allocated(state) - in_flight
    order = sorted(
        pools, key=lambda n: (pools[n].usable - pools[n].demand + len(pools[n].in_use), n)
    )
    for name in order:
        pool = pools[name]
        count = min(pool.requested - len(pool.held) - sum(pool.in_flight.values()), budget)
        if count > 0:
            events.append(IpsRequested(subnet, name, pool.requests_made + 1, count, at))
            budget -= count
    return events


def cause_of(command: SubnetCommand, facts: list[SubnetEvent]) -> str:
    if isinstance(command, JoinNodes):
        return f"join {facts[0].node}" if len(facts) == 1 else f"join {len(facts)} nodes"  # type: ignore[union-attr]
    kind = {
        LeaveNode: "leave",
        ReportDemand: "demand",
        RecordAllocation: "allocation",
        RecordRelease: "release",
    }[type(command)]
    return f"{kind} {command.node}"  # type: ignore[union-attr]


def fresh(state: SubnetState) -> SubnetState:
    """The same state without what evolve kept for it (``replace`` leaves that behind)."""
    return replace(state)


class Driven:
    """A subnet driven by random commands; every decision checked against the full re-plan."""

    def __init__(self, config: IpamConfig, capacity: int, seed: int) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.state = initial_state()
        self.at = T0
        self.next_address = 0
        self.joined = 0
        self.decisions = 0
        self.seen: set[type] = set()
        self(CreateSubnet("s", capacity, at=self.at))

    def __call__(self, command: SubnetCommand) -> None:
        before = self.state
        try:
            events = decide(before, command, config=self.config)
        except (Rejected, InvalidCommand) as refused:
            # Refused the same way when decided afresh.
            with pytest.raises(type(refused)):
                decide(fresh(before), command, config=self.config)
            return
        self.decisions += 1
        if not isinstance(command, CreateSubnet):
            count = next((i for i, e in enumerate(events) if not isinstance(e, FACTS)), len(events))
            facts = events[:count]
            after = fresh(before)
            for event in facts:
                after = evolve(after, event)
            assert events == facts + replanned(
                before, after, self.config, cause_of(command, facts), command.at
            )
        assert events == decide(fresh(before), command, config=self.config)
        for event in events:
            self.state = evolve(self.state, event)
            self.seen.add(type(event))
        if not isinstance(command, CreateSubnet):
            kept = self.state._index
            assert kept is not None
            built = _index_of(fresh(self.state), self.config)
            if kept.off_plan is None:  # not known until the next decision, by design
                built = replace(built, off_plan=None)
            assert kept == built

    def step(self) -> None:
        self.at += timedelta(seconds=1)
        state, rng, at = self.state, self.rng, self.at
        names = sorted(state.nodes)
        roll = rng.random()
        if roll < 0.08 or not names:
            joining = tuple(f"n{self.joined + i:03d}" for i in range(rng.randint(1, 6)))
            self.joined += len(joining)
            maxima = {n: rng.choice((8, 30, 110, 250)) for n in joining if rng.random() < 0.5}
            self(JoinNodes("s", joining, at=at, max_ips=maxima))
        elif roll < 0.12:
            self(LeaveNode("s", rng.choice(names), at=at))
        elif roll < 0.55:
            node = rng.choice(names)
            held = state.nodes[node].held
            demand = rng.choice((0, 1, 2, rng.randint(0, 40), rng.randint(0, 250)))
            in_use = held[: min(demand, len(held))]
            self(ReportDemand("s", node, demand, in_use, at=at))
        elif roll < 0.85:
            for node, request, count in outstanding_requests(state)[: rng.randint(1, 8)]:
                # Answers in full, short, empty, or for a request of a departed node.
                given = rng.choice((count, count, count, count // 2, 0))
                ips = tuple(f"ip-{self.next_address + k}" for k in range(given))
                self.next_address += given
                self(RecordAllocation("s", node, request, ips, at=at))
        elif roll < 0.97:
            for node, ips in list(pending_releases(state).items())[: rng.randint(1, 8)]:
                self(RecordRelease("s", node, ips, at=at))
        else:
            node = rng.choice(names)
            # Refused: an IP the node does not hold.
            self(ReportDemand("s", node, 1, ("ip-nobody",), at=at))


CONFIGS = {
    "default": IpamConfig(),
    "no buffer": IpamConfig(buffer=0.0),
    "small nodes": IpamConfig(max_ips=30, x_ssf=0.5, buffer=0.75),
    "flapping flag": IpamConfig(upper=0.3, lower=0.25, x_nsf=1.0),
}


class TestIncrementalDecisions:
    @pytest.mark.parametrize("name", sorted(CONFIGS))
    def test_a_long_run_decides_as_planning_every_node(self, name: str) -> None:
        """Over hundreds of random commands (joins, leaves, demands, full, short and empty
        answers, releases, refusals), each decision equals the plan made from every node, and
        the sums kept through evolve equal those built from the state's nodes."""
        driven = Driven(CONFIGS[name], capacity=1024, seed=sum(map(ord, name)))
        for _ in range(500):
            driven.step()
        assert driven.decisions > 250
        assert len(driven.state.nodes) > 10
        kinds = {BatchSizeChanged, PoolResized, IpsRequested, IpsAllocated, IpsReleased, NodeLeft}
        assert kinds <= driven.seen
        if name == "flapping flag":
            assert ExhaustionChanged in driven.seen

    @settings(max_examples=20, deadline=None)
    @given(
        seed=st.integers(min_value=0, max_value=2**32),
        capacity=st.sampled_from((64, 256, 1024, 4096)),
        config=st.sampled_from(sorted(CONFIGS)),
    )
    def test_any_history_decides_as_planning_every_node(
        self, seed: int, capacity: int, config: str
    ) -> None:
        """The same for any seed, subnet size and configuration (exhausted subnets included)."""
        driven = Driven(CONFIGS[config], capacity=capacity, seed=seed)
        for _ in range(100):
            driven.step()

    def test_a_state_built_elsewhere_is_planned_from_its_nodes(self) -> None:
        """A state not folded here (built field by field) is decided on from its own nodes."""
        pools = {"a": NodePool(demand=5), "b": NodePool(demand=9, max_ips=8)}
        state = SubnetState("s", 512, pools)
        command = ReportDemand("s", "a", 7, at=T0)

        events = decide(state, command, config=IpamConfig())

        assert events[0] == DemandReported("s", "a", 7, (), T0)
        assert {e.node for e in events if isinstance(e, PoolResized)} == {"a", "b"}

    def test_the_kept_sums_are_no_part_of_the_state(self) -> None:
        """Two states with the same fields are equal and dump the same, whatever was kept."""
        driven = Driven(IpamConfig(), capacity=1024, seed=7)
        for _ in range(100):
            driven.step()
        assert driven.state._index is not None
        assert driven.state == fresh(driven.state)
        assert repr(driven.state) == repr(fresh(driven.state))
        assert to_data(driven.state) == to_data(fresh(driven.state))
