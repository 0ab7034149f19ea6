"""The Subnet aggregate: joins, demand, allocations, releases, exhaustion — and that it settles."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain import codec, ipam
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.ipam import (
    BatchSizeChanged,
    CreateSubnet,
    DemandReported,
    ExhaustionChanged,
    IpamConfig,
    IpsAllocated,
    IpsReleased,
    IpsRequested,
    JoinNodes,
    LeaveNode,
    NodeJoined,
    NodeLeft,
    PoolResized,
    RecordAllocation,
    RecordRelease,
    ReportDemand,
    SubnetCommand,
    SubnetCreated,
    SubnetEvent,
    SubnetState,
    allocated,
    decide,
    evolve,
    initial_state,
    outstanding_requests,
    pending_releases,
    to_data,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float = 0) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Subnet:
    """One subnet stream driven through commands, with a fake allocator handing out addresses."""

    def __init__(self, capacity: int = 1024, config: IpamConfig | None = None) -> None:
        self.state: SubnetState = initial_state()
        self.events: list[SubnetEvent] = []
        self.config = config or IpamConfig()
        self.next_address = 0
        self(CreateSubnet("s", capacity, at=at()))

    def __call__(self, *commands: SubnetCommand) -> list[SubnetEvent]:
        produced: list[SubnetEvent] = []
        for command in commands:
            new = decide(self.state, command, config=self.config)
            for event in new:
                self.state = evolve(self.state, event)
            produced.extend(new)
        self.events.extend(produced)
        return produced

    def fulfil(self) -> list[SubnetEvent]:
        """Answer every outstanding request in full and release every pending IP, until quiet."""
        produced: list[SubnetEvent] = []
        while outstanding_requests(self.state) or pending_releases(self.state):
            for node, request, count in outstanding_requests(self.state):
                ips = tuple(f"ip-{self.next_address + k}" for k in range(count))
                self.next_address += count
                produced += self(RecordAllocation("s", node, request, ips, at=at()))
            for node, ips in pending_releases(self.state).items():
                produced += self(RecordRelease("s", node, ips, at=at()))
        return produced

    def use(self, node: str, demand: int) -> list[SubnetEvent]:
        """Report ``demand`` pods on ``node``, as many holding IPs as the node has."""
        held = self.state.nodes[node].held
        in_use = tuple(held[: min(demand, len(held))])
        return self(ReportDemand("s", node, demand, in_use, at=at()))


E = TypeVar("E")


def of(kind: type[E], events: Sequence[SubnetEvent]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


def nodes(n: int) -> tuple[str, ...]:
    return tuple(f"n{i:02d}" for i in range(n))


class TestConfig:
    @pytest.mark.parametrize(
        "options",
        [{"buffer": -1.0}, {"x_nsf": 0.5}, {"max_ips": 0}, {"upper": 0.4, "lower": 0.5}],
    )
    def test_bad_config_refused(self, options: dict[str, float]) -> None:
        """Configuration is validated once, at construction."""
        with pytest.raises(InvalidCommand):
            IpamConfig(**options)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("options", "field", "allowed"),
        [
            ({"max_ips": 251}, "max_ips", "1 and 250"),
            ({"max_ips": 0}, "max_ips", "1 and 250"),
            ({"x_ssf": 0.0}, "x_ssf", "(0, 1]"),
            ({"x_ssf": 1.5}, "x_ssf", "(0, 1]"),
            ({"x_ssf": float("nan")}, "x_ssf", "(0, 1]"),
            ({"x_nsf": 0.5}, "x_nsf", "at least 1"),
        ],
    )
    def test_out_of_range_names_the_field_and_range(
        self, options: dict[str, float], field: str, allowed: str
    ) -> None:
        """A maximum above the 250 pods a node can run, or a safety factor outside its range, is
        refused with a message naming the field and what it may be."""
        with pytest.raises(InvalidCommand) as refused:
            IpamConfig(**options)  # type: ignore[arg-type]
        assert field in str(refused.value) and allowed in str(refused.value)

    def test_subnet_safety_factor_holds_back_part_of_the_subnet(self) -> None:
        """``x_ssf`` hands out only that fraction of the subnet as batches (seed 03's
        ``B = X_ssf·C / (X_nsf·N)``): half of a /22 for 32 idle nodes halves their batch."""
        whole = Subnet()
        whole(JoinNodes("s", nodes(32), at=at()))
        half = Subnet(config=IpamConfig(x_ssf=0.5))
        half(JoinNodes("s", nodes(32), at=at()))
        assert (whole.state.batch_size, half.state.batch_size) == (16, 8)


class TestNodeMaximum:
    def test_batch_clamped_to_the_node_maximum(self) -> None:
        """A /16 with one node records a batch of at most the node's 250 IPs (the original
        clamps its scaler's batch to ``[1, maxIPCount]``), not 2^15: in the batch change, the
        pool event and the dump."""
        subnet = Subnet(capacity=65536)
        assert subnet.state.batch_size == 250
        events = subnet(JoinNodes("s", ("n1",), at=at()))
        assert subnet.state.batch_size == 250
        assert [e.batch_size for e in of(BatchSizeChanged, events)] in ([], [250])
        [resized] = of(PoolResized, events)
        assert (resized.batch_size, resized.requested) == (250, 250)
        assert to_data(subnet.state)["batch_size"] == 250

    def test_created_batch_clamped_to_the_configured_maximum(self) -> None:
        """With no nodes yet the batch is clamped to the configured maximum."""
        subnet = Subnet(config=IpamConfig(max_ips=110))
        assert subnet.events == [SubnetCreated("s", 1024, 110, at())]

    def test_each_node_has_its_own_maximum(self) -> None:
        """Nodes whose max pods differ: each node's batch and pool are clamped to its own
        maximum, the others keep the subnet's batch."""
        subnet = Subnet(capacity=65536)
        events = subnet(JoinNodes("s", ("big", "small"), at=at(), max_ips={"small": 30}))
        resized = {e.node: (e.batch_size, e.requested) for e in of(PoolResized, events)}
        assert resized == {"big": (250, 250), "small": (30, 30)}
        asked = {r.node: r.count for r in of(IpsRequested, events)}
        assert asked == {"big": 250, "small": 30}
        assert subnet.state.nodes["small"].max_ips == 30
        assert to_data(subnet.state)["nodes"]["small"]["max_ips"] == 30  # type: ignore[index]

    def test_a_small_node_leaves_more_for_the_others(self) -> None:
        """A node that can hold only a few IPs takes only those from the subnet: its smaller
        share lets the others keep a larger batch than if every node could hold 250."""
        names = nodes(16)
        uniform = Subnet(capacity=1024)
        uniform(JoinNodes("s", names, at=at()))
        mixed = Subnet(capacity=1024)
        mixed(JoinNodes("s", names, at=at(), max_ips=dict.fromkeys(names[:8], 8)))
        for subnet in (uniform, mixed):
            subnet.fulfil()
            for index, name in enumerate(names):
                subnet.use(name, 6 if index < 8 else 20)
                subnet.fulfil()
        assert (uniform.state.batch_size, mixed.state.batch_size) == (16, 32)
        assert {mixed.state.nodes[n].requested for n in names[:8]} == {8}

    def test_node_maximum_caps_at_the_configured_one(self) -> None:
        """A node's own maximum never lifts it above the configured maximum."""
        subnet = Subnet(capacity=65536, config=IpamConfig(max_ips=100))
        events = subnet(JoinNodes("s", ("n1",), at=at(), max_ips={"n1": 200}))
        [resized] = of(PoolResized, events)
        assert (resized.batch_size, resized.requested) == (100, 100)

    @pytest.mark.parametrize(
        ("max_ips", "words"),
        [
            ({"n1": 251}, "between 1 and 250"),
            ({"n1": 0}, "between 1 and 250"),
            ({"n1": 2.5}, "between 1 and 250"),
            ({"ghost": 30}, "ghost"),
        ],
    )
    def test_bad_node_maximum_refused_and_changes_nothing(
        self, max_ips: dict[str, int], words: str
    ) -> None:
        """A node maximum out of range, or for a node not being joined, refuses the whole join
        with a message naming it; nothing is recorded."""
        subnet = Subnet()
        before = subnet.state
        with pytest.raises(InvalidCommand, match=words):
            subnet(JoinNodes("s", ("n1",), at=at(), max_ips=max_ips))
        assert subnet.state == before


