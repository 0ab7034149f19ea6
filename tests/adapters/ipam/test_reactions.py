"""Settling a subnet: a pass's allocator answers and releases recorded in few commits, each on
its own (its causation id, its refusal), as recording them one by one did."""

from __future__ import annotations

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import (
    AllocatorUnavailable,
    CommandRejected,
    InMemoryAllocator,
    IpamRuntime,
    SubnetService,
)
from fleetledger.domain import ipam
from fleetledger.eventstore import EventStore
from tests.counting_store import CountingStore

from .support import EPOCH, SUBNET, allocator, assert_consistent

NODES = tuple(f"node-{i:03d}" for i in range(120))


def runtime_on(store: object, fake: InMemoryAllocator) -> IpamRuntime:
    return IpamRuntime(store, fake, clock=ManualClock(EPOCH), threads=False).start()  # type: ignore[arg-type]


class LeavesOnCall(InMemoryAllocator):
    """The fake allocator, with one node deleted while its call is in progress."""

    def __init__(self, leaving: str) -> None:
        super().__init__()
        self.leaving = leaving
        self.service: SubnetService | None = None

    def allocate(self, subnet_id: str, node: str, *, request: int, count: int) -> tuple[str, ...]:
        answered = super().allocate(subnet_id, node, request=request, count=count)
        if node == self.leaving and self.service is not None:
            self.service.leave(subnet_id, node)
        return answered


class FailsAfter(InMemoryAllocator):
    """The fake allocator, unreachable from its ``calls``-th allocation on, until healed."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.left = calls

    def allocate(self, subnet_id: str, node: str, *, request: int, count: int) -> tuple[str, ...]:
        if self.left <= 0:
            raise AllocatorUnavailable("the allocator is down")
        self.left -= 1
        return super().allocate(subnet_id, node, request=request, count=count)


class TestSettle:
    def test_a_pass_over_many_nodes_commits_in_few_transactions(self, store: EventStore) -> None:
        """120 nodes' answers, then their releases, are recorded in a few commits (not one per
        node), each with its own causation id; the subnet and the allocator agree."""
        counting = CountingStore(store)
        fake = allocator(capacity=8192)
        runtime = runtime_on(counting, fake)
        runtime.service.create(SUBNET, 8192)
        runtime.service.join(SUBNET, NODES)
        for node in NODES:
            runtime.service.report_demand(SUBNET, node, 20)
        asked = ipam.outstanding_requests(runtime.service.load(SUBNET))
        before = counting.commits

        calls = runtime.reactions.settle(SUBNET)

        assert calls == len(asked) >= len(NODES)
        assert counting.commits - before <= 2
        state = runtime.service.load(SUBNET)
        assert ipam.outstanding_requests(state) == ()
        assert_consistent(state, fake)
        causes = {
            str(r.metadata.get("causation_id"))
            for r in store.read_all(after=0, limit=100_000)
            if r.type.startswith("ipam.IpsAllocated")
        }
        assert {f"allocate:{n}" for n in NODES} <= {c.rsplit(":", 1)[0] for c in causes}

        for node in NODES:
            runtime.service.report_demand(SUBNET, node, 0)
        before = counting.commits
        runtime.reactions.settle(SUBNET)

        assert counting.commits - before <= 3  # the releases, then the requests they allow
        runtime.step()  # what the releases decided in turn
        state = runtime.service.load(SUBNET)
        assert ipam.pending_releases(state) == {}
        assert_consistent(state, fake)

    def test_a_settled_subnet_commits_nothing(self, store: EventStore) -> None:
        """Settling again, with nothing outstanding, calls nobody and appends nothing."""
        counting = CountingStore(store)
        fake = allocator(capacity=8192)
        runtime = runtime_on(counting, fake)
        runtime.service.create(SUBNET, 8192)
        runtime.service.join(SUBNET, NODES)
        runtime.step()
        head, before = store.head(), counting.commits

        assert runtime.reactions.settle(SUBNET) == 0
        assert (store.head(), counting.commits) == (head, before)

    def test_a_refused_answer_leaves_the_others_recorded(self, store: EventStore) -> None:
        """A node leaves while its call is in flight: its answer is refused and its IPs go back
        to the allocator; every other node's answer of the same pass is recorded."""
        fake = LeavesOnCall(NODES[5])
        fake.add_subnet(SUBNET, 8192)
        runtime = runtime_on(store, fake)
        fake.service = runtime.service
        runtime.service.create(SUBNET, 8192)
        runtime.service.join(SUBNET, NODES[:10])

        runtime.reactions.settle(SUBNET)

        state = runtime.service.load(SUBNET)
        assert NODES[5] not in state.nodes
        assert all(len(p.held) == p.requested > 0 for p in state.nodes.values())
        assert NODES[5] not in fake.held(SUBNET)
        assert_consistent(state, fake)

    def test_answers_before_an_allocator_failure_are_recorded(self, store: EventStore) -> None:
        """The allocator fails mid-pass: the answers it gave are recorded all the same, and the
        next settle makes the remaining calls (each answered once)."""
        fake = FailsAfter(3)
        fake.add_subnet(SUBNET, 8192)
        runtime = runtime_on(store, fake)
        runtime.service.create(SUBNET, 8192)
        runtime.service.join(SUBNET, NODES[:8])

        with pytest.raises(AllocatorUnavailable):
            runtime.reactions.settle(SUBNET)

        state = runtime.service.load(SUBNET)
        assert len(ipam.outstanding_requests(state)) == 5
        assert_consistent(state, fake)
        fake.left = 100
        runtime.reactions.settle(SUBNET)
        state = runtime.service.load(SUBNET)
        assert ipam.outstanding_requests(state) == ()
        assert_consistent(state, fake)


class TestPluralCalls:
    def test_demands_of_many_subnets_commit_together(self, store: EventStore) -> None:
        """Reports for nodes of several subnets: one commit, each report its own outcome — a
        refused one (IPs the node does not hold) refused alone."""
        counting = CountingStore(store)
        subnets = [f"pods-{n}" for n in range(4)]
        fake = InMemoryAllocator()
        runtime = runtime_on(counting, fake)
        for subnet in subnets:
            fake.add_subnet(subnet, 1024)
            runtime.service.create(subnet, 1024)
            runtime.service.join(subnet, NODES[:10])
        reports: list[tuple[str, str, int, tuple[str, ...]]] = [
            (s, n, 3, ()) for s in subnets for n in NODES[:10]
        ]
        reports[7] = (subnets[0], NODES[7], 3, ("10.9.9.9",))
        before = counting.commits

        outcomes = runtime.service.report_demands(reports)

        assert counting.commits - before == 1
        assert isinstance(outcomes[7], CommandRejected)
        assert sum(isinstance(o, CommandRejected) for o in outcomes) == 1
        for subnet, node, demand, _ in reports[:7] + reports[8:]:
            assert runtime.service.load(subnet).nodes[node].demand == demand
        assert runtime.service.load(subnets[0]).nodes[NODES[7]].demand == 0

    def test_each_outcome_is_the_singular_calls(self, store: EventStore) -> None:
        """Unknown subnet and malformed commands come back as the singular call raises them."""
        runtime = runtime_on(store, allocator())
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES[:2])

        outcomes = runtime.service.report_demands(
            [("nowhere", NODES[0], 1, ()), (SUBNET, NODES[0], -1, ()), (SUBNET, NODES[1], 2, ())]
        )

        kinds = [type(o).__name__ for o in outcomes]
        assert kinds == ["UnknownSubnet", "InvalidIpamCommand", "Decision"]
