"""Helpers shared by the pod-IP runtime tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
from fleetledger.adapters.runtime import LEADER_SHARD_KEY, LEADER_TERM_KEY
from fleetledger.domain import ipam
from fleetledger.eventstore import EventStore

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
SUBNET = "pods-a"


def allocator(capacity: int = 1024, subnet: str = SUBNET) -> InMemoryAllocator:
    fake = InMemoryAllocator()
    fake.add_subnet(subnet, capacity)
    return fake


def stepped(store: EventStore, fake: InMemoryAllocator) -> IpamRuntime:
    """A started runtime without threads, on a manual clock."""
    return IpamRuntime(store, fake, clock=ManualClock(EPOCH), threads=False).start()


def assert_consistent(state: ipam.SubnetState, fake: InMemoryAllocator) -> None:
    """The subnet's record of who holds which IP is the allocator's, IP for IP."""
    recorded = {node: set(pool.held) for node, pool in state.nodes.items() if pool.held}
    held = {node: set(ips) for node, ips in fake.held(state.subnet_id or "").items()}
    assert held == recorded


def wait_until(store: EventStore, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait, woken by every append, until ``condition()`` holds (fail after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        assert left > 0, "the condition did not hold in time"
        store.wait_for_wake(store.wake_sequence(), timeout=min(left, 0.5))


def answer_fences(store: EventStore, subnet: str) -> list[tuple[object, object]]:
    """The (leader_term, leader_shard) of each allocator answer recorded for ``subnet``."""
    return [
        (r.metadata.get(LEADER_TERM_KEY), r.metadata.get(LEADER_SHARD_KEY))
        for r in store.read_stream(f"subnet-{subnet}")
        if r.type == "ipam.IpsAllocated"
    ]
