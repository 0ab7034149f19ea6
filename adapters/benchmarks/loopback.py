"""A load generator's HTTP/1.1 client: one keep-alive connection, JSON bodies, little else.

A benchmark on a 2-core machine shares its cores with the server it measures, so every
microsecond the client spends per request is taken from the server. aiohttp's client costs about
0.2 ms of CPU per request here, a third of what the agents' endpoint itself costs; this client
writes the request line and headers once per path and parses answers with httptools (llhttp,
the parser uvicorn serves with), at a fraction of that. It speaks to our own server on loopback
only: no TLS, redirects, cookies, proxies or chunked request bodies.
"""

from __future__ import annotations

import asyncio

import httptools
import orjson

__all__ = ["LoopbackClient"]


class LoopbackClient:
    """One keep-alive connection to ``host:port``; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._protocol: _Answers | None = None

    async def __aenter__(self) -> LoopbackClient:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(_Answers, self._host, self._port)
        self._protocol = protocol
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._protocol is not None:
            self._protocol.close()

    async def post_json(self, path: str, body: object) -> tuple[int, bytes]:
        """POST ``body`` as JSON; the answer's status and body."""
        if self._protocol is None:
            raise RuntimeError("connect first: async with LoopbackClient(host, port) as client")
        payload = orjson.dumps(body)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1")
        return await self._protocol.exchange(head + payload)


class _Answers(asyncio.Protocol):
    """Feeds what the server sends to httptools and hands each complete answer to its waiter."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionError("the server closed the connection")
        if self._waiter is not None:
            raise RuntimeError("one request at a time on a connection")
        self._waiter = asyncio.get_running_loop().create_future()
        self._body = []
        self._transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ConnectionError(f"the server's answer is not HTTP: {e}"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), b"".join(self._body)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"the connection was lost: {exc or 'closed by the server'}"))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _fail(self, error: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self._transport is not None:
            self._transport.close()
