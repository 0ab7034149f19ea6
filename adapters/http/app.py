"""The HTTP API of machine requests (FastAPI).

=========================================  =====================================================
``POST /v1/machines``                      one or many requests → ``202`` with their ids; all
                                           are appended in one transaction or none is
``GET /v1/machines/{request_id}``          status and outcome; ``?wait=SECONDS`` (≤ 60)
                                           long-polls until the outcome is known
``GET /healthz``                           liveness: the runtime is running; its role (leader
                                           or follower) and leader term
``GET /readyz``                            readiness: the schema is at head and the read model
                                           has caught up with the log; role and term
=========================================  =====================================================

Errors, each with the standard ``{"detail": …}`` body: ``422`` for a body that does not validate
(``detail[].loc`` names the field at fault, nothing appended), ``409`` when the grouper refuses a
request (a machine name in use, a request id reused with other content; nothing appended),
``404`` for an unknown request id, ``503`` (with ``Retry-After``) while the log is unreachable or
the runtime is not running.

Reads come from the runtime's read model (:mod:`fleetledger.projections.machine_requests`). A
``POST`` returns only once the read model has folded what it appended, so a ``GET`` right after it
finds the request. The long-poll awaits a future the read model resolves when the request reaches
its outcome: no thread is held and no loop polls while a client waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import structlog
from fastapi import FastAPI, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from fleetledger.adapters.machines import (
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MachineRequest,
    MachinesRuntime,
    RequestRejected,
    RuntimeStopped,
)
from fleetledger.domain.errors import InvalidCommand
from fleetledger.eventstore import EventStoreError, SchemaOutOfDate

from .models import AcceptedResponse, MachineRequestBody, MachinesBody, MachineStatusResponse

__all__ = ["MAX_WAIT_SECONDS", "create_app"]

log = structlog.get_logger(__name__)

MAX_WAIT_SECONDS = 60.0
"""Longest ``?wait=``: long enough to cover a batch, short enough for proxies' idle timeouts."""
_READ_YOUR_WRITES_SECONDS = 10.0
_READY_LAG_EVENTS = 1000
"""A read model further behind than this is not ready to answer reads."""


def create_app(runtime: MachinesRuntime, *, manage_runtime: bool = False) -> FastAPI:
    """The API over ``runtime``; with ``manage_runtime`` the app starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_runtime:
            await run_in_threadpool(runtime.start)
        try:
            yield
        finally:
            if manage_runtime:
                await run_in_threadpool(runtime.stop)

    app = FastAPI(
        title="fleetledger",
        summary="Batched VM creation, recorded as events.",
        version="0.1.0",
        lifespan=lifespan,
    )
    _install_error_handlers(app)

    @app.post(
        "/v1/machines",
        status_code=status.HTTP_202_ACCEPTED,
        response_model=AcceptedResponse,
        responses={409: {"description": "the grouper refused a request"}},
    )
    def create_machines(body: MachinesBody, response: Response) -> AcceptedResponse:
        """Enqueue machine requests; their outcomes follow at the status URLs."""
        if not runtime.running:
            raise RuntimeStopped("the machines runtime is not running")
        requests = [_domain_request(index, item) for index, item in enumerate(body.requests)]
        accepted = runtime.service.request(requests)
        target = accepted.last_position or runtime.store.head()
        runtime.wait_until_read(target, timeout=_READ_YOUR_WRITES_SECONDS)
        urls = [f"/v1/machines/{request_id}" for request_id in accepted.request_ids]
        if len(urls) == 1:
            response.headers["Location"] = urls[0]
        return AcceptedResponse(request_ids=list(accepted.request_ids), status_urls=urls)

    @app.get(
        "/v1/machines/{request_id}",
        response_model=MachineStatusResponse,
        responses={404: {"description": "no such request"}},
    )
    async def machine_status(
        request_id: str,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_SECONDS,
                description="Seconds to wait for the outcome if it is not known yet.",
            ),
        ] = 0.0,
    ) -> JSONResponse:
        """The request's status; with ``wait``, returns as soon as its outcome is known."""
        projection = runtime.projection
        view = projection.get(request_id)
        if view is None:
            # Appended by another process, perhaps, and not folded yet: look once more.
            await run_in_threadpool(projection.catch_up, runtime.store)
            view = projection.get(request_id)
            if view is None:
                return _error(404, f"no machine request {request_id!r}; check the id from POST")
        if wait > 0 and not view.terminal:
            try:
                view = await asyncio.wait_for(
                    asyncio.wrap_future(projection.watch(request_id)), timeout=wait
                )
            except TimeoutError:
                view = projection.get(request_id) or view
        return JSONResponse(view.to_dict())

    _install_health_routes(app, runtime)
    return app


def _install_health_routes(app: FastAPI, runtime: MachinesRuntime) -> None:
    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """Liveness: 200 while the runtime runs, 503 otherwise."""
        body = {
            "status": "ok" if runtime.running else "stopped",
            "role": runtime.role,
            "term": runtime.term,
            "grouper": runtime.service.grouper_name,
            "requests": runtime.projection.counts(),
        }
        return JSONResponse(body, status_code=200 if runtime.running else 503)

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        """Readiness: 200 when the schema is at head and the read model has caught up."""
        problems: list[str] = []
        try:
            head = runtime.store.head()
            runtime.store.backend.check_schema()
        except SchemaOutOfDate as e:
            problems.append(str(e))
        except EventStoreError as e:
            return _error(503, f"the event log is unreachable: {e}", retry_after=5)
        lag = max(0, head - runtime.projection.position)
        if lag > _READY_LAG_EVENTS:
            problems.append(f"read model {lag} events behind the log")
        if not runtime.running:
            problems.append("runtime not running")
        problems.extend(f"reactor stopped: {failure}" for failure in runtime.reactor_failures())
        body = {
            "status": "ready" if not problems else "not ready",
            "role": runtime.role,
            "term": runtime.term,
            "log_position": head,
            "read_model_lag": lag,
            "problems": problems,
        }
        return JSONResponse(body, status_code=200 if not problems else 503)


def _domain_request(index: int, item: MachineRequestBody) -> MachineRequest:
    try:
        template = item.template.to_template()
    except InvalidCommand as e:
        raise InvalidRequest(e.reason, index=index, field="template") from e
    return item.to_request(template)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequest)
    async def invalid(_: Request, error: InvalidRequest) -> JSONResponse:
        loc: list[object] = ["body", "requests", error.index]
        if error.field is not None:
            loc.append(error.field)
        detail = [{"loc": loc, "msg": str(error), "type": "value_error"}]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(RequestRejected)
    async def rejected(_: Request, error: RequestRejected) -> JSONResponse:
        return _error(409, {"index": error.index, "reason": error.reason})

    @app.exception_handler(LogUnavailable)
    async def unavailable(_: Request, error: LogUnavailable) -> JSONResponse:
        log.error("request failed: event log unavailable", error=str(error))
        return _error(503, str(error), retry_after=5)

    @app.exception_handler(LogContention)
    async def contention(_: Request, error: LogContention) -> JSONResponse:
        return _error(503, str(error), retry_after=1)

    @app.exception_handler(RuntimeStopped)
    async def stopped(_: Request, error: RuntimeStopped) -> JSONResponse:
        return _error(503, str(error), retry_after=5)


def _error(code: int, detail: object, *, retry_after: int | None = None) -> JSONResponse:
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return JSONResponse({"detail": detail}, status_code=code, headers=headers)
