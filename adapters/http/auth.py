"""Bearer tokens: nobody but a holder of a configured token gets past the probes.

Every request, websocket handshakes included, needs ``Authorization: Bearer <token>`` except the
probes in :data:`PUBLIC_PATHS` (``/healthz``, ``/readyz``, ``/metrics``), which orchestrators and
scrapers call without credentials. The check is an ASGI middleware over the whole app rather than
a per-route dependency, so a router included later is protected without anyone remembering to,
and a caller without a token is refused before its body is read or parsed.
:func:`document_bearer_auth` writes the scheme into the OpenAPI schema, on every operation but
the probes.

Several tokens may be valid at once, for rotation: add the new one, move the clients, drop the
old one. Tokens are compared as SHA-256 digests with :func:`hmac.compare_digest` against every
configured token, so neither a token's length nor which token matched shows in the timing. Tokens
never appear in logs, reprs or error bodies.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "ENV_VARIABLE",
    "MIN_TOKEN_LENGTH",
    "PUBLIC_PATHS",
    "ApiTokens",
    "BearerAuth",
    "check_exposure",
    "document_bearer_auth",
]

log = structlog.get_logger(__name__)

ENV_VARIABLE = "FLEETLEDGER_API_TOKENS"
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MIN_TOKEN_LENGTH = 16
"""Shorter tokens can be guessed; ``openssl rand -hex 32`` gives a good one."""
_SCHEME = "bearerAuth"
# RFC 6750 ``b64token``: what may follow "Bearer " in a header.
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
_CHALLENGE = 'Bearer realm="fleetledger"'
# The ASGI extension that lets a websocket handshake be answered with an HTTP response.
_DENIAL = "websocket.http.response"


class ApiTokens:
    """The set of accepted tokens, validated once at construction."""

    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        digests = []
        for position, token in enumerate(tokens, start=1):
            _check_token(position, token)
            digests.append(_digest(token))
        if not digests:
            raise ValueError(
                f"no API token given; set {ENV_VARIABLE}=<token>[,<token>…] or pass --api-token"
            )
        self._digests = tuple(digests)

    @classmethod
    def parse(cls, text: str) -> ApiTokens:
        """Tokens from comma-separated ``text`` (as in :data:`ENV_VARIABLE`); blanks ignored."""
        return cls(part.strip() for part in text.split(",") if part.strip())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiTokens | None:
        """Tokens from :data:`ENV_VARIABLE`, or ``None`` when it is unset or empty."""
        text = (os.environ if environ is None else environ).get(ENV_VARIABLE, "")
        return cls.parse(text) if text.strip() else None

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one of the configured tokens, in time independent of which."""
        candidate = _digest(token)
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(digest, candidate)
        return matched

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiTokens(<{len(self._digests)} token(s)>)"


def _check_token(position: int, token: object) -> None:
    if not isinstance(token, str):
        raise ValueError(f"API token {position} must be a string")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"API token {position} is {len(token)} characters long; use at least "
            f"{MIN_TOKEN_LENGTH} (e.g. `openssl rand -hex 32`)"
        )
    if _TOKEN_CHARS.match(token) is None:
        raise ValueError(
            f"API token {position} may hold only letters, digits and - . _ ~ + / "
            "(and = at the end), so that it fits in an Authorization header"
        )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def check_exposure(host: str, tokens: ApiTokens | None, *, allow_open: bool = False) -> None:
    """Refuse (``ValueError``) to serve an open API beyond loopback unless ``allow_open``.

    Without tokens anyone who reaches the port can create VMs; on loopback that is only this
    machine, anywhere else it needs an explicit decision (``serve --insecure-no-auth``).
    """
    if tokens is not None or allow_open or _is_loopback(host):
        return
    raise ValueError(
        f"refusing to serve on {host} without API tokens: set {ENV_VARIABLE}=<token>[,<token>…] "
        "(or --api-token), or pass --insecure-no-auth to serve an open API on purpose"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere, or "" (every interface)


class BearerAuth:
    """ASGI middleware: 401 with ``WWW-Authenticate`` for requests without a valid token.

    Websocket handshakes (``/v1/watch``) are checked the same way, before they are accepted:
    the same ``401`` where the server can answer a handshake with an HTTP response (uvicorn
    can), otherwise a close with code ``1008``, which the server sends as ``403``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: ApiTokens,
        public_paths: Iterable[str] = PUBLIC_PATHS,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.public_paths = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        token = _bearer_token(scope)
        if token is not None and self.tokens.accepts(token):
            await self.app(scope, receive, send)
            return
        # Never the header itself: a token sent to the wrong server is still a secret.
        log.info(
            "refused a request without a valid API token",
            path=scope["path"],
            reason="no bearer token" if token is None else "unknown token",
        )
        challenge = _CHALLENGE if token is None else f'{_CHALLENGE}, error="invalid_token"'
        detail = (
            "send an API token: Authorization: Bearer <token>"
            if token is None
            else "the API token is not valid; check it against the server's configured tokens"
        )
        response = JSONResponse(
            {"detail": detail}, status_code=401, headers={"WWW-Authenticate": challenge}
        )
        if scope["type"] == "websocket" and _DENIAL not in scope.get("extensions", {}):
            # A server that cannot send an HTTP answer to a handshake turns a close before
            # accepting into a bare 403.
            await send({"type": "websocket.close", "code": 1008, "reason": "not authorised"})
            return
        await response(scope, receive, send)


def _bearer_token(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            header: str = value.decode("latin-1")
            scheme, _, token = header.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def document_bearer_auth(app: FastAPI, *, public_paths: Iterable[str] = PUBLIC_PATHS) -> None:
    """Declare the bearer scheme in ``app``'s OpenAPI schema, required by every operation
    outside ``public_paths``, each documenting its ``401``. Routes included later are covered:
    the schema is built on first use."""
    public = frozenset(public_paths)
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})[_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": f"One of the tokens configured on the server ({ENV_VARIABLE}).",
        }
        for path, operations in schema.get("paths", {}).items():
            if path in public:
                continue
            for operation in operations.values():
                operation["security"] = [{_SCHEME: []}]
                operation.setdefault("responses", {})["401"] = {
                    "description": "no API token, or not a valid one (see WWW-Authenticate)"
                }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