class TestCreate:
    def test_created_with_the_batch_for_no_nodes(self) -> None:
        """A new subnet records its capacity and the batch its first node would get: 512 for
        a /22, clamped to the 250 IPs a node may hold."""
        subnet = Subnet()
        assert subnet.events == [SubnetCreated("s", 1024, 250, at())]

    def test_create_again_is_a_no_op(self) -> None:
        """Creating the same subnet twice changes nothing."""
        subnet = Subnet()
        assert subnet(CreateSubnet("s", 1024, at=at(1))) == []

    def test_capacity_never_changes(self) -> None:
        """A second create with another capacity is refused."""
        subnet = Subnet()
        with pytest.raises(Rejected, match="capacity does not change"):
            subnet(CreateSubnet("s", 2048, at=at(1)))

    @pytest.mark.parametrize("capacity", [0, -1, 1024.0])
    def test_bad_capacity_refused(self, capacity: int) -> None:
        """Capacity is a positive count of IPs."""
        with pytest.raises(InvalidCommand, match="capacity"):
            decide(initial_state(), CreateSubnet("s", capacity, at=at()))

    def test_commands_need_the_subnet(self) -> None:
        """Nothing but a create is accepted before the subnet exists."""
        with pytest.raises(Rejected, match="create it first"):
            decide(initial_state(), JoinNodes("s", ("n1",), at=at()))

    def test_wrong_stream_refused(self) -> None:
        """A command naming another subnet is refused."""
        subnet = Subnet()
        with pytest.raises(InvalidCommand, match="stream of subnet s"):
            subnet(JoinNodes("t", ("n1",), at=at()))

    def test_naive_time_refused(self) -> None:
        """Commands carry timezone-aware times."""
        with pytest.raises(InvalidCommand, match="timezone-aware"):
            decide(initial_state(), CreateSubnet("s", 1024, at=datetime(2025, 1, 1)))


