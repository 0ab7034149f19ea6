"""A node's events as the domain decides them, for tests that check invariants over a log."""

from __future__ import annotations

from datetime import UTC, datetime

from fleetledger.domain import nodes
from fleetledger.domain.nodes import (
    AgentResourcesRequest,
    Bounds,
    ComputeUnit,
    JoinNode,
    NodeConfig,
    NodeEvent,
    ReservePod,
    VmPodSpec,
)

__all__ = ["AT", "CONFIG", "node_with_a_pod"]

AT = datetime(2025, 1, 1, tzinfo=UTC)

CONFIG = NodeConfig(
    cpu_system_milli=1000,
    memory_system_slots=2,
    cpu_watermark=0.9,
    memory_watermark=0.9,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=1 << 30,
)


def node_with_a_pod() -> list[NodeEvent]:
    """A node of 4 CPUs (3 reservable) with a VM pod of up to 4 CPUs, decided by the domain."""
    state = nodes.initial_state()
    events: list[NodeEvent] = []
    for command in (
        JoinNode("n", 4000, 16 << 30, 0, CONFIG, at=AT),
        ReservePod(
            VmPodSpec(name="vm", cpu=Bounds(250, 250, 4000), memory=Bounds(1, 1, 4)),
            at=AT,
            already_running=True,
        ),
        AgentResourcesRequest("vm", 2000, 2, at=AT),
    ):
        decided = nodes.decide(state, command)
        for event in decided:
            state = nodes.evolve(state, event)
        events.extend(decided)
    return events
