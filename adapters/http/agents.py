"""The autoscaler agents' endpoint and dumpstate, as a router the app includes.

=========================================  =====================================================
``POST /v1/agent/resources``               an agent asks for new amounts for its VM pod:
                                           ``{pod, protocol_version, cpu, memory, metrics}``
                                           (``cpu`` in CPUs, may be fractional; ``memory`` in
                                           slots) → ``200`` with the permit and compute unit
``GET /v1/dumpstate``                      every node's accounting as JSON (``position``,
                                           ``config``, ``nodes``, ``migration_queue``);
                                           ``?as_of=POSITION`` replays the log to that position
=========================================  =====================================================

Errors, each with ``{"detail": …}``: ``400`` for an unsupported protocol version, fractional CPU
on a protocol without it, or amounts outside the VM's bounds; ``404`` for a pod no node accounts;
``409`` for a migrating pod asking for anything but its reservation (or another refusal); ``503``
(with ``Retry-After``) while the log is unreachable or the runtime is not running. Bodies that do
not validate get FastAPI's ``422``.

Each request is one decision appended to its node's stream before the answer; concurrent
requests are batched into shared appends and group commits (see
:mod:`fleetledger.adapters.nodes.service`). The agents' handler is a coroutine that awaits the
decision's future, on a lean route (:class:`~.lean.LeanRouter`; a :class:`~.lean.LeanApp` serves
it ahead of the framework's middleware and router): no thread is held per agent while its
append is in flight, no thread hop is paid per request (a pod the process does not know yet is
located on the thread pool, since that reads the log), and no more framework than validation.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

from fleetledger.adapters.nodes import (
    Grant,
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MigratingPodMismatch,
    NodesError,
    NodesRuntime,
    RuntimeStopped,
    UnknownPod,
)
from fleetledger.domain.nodes import MILLI_PER_CPU
from fleetledger.eventstore import InvalidEvent
from fleetledger.projections.dumpstate import dumpstate_at, with_subnets
from fleetledger.projections.nodes import dump_json

from .edge import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_DNS_SUBDOMAIN,
    STRICT_JSON,
    FiniteFloat,
    storable,
)
from .lean import LeanRouter

__all__ = [
    "FRACTIONAL_CPU_SINCE",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "AgentMetrics",
    "AgentResourcesBody",
    "agents_router",
]

SUPPORTED_PROTOCOL_VERSIONS = (1, 2, 3)
FRACTIONAL_CPU_SINCE = 2
"""Agents before this protocol version scale whole CPUs only (their grants round down)."""


MAX_CPUS = 100_000
"""More CPUs than any VM has; bounds the milli-CPUs recorded (a float beyond it would overflow
the conversion, or reach the log as a number no reader holds)."""
MAX_MEMORY_SLOTS = 2**31 - 1
MAX_LOAD_AVERAGE = 1_000_000.0
MAX_POSITION = 2**63 - 1
"""Log positions are signed 64-bit integers in both backends."""


class AgentMetrics(BaseModel):
    """What an agent reports of its VM's load; the migration queue prefers low load."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    load_average_1min: FiniteFloat = Field(ge=0, le=MAX_LOAD_AVERAGE)


class AgentResourcesBody(BaseModel):
    """An agent's request: the amounts it wants its pod to have. The pod is a Kubernetes pod
    name (a DNS subdomain); numbers are finite and within :data:`MAX_CPUS`,
    :data:`MAX_MEMORY_SLOTS` and :data:`MAX_LOAD_AVERAGE` (:mod:`.edge`)."""

    model_config = STRICT_JSON

    pod: Annotated[
        str,
        BeforeValidator(storable),
        Field(min_length=1, max_length=MAX_DNS_SUBDOMAIN, pattern=DNS_SUBDOMAIN_PATTERN),
    ]
    protocol_version: StrictInt = Field(ge=0, le=2**31 - 1)
    cpu: FiniteFloat = Field(ge=0, le=MAX_CPUS, description="CPUs, e.g. 0.25 or 2")
    memory: StrictInt = Field(ge=0, le=MAX_MEMORY_SLOTS, description="memory slots")
    metrics: AgentMetrics | None = None


