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
    "ANY_GPU",
    "STRATEGIES",
    "WORKER_STATUSES",
    "NewWorker",
    "PendingWorker",
    "PlacementPlan",
    "Pool",
    "Snapshot",
    "Strategy",
    "Worker",
    "WorkerStatus",
    "WorkloadRequest",
]

WorkerStatus: TypeAlias = Literal["available", "draining", "disabled"]
"""Only ``available`` pools and workers take new workloads."""
WORKER_STATUSES: tuple[WorkerStatus, ...] = get_args(WorkerStatus)

Strategy: TypeAlias = Literal["binpack", "spread"]
"""How a pool chooses among its workers a workload fits on: ``binpack`` the tightest fit,
``spread`` any of them by a hash of the workload id (beta9's worker affinity)."""
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)

ANY_GPU = "any"
"""A GPU type that accepts every type (beta9's ``GPU_ANY``): ``("any",)`` means ``()``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadRequest:
    """One workload to place (seed 02's ``ContainerRequest``).

    ``gpu_types`` lists acceptable GPU types, preferred first; empty means any, and so does
    ``"any"`` (beta9's ``GPU_ANY``): the types listed before it are preferred, in order, then any
    other type. ``selector`` names the pool the workload must run in; without one it only goes to
    pools that do not require a selector. A non-``preemptible`` workload never lands on a
    preemptible (spot) worker. Higher ``priority`` is planned first.
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
    Higher ``priority`` pools are preferred. ``strategy`` says how a workload chooses among the
    pool's workers it fits on: ``binpack`` (the default) the tightest, ``spread`` CPU-only work
    on any of them by a hash of its id, as beta9 spreads CPU work (GPU work is always packed).
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
    strategy: Strategy = "binpack"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"pool {self.name}: strategy must be one of {', '.join(STRATEGIES)} "
                f"(binpack fills the tightest worker, spread shares CPU work across workers), "
                f"got {self.strategy!r}"
            )


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
    retired: frozenset[str] = frozenset()
    """Worker names never to ask for again: their machines failed, and a request under the same
    name would only be answered with that failure."""


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
    are the new workers to request. ``optimality_gap`` is how many more new workers than the
    minimum the provisions may be: 0 when the overflow's packing is proven minimal, else the
    workers asked for minus the best lower bound the search proved within its step budget.
    """

    placed: Mapping[str, str] = field(default_factory=dict)
    reservations: Mapping[str, tuple[WorkloadRequest, ...]] = field(default_factory=dict)
    versions: Mapping[str, int] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)
    provisions: tuple[NewWorker, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
    optimality_gap: int = 0
