"""The HTTP API of machine requests (FastAPI).

=========================================  =====================================================
``POST /v1/machines``                      one or many requests → ``202`` with their ids and
                                           status URLs; all are appended in one transaction or
                                           none is
``GET /v1/machines/{request_id}``          status and outcome; ``?wait=SECONDS`` (≤ 60)
                                           long-polls until the outcome is known
``GET /healthz``                           liveness: the runtime is running; its role (leader
                                           or follower) and leader term
``GET /readyz``                            readiness: the schema is at head, the read model
                                           has caught up with the log and no leader duty
                                           keeps failing; role and term. Both answer within a
                                           second whatever the database does (:mod:`.probes`):
                                           ``503`` saying which check hangs
``GET /metrics``                           Prometheus metrics (:mod:`fleetledger.adapters.
                                           metrics`): folded from the log, plus the process's
                                           role, append latency and placement costs
=========================================  =====================================================

With API tokens configured (:mod:`.auth`) every route but ``/healthz``, ``/readyz`` and
``/metrics`` needs ``Authorization: Bearer <token>``; ``401`` with ``WWW-Authenticate`` otherwise.

What a request may carry is held to the edge rule (:mod:`.edge`) — no control characters or lone
surrogates in text that reaches the log, finite numbers in range, ids that URLs can read back —
and a path holding a control character is ``404`` before any route reads it. A value the log
itself refuses (``InvalidEvent``) is the request's fault: ``422``, never the ``503`` of an outage.

Errors, each with the standard ``{"detail": …}`` body: ``413`` for a body over
``max_body_bytes`` (:mod:`.limits`), ``422`` for a body that is not JSON or does not validate
(``detail[].loc`` names the field at fault, ``msg`` says why; the offending value is not echoed
back), ``400`` for a body FastAPI cannot read at all (sent as another content type), ``409`` when
the grouper refuses a request (a machine name in use, a request id reused with other content),
``404`` for an unknown request id, ``503`` (with ``Retry-After``) while the log is unreachable or
the runtime is not running. Nothing is appended for any of them.

Status URLs are percent-encoded so that every id gives a working URL and a valid ``Location``
header.

Reads come from the runtime's read model (:mod:`fleetledger.projections.machine_requests`). A
``POST`` answers as soon as the log has its requests; the model folds them a moment later. A
``GET`` for a request the model has not folded yet catches it up from the log before it would
answer ``404``, so a ``GET`` right after the ``202`` finds the request all the same. Under load,
waiting in the ``POST`` for the model instead cost each one about 10 ms (the follower's read of
the log, and its hand-off back to the event loop) and a fifth of the throughput. The ``POST``
handler is a coroutine on a lean route, which the app (:class:`~.lean.LeanApp`) serves ahead of
FastAPI's middleware stack and router: it awaits the grouper's decision as a future, holding no
thread while the append is in flight. The long-poll awaits a future the read model resolves when
the request reaches its outcome: no thread is held and no loop polls while a client waits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol
from urllib.parse import quote

import structlog
from fastapi import APIRouter, FastAPI, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from fleetledger.adapters.machines import (
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MachineRequest,
    MachinesRuntime,
    RequestRejected,
    RuntimeStopped,
)
from fleetledger.adapters.metrics.http import metrics_router, runtime_metrics
from fleetledger.domain.errors import InvalidCommand
from fleetledger.eventstore import EventStoreError, InvalidEvent, SchemaOutOfDate

from .auth import ApiTokens, BearerAuth, document_bearer_auth
from .edge import EdgePaths
from .lean import LeanApp, LeanRouter
from .limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit, checked_max_body_bytes
from .models import AcceptedResponse, MachineRequestBody, MachinesBody, MachineStatusResponse
from .probes import ProbeTimeout, SingleFlightCheck

__all__ = ["MAX_WAIT_SECONDS", "create_app", "status_url"]

log = structlog.get_logger(__name__)

MAX_WAIT_SECONDS = 60.0
"""Longest ``?wait=``: long enough to cover a batch, short enough for proxies' idle timeouts."""
_READY_LAG_EVENTS = 1000
"""A read model further behind than this is not ready to answer reads."""
_LOG_RETRY_SECONDS = 5

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body could not be read as JSON"},
    413: {"description": "the body is larger than the server's limit"},
    503: {"description": "the log is unreachable or the runtime is not running; see Retry-After"},
}


class _JSON(JSONResponse):
    """JSON in ASCII: text that cannot be encoded as UTF-8 (a lone surrogate sent by a client)
    is escaped instead of failing the response."""

    def render(self, content: Any) -> bytes:
        return _encode_ascii_json(content).encode()


# Built once: json.dumps with options builds an encoder on every call.
_encode_ascii_json = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, separators=(",", ":")
).encode


def status_url(request_id: str) -> str:
    """The status URL of ``request_id``, percent-encoded so that any id gives a working URL."""
    return f"/v1/machines/{quote(request_id, safe='')}"