def agents_router(runtime: NodesRuntime) -> APIRouter:
    """The agents' endpoint and dumpstate over ``runtime``."""
    router = LeanRouter(tags=["nodes"])

    async def agent_resources(body: AgentResourcesBody) -> JSONResponse:
        """Grant the pod's permit: the new reserved amounts and the compute unit."""
        if body.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
            return _error(
                400,
                f"protocol version {body.protocol_version} is not supported; use one of "
                f"{', '.join(map(str, SUPPORTED_PROTOCOL_VERSIONS))}",
            )
        cpu_milli = round(body.cpu * MILLI_PER_CPU)
        if abs(cpu_milli - body.cpu * MILLI_PER_CPU) > 1e-6:
            return _error(400, f"cpu {body.cpu} is finer than a milli-CPU; round it")
        if not runtime.running:
            return _error(503, "the node runtime is not running", retry_after=1)
        service = runtime.service
        amounts: dict[str, Any] = {
            "cpu_milli": cpu_milli,
            "memory_slots": body.memory,
            "fractional_cpu": body.protocol_version >= FRACTIONAL_CPU_SINCE,
            "load": None if body.metrics is None else float(body.metrics.load_average_1min),
        }
        try:
            grant = await service.arequest_resources(body.pod, **amounts)
            if grant is None:  # a pod not indexed here: locating it reads the log
                grant = await run_in_threadpool(
                    partial(service.request_resources, body.pod, **amounts)
                )
        except NodesError as e:
            return _refused(e)
        return _GrantResponse(_granted(grant))

    router.add_lean_post("/v1/agent/resources", agent_resources)

    @router.get("/v1/dumpstate")
    def dumpstate(
        as_of: Annotated[
            int | None, Query(ge=0, le=MAX_POSITION, description="a log position")
        ] = None,
    ) -> Response:
        if as_of is None:
            dump = with_subnets(runtime.store, runtime.dump())
        else:
            try:
                dump = dumpstate_at(runtime.store, as_of)
            except ValueError as e:
                return _error(400, str(e))
        return Response(dump_json(dump), media_type="application/json")

    return router


class _GrantResponse(JSONResponse):
    """A grant rendered by orjson: the agents' answer is sent thousands of times a second and
    holds only numbers, names and short warnings, where the standard encoder costs several
    times more of the server's time per request."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _granted(grant: Grant) -> dict[str, object]:
    unit = grant.compute_unit
    return {
        "pod": grant.pod,
        "node": grant.node,
        "permit": {
            "cpu": grant.cpu_milli / MILLI_PER_CPU,
            "cpu_milli": grant.cpu_milli,
            "memory": grant.memory_slots,
        },
        "compute_unit": {
            "cpu": unit.cpu_milli / MILLI_PER_CPU,
            "cpu_milli": unit.cpu_milli,
            "memory": unit.memory_slots,
        },
        "capacity_pressure": {"cpu_milli": grant.cpu_pressure, "memory": grant.memory_pressure},
        "migrating": grant.migrating,
        "warnings": list(grant.warnings),
        "position": grant.position,
    }


def _refused(error: NodesError) -> JSONResponse:
    if isinstance(error.__cause__, InvalidEvent):
        # The log refused a value the request carried: its fault, which is no outage.
        return _error(422, str(error))
    if isinstance(error, InvalidRequest):
        return _error(400, str(error))
    if isinstance(error, UnknownPod):
        return _error(404, str(error))
    if isinstance(error, LogUnavailable | LogContention | RuntimeStopped):
        return _error(503, str(error), retry_after=1)
    if isinstance(error, MigratingPodMismatch):
        return _error(409, str(error))
    return _error(409, str(error))


def _error(code: int, detail: str, *, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"detail": detail}, status_code=code, headers=headers)
