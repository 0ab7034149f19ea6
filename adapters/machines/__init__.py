"""The machine-request runtime: grouper service, coordinator reactor, driver, facade.

The vertical slice of docs/ARCHITECTURE.md, "VM creation batching" — a request goes domain →
log → reactor → cloud → outcome::

    from fleetledger.adapters.machines import MachineRequest, MachinesRuntime, skip_batching
    with MachinesRuntime(store, FakeCloud()) as runtime:
        future = runtime.machines.enqueue(MachineRequest(machine_name="m-1", template=template))
        outcome = future.result(timeout=30)

Modules, one job each: :mod:`~fleetledger.adapters.machines.service` (decide and append grouper
commands), :mod:`~fleetledger.adapters.machines.coordinator` (execute sealed batches against the
cloud port), :mod:`~fleetledger.adapters.machines.driver` (the grouper's clock),
:mod:`~fleetledger.adapters.machines.facade` (enqueue → future),
:mod:`~fleetledger.adapters.machines.runtime` (the wiring),
:mod:`~fleetledger.adapters.machines.records` (events ⇄ log records with idempotent ids),
:mod:`~fleetledger.adapters.machines.streams` (stream names),
:mod:`~fleetledger.adapters.machines.context` (skip-batching flag and batch metadata),
:mod:`~fleetledger.adapters.machines.clouds` (choosing the cloud adapter),
:mod:`~fleetledger.adapters.machines.write_budget` (the cloud's write budget as the coordinator
spends it), :mod:`~fleetledger.adapters.machines.throttled` (waits for it, recorded),
:mod:`~fleetledger.adapters.machines.errors`.
"""

from __future__ import annotations

from fleetledger.adapters.runtime import InlineRunner, RetryPolicy, TaskRunner, ThreadRunner

from .clouds import CLOUD_KINDS, CloudChoice, build_cloud
from .context import BatchMetadata, current_batch, should_skip_batching, skip_batching
from .coordinator import (
    DEFAULT_MAX_CONCURRENT_BATCHES,
    Coordinator,
    CoordinatorOptions,
    DispatchMode,
)
from .driver import GrouperDriver
from .errors import (
    BatchStalled,
    CloudNotConfigured,
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MachinesError,
    RequestRejected,
    RuntimeStopped,
    UnknownRequest,
)
from .facade import Machines
from .machine_request import MachineRequest
from .outcomes import MachineOutcome
from .runtime import MachinesRuntime
from .service import Accepted, MachineService
from .streams import DEFAULT_GROUPER, batch_stream_id, grouper_stream_id
from .throttled import BatchThrottled
from .write_budget import ThrottleReason, WriteBudget, WriteReservation

__all__ = [
    "CLOUD_KINDS",
    "DEFAULT_GROUPER",
    "DEFAULT_MAX_CONCURRENT_BATCHES",
    "Accepted",
    "BatchMetadata",
    "BatchStalled",
    "BatchThrottled",
    "CloudChoice",
    "CloudNotConfigured",
    "Coordinator",
    "CoordinatorOptions",
    "DispatchMode",
    "GrouperDriver",
    "InlineRunner",
    "InvalidRequest",
    "LogContention",
    "LogUnavailable",
    "MachineOutcome",
    "MachineRequest",
    "MachineService",
    "Machines",
    "MachinesError",
    "MachinesRuntime",
    "RequestRejected",
    "RetryPolicy",
    "RuntimeStopped",
    "TaskRunner",
    "ThreadRunner",
    "ThrottleReason",
    "UnknownRequest",
    "WriteBudget",
    "WriteReservation",
    "batch_stream_id",
    "build_cloud",
    "current_batch",
    "grouper_stream_id",
    "should_skip_batching",
    "skip_batching",
]