def create_app(
    runtime: MachinesRuntime,
    *,
    manage_runtime: bool = False,
    api_tokens: ApiTokens | Iterable[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    routers: Sequence[APIRouter] = (),
    companions: Sequence[Lifecycle] = (),
    readiness_checks: Sequence[Callable[[], Iterable[str]]] = (),
    metrics: CollectorRegistry | None = None,
) -> FastAPI:
    """The API over ``runtime``; with ``manage_runtime`` the app starts and stops it.

    ``routers`` add the other capabilities' routes (behind the same tokens and limits);
    ``companions`` are their runtimes, started after ``runtime`` and stopped before it (so the
    machines runtime, which releases the leadership, stops last). ``readiness_checks`` name what
    else keeps the process from being ready (a companion's stalled duty, a stale cluster cache):
    each problem they return fails ``/readyz``. ``GET /metrics`` serves ``metrics`` (default:
    the log's metrics and the runtime's role, :func:`~fleetledger.adapters.metrics.http.
    runtime_metrics`).

    ``api_tokens`` (an :class:`~.auth.ApiTokens` or the tokens themselves) makes every route but
    the probes require one of them; ``None`` leaves the API open, which only a caller that has
    decided so (a loopback-only server, a test) should do. Bodies over ``max_body_bytes`` get
    ``413``. Both are validated here: a ``ValueError`` says what to fix.
    """
    tokens = _tokens(api_tokens)
    max_body_bytes = checked_max_body_bytes(max_body_bytes)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_runtime:
            await run_in_threadpool(runtime.start)
            for companion in companions:
                await run_in_threadpool(companion.start)
        try:
            yield
        finally:
            if manage_runtime:
                for companion in reversed(companions):
                    await run_in_threadpool(companion.stop)
                await run_in_threadpool(runtime.stop)

    # Without tokens the interactive docs work as usual; with them a browser could not load the
    # schema they show (it is behind the token too), so they are not served.
    app = LeanApp(
        title="fleetledger",
        summary="Batched VM creation, recorded as events.",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=_JSON,
        docs_url="/docs" if tokens is None else None,
        redoc_url="/redoc" if tokens is None else None,
    )
    _install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(EdgePaths)
    if tokens is not None:
        app.add_middleware(BearerAuth, tokens=tokens)
        document_bearer_auth(app)

    async def create_machines(body: MachinesBody) -> JSONResponse:
        """Enqueue machine requests; their outcomes follow at the status URLs."""
        if not runtime.running:
            raise RuntimeStopped("the machines runtime is not running")
        requests = [_domain_request(index, item) for index, item in enumerate(body.requests)]
        accepted = await runtime.service.arequest(requests)
        urls = [status_url(request_id) for request_id in accepted.request_ids]
        # AcceptedResponse's shape (it documents the route), without building the model.
        answer = {"request_ids": list(accepted.request_ids), "status_urls": urls}
        headers = {"Location": urls[0]} if len(urls) == 1 else None
        return _JSON(answer, status_code=status.HTTP_202_ACCEPTED, headers=headers)

    hot = LeanRouter()
    hot.add_lean_post(
        "/v1/machines",
        create_machines,
        status_code=status.HTTP_202_ACCEPTED,
        response_model=AcceptedResponse,
        responses={409: {"description": "the grouper refused a request"}, **_ERRORS},
    )
    app.include_router(hot)

    # ``:path`` so that an id holding a "/" (taken through another door than this API's, whose
    # ids cannot) still finds its request from its percent-encoded URL.
    @app.get(
        "/v1/machines/{request_id:path}",
        response_model=MachineStatusResponse,
        responses={404: {"description": "no such request"}, **_ERRORS},
    )
    async def machine_status(
        request_id: str,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_SECONDS,
                allow_inf_nan=False,
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
        return _JSON(view.to_dict())

    _install_health_routes(app, runtime, readiness_checks)
    app.include_router(metrics_router(runtime_metrics(runtime) if metrics is None else metrics))
    for router in routers:
        app.include_router(router)
    return app


class Lifecycle(Protocol):
    """A runtime the app starts and stops with itself."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


def _tokens(api_tokens: ApiTokens | Iterable[str] | None) -> ApiTokens | None:
    if api_tokens is None or isinstance(api_tokens, ApiTokens):
        return api_tokens
    return ApiTokens(api_tokens)


def _install_health_routes(
    app: FastAPI, runtime: MachinesRuntime, checks: Sequence[Callable[[], Iterable[str]]]
) -> None:
    probe_errors: dict[int | str, dict[str, Any]] = {503: {"description": "not live / not ready"}}
    # Each probe answers within its deadline whatever the database does (see .probes): a check
    # still running past it is a 503 saying what hangs.
    liveness = SingleFlightCheck(lambda: _liveness(runtime), what="the liveness check")
    readiness = SingleFlightCheck(lambda: _readiness(runtime, checks), what="the readiness check")

    @app.get("/healthz", responses=probe_errors)
    async def healthz() -> JSONResponse:
        """Liveness: 200 while the runtime runs, 503 otherwise. A stalled duty does not make
        the process dead (restarting it would not unstall a log that refuses its writes), but it
        is listed under ``stalls``; readiness fails on it."""
        try:
            body = await liveness.run()
        except ProbeTimeout as e:
            return _error(503, str(e), retry_after=1)
        return _JSON(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/readyz", responses=probe_errors)
    async def readyz() -> JSONResponse:
        """Readiness: 200 when the schema is at head, the read model has caught up, and no
        leader duty keeps failing (each named under ``problems``)."""
        try:
            body = await readiness.run()
        except ProbeTimeout as e:
            return _error(503, str(e), retry_after=1)
        except EventStoreError as e:
            return _error(503, f"the event log is unreachable: {e}", retry_after=_LOG_RETRY_SECONDS)
        return _JSON(body, status_code=200 if not body["problems"] else 503)


def _liveness(runtime: MachinesRuntime) -> dict[str, Any]:
    return {
        "status": "ok" if runtime.running else "stopped",
        "role": runtime.role,
        "term": runtime.term,
        "grouper": runtime.service.grouper_name,
        "requests": runtime.projection.counts(),
        "stalls": runtime.stalls(),
    }


def _readiness(
    runtime: MachinesRuntime, checks: Sequence[Callable[[], Iterable[str]]]
) -> dict[str, Any]:
    problems: list[str] = []
    head = runtime.store.head()
    try:
        runtime.store.backend.check_schema()
    except SchemaOutOfDate as e:
        problems.append(str(e))
    # The read model catches up first (to the head, past other capabilities' events), so the
    # lag counts only what arrived since.
    runtime.projection.catch_up(runtime.store)
    lag = max(0, head - runtime.projection.position)
    if lag > _READY_LAG_EVENTS:
        problems.append(f"read model {lag} events behind the log")
    if not runtime.running:
        problems.append("runtime not running")
    problems.extend(f"duty stalled: {stall}" for stall in runtime.stalls())
    for check in checks:
        problems.extend(check())
    return {
        "status": "ready" if not problems else "not ready",
        "role": runtime.role,
        "term": runtime.term,
        "log_position": head,
        "read_model_lag": lag,
        "problems": problems,
    }


def _domain_request(index: int, item: MachineRequestBody) -> MachineRequest:
    try:
        template = item.template.to_template()
    except InvalidCommand as e:
        raise InvalidRequest(e.reason, index=index, field="template") from e
    return item.to_request(template)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, error: RequestValidationError) -> JSONResponse:
        # Field and reason only: echoing the input back could mean megabytes, a NaN or a lone
        # surrogate that JSON cannot carry, turning a refusal into a 500.
        detail = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in error.errors()
        ]
        return _JSON({"detail": detail}, status_code=422)

    @app.exception_handler(EventStoreError)
    async def unreadable(_: Request, error: EventStoreError) -> JSONResponse:
        if isinstance(error, InvalidEvent):
            # The log refused a value the request carried: the request's fault, no outage.
            detail = [
                {"loc": ["body"], "msg": f"the log refuses it: {error}", "type": "value_error"}
            ]
            return _JSON({"detail": detail}, status_code=422)
        log.error("request failed: event log unreadable", error=str(error))
        return _error(503, f"the event log is unreachable: {error}", retry_after=_LOG_RETRY_SECONDS)

    @app.exception_handler(InvalidRequest)
    async def invalid(_: Request, error: InvalidRequest) -> JSONResponse:
        loc: list[object] = ["body", "requests", error.index]
        if error.field is not None:
            loc.append(error.field)
        detail = [{"loc": loc, "msg": str(error), "type": "value_error"}]
        return _JSON({"detail": detail}, status_code=422)

    @app.exception_handler(RequestRejected)
    async def rejected(_: Request, error: RequestRejected) -> JSONResponse:
        return _error(409, {"index": error.index, "reason": error.reason})

    @app.exception_handler(LogUnavailable)
    async def unavailable(_: Request, error: LogUnavailable) -> JSONResponse:
        log.error("request failed: event log unavailable", error=str(error))
        return _error(503, str(error), retry_after=_LOG_RETRY_SECONDS)

    @app.exception_handler(LogContention)
    async def contention(_: Request, error: LogContention) -> JSONResponse:
        return _error(503, str(error), retry_after=1)

    @app.exception_handler(RuntimeStopped)
    async def stopped(_: Request, error: RuntimeStopped) -> JSONResponse:
        return _error(503, str(error), retry_after=_LOG_RETRY_SECONDS)


def _error(code: int, detail: object, *, retry_after: int | None = None) -> JSONResponse:
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return _JSON({"detail": detail}, status_code=code, headers=headers)
