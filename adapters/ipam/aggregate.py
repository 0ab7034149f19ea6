"""The Subnet aggregate as the decider host runs it: one stream per subnet, ``subnet-<id>``."""

from __future__ import annotations

import functools

from fleetledger.adapters.runtime import Aggregate, EventCodec, events_of
from fleetledger.domain import ipam
from fleetledger.domain.codec import registered_event_types
from fleetledger.domain.ipam import IpamConfig, SubnetCommand, SubnetEvent, SubnetState

__all__ = [
    "SUBNET_CODEC",
    "SUBNET_CREATED_TYPES",
    "SUBNET_EVENT_TYPE_NAMES",
    "SUBNET_EVENT_TYPES",
    "SUBNET_STREAM_PREFIX",
    "subnet_aggregate",
    "subnet_id_of",
    "subnet_stream_id",
]

SUBNET_STREAM_PREFIX = "subnet-"

SUBNET_EVENT_TYPES: tuple[type, ...] = events_of(SubnetEvent)

# An event is about its node when it has one, else about the subnet.
SUBNET_CODEC: EventCodec[SubnetEvent] = EventCodec(
    "subnet", SUBNET_EVENT_TYPES, correlation_fields=("node", "subnet_id")
)

SUBNET_EVENT_TYPE_NAMES: tuple[str, ...] = tuple(SUBNET_CODEC.type_names())
"""The stored names of every subnet event (for filtered reads)."""

SUBNET_CREATED_TYPES: tuple[str, ...] = tuple(
    sorted(n for n, t in registered_event_types().items() if t.cls is ipam.SubnetCreated)
)
"""The stored name of the event that opens a subnet's stream."""


def subnet_stream_id(subnet_id: str) -> str:
    """The stream of one subnet."""
    return f"{SUBNET_STREAM_PREFIX}{subnet_id}"


def subnet_id_of(stream_id: str) -> str | None:
    """The subnet a stream belongs to, or ``None`` for another aggregate's stream."""
    if not stream_id.startswith(SUBNET_STREAM_PREFIX):
        return None
    return stream_id[len(SUBNET_STREAM_PREFIX) :] or None


def subnet_aggregate(
    config: IpamConfig | None = None,
) -> Aggregate[SubnetState, SubnetCommand, SubnetEvent]:
    """The Subnet under ``config`` (the domain's defaults when ``None``); no deadlines."""
    return Aggregate(
        name="subnet",
        initial_state=ipam.initial_state,
        evolve=ipam.evolve,
        decide=functools.partial(ipam.decide, config=config or IpamConfig()),
        codec=SUBNET_CODEC,
        stream_of=subnet_stream_id,
    )
