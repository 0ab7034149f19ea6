"""Workload placement's endpoints, as a router the app includes.

=========================================  =====================================================
``POST /v1/workloads``                     one workload or ``{"workloads": [...]}``: each
                                           ``{id?, cpu_milli, memory_bytes, gpu, gpu_types,
                                           selector, preemptible, priority}`` → ``202`` with
                                           ``{"ids": [...]}`` once they are in the log (queued
                                           for the next batch; a restart keeps them). An id
                                           sent again with the same request is answered by
                                           the first
``GET /v1/workloads/{id}[?wait=SECONDS]``  ``{id, state, node, worker, reason}``: ``placed`` on
                                           ``node``, ``pending-provisioning`` for ``worker``,
                                           ``rejected`` with ``reason``, ``queued`` or
                                           ``released``; ``wait`` holds the answer (up to 30 s)
                                           while the workload is still queued
``DELETE /v1/workloads/{id}``              release: its capacity goes back through its node's
                                           stream → ``200`` with the status
=========================================  =====================================================

Errors, each with ``{"detail": …}``: ``400`` for a malformed workload, ``404`` for an unknown
id, ``409`` for an id already submitted with a different request (nothing of that submission is
recorded), ``503`` (with ``Retry-After``) while the log is unreachable or the runtime is stopped;
bodies that do not validate get FastAPI's ``422``.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt

from fleetledger.adapters.placement import (
    InvalidWorkload,
    LogUnavailable,
    PlacementError,
    PlacementRuntime,
    RuntimeStopped,
    UnknownWorkload,
    WorkloadConflict,
    WorkloadStatus,
)
from fleetledger.domain.placement import WorkloadRequest
from fleetledger.eventstore import InvalidEvent

from .edge import ID_PATTERN, MAX_ID_LENGTH, MAX_SAFE_INTEGER, STRICT_JSON, Id, LabelValue

__all__ = ["MAX_WAIT_SECONDS", "WorkloadBody", "WorkloadsBody", "workloads_router"]

MAX_WAIT_SECONDS = 30.0
MAX_CPU_MILLI = 100_000_000
MAX_GPUS = 1024
MAX_GPU_TYPES = 16
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
"""Kubernetes' PriorityClass value range (int32)."""

WorkloadId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        pattern=ID_PATTERN,
        description="the workload's id, as submitted",
    ),
]


class WorkloadBody(BaseModel):
    """One workload to place; ``id`` defaults to a fresh one (send your own to retry safely).

    Held to the edge rule (:mod:`.edge`): the id is URL-safe (it is read back by path), the
    selector and GPU types are Kubernetes label values, numbers are bounded."""

    model_config = STRICT_JSON

    id: Id | None = None
    cpu_milli: StrictInt = Field(ge=0, le=MAX_CPU_MILLI)
    memory_bytes: StrictInt = Field(ge=0, le=MAX_SAFE_INTEGER)
    gpu: StrictInt = Field(default=0, ge=0, le=MAX_GPUS)
    gpu_types: list[LabelValue] = Field(
        default_factory=list, max_length=MAX_GPU_TYPES, description="preferred first; [] = any"
    )
    selector: LabelValue | None = Field(default=None, description="a pool name")
    preemptible: StrictBool = False
    priority: StrictInt = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)

    def request(self) -> WorkloadRequest:
        return WorkloadRequest(
            id=self.id or uuid.uuid4().hex,
            cpu_milli=self.cpu_milli,
            memory_bytes=self.memory_bytes,
            gpu=self.gpu,
            gpu_types=tuple(self.gpu_types),
            selector=self.selector,
            preemptible=self.preemptible,
            priority=self.priority,
        )


class WorkloadsBody(BaseModel):
    """Several workloads at once; they join the same batch when it has room."""

    model_config = STRICT_JSON

    workloads: list[WorkloadBody] = Field(min_length=1, max_length=10_000)


def workloads_router(runtime: PlacementRuntime) -> APIRouter:
    """The workload endpoints over ``runtime``."""
    router = APIRouter(tags=["workloads"])

    @router.post("/v1/workloads", status_code=202)
    def submit(body: WorkloadsBody | WorkloadBody) -> JSONResponse:
        items = body.workloads if isinstance(body, WorkloadsBody) else [body]
        try:
            ids = runtime.submit([item.request() for item in items])
        except PlacementError as e:
            return _refused(e)
        except InvalidEvent as e:
            # The log refused a value: the request's fault, which is no outage.
            return JSONResponse({"detail": f"the log refuses the workload: {e}"}, status_code=422)
        return JSONResponse({"ids": list(ids)}, status_code=202)

    @router.get("/v1/workloads/{workload_id}")
    def status(
        workload_id: WorkloadId,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS, description="seconds")] = 0.0,
    ) -> JSONResponse:
        try:
            found = runtime.wait(workload_id, timeout=wait) if wait else runtime.status(workload_id)
        except PlacementError as e:
            return _refused(e)
        return JSONResponse(_status(found))

    @router.delete("/v1/workloads/{workload_id}")
    def release(workload_id: WorkloadId) -> JSONResponse:
        try:
            runtime.release(workload_id)
            return JSONResponse(_status(runtime.status(workload_id)))
        except PlacementError as e:
            return _refused(e)

    return router


def _status(status: WorkloadStatus) -> dict[str, object]:
    return {
        "id": status.id,
        "state": status.state,
        "node": status.node,
        "worker": status.worker,
        "reason": status.reason,
    }


def _refused(error: PlacementError) -> JSONResponse:
    if isinstance(error.__cause__, InvalidEvent):
        # A refused value, whatever the runtime called it: the request's fault, no outage.
        return JSONResponse({"detail": str(error)}, status_code=422)
    if isinstance(error, InvalidWorkload):
        return JSONResponse({"detail": str(error)}, status_code=400)
    if isinstance(error, UnknownWorkload):
        return JSONResponse({"detail": str(error)}, status_code=404)
    if isinstance(error, WorkloadConflict):
        return JSONResponse({"detail": str(error)}, status_code=409)
    if isinstance(error, LogUnavailable | RuntimeStopped):
        return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"detail": str(error)}, status_code=409)
