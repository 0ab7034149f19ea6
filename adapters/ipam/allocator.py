"""The IP allocator port: hands a node pod IPs from its subnet and takes them back.

In Azure this is the delegated IPAM behind a node's NodeNetworkConfig; the runtime needs only two
calls, and :class:`InMemoryAllocator` is the fake that runs the tests and the simulator.

Both calls must be idempotent, because the runtime makes them at least once (a restart between a
call and the recording of its answer makes it again):

- ``allocate`` is keyed by ``(subnet, node, request)``: asked again, it answers the IPs it gave
  the first time, never new ones — otherwise a restart would hand a node twice its IPs;
- ``release`` of an IP the node no longer holds changes nothing.
"""

from __future__ import annotations

import heapq
import ipaddress
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from .errors import AllocatorUnavailable

__all__ = ["InMemoryAllocator", "IpAllocator"]


class IpAllocator(Protocol):
    """Allocates pod IPs of a subnet to its nodes."""

    def allocate(self, subnet_id: str, node: str, *, request: int, count: int) -> tuple[str, ...]:
        """Up to ``count`` free IPs of ``subnet_id`` for ``node`` (fewer when the subnet has
        fewer free). The same ``(subnet_id, node, request)`` always gets the same answer.

        Raises :class:`~fleetledger.adapters.ipam.errors.AllocatorUnavailable`.
        """
        ...

    def release(self, subnet_id: str, node: str, ips: Collection[str]) -> None:
        """Return ``ips`` of ``node`` to the subnet; IPs the node does not hold are ignored.

        Raises :class:`~fleetledger.adapters.ipam.errors.AllocatorUnavailable`.
        """
        ...


@dataclass(slots=True)
class _Subnet:
    addresses: tuple[str, ...]
    owners: dict[str, str] = field(default_factory=dict)
    answers: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    index: dict[str, int] = field(default_factory=dict)
    """Each address's place in ``addresses``."""
    free: list[int] = field(default_factory=list)
    """The places of the free addresses, a heap: the lowest free comes first without scanning
    the taken ones (a subnet of thousands of nodes holds tens of thousands)."""

    def __post_init__(self) -> None:
        self.index = {ip: place for place, ip in enumerate(self.addresses)}
        self.free = list(range(len(self.addresses)))


class InMemoryAllocator:
    """A fake allocator: consecutive IPv4 addresses per subnet, lowest free first; thread-safe.

    It counts its calls (``allocate_calls``, ``release_calls``) for tests and the simulator.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subnets: dict[str, _Subnet] = {}
        self.allocate_calls = 0
        self.release_calls = 0

    def add_subnet(self, subnet_id: str, capacity: int, *, first: str = "10.0.0.0") -> None:
        """Make ``capacity`` addresses from ``first`` on allocatable in ``subnet_id``."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        start = ipaddress.IPv4Address(first)
        with self._lock:
            if subnet_id in self._subnets:
                raise ValueError(f"subnet {subnet_id!r} was already added")
            self._subnets[subnet_id] = _Subnet(
                tuple(str(start + offset) for offset in range(capacity))
            )

    def allocate(self, subnet_id: str, node: str, *, request: int, count: int) -> tuple[str, ...]:
        with self._lock:
            self.allocate_calls += 1
            subnet = self._subnet(subnet_id)
            answered = subnet.answers.get((node, request))
            if answered is not None:
                return answered
            free, addresses = subnet.free, subnet.addresses
            granted = tuple(
                addresses[heapq.heappop(free)] for _ in range(min(max(count, 0), len(free)))
            )
            for ip in granted:
                subnet.owners[ip] = node
            subnet.answers[(node, request)] = granted
            return granted

    def release(self, subnet_id: str, node: str, ips: Collection[str]) -> None:
        with self._lock:
            self.release_calls += 1
            subnet = self._subnet(subnet_id)
            for ip in ips:
                if subnet.owners.get(ip) == node:
                    del subnet.owners[ip]
                    heapq.heappush(subnet.free, subnet.index[ip])

    def held(self, subnet_id: str) -> dict[str, tuple[str, ...]]:
        """The IPs each node of ``subnet_id`` holds, by node."""
        with self._lock:
            subnet = self._subnet(subnet_id)
            by_node: dict[str, list[str]] = {}
            for ip in subnet.addresses:
                owner = subnet.owners.get(ip)
                if owner is not None:
                    by_node.setdefault(owner, []).append(ip)
            return {node: tuple(ips) for node, ips in sorted(by_node.items())}

    def _subnet(self, subnet_id: str) -> _Subnet:
        subnet = self._subnets.get(subnet_id)
        if subnet is None:
            raise AllocatorUnavailable(
                f"the allocator does not know subnet {subnet_id!r}; add it (add_subnet) first"
            )
        return subnet
