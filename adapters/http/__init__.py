"""The HTTP API (FastAPI): ``POST/GET /v1/machines``, ``/healthz``; see :mod:`.app`.

``create_app(runtime, api_tokens=ApiTokens.from_env(), max_body_bytes=...)`` protects every
route but the probes with bearer tokens (:mod:`.auth`), websocket handshakes included, and caps
request bodies (:mod:`.limits`). The other capabilities' routers are mounted with
``create_app(..., routers=[...])``: the agents' (:mod:`.agents`), subnets' (:mod:`.subnets`),
workloads' (:mod:`.workloads`) and the external scheduler's testbeds, jobs, schedulings and
their live watch (:mod:`.testbeds`, :mod:`.watch`).
"""

from __future__ import annotations

from .app import MAX_WAIT_SECONDS, create_app
from .auth import ApiTokens
from .limits import DEFAULT_MAX_BODY_BYTES

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MAX_WAIT_SECONDS", "ApiTokens", "create_app"]
