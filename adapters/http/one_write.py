"""A response's head and body leave in one write.

uvicorn writes a response's status line and headers when the app sends ``http.response.start``
and the body when it sends ``http.response.body``: two ``write`` calls, and with uvloop two
``send`` system calls made while holding the GIL. On loopback a ``send`` also runs the receiving
side's network stack and wakes the reader, so under ``wrk`` those two calls were 19 % of the
time ``serve`` held the GIL, about 50 µs per machine request: the largest single item of the
POST path. An answer sent in one go (every JSON answer of the API) needs one.

:class:`HeadWithBody` is a cycle's transport that holds the head until the body's first write
and sends both together. It never delays the head by more than the current turn of the event
loop (a streaming response whose first chunk comes later gets its head on its own), and
closing the connection or completing a response without a body (``HEAD``, ``204``) sends what
is held first. Writes before the response starts (``100 Continue``) go straight through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ForwardingTransport", "HeadWithBody", "ResponseCycle"]


class ResponseCycle(Protocol):
    """What :class:`HeadWithBody` reads of uvicorn's request-response cycle."""

    response_started: bool


class ForwardingTransport(asyncio.Transport):
    """A transport that hands every call to ``transport``; a subclass changes what it needs
    (uvicorn's protocol and its flow control use the whole interface)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def close(self) -> None:
        self._transport.close()

    def write_eof(self) -> None:
        self._transport.write_eof()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class HeadWithBody(ForwardingTransport):
    """The transport one request's response is written to (see the module docstring)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        cycle: ResponseCycle,
        *,
        on_response: Callable[[], None],
    ) -> None:
        super().__init__(transport)
        self._loop = loop
        # The cycle holds this transport, so this reference is a cycle: dropped as soon as the
        # head is seen, so that a finished request is freed by its reference count rather than
        # left to the collector (uvicorn breaks its own cycles for the same reason).
        self._cycle: ResponseCycle | None = cycle
        self._on_response: Callable[[], None] | None = on_response
        self._held: bytes | None = None
        self._backstop: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._cancel_backstop()
            self._transport.write(held + bytes(data))
        elif self._cycle is not None and self._cycle.response_started:
            # uvicorn marks the response started, then writes its head.
            self._cycle = None
            self._held = bytes(data)
            self._backstop = self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def response_complete(self) -> None:
        """The cycle's ``on_response``: what is held goes before the connection moves on."""
        self._cycle = None
        self.flush()
        # Dropped once called: it is the protocol's, and the protocol holds the cycle.
        on_response, self._on_response = self._on_response, None
        if on_response is not None:
            on_response()

    def flush(self) -> None:
        """Send what is held now."""
        held = self._held
        self._cancel_backstop()
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def _cancel_backstop(self) -> None:
        if self._backstop is not None:
            self._backstop.cancel()
            self._backstop = None

    # -- what must not overtake what is held --------------------------------------------------

    def close(self) -> None:
        self.flush()
        super().close()

    def write_eof(self) -> None:
        self.flush()
        super().write_eof()

    def abort(self) -> None:
        self._held = None
        self._cancel_backstop()
        super().abort()

    def get_write_buffer_size(self) -> int:
        return super().get_write_buffer_size() + len(self._held or b"")
