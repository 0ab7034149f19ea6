"""The vocabulary of batch workload placement: requests, pools, the capacity snapshot, the plan.

Amounts follow node accounting (:mod:`fleetledger.domain.nodes`): CPU in milli-CPU, memory in
bytes, GPUs as a count. A workload is a non-VM pod there: its requests add to the node's raw sums,
which count rounded up to whole CPUs and memory slots — so a worker's free room is given in raw
amounts (what the raw sums may still grow by), and the tracker needs no rounding per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, get_args

from fleetledger.domain.template import MachineTemplate

__all__ = [
    "WORKER_STATUSES",
    "NewWorker",
    "PendingWorker",
    "PlacementPlan",
    "Pool",
    "Snapshot",
    "Worker",
    "WorkerStatus",
    "WorkloadRequest",
]

WorkerStatus: TypeAlias = Literal["available", "draining", "disabled"]
"""Only ``available`` pools and workers take new workloads."""
WORKER_STATUSES: tuple[WorkerStatus, ...] = get_args(WorkerStatus)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadRequest:
    """One workload to place (seed 02's ``ContainerRequest``).

    ``gpu_types`` lists acceptable GPU types, preferred first; empty means any. ``selector`` names
    the pool the workload must run in; without one it only goes to pools that do not require a
    selector. A non-``preemptible`` workload never lands on a preemptible (spot) worker. Higher
    ``priority`` is planned first.
    """

    id: str
    cpu_milli: int
    memory_bytes: int
    gpu: int = 0
    gpu_types: tuple[str, ...] = ()
    selector: str | None = None
    preemptible: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """A group of identical workers and how to get another one.

    ``worker_*`` is what a new worker of the pool brings (its allocatable resources); the machine
    request for one carries ``template``; its nodes count memory in ``memory_slot_bytes`` slots.
    Higher ``priority`` pools are preferred.
    """

    name: str
    template: MachineTemplate
    worker_cpu_milli: int
    worker_memory_bytes: int
    worker_gpu: int = 0
    memory_slot_bytes: int = 1 << 30
    gpu_type: str | None = None
    requires_selector: bool = False
    preemptible: bool = False
    status: WorkerStatus = "available"
    priority: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Worker:
    """What one node can still take, as its stream stood at ``version``: how far its non-VM
    pods' raw sums may grow (read from a node's state by the placement adapter)."""

    name: str
    pool: str
    version: int
    free_cpu_milli: int
    free_memory_bytes: int
    free_gpu: int
    status: WorkerStatus = "available"


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingWorker:
    """A worker requested from the cloud and not yet joined, with the workloads waiting for it.

    ``free_*`` is what remains of it once those workloads are counted: overflow fills it before
    asking for another worker.
    """

    name: str
    pool: str
    request_ids: tuple[str, ...]
    free_cpu_milli: int
    free_memory_bytes: int
    free_gpu: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Node capacity read once for a whole batch, and the workers still being provisioned."""

    workers: tuple[Worker, ...] = ()
    pending: tuple[PendingWorker, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class NewWorker:
    """A worker overflow asks for: its name (the machine name), pool and the workloads it takes.

    ``used_*`` is what those workloads take of it.
    """

    name: str
    pool: str
    request_ids: tuple[str, ...]
    used_cpu_milli: int
    used_memory_bytes: int
    used_gpu: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementPlan:
    """What one batch decides; every request of the batch is in exactly one of the four outcomes.

    ``reservations`` holds, per touched node, the workloads placed on it in planning order (the
    commit turns them into that node's reservations, one event per node); ``versions``
    the stream version each node's plan was made on (the commit's expected version).
    ``waiting`` maps a request to an already-requested worker it now waits for; ``provisions``
    are the new workers to request.
    """

    placed: Mapping[str, str] = field(default_factory=dict)
    reservations: Mapping[str, tuple[WorkloadRequest, ...]] = field(default_factory=dict)
    versions: Mapping[str, int] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)
    provisions: tuple[NewWorker, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
