"""The pod-IP runtime end to end: the subnet asks, the allocator answers, the log records."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest

from fleetledger.adapters.clock import ManualClock, SystemClock
from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime, SubnetService
from fleetledger.adapters.runtime import LEADER_TERM_KEY, Shard
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.domain import ipam
from fleetledger.eventstore import EventStore
from tests.counting_store import CountingStore

from .support import (
    EPOCH,
    SUBNET,
    allocator,
    answer_fences,
    assert_consistent,
    stepped,
    wait_until,
)

NODES = tuple(f"node-{i}" for i in range(4))


class NodeLeavesDuringCall(InMemoryAllocator):
    """The fake allocator, with the node deleted while its first call is in progress."""

    def __init__(self) -> None:
        super().__init__()
        self.service: SubnetService | None = None
        self.answered: tuple[str, ...] = ()

    def allocate(self, subnet_id: str, node: str, *, request: int, count: int) -> tuple[str, ...]:
        self.answered = super().allocate(subnet_id, node, request=request, count=count)
        assert self.service is not None
        self.service.leave(subnet_id, node)
        return self.answered


def with_demand(runtime: IpamRuntime, *, node: str = "node-0", ips: int = 20) -> None:
    """Create the subnet on ``runtime``, join the nodes, and have ``node`` ask for ``ips``."""
    runtime.service.create(SUBNET, 1024)
    runtime.service.join(SUBNET, NODES)
    runtime.service.report_demand(SUBNET, node, ips)


def types_in(store: EventStore, type_name: str) -> int:
    return sum(1 for r in store.read_all(limit=10_000) if r.type == type_name)


class TestAllocation:
    def test_requested_ips_are_allocated_and_recorded(self, store: EventStore) -> None:
        """Every IpsRequested ends with the allocator's IPs recorded for its node."""
        fake = allocator()
        runtime = stepped(store, fake)
        with_demand(runtime)

        runtime.step()

        state = runtime.service.load(SUBNET)
        assert ipam.outstanding_requests(state) == ()
        assert all(len(p.held) == p.requested > 0 for p in state.nodes.values())
        assert_consistent(state, fake)

    def test_a_falling_demand_releases_the_surplus(self, store: EventStore) -> None:
        """Pending releases are given back to the allocator and recorded as released."""
        fake = allocator()
        runtime = stepped(store, fake)
        with_demand(runtime, ips=100)
        runtime.step()
        grown = len(runtime.service.load(SUBNET).nodes["node-0"].held)

        runtime.service.report_demand(SUBNET, "node-0", 0)
        runtime.step()

        state = runtime.service.load(SUBNET)
        assert len(state.nodes["node-0"].held) < grown
        assert ipam.pending_releases(state) == {}
        assert all(len(p.held) == p.requested for p in state.nodes.values())
        assert types_in(store, "ipam.IpsReleased") >= 1
        assert_consistent(state, fake)

    def test_a_node_leaving_returns_its_ips_to_the_allocator(self, store: EventStore) -> None:
        """The gone node's IPs are free in the allocator as well as in the subnet."""
        fake = allocator()
        runtime = stepped(store, fake)
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES)
        runtime.step()

        runtime.service.leave(SUBNET, "node-1")
        runtime.step()

        assert "node-1" not in fake.held(SUBNET)
        assert_consistent(runtime.service.load(SUBNET), fake)

    def test_an_answer_for_a_node_that_left_goes_back(self, store: EventStore) -> None:
        """A node that leaves while the allocator call for it is in flight keeps no IP: the
        subnet refuses the answer and the runtime returns it to the allocator."""
        fake = NodeLeavesDuringCall()
        fake.add_subnet(SUBNET, 1024)
        runtime = stepped(store, fake)
        fake.service = runtime.service
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, ("node-0",))

        runtime.step()

        assert fake.answered and fake.held(SUBNET) == {}
        assert "node-0" not in runtime.service.load(SUBNET).nodes

    def test_the_runtime_runs_by_itself_with_threads(self, store: EventStore) -> None:
        """Started with threads, the reactor and its worker settle the subnet unaided."""
        fake = allocator()
        with IpamRuntime(store, fake, clock=SystemClock(), reactor_poll_seconds=0.1) as runtime:
            with_demand(runtime, node="node-2", ips=40)

            wait_until(
                store,
                lambda: not ipam.outstanding_requests(runtime.service.load(SUBNET)),
            )
            state = runtime.service.load(SUBNET)

        assert state.nodes["node-2"].requested == len(state.nodes["node-2"].held) >= 40
        assert_consistent(state, fake)

    def test_many_agents_at_once_with_the_allocator_running(self, store: EventStore) -> None:
        """Demand reports from many threads while the reactor runs: the subnet settles with
        every node's pool allocated and the allocator agreeing with the log."""
        fake = allocator()
        nodes = [f"node-{i}" for i in range(16)]
        with IpamRuntime(store, fake, clock=SystemClock(), reactor_poll_seconds=0.1) as runtime:
            runtime.service.create(SUBNET, 1024)
            runtime.service.join(SUBNET, nodes)
            start = threading.Barrier(len(nodes))

            def report(index: int) -> None:
                start.wait()
                runtime.service.report_demand(SUBNET, nodes[index], 3 * index)

            with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
                list(pool.map(report, range(len(nodes))))

            def settled() -> bool:
                state = runtime.service.load(SUBNET)
                return not ipam.outstanding_requests(state) and not ipam.pending_releases(state)

            wait_until(store, settled)
            state = runtime.service.load(SUBNET)

        assert {n: state.nodes[n].demand for n in nodes} == {n: 3 * i for i, n in enumerate(nodes)}
        assert all(len(p.held) == p.requested for p in state.nodes.values())
        assert_consistent(state, fake)


