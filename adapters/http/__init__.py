"""The HTTP API (FastAPI): ``POST/GET /v1/machines``, ``/healthz``; see :mod:`.app`."""

from __future__ import annotations

from .app import MAX_WAIT_SECONDS, create_app

__all__ = ["MAX_WAIT_SECONDS", "create_app"]
