"""The pod-IP capability on the decider host (docs/ARCHITECTURE.md, "Pod-IP batch sizing").

Modules, one job each: :mod:`~fleetledger.adapters.ipam.aggregate` (the Subnet aggregate, its
codec and stream names), :mod:`~fleetledger.adapters.ipam.service` (decide and append subnet
commands), :mod:`~fleetledger.adapters.ipam.allocator` (the allocator port and its in-memory
fake), :mod:`~fleetledger.adapters.ipam.reactions` (allocator calls made from the log, their
answers recorded), :mod:`~fleetledger.adapters.ipam.runtime` (the wiring),
:mod:`~fleetledger.adapters.ipam.errors`.
"""

from __future__ import annotations

from .aggregate import (
    SUBNET_CODEC,
    SUBNET_EVENT_TYPE_NAMES,
    subnet_aggregate,
    subnet_id_of,
    subnet_stream_id,
)
from .allocator import InMemoryAllocator, IpAllocator
from .errors import (
    AllocatorUnavailable,
    CommandRejected,
    InvalidIpamCommand,
    IpamError,
    LogContention,
    LogUnavailable,
    NotLeader,
    UnknownSubnet,
)
from .reactions import SubnetReactions
from .runtime import IpamRuntime, QueuedRunner
from .service import SubnetService, SubnetStream

__all__ = [
    "SUBNET_CODEC",
    "SUBNET_EVENT_TYPE_NAMES",
    "AllocatorUnavailable",
    "CommandRejected",
    "InMemoryAllocator",
    "InvalidIpamCommand",
    "IpAllocator",
    "IpamError",
    "IpamRuntime",
    "LogContention",
    "LogUnavailable",
    "NotLeader",
    "QueuedRunner",
    "SubnetReactions",
    "SubnetService",
    "SubnetStream",
    "UnknownSubnet",
    "subnet_aggregate",
    "subnet_id_of",
    "subnet_stream_id",
]
