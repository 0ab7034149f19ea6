"""A cap on request bodies: ``413`` before a byte past the limit is buffered or parsed.

A body announced larger than the limit (``Content-Length``) is refused without reading it; a body
sent in chunks is counted as it arrives and refused as soon as it passes the limit. Bodies within
the limit are read here in full and handed on, so nothing downstream can be made to hold more.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodySizeLimit", "checked_max_body_bytes", "replay_body"]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""1 MiB: a thousand requests of ordinary size fit; the log's own event limit is 1 MiB too."""


def checked_max_body_bytes(max_bytes: object) -> int:
    """``max_bytes`` if it is a positive integer; a ``ValueError`` saying so otherwise."""
    if type(max_bytes) is not int or max_bytes < 1:
        raise ValueError(
            "max_body_bytes must be a positive number of bytes "
            f"(e.g. {DEFAULT_MAX_BODY_BYTES}), got {max_bytes!r}"
        )
    return max_bytes


class BodySizeLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with ``413``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = checked_max_body_bytes(max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay_body(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {
                "detail": f"the request body is larger than {self.max_bytes} bytes; "
                "send fewer requests per call"
            },
            status_code=413,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server refuses a malformed length before we see it
    return 0


def replay_body(body: bytes, receive: Receive) -> Receive:
    """``receive`` that yields the buffered body once, then whatever the client sends next
    (its disconnect, which long polls listen for)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