class TestShortAllocator:
    def test_a_short_allocator_is_not_asked_in_a_loop(self, store: EventStore) -> None:
        """An allocator with fewer free IPs than the subnet counts answers short once; the
        subnet's requests then wait instead of being asked again and again."""
        fake = allocator(capacity=10)  # the subnet believes it has 1024
        runtime = stepped(store, fake)
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES)

        runtime.step()

        state = runtime.service.load(SUBNET)
        assert fake.allocate_calls <= len(NODES)
        assert ipam.outstanding_requests(state)
        assert ipam.allocated(state) == 10
        assert_consistent(state, fake)

    def test_ips_given_back_let_the_waiting_requests_through(self, store: EventStore) -> None:
        """Once a node's IPs return to the allocator, the waiting requests are answered."""
        fake = allocator(capacity=40)
        runtime = stepped(store, fake)
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES)
        runtime.step()
        before = runtime.service.load(SUBNET)
        [holder] = [n for n, p in before.nodes.items() if p.held]

        runtime.service.leave(SUBNET, holder)
        runtime.step()

        state = runtime.service.load(SUBNET)
        assert ipam.allocated(before) == ipam.allocated(state) == 40
        assert holder not in fake.held(SUBNET) and fake.held(SUBNET)
        assert_consistent(state, fake)


