"""Batch workload placement (seed 02): one batch planned on one capacity snapshot, overflow
packed into the fewest new workers, and the workload aggregate that records each outcome.

The workload aggregate is exported as a module (``workloads.decide``).
"""

from __future__ import annotations

from fleetledger.domain.placement import workloads
from fleetledger.domain.placement.capacity import Capacity
from fleetledger.domain.placement.model import (
    ANY_GPU,
    STRATEGIES,
    WORKER_STATUSES,
    NewWorker,
    PendingWorker,
    PlacementPlan,
    Pool,
    Snapshot,
    Strategy,
    Worker,
    WorkerStatus,
    WorkloadRequest,
)
from fleetledger.domain.placement.pack import (
    DEFAULT_SEARCH_STEPS,
    Packed,
    check_search_steps,
    pack_overflow,
)
from fleetledger.domain.placement.planner import (
    plan,
    plan_on,
)
from fleetledger.domain.placement.pools import (
    check_request,
    eligible,
    holds,
    never_fits,
    pool_order,
    worker_room,
)
from fleetledger.domain.placement.workloads import (
    STREAM_PREFIX,
    RecordPlacement,
    RecordRejection,
    RecordWaiting,
    Recovery,
    ReleaseWorkload,
    SubmitWorkload,
    Workload,
    WorkloadCommand,
    WorkloadEvent,
    WorkloadPhase,
    WorkloadPlaced,
    WorkloadRejected,
    WorkloadReleased,
    WorkloadSubmitted,
    WorkloadWaiting,
    decide,
    evolve,
    initial_state,
    recover,
    stream_id,
    workload_of_stream,
)

__all__ = [
    "ANY_GPU",
    "Capacity",
    "DEFAULT_SEARCH_STEPS",
    "NewWorker",
    "Packed",
    "PendingWorker",
    "PlacementPlan",
    "Pool",
    "RecordPlacement",
    "RecordRejection",
    "RecordWaiting",
    "Recovery",
    "ReleaseWorkload",
    "STRATEGIES",
    "STREAM_PREFIX",
    "Snapshot",
    "Strategy",
    "SubmitWorkload",
    "WORKER_STATUSES",
    "Worker",
    "WorkerStatus",
    "Workload",
    "WorkloadCommand",
    "WorkloadEvent",
    "WorkloadPhase",
    "WorkloadPlaced",
    "WorkloadRejected",
    "WorkloadReleased",
    "WorkloadRequest",
    "WorkloadSubmitted",
    "WorkloadWaiting",
    "check_request",
    "check_search_steps",
    "decide",
    "eligible",
    "evolve",
    "holds",
    "initial_state",
    "never_fits",
    "pack_overflow",
    "plan",
    "plan_on",
    "pool_order",
    "recover",
    "stream_id",
    "worker_room",
    "workload_of_stream",
    "workloads",
]
