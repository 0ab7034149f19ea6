"""``GET /metrics`` in Prometheus' text format, on the API's listener and on the extender's.

:func:`metrics_registry` gathers the collectors a process serves: the log's (:mod:`.from_log`),
the live runtimes' (:mod:`.live`), the process's append latency (:mod:`.appends`) and its CPU,
memory and file descriptors (prometheus-client's process collector). One registry may back both
listeners of a ``serve`` process, so the log is folded once.

:func:`metrics_router` mounts the route on a FastAPI app; :class:`MetricsEndpoint` answers it
in front of a plain ASGI app (the extender). A scrape folds the log in a worker thread, never on
the event loop. The route is public like the probes (``adapters.http.auth.PUBLIC_PATHS``):
scrapers call without credentials, and no value carries a secret or an id of a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetledger.eventstore import EventStore
from fleetledger.projections.machine_requests import REQUEST_EVENT_TYPES

from .appends import APPEND_LATENCY
from .from_log import LogMetrics, Subscriber
from .live import LiveMetrics, PlacementReports

__all__ = [
    "CONTENT_TYPE",
    "METRICS_PATH",
    "MachinesRuntimeView",
    "MetricsEndpoint",
    "metrics_registry",
    "metrics_router",
    "runtime_metrics",
]

METRICS_PATH = "/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format, which every Prometheus (2.x too) reads. Newer prometheus-clients
announce ``version=1.0.0``, which differs only for names outside ``[a-zA-Z0-9_:]``: none here."""


def metrics_registry(
    store: EventStore,
    *,
    live: LiveMetrics | None = None,
    subscribers: Sequence[Subscriber] = (),
    log_metrics: LogMetrics | None = None,
) -> CollectorRegistry:
    """A registry serving ``store``'s log metrics (or the given ``log_metrics``), ``live``'s,
    the append latency and the process's own."""
    registry = CollectorRegistry(auto_describe=False)
    collectors: list[Collector] = [
        log_metrics if log_metrics is not None else LogMetrics(store, subscribers=subscribers),
        APPEND_LATENCY,
        ProcessCollector(registry=None),
    ]
    if live is not None:
        collectors.append(live)
    for collector in collectors:
        registry.register(collector)
    return registry


class _Positioned(Protocol):
    @property
    def position(self) -> int: ...


class MachinesRuntimeView(Protocol):
    """What the metrics read of a machines runtime: its log, leadership and read model."""

    @property
    def store(self) -> EventStore: ...

    @property
    def role(self) -> str: ...

    @property
    def term(self) -> int | None: ...

    @property
    def projection(self) -> _Positioned: ...


def runtime_metrics(
    runtime: MachinesRuntimeView, *, placement: PlacementReports | None = None
) -> CollectorRegistry:
    """The registry a process serving ``runtime`` exposes: its log's metrics, its role and term,
    the lag of its machine-requests read model and, given the placement runtime, what its
    batches cost."""
    projection = runtime.projection
    return metrics_registry(
        runtime.store,
        live=LiveMetrics(role=lambda: runtime.role, term=lambda: runtime.term, placement=placement),
        subscribers=[
            Subscriber("machine_requests", lambda: projection.position, REQUEST_EVENT_TYPES)
        ],
    )


async def _exposition(registry: CollectorRegistry) -> bytes:
    return await run_in_threadpool(generate_latest, registry)


def metrics_router(registry: CollectorRegistry) -> APIRouter:
    """A router serving ``registry`` on ``GET /metrics`` (left out of the OpenAPI document: it
    is not JSON)."""
    router = APIRouter()

    @router.get(METRICS_PATH, include_in_schema=False)
    async def metrics() -> Response:
        return Response(await _exposition(registry), media_type=CONTENT_TYPE)

    return router


class MetricsEndpoint:
    """ASGI middleware answering ``GET /metrics`` from ``registry``; every other request goes
    to ``app``."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != METRICS_PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, 405, b'{"detail":"/metrics takes GET"}', b"application/json", True)
            return
        body = await _exposition(self.registry)
        await _send(send, 200, b"" if scope["method"] == "HEAD" else body, CONTENT_TYPE.encode())


async def _send(
    send: Send, status: int, body: bytes, content_type: bytes, allow: bool = False
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if allow:
        headers.append((b"allow", b"GET"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
