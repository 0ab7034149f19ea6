"""Batch workload placement on the node accounting streams (docs/ARCHITECTURE.md, "Workload
placement").

:class:`Collector` gathers requests into batches; :class:`PlacementService` plans each batch on
one snapshot with :func:`fleetledger.domain.placement.plan` and commits it in one multi-stream
append (each node's reservations one event on its ``node-<name>`` stream, each waiting or
rejected workload one event on its ``workload-<id>`` stream), sending overflow to the Grouper as
machine requests; :class:`PlacementRuntime` runs them and rebuilds them from the log at start.
"""

from __future__ import annotations

from .capacity import reservation, worker_of
from .collector import Collector
from .errors import (
    InvalidWorkload,
    LogUnavailable,
    PlacementError,
    RuntimeStopped,
    UnknownWorkload,
    WorkloadConflict,
)
from .runtime import PlacementRuntime
from .service import (
    BatchReport,
    MachineRequester,
    PlacementService,
    WorkloadState,
    WorkloadStatus,
    pool_by_prefix,
)

__all__ = [
    "BatchReport",
    "Collector",
    "InvalidWorkload",
    "LogUnavailable",
    "MachineRequester",
    "PlacementError",
    "PlacementRuntime",
    "PlacementService",
    "RuntimeStopped",
    "UnknownWorkload",
    "WorkloadConflict",
    "WorkloadState",
    "WorkloadStatus",
    "pool_by_prefix",
    "reservation",
    "worker_of",
]
