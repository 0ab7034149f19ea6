"""What the API server said when it refused a request: the ``message`` of its ``Status``."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

__all__ = ["status_message"]


def status_message(e: ApiException) -> str:
    """The ``message`` of the ``Status`` body the API answered with, else the HTTP reason."""
    try:
        body = json.loads(e.body or "")
    except (TypeError, ValueError):
        return str(e.reason)
    message = body.get("message") if isinstance(body, dict) else None
    return str(message) if message else str(e.reason)