class TestRestart:
    def test_requests_left_unanswered_are_made_after_a_restart(self, store: EventStore) -> None:
        """Requests recorded before a crash, no allocator call made: the next leader makes
        each call once."""
        fake = allocator()
        first = stepped(store, fake)
        first.service.create(SUBNET, 1024)
        first.service.join(SUBNET, NODES)
        asked = ipam.outstanding_requests(first.service.load(SUBNET))
        first.stop()  # before any step: the requests are in the log, no call was made

        second = stepped(store, fake)
        second.step()

        state = second.service.load(SUBNET)
        assert len(asked) == len(NODES)
        assert ipam.outstanding_requests(state) == ()
        assert fake.allocate_calls == len(asked)
        assert_consistent(state, fake)

    def test_a_restarted_runtime_reads_no_subnet_history_back(self, store: EventStore) -> None:
        """Its streams are hosted from the read model it folded at start-up: the first use of
        a subnet reads nothing back, and holds what a load of the stream holds."""
        fake = allocator()
        first = stepped(store, fake)
        with_demand(first)
        first.step()
        first.stop()
        reads = CountingStore(store)

        second = stepped(cast(EventStore, reads), fake)
        state = second.service.stream(SUBNET).state

        assert reads.stream_reads == 0
        assert state == SubnetService(store, clock=SystemClock()).load(SUBNET)
        second.service.report_demand(SUBNET, "node-1", 7)
        assert second.service.load(SUBNET).nodes["node-1"].demand == 7

    def test_an_answer_not_recorded_is_not_allocated_twice(self, store: EventStore) -> None:
        """The allocator answered before the crash but the answer never reached the log: the
        next leader records that same answer, and the allocator hands out nothing more."""
        fake = allocator()
        first = stepped(store, fake)
        first.service.create(SUBNET, 1024)
        first.service.join(SUBNET, NODES)
        node, request, count = ipam.outstanding_requests(first.service.load(SUBNET))[0]
        answered = fake.allocate(SUBNET, node, request=request, count=count)
        with contextlib.suppress(Exception):
            first.stop()

        second = stepped(store, fake)
        second.step()

        state = second.service.load(SUBNET)
        assert set(state.nodes[node].held) == set(answered)
        assert sum(len(ips) for ips in fake.held(SUBNET).values()) == ipam.allocated(state)
        assert_consistent(state, fake)

    def test_replaying_the_reactor_from_the_start_changes_nothing(self, store: EventStore) -> None:
        """A reactor that reacts again to everything (a lost checkpoint) makes no new call."""
        fake = allocator()
        runtime = stepped(store, fake)
        with_demand(runtime, ips=30)
        runtime.step()
        head, calls = store.head(), fake.allocate_calls + fake.release_calls

        replay = IpamRuntime(store, fake, threads=False, reactor_name="ipam-allocator-replay")
        replay.start().step()

        assert store.head() == head
        assert fake.allocate_calls + fake.release_calls == calls


class TestLeadership:
    def test_a_follower_makes_no_allocator_call(self, store: EventStore) -> None:
        """Without the lease the runtime accepts commands but leaves the allocator alone."""
        fake = allocator()
        board: dict[str, str] = {}
        Leadership(store, MemoryLease(board, holder="other"), clock=SystemClock()).step()
        follower = IpamRuntime(store, fake, threads=False, leadership=leadership(store, board))
        follower.start()
        follower.service.create(SUBNET, 1024)
        follower.service.join(SUBNET, NODES)

        follower.step()

        assert not follower.leading
        assert fake.allocate_calls == 0
        assert ipam.outstanding_requests(follower.service.load(SUBNET))

    def test_once_elected_it_settles_and_fences_what_it_records(self, store: EventStore) -> None:
        """Elected, the runtime makes the calls the log still asks for, and the answers it
        records carry its leader term."""
        fake = allocator()
        board: dict[str, str] = {}
        other = Leadership(store, MemoryLease(board, holder="other"), clock=SystemClock())
        other.step()
        mine = leadership(store, board)
        runtime = IpamRuntime(store, fake, threads=False, leadership=mine).start()
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES)

        other.stop()
        mine.step()
        runtime.step()

        allocated = [r for r in store.read_all(limit=10_000) if r.type == "ipam.IpsAllocated"]
        assert runtime.leading and mine.term() == 2
        assert len(allocated) == len(NODES)
        assert {r.metadata.get(LEADER_TERM_KEY) for r in allocated} == {2}
        assert_consistent(runtime.service.load(SUBNET), fake)


def leadership(store: EventStore, board: dict[str, str]) -> Leadership:
    return Leadership(store, MemoryLease(board, holder="me"), clock=SystemClock(), holder="me")


ZERO, ONE = Shard("ipam", 0, 2), Shard("ipam", 1, 2)
OWNED = {ZERO: SUBNET, ONE: "pods-b"}
"""A subnet of each partition (the partition of a name is pinned: see the shards' tests)."""


