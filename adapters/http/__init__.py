"""The HTTP API (FastAPI): ``POST/GET /v1/machines``, ``/healthz``; see :mod:`.app`.

``create_app(runtime, api_tokens=ApiTokens.from_env(), max_body_bytes=...)`` protects every
route but the probes with bearer tokens (:mod:`.auth`) and caps request bodies (:mod:`.limits`).
"""

from __future__ import annotations

from .app import MAX_WAIT_SECONDS, create_app
from .auth import ApiTokens
from .limits import DEFAULT_MAX_BODY_BYTES

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MAX_WAIT_SECONDS", "ApiTokens", "create_app"]
