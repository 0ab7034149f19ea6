"""The subnet service: commands decided on their subnet's stream, refusals in this package's
terms, many callers at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import (
    CommandRejected,
    InvalidIpamCommand,
    NotLeader,
    SubnetService,
    UnknownSubnet,
    subnet_stream_id,
)
from fleetledger.adapters.runtime import Writer
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.domain import ipam
from fleetledger.domain.errors import InvalidCommand
from fleetledger.eventstore import EventStore

from .support import EPOCH, SUBNET


def service(store: EventStore) -> SubnetService:
    return SubnetService(store, clock=ManualClock(EPOCH))


class TestCommands:
    def test_a_subnet_is_one_stream(self, store: EventStore) -> None:
        """Creating, joining and reporting land in ``subnet-<id>`` and fold into its state."""
        subnets = service(store)
        subnets.create(SUBNET, 1024)
        subnets.join(SUBNET, ["n-1", "n-2"])
        subnets.report_demand(SUBNET, "n-1", 9)

        state = subnets.load(SUBNET)

        assert state.capacity == 1024 and set(state.nodes) == {"n-1", "n-2"}
        assert state.nodes["n-1"].demand == 9
        assert {r.stream_id for r in store.read_all()} == {subnet_stream_id(SUBNET)}

    def test_subnets_are_listed_from_the_log(self, store: EventStore) -> None:
        """Every created subnet, whichever process created it."""
        service(store).create("b", 256)
        service(store).create("a", 512)

        assert service(store).subnet_ids() == ("a", "b")

    def test_a_refusal_on_a_stale_fold_is_decided_again(self, store: EventStore) -> None:
        """A node joined by another process is known once the stream is caught up."""
        mine, theirs = service(store), service(store)
        mine.create(SUBNET, 1024)
        mine.load(SUBNET)
        theirs.join(SUBNET, ["n-1"])

        mine.report_demand(SUBNET, "n-1", 3)

        assert mine.load(SUBNET).nodes["n-1"].demand == 3


class TestNodeMaxima:
    def test_a_node_joins_with_its_own_maximum(self, store: EventStore) -> None:
        """A node's max pods reach its stream: its batch and pool are clamped to it, the log
        records it, and a fresh process folds the same maximum back."""
        subnets = service(store)
        subnets.create(SUBNET, 65536)
        subnets.join(SUBNET, ["big", "small"], max_ips={"small": 30})

        state = service(store).load(SUBNET)

        assert (state.nodes["small"].max_ips, state.nodes["small"].requested) == (30, 30)
        assert (state.nodes["big"].max_ips, state.nodes["big"].requested) == (None, 250)
        assert state.batch_size == 250

    def test_configuration_reaches_the_decisions(self, store: EventStore) -> None:
        """The service decides under its configuration: the subnet safety factor and the
        maximum are used, and a bad value is refused before anything runs."""
        subnets = SubnetService(
            store, clock=ManualClock(EPOCH), config=ipam.IpamConfig(x_ssf=0.5, max_ips=100)
        )
        subnets.create(SUBNET, 1024)
        subnets.join(SUBNET, [f"n-{i}" for i in range(32)])
        assert subnets.load(SUBNET).batch_size == 8
        with pytest.raises(InvalidCommand, match="max_ips"):
            ipam.IpamConfig(max_ips=300)

    def test_a_bad_maximum_is_invalid_and_appends_nothing(self, store: EventStore) -> None:
        """A maximum above 250 refuses the join, naming the node and the range."""
        subnets = service(store)
        subnets.create(SUBNET, 1024)
        head = store.head()

        with pytest.raises(InvalidIpamCommand, match=r"max_ips of node n-1 .*between 1 and 250"):
            subnets.join(SUBNET, ["n-1"], max_ips={"n-1": 300})
        assert store.head() == head


class TestRefusals:
    def test_an_unknown_subnet(self, store: EventStore) -> None:
        """Commands to a subnet never created say so, and append nothing."""
        with pytest.raises(UnknownSubnet, match="create it first"):
            service(store).join("nowhere", ["n-1"])
        with pytest.raises(UnknownSubnet):
            service(store).load("nowhere")
        assert store.head() == 0

    def test_a_rejected_command_keeps_the_domains_reason(self, store: EventStore) -> None:
        """An unknown node is refused with what to do about it."""
        subnets = service(store)
        subnets.create(SUBNET, 1024)

        with pytest.raises(CommandRejected, match="join it before"):
            subnets.report_demand(SUBNET, "stranger", 1)

    def test_a_malformed_command_is_invalid(self, store: EventStore) -> None:
        """A negative demand is a ValueError of this package, nothing appended."""
        subnets = service(store)
        subnets.create(SUBNET, 1024)
        subnets.join(SUBNET, ["n-1"])
        head = store.head()

        with pytest.raises(InvalidIpamCommand, match="demand"):
            subnets.report_demand(SUBNET, "n-1", -1)
        with pytest.raises(InvalidIpamCommand):
            subnets.create("", 1024)
        assert store.head() == head


class TestConcurrency:
    def test_many_agents_reporting_at_once_all_land(self, store: EventStore) -> None:
        """Demand reports from many threads: each one decided on the state the others left,
        none lost, the stream's versions without gaps."""
        nodes = [f"n-{i}" for i in range(24)]
        subnets = service(store)
        subnets.create(SUBNET, 4096)
        subnets.join(SUBNET, nodes)
        start = threading.Barrier(len(nodes))

        def report(index: int) -> int | None:
            start.wait()
            return subnets.report_demand(SUBNET, nodes[index], index + 1).last_position

        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            positions = list(pool.map(report, range(len(nodes))))

        stream = store.read_stream(subnet_stream_id(SUBNET))
        state = service(store).load(SUBNET)
        assert all(p is not None for p in positions)
        assert [r.stream_version for r in stream] == list(range(1, len(stream) + 1))
        assert {n: state.nodes[n].demand for n in nodes} == {n: i + 1 for i, n in enumerate(nodes)}
        assert state == subnets.load(SUBNET)
        assert sum(c for _, _, c in ipam.outstanding_requests(state)) <= state.capacity


class TestFencing:
    def test_a_deposed_leader_cannot_record_an_answer(self, store: EventStore) -> None:
        """Recording an allocator answer is a leader duty: once a newer term is elected, the
        old leader's record is refused as NotLeader and nothing lands."""
        board: dict[str, str] = {}
        clock = ManualClock(EPOCH)
        mine = Leadership(store, MemoryLease(board, holder="me"), clock=clock, holder="me")
        mine.step()
        subnets = SubnetService(store, clock=clock, writer=Writer(fencing=mine))
        subnets.create(SUBNET, 1024)
        subnets.join(SUBNET, ["n-1"])
        [(node, request, _)] = ipam.outstanding_requests(subnets.load(SUBNET))
        board.clear()  # my lease lapses unnoticed; another process is elected
        Leadership(store, MemoryLease(board, holder="them"), clock=clock, holder="them").step()
        head = store.head()

        with pytest.raises(NotLeader, match="newer leader"):
            subnets.record_allocation(SUBNET, node, request, ("10.0.0.1",), causation_id="t")

        assert store.head() == head
