"""Builders for the node-runtime tests: a fake cluster of nodes and VM pods, a manual runtime."""

from __future__ import annotations

from datetime import UTC, datetime

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.nodes import FakeMigrations, NodesRuntime, vm_annotations
from fleetledger.domain.nodes import Bounds, ComputeUnit, NodeConfig
from fleetledger.eventstore import EventStore

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
GIB_MIB = 1024
CONFIG = NodeConfig(
    cpu_system_milli=0,
    memory_system_slots=0,
    cpu_watermark=0.9,
    memory_watermark=0.9,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=1 << 30,
)


def node(name: str, *, cpus: int = 10, memory_gib: int = 10) -> Node:
    return Node(name, cpu_millis=cpus * 1000, memory_mib=memory_gib * GIB_MIB)


def vm_pod(
    name: str,
    on: str,
    *,
    cpu: tuple[int, int, int] = (1000, 2000, 4000),
    memory: tuple[int, int, int] = (1, 2, 4),
    scaling: bool = True,
    migration: bool = True,
) -> PodSpec:
    """A VM pod bound to ``on`` with its VM's bounds (milli-CPU, memory slots) and settings."""
    annotations = vm_annotations(
        Bounds(*cpu), Bounds(*memory), scaling=scaling, migration=migration
    )
    return PodSpec(name, node=on, annotations=annotations)


def cluster(*nodes: Node, pods: tuple[PodSpec, ...] = ()) -> FakeCluster:
    found = FakeCluster(nodes)
    for pod in pods:
        found.create_pod(pod)
    return found


def manual_runtime(
    store: EventStore,
    fleet: FakeCluster,
    *,
    clock: ManualClock | None = None,
    migrations: FakeMigrations | None = None,
    snapshot_every: int = 1000,
) -> NodesRuntime:
    """A runtime without threads on ``fleet``, started (it took the nodes over and synced)."""
    return NodesRuntime(
        store,
        fleet,
        clock=clock or ManualClock(EPOCH),
        config=CONFIG,
        migrations=migrations,
        threads=False,
        snapshot_every=snapshot_every,
    ).start()
