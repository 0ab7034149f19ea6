"""Server hardening, in one place for every listener (the API's and the extender's).

:func:`uvicorn_settings` gives the keyword settings of a ``uvicorn.Config``: its HTTP protocol
(:class:`EdgeHttpProtocol`, uvicorn's httptools protocol with the guards below), the keep-alive
timeout and, for a listener given a certificate, TLS.

=====================================  ===========================================================
a connection that sends nothing        closed after :attr:`ListenerLimits.idle_seconds` (uvicorn
(before its first request or between   arms its keep-alive timer only after a response, so a
requests)                              connection that never sent a byte stayed open for ever)
a request's head (request line and     must arrive whole within ``header_seconds`` of its first
headers)                               byte and hold at most ``max_head_bytes``; ``408`` / ``431``
                                       and the connection closed otherwise (neither uvicorn nor
                                       httptools bounds either)
a request's body                       must arrive whole within ``body_seconds`` of its head;
                                       ``408`` and closed otherwise
connections                            at most ``max_connections`` (below the process's file
                                       limit): past it, the connection idle the longest is closed
                                       to make room; when none is idle, the newcomer is answered
                                       only on the probe paths (``503`` elsewhere), and past a
                                       small reserve for probes it is reset at once. uvicorn's own
                                       ``limit_concurrency`` would answer the probes ``503`` too.
an ``Authorization`` header holding    ``401`` with ``WWW-Authenticate`` (an unusable credential,
a control character                    as the token check answers any other), not the parser's
                                       ``400``, on a listener that requires tokens
=====================================  ===========================================================

The file limit matters because an accepted socket is a descriptor: with every descriptor held
by idle sockets the server can accept nothing — not even the orchestrator's probe — and asyncio
retries ``accept`` on a timer while the clients wait or are reset.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import structlog
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .auth import PUBLIC_PATHS, BearerAuth

__all__ = [
    "EdgeHttpProtocol",
    "ListenerLimits",
    "TlsFiles",
    "connection_budget",
    "edge_protocol",
    "requires_tokens",
    "uvicorn_settings",
]

log = structlog.get_logger(__name__)

_PROBE_RESERVE = 32
"""Connections accepted beyond the cap, answered on the probe paths only."""


def connection_budget(*, listeners: int = 1, limit: int | None = None) -> int:
    """Connections one of ``listeners`` listeners may hold: the file limit (``RLIMIT_NOFILE``'s
    soft limit, or ``limit``) less headroom for the database pool, logs and the probe reserve,
    shared between the listeners."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            limit = 1 << 20
    headroom = max(64, limit // 8) + _PROBE_RESERVE * listeners
    return max(8, (limit - headroom) // max(1, listeners))


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerLimits:
    """The guards of one listener (see the module docstring)."""

    idle_seconds: float = 5.0
    header_seconds: float = 10.0
    body_seconds: float = 30.0
    """A megabyte (the default body limit) in 30 s is 35 kB/s: slower is an attack or broken."""
    max_head_bytes: int = 64 * 1024
    max_connections: int = field(default_factory=connection_budget)
    authenticated: bool = False
    """Whether the listener requires bearer tokens (an unusable ``Authorization`` is ``401``)."""
    public_paths: frozenset[str] = PUBLIC_PATHS

    def __post_init__(self) -> None:
        for name in ("idle_seconds", "header_seconds", "body_seconds"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise ValueError(f"{name} must be within (0, 3600] seconds, got {value!r}")
        if self.max_connections < 1 or self.max_head_bytes < 1024:
            raise ValueError("max_connections must be >= 1 and max_head_bytes >= 1024")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A PEM certificate (chain) and its private key, both readable."""

    cert: Path
    key: Path

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, *, flag: str) -> TlsFiles | None:
        """Both given or neither; ``ValueError`` naming ``flag`` (``--tls``) otherwise, or for
        a file that cannot be read."""
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise ValueError(f"{flag}-cert and {flag}-key go together: give both or neither")
        files = cls(Path(cert), Path(key))
        for option, path in ((f"{flag}-cert", files.cert), (f"{flag}-key", files.key)):
            try:
                path.read_bytes()
            except OSError as e:
                raise ValueError(f"{option}: cannot read {path}: {e.strerror or e}") from None
        return files


def uvicorn_settings(
    *,
    authenticated: bool,
    public_paths: Iterable[str] = PUBLIC_PATHS,
    listeners: int = 1,
    tls: TlsFiles | None = None,
    limits: ListenerLimits | None = None,
) -> dict[str, Any]:
    """``uvicorn.Config`` keyword settings for a hardened listener, one of ``listeners`` in the
    process (they share its file limit)."""
    if limits is None:
        limits = ListenerLimits(
            authenticated=authenticated,
            public_paths=frozenset(public_paths),
            max_connections=connection_budget(listeners=listeners),
        )
    settings: dict[str, Any] = {
        "http": edge_protocol(limits),
        # uvicorn's own keep-alive timer (after a response); ours covers the first request too.
        "timeout_keep_alive": max(1, round(limits.idle_seconds)),
        # uvicorn formats every response's access-log arguments (client address, quoted path)
        # whenever the logger has a handler, even at a level that drops the line: 1.3 % of the
        # GIL's samples under load, for lines nobody sees.
        "access_log": logging.getLogger("uvicorn.access").isEnabledFor(logging.INFO),
    }
    if tls is not None:
        settings["ssl_certfile"] = str(tls.cert)
        settings["ssl_keyfile"] = str(tls.key)
    return settings


def edge_protocol(limits: ListenerLimits) -> type[EdgeHttpProtocol]:
    """:class:`EdgeHttpProtocol` bound to ``limits`` (uvicorn builds protocols from a class)."""
    return type("EdgeHttpProtocol", (EdgeHttpProtocol,), {"limits": limits})


class EdgeHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the listener's guards (see the module docstring)."""

    limits: ClassVar[ListenerLimits] = ListenerLimits(max_connections=1024)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: Any = None
        self._head = bytearray()
        self._reading_head = True
        self._idle_since = self.loop.time()

    # -- connections -----------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._idle_since = self.loop.time()
        self._arm(self.limits.idle_seconds, self._close_quietly)
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def idle(self) -> bool:
        """No request in the app's hands: between requests, or still sending a head."""
        return self.cycle is None or self.cycle.response_complete

    def _make_room(self) -> None:
        connections = self.connections
        cap = self.limits.max_connections
        if len(connections) <= cap:
            return
        idle = [
            c for c in connections if c is not self and isinstance(c, EdgeHttpProtocol) and c.idle()
        ]
        if idle:
            victim = min(idle, key=lambda c: c._idle_since)
            connections.discard(victim)  # counted out now; its close completes later
            victim._close_quietly()
            return
        if len(connections) > cap + _PROBE_RESERVE:
            log.warning("connection refused: every connection is busy", connections=cap)
            connections.discard(self)
            self.transport.abort()
            return
        self.app = _ProbesOnly(self.app, self.limits.public_paths)

    # -- requests --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            if len(self._head) + len(data) > self.limits.max_head_bytes:
                self._answer_and_close(431, "the request's head is larger than the server takes")
                return
            self._head += data
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.limits.header_seconds, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._head.clear()
        self._reading_head = False
        queued = bool(self.pipeline)
        super().on_headers_complete()
        upgrading = self.parser.should_upgrade() and self._should_upgrade()
        if upgrading or queued or bool(self.pipeline):
            # A websocket has its own pings; a pipelined request is read once the one before
            # it is answered.
            self._disarm()
        else:
            self._arm(self.limits.body_seconds, self._body_too_slow)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._disarm()  # the app answers in its own time; then uvicorn's keep-alive timer runs

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if self.limits.authenticated and _unusable_credentials(
            bytes(self._head), self.limits.public_paths
        ):
            self._answer_and_close(
                401,
                "the API token is not valid; check it against the server's configured tokens",
                extra=[(b"www-authenticate", b'Bearer realm="fleetledger", error="invalid_token"')],
            )
            return
        super().send_400_response(msg)

    # -- deadlines -------------------------------------------------------------------------------

    def _arm(self, seconds: float, expire: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close_quietly(self) -> None:
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _head_too_slow(self) -> None:
        self._answer_and_close(408, "the request's head did not arrive in time")

    def _body_too_slow(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self._close_quietly()
            return
        if cycle is not None:
            # The app, waiting for the rest of the body, sees the client gone and sends nothing.
            cycle.disconnected = True
            cycle.message_event.set()
        self._answer_and_close(408, "the request's body did not arrive in time")

    def _answer_and_close(
        self,
        status: int,
        detail: str,
        *,
        extra: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    ) -> None:
        self._disarm()
        if self.transport is None or self.transport.is_closing():
            return
        body = JSONResponse({"detail": detail}).body
        reason = {
            401: b"Unauthorized",
            408: b"Request Timeout",
            431: b"Request Header Fields Too Large",
        }
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason.get(status, b"Error"))]
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *extra,
        ]
        lines += [name + b": " + value + b"\r\n" for name, value in headers]
        self.transport.write(b"".join(lines) + b"\r\n" + body)
        self.transport.close()


def _unusable_credentials(head: bytes, public_paths: frozenset[str]) -> bool:
    """Whether the head the parser refused carries an ``Authorization`` header holding a control
    character, on a path that needs a token."""
    lines = head.split(b"\n")
    target = lines[0].split(b" ")[1] if len(lines[0].split(b" ")) > 1 else b""
    path = target.split(b"?", 1)[0].decode("latin-1")
    if path in public_paths:
        return False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"authorization":
            value = value.rstrip(b"\r")
            return any((byte < 0x20 and byte != 0x09) or byte == 0x7F for byte in value)
    return False


class _ProbesOnly:
    """A connection accepted while every other is busy: the probes are answered, nothing else
    (``503``, so that a client retries elsewhere or later)."""

    __slots__ = ("app", "public_paths")

    def __init__(self, app: ASGIApp, public_paths: frozenset[str]) -> None:
        self.app = app
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": "the server is at its connection limit; retry shortly"},
            status_code=503,
            headers={"Retry-After": "1", "Connection": "close"},
        )
        await response(scope, receive, send)


def requires_tokens(app: object) -> bool:
    """Whether ``app`` checks bearer tokens: it is a :class:`~.auth.BearerAuth`, or a Starlette
    app with one among its middleware."""
    if isinstance(app, BearerAuth):
        return True
    middleware = getattr(app, "user_middleware", ())
    return any(getattr(m, "cls", None) is BearerAuth for m in middleware)