class TestJoin:
    def test_nodes_joined_together_are_planned_together(self) -> None:
        """32 idle nodes on a /22 get a batch of 16: one pool and one request each."""
        subnet = Subnet()
        events = subnet(JoinNodes("s", nodes(32), at=at()))
        assert len(of(NodeJoined, events)) == 32
        [change] = of(BatchSizeChanged, events)
        assert (change.previous, change.batch_size, change.node_count) == (250, 16, 32)
        assert change.cause == "join 32 nodes"
        requests = of(IpsRequested, events)
        assert [(r.node, r.count) for r in requests] == [(n, 16) for n in nodes(32)]

    def test_join_again_is_a_no_op(self) -> None:
        """A node already in the subnet joins without effect."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        assert subnet(JoinNodes("s", ("n1",), at=at(1))) == []

    @pytest.mark.parametrize("names", [(), ("a", "a"), ("",)])
    def test_bad_names_refused(self, names: tuple[str, ...]) -> None:
        """Join names at least one node, each once, each non-empty."""
        subnet = Subnet()
        with pytest.raises(InvalidCommand):
            subnet(JoinNodes("s", names, at=at()))

    def test_requests_stay_within_the_subnet(self) -> None:
        """More nodes than the subnet can give a batch get what is left, never more."""
        subnet = Subnet(capacity=64)
        events = subnet(JoinNodes("s", nodes(100), at=at()))
        assert sum(r.count for r in of(IpsRequested, events)) == 64


class TestDemand:
    def test_batch_change_records_its_inputs(self) -> None:
        """When demand moves the batch, the event says what it was, why and from what inputs:
        32 idle nodes on a /22 fill it exactly at 16 (512 held + 512 to spare), so the first
        node to use 12 IPs halves the batch."""
        subnet = Subnet()
        subnet(JoinNodes("s", nodes(32), at=at()))
        subnet.fulfil()
        events = subnet(ReportDemand("s", "n00", 12, at=at(5)))
        [change] = of(BatchSizeChanged, events)
        assert change == BatchSizeChanged(
            subnet_id="s",
            batch_size=8,
            previous=16,
            exhausted=False,
            capacity=1024,
            node_count=32,
            total_demand=12,
            floor=32 + 12,
            allocated=512,
            direction="rising",
            cause="demand n00",
            at=at(5),
        )

    def test_falling_demand_recorded_as_falling(self) -> None:
        """The batch growing back is recorded with the direction of the demand."""
        subnet = Subnet()
        subnet(JoinNodes("s", nodes(32), at=at()))
        subnet.fulfil()
        subnet(ReportDemand("s", "n00", 12, at=at()))
        [change] = of(BatchSizeChanged, subnet(ReportDemand("s", "n00", 0, at=at())))
        assert (change.previous, change.batch_size, change.direction) == (8, 16, "falling")

    def test_same_report_changes_nothing(self) -> None:
        """Repeating a node's report records nothing."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        subnet.use("n1", 3)
        assert subnet.use("n1", 3) == []

    def test_ip_not_held_refused(self) -> None:
        """A node cannot report using an IP it does not hold."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        with pytest.raises(Rejected, match="does not hold"):
            subnet(ReportDemand("s", "n1", 1, ("10.0.0.9",), at=at()))

    def test_demand_below_in_use_refused(self) -> None:
        """Demand counts the pods holding IPs too."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        held = subnet.state.nodes["n1"].held
        with pytest.raises(InvalidCommand, match="at least 2"):
            subnet(ReportDemand("s", "n1", 1, held[:2], at=at()))

    def test_unknown_node_refused(self) -> None:
        """Only joined nodes report demand."""
        subnet = Subnet()
        with pytest.raises(Rejected, match="join it"):
            subnet(ReportDemand("s", "ghost", 1, at=at()))