def shard_runtime(
    store: EventStore, fake: InMemoryAllocator, board: dict[str, str], holder: str, shard: Shard
) -> IpamRuntime:
    """A started runtime without threads leading ``shard`` once it wins the shard's lease on
    ``board`` (elected at start if the lease is free)."""
    clock = ManualClock(EPOCH)
    lease = MemoryLease(board, holder=holder, name=shard.name)
    leading = Leadership(store, lease, clock=clock, holder=holder, shard=shard)
    return IpamRuntime(
        store, fake, clock=clock, threads=False, leadership=leading, shard=shard
    ).start()


class TestShards:
    def _subnets(
        self, runtime: IpamRuntime, fake: InMemoryAllocator, nodes: tuple[str, ...]
    ) -> None:
        """Each partition's subnet, with the allocator and ``nodes`` joined to it."""
        for subnet in OWNED.values():
            fake.add_subnet(subnet, 1024)
            runtime.service.create(subnet, 1024)
            runtime.service.join(subnet, nodes)

    def test_each_shard_leader_settles_only_its_own_subnets(self, store: EventStore) -> None:
        """Two runtimes on one log lead ipam/0-of-2 and ipam/1-of-2 at once: each makes the
        allocator calls of its partition's subnet only, and records them under its shard's
        term 1."""
        assert all(shard.owns(subnet) for shard, subnet in OWNED.items())
        board: dict[str, str] = {}
        fake = InMemoryAllocator()
        first = shard_runtime(store, fake, board, "a", ZERO)
        second = shard_runtime(store, fake, board, "b", ONE)
        self._subnets(first, fake, NODES)

        first.step()

        assert len(answer_fences(store, OWNED[ZERO])) == len(NODES)
        assert answer_fences(store, OWNED[ONE]) == []
        second.step()
        for shard, subnet in OWNED.items():
            assert set(answer_fences(store, subnet)) == {(1, shard.name)}
            state = second.service.load(subnet)
            assert ipam.outstanding_requests(state) == ()
            assert_consistent(state, fake)

    def test_a_moved_shards_old_leader_is_fenced_and_the_other_shard_goes_on(
        self, store: EventStore
    ) -> None:
        """ipam/0-of-2 passes to a third runtime (its term 2). The old leader's next recording
        is refused and it stops leading; the new one makes the call, and ipam/1-of-2's leader
        goes on at its term 1."""
        board: dict[str, str] = {}
        fake = InMemoryAllocator()
        old = shard_runtime(store, fake, board, "a", ZERO)
        other = shard_runtime(store, fake, board, "b", ONE)
        self._subnets(old, fake, NODES[:1])
        old.step()
        other.step()
        del board[ZERO.name]  # the old holder stalled past its lease
        new = shard_runtime(store, fake, board, "c", ZERO)
        assert new.leading and new.leadership is not None and new.leadership.term() == 2
        for subnet in OWNED.values():
            new.service.join(subnet, NODES[1:2])

        old.step()
        assert not old.leading
        assert len(answer_fences(store, OWNED[ZERO])) == 1
        new.step()
        other.step()

        assert answer_fences(store, OWNED[ZERO]) == [(1, ZERO.name), (2, ZERO.name)]
        assert answer_fences(store, OWNED[ONE]) == [(1, ONE.name), (1, ONE.name)]
        assert (store.leader_term(ZERO.name), store.leader_term(ONE.name)) == (2, 1)
        for subnet in OWNED.values():
            assert_consistent(new.service.load(subnet), fake)

    def test_a_runtime_and_its_leadership_lead_the_same_shard(self, store: EventStore) -> None:
        """A shard without its leadership, a leadership of another shard, or a shard of
        another capability is refused at construction, saying what to give."""

        def leading(shard: str | None) -> Leadership:
            return Leadership(store, MemoryLease({}, holder="a"), clock=SystemClock(), shard=shard)

        for leadership_, shard, problem in (
            (leading(None), ZERO, "leads every subnet"),
            (leading("ipam/1-of-2"), ZERO, "leads shard 'ipam/1-of-2'"),
            (leading("ipam/0-of-2"), None, "no shard"),
            (None, Shard("nodes", 0, 2), "IpamRuntime leads a shard of the subnets"),
        ):
            with pytest.raises(ValueError, match=problem):
                IpamRuntime(store, allocator(), threads=False, leadership=leadership_, shard=shard)
