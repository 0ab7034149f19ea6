"""A response's head held for its body, on a real event loop."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fleetledger.adapters.http.one_write import HeadWithBody


class Wire(asyncio.Transport):
    """A transport that records each write call."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted


@dataclass
class Cycle:
    response_started: bool = False
    completions: list[list[bytes]] = field(default_factory=list)
    transport: object = None


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def holder(loop: asyncio.AbstractEventLoop) -> tuple[HeadWithBody, Wire, Cycle]:
    wire, cycle = Wire(), Cycle()
    out = HeadWithBody(
        wire, loop, cycle, on_response=lambda: cycle.completions.append(list(wire.writes))
    )
    return out, wire, cycle


def turn(loop: asyncio.AbstractEventLoop) -> None:
    """One turn of the loop: the callbacks already scheduled run."""
    loop.run_until_complete(asyncio.sleep(0))


def test_a_head_and_its_body_leave_in_one_write(loop: asyncio.AbstractEventLoop) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out.write(b"{}")
    assert wire.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]


def test_later_chunks_go_straight_through(loop: asyncio.AbstractEventLoop) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"head")
    out.write(b"one")
    out.write(b"two")
    turn(loop)
    assert wire.writes == [b"headone", b"two"]


def test_a_write_before_the_response_starts_is_not_held(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``100 Continue`` is written while the response has not started: the client waits for it."""
    out, wire, _ = holder(loop)
    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert wire.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


def test_a_head_whose_body_is_late_leaves_at_the_end_of_the_turn(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A streaming response's first chunk may come much later: its client sees the head now."""
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"head")
    assert wire.writes == []
    turn(loop)
    assert wire.writes == [b"head"]
    out.write(b"chunk")
    assert wire.writes == [b"head", b"chunk"]


def test_a_response_without_a_body_sends_its_head_before_the_connection_moves_on(
    loop: asyncio.AbstractEventLoop,
) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    out.response_complete()
    assert cycle.completions == [[b"HTTP/1.1 204 No Content\r\n\r\n"]]
    turn(loop)
    assert wire.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]


def test_close_sends_what_is_held_first(loop: asyncio.AbstractEventLoop) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"head")
    out.close()
    assert wire.writes == [b"head"] and wire.closed


def test_abort_drops_what_is_held(loop: asyncio.AbstractEventLoop) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"head")
    out.abort()
    turn(loop)
    assert wire.writes == [] and wire.aborted


def test_nothing_is_written_to_a_connection_already_closing(
    loop: asyncio.AbstractEventLoop,
) -> None:
    out, wire, cycle = holder(loop)
    cycle.response_started = True
    out.write(b"head")
    wire.closed = True  # the client went away
    turn(loop)
    assert wire.writes == []


def test_a_finished_response_is_freed_without_the_collector(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The cycle holds its transport and the transport its cycle until the head is seen; after
    that, dropping the cycle frees both by reference counting."""
    out, _, cycle = holder(loop)
    cycle.transport = out
    cycle.response_started = True
    out.write(b"head")
    out.write(b"body")
    out.response_complete()
    freed = weakref.ref(cycle)
    collecting = gc.isenabled()
    gc.disable()
    try:
        del cycle, out
        assert freed() is None
    finally:
        if collecting:
            gc.enable()