class TestAllocation:
    def test_allocation_lands_in_the_pool(self) -> None:
        """Answered IPs join the node's pool and the request is no longer outstanding."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        [(node, request, count)] = outstanding_requests(subnet.state)
        ips = tuple(f"a{k}" for k in range(count))
        assert subnet(RecordAllocation("s", node, request, ips, at=at())) == [
            IpsAllocated("s", "n1", request, ips, at())
        ]
        assert subnet.state.nodes["n1"].held == ips
        assert outstanding_requests(subnet.state) == ()

    def test_partial_answer_is_asked_again(self) -> None:
        """Fewer IPs than asked land, and the remainder is requested at once."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        [(_, request, count)] = outstanding_requests(subnet.state)
        events = subnet(RecordAllocation("s", "n1", request, ("a0",), at=at()))
        [again] = of(IpsRequested, events)
        assert (again.request, again.count) == (request + 1, count - 1)

    def test_same_answer_again_is_a_no_op(self) -> None:
        """A repeated allocation record changes nothing."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        [(_, request, _count)] = outstanding_requests(subnet.state)
        subnet(RecordAllocation("s", "n1", request, ("a0", "a1"), at=at()))
        assert subnet(RecordAllocation("s", "n1", request, ("a0", "a1"), at=at())) == []

    def test_more_than_asked_refused(self) -> None:
        """The allocator cannot answer more IPs than were asked."""
        subnet = Subnet(capacity=16)
        subnet(JoinNodes("s", ("n1", "n2"), at=at()))
        [(node, request, count), *_] = outstanding_requests(subnet.state)
        ips = tuple(f"a{k}" for k in range(count + 1))
        with pytest.raises(InvalidCommand, match="at most"):
            subnet(RecordAllocation("s", node, request, ips, at=at()))

    def test_unknown_request_refused(self) -> None:
        """Only requests the subnet made can be answered."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        with pytest.raises(InvalidCommand, match="no allocator request 7"):
            subnet(RecordAllocation("s", "n1", 7, ("a0",), at=at()))

    def test_address_held_elsewhere_refused(self) -> None:
        """An address handed out twice is refused."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1", "n2"), at=at()))
        subnet(RecordAllocation("s", "n1", 1, ("a0",), at=at()))
        with pytest.raises(Rejected, match="twice"):
            subnet(RecordAllocation("s", "n2", 1, ("a0",), at=at()))

    def test_answer_for_a_departed_node_refused(self) -> None:
        """IPs answered for a node that left must go back to the allocator."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet(LeaveNode("s", "n1", at=at()))
        with pytest.raises(Rejected, match="return the IPs"):
            subnet(RecordAllocation("s", "n1", 1, ("a0",), at=at()))


