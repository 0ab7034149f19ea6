"""Nodes, pools and services for the placement runtime's tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.machines import MachineRequest
from fleetledger.adapters.nodes import DEFAULT_NODE_CONFIG, NodeService
from fleetledger.domain.nodes import JoinNode
from fleetledger.domain.placement import Pool, WorkloadRequest
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore

GIB = 1 << 30
T0 = datetime(2025, 1, 1, tzinfo=UTC)
CPU_POOL = Pool(
    name="cpu",
    template=MachineTemplate(vm_size="Standard_D4s_v5"),
    worker_cpu_milli=4000,
    worker_memory_bytes=16 * GIB,
)


class FakeMachines:
    """Records the machine requests overflow sends (the Grouper's port)."""

    def __init__(self) -> None:
        self.requests: list[MachineRequest] = []
        self.failed: set[str] = set()  # machine names whose creation the test fails

    def request(self, requests: Sequence[MachineRequest]) -> object:
        self.requests.extend(requests)
        return None

    def status(self, request_id: str) -> tuple[str, str] | None:
        asked = next((r for r in self.requests if r.request_id == request_id), None)
        if asked is None:
            return None
        return ("failed" if asked.machine_name in self.failed else "sealed"), "batch-1"


def node_service(store: EventStore, clock: ManualClock | None = None) -> NodeService:
    return NodeService(store, clock=clock or ManualClock(T0))


def join(service: NodeService, name: str, *, cpu: int = 4000, memory: int = 16 * GIB) -> None:
    service.execute(
        name,
        lambda at: [JoinNode(name, cpu, memory, 0, DEFAULT_NODE_CONFIG, at=at)],
        cause="test",
    )


def workload(rid: str, cpu: int = 1000, memory: int = GIB, **kw: object) -> WorkloadRequest:
    return WorkloadRequest(id=rid, cpu_milli=cpu, memory_bytes=memory, **kw)  # type: ignore[arg-type]