class TestRelease:
    def test_shrinking_demand_marks_free_ips(self) -> None:
        """When a pool's target falls, its latest free IPs become pending release."""
        subnet = Subnet()
        subnet(JoinNodes("s", nodes(32), at=at()))
        subnet.fulfil()
        subnet.use("n00", 40)
        subnet.fulfil()
        assert len(subnet.state.nodes["n00"].held) == 48
        events = subnet.use("n00", 2)
        [resized] = [e for e in of(PoolResized, events) if e.node == "n00"]
        assert isinstance(resized, PoolResized)
        held = subnet.state.nodes["n00"].held
        assert resized.requested == 16
        assert resized.pending_release == held[16:]
        assert not set(resized.pending_release) & set(held[:2])

    def test_release_returns_ips(self) -> None:
        """Released IPs leave the pool and the subnet's allocation."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        subnet.use("n1", 10)
        before = allocated(subnet.state)
        subnet(JoinNodes("s", nodes(7), at=at()))
        pending = pending_releases(subnet.state)["n1"]
        assert len(pending) == 250 - 64
        events = subnet(RecordRelease("s", "n1", pending, at=at()))
        assert of(IpsReleased, events) == [IpsReleased("s", "n1", pending, at())]
        assert allocated(subnet.state) == before - len(pending)

    def test_in_use_ip_not_released(self) -> None:
        """A node never releases an IP a pod holds."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        subnet.use("n1", 1)
        busy = subnet.state.nodes["n1"].in_use
        with pytest.raises(Rejected, match="in use"):
            subnet(RecordRelease("s", "n1", busy, at=at()))

    def test_release_again_is_a_no_op(self) -> None:
        """Releasing IPs already released changes nothing."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        subnet(JoinNodes("s", nodes(7), at=at()))
        pending = pending_releases(subnet.state)["n1"]
        subnet(RecordRelease("s", "n1", pending, at=at()))
        assert subnet(RecordRelease("s", "n1", pending, at=at())) == []


class TestLeave:
    def test_leaving_frees_every_ip(self) -> None:
        """A departed node's IPs return to the subnet."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1", "n2"), at=at()))
        subnet.fulfil()
        held = subnet.state.nodes["n1"].held
        events = subnet(LeaveNode("s", "n1", at=at()))
        assert events[0] == NodeLeft("s", "n1", held, at())
        assert "n1" not in subnet.state.nodes
        assert not set(held) & set(subnet.state.owners)

    def test_leave_again_is_a_no_op(self) -> None:
        """Leaving twice changes nothing."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet(LeaveNode("s", "n1", at=at()))
        assert subnet(LeaveNode("s", "n1", at=at())) == []


class TestExhaustion:
    def test_exhausted_above_upper_cleared_below_lower(self) -> None:
        """When the floor passes 90 % the batch is 1 with buffer 1; below 50 % it recovers."""
        subnet = Subnet(capacity=256)
        subnet(JoinNodes("s", nodes(8), at=at()))
        subnet.fulfil()
        events: list[SubnetEvent] = []
        for name in nodes(8):
            events += subnet.use(name, 29)
            events += subnet.fulfil()
        [flag] = of(ExhaustionChanged, events)
        assert isinstance(flag, ExhaustionChanged)
        assert (flag.exhausted, flag.floor) == (True, 8 * 30)
        assert subnet.state.batch_size == 1
        assert {n.requested for n in subnet.state.nodes.values()} == {30}
        events = []
        for name in nodes(8):
            events += subnet.use(name, 10)
        flags = of(ExhaustionChanged, events)
        assert [f.exhausted for f in flags] == [False]
        assert subnet.state.batch_size > 1

    def test_between_thresholds_the_flag_holds(self) -> None:
        """Falling from above 90 % to 70 % keeps the subnet exhausted."""
        subnet = Subnet(capacity=100)
        subnet(JoinNodes("s", ("n1",), at=at()))
        subnet.fulfil()
        subnet.use("n1", 95)
        subnet.fulfil()
        assert subnet.state.exhausted
        subnet.use("n1", 69)
        assert subnet.state.exhausted


class TestQueries:
    def test_to_data_is_json(self) -> None:
        """The dump is JSON-ready and shows pools per node."""
        subnet = Subnet()
        subnet(JoinNodes("s", ("n1",), at=at()))
        data = to_data(subnet.state)
        json.dumps(data)
        assert data["batch_size"] == 250
        assert data["nodes"]["n1"]["in_flight"] == {"1": 250}  # type: ignore[index]


class TestCodec:
    def test_every_event_round_trips(self) -> None:
        """Each subnet event is registered and survives encode/decode."""
        samples: list[SubnetEvent] = [
            SubnetCreated("s", 1024, 512, at()),
            NodeJoined("s", "n1", at()),
            NodeJoined("s", "n2", at(), max_ips=30),
            NodeLeft("s", "n1", ("a", "b"), at()),
            DemandReported("s", "n1", 3, ("a",), at()),
            ExhaustionChanged("s", True, 930, 1024, at()),
            BatchSizeChanged(
                "s", 8, 16, False, 1024, 28, 560, 588, 896, "rising", "demand n1", at()
            ),
            PoolResized("s", "n1", 24, ("c",), 8, 0.5, 20, at()),
            IpsRequested("s", "n1", 3, 16, at()),
            IpsAllocated("s", "n1", 3, ("a", "b"), at()),
            IpsReleased("s", "n1", ("c",), at()),
        ]
        names = set()
        for event in samples:
            name, version, data = codec.to_data(event)
            names.add(name)
            assert name.startswith("ipam.") and version == 1
            assert codec.from_data(name, version, json.loads(json.dumps(data))) == event
        assert len(names) == len(samples) - 1

    def test_node_joined_before_node_maxima_decodes(self) -> None:
        """A ``NodeJoined`` stored before nodes had their own maximum decodes with none."""
        name, version, data = codec.to_data(NodeJoined("s", "n1", at()))
        del data["max_ips"]
        assert codec.from_data(name, version, data) == NodeJoined("s", "n1", at())


# -- the aggregate settles -----------------------------------------------------------------------

reports = st.lists(
    st.tuples(st.integers(min_value=0, max_value=39), st.integers(min_value=0, max_value=60)),
    min_size=1,
    max_size=60,
)


class TestSettles:
    def test_issue_example_settles(self) -> None:
        """28 nodes using 20 IPs each on a /22 (where the formula cycles) settle on 8 and stay:
        once allocations and releases have landed, nothing more is decided."""
        subnet = Subnet()
        subnet(JoinNodes("s", nodes(28), at=at()))
        subnet.fulfil()
        for name in nodes(28):
            subnet.use(name, 20)
            subnet.fulfil()
        for name in nodes(28):  # pods that waited while the pools grew now hold their IPs
            subnet.use(name, 20)
        settled = len(subnet.events)
        assert subnet.fulfil() == []
        assert subnet.state.batch_size == 8
        assert allocated(subnet.state) == 28 * 24
        for name in nodes(28):
            assert subnet.use(name, 20) == []
        assert subnet.fulfil() == []
        assert of(BatchSizeChanged, subnet.events[settled:]) == []

    @settings(max_examples=60, deadline=None)
    @given(node_count=st.integers(min_value=1, max_value=40), reports=reports)
    def test_constant_demand_reaches_a_fixed_point(
        self, node_count: int, reports: list[tuple[int, int]]
    ) -> None:
        """Whatever the history, once demands stop changing and the allocator has answered,
        the subnet decides nothing more: no batch change, no flag flip, no request, no release
        — and it never holds or asks for more IPs than it has."""
        subnet = Subnet()
        names = nodes(node_count)
        subnet(JoinNodes("s", names, at=at()))
        for index, demand in reports:
            subnet.use(names[index % node_count], demand)
            in_flight = sum(count for _, _, count in outstanding_requests(subnet.state))
            assert allocated(subnet.state) + in_flight <= 1024
            subnet.fulfil()
        demands = {n: p.demand for n, p in subnet.state.nodes.items()}
        for name, demand in demands.items():
            subnet.use(name, demand)
        subnet.fulfil()
        quiet: list[SubnetEvent] = []
        for _ in range(3):
            for name, demand in demands.items():
                quiet += subnet.use(name, demand)
            quiet += subnet.fulfil()
        assert quiet == []
        if not subnet.state.exhausted:
            assert subnet.state.batch_size == ipam.subnet_batch_size(1024, list(demands.values()))
