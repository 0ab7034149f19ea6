"""LoopbackClient: JSON POSTs on one keep-alive connection, answers parsed by httptools."""

from __future__ import annotations

import asyncio
import json

import pytest

from fleetledger.adapters.benchmarks.loopback import LoopbackClient


async def echo_server(*, close_after: int | None = None) -> asyncio.Server:
    """Answers each POST with its JSON body's ``n`` doubled; closes after ``close_after``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while close_after is None or answered < close_after:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            body = json.loads(await reader.readexactly(length))
            answer = json.dumps({"twice": body["n"] * 2}).encode()
            writer.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
            await writer.drain()
            answered += 1
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def test_several_posts_share_one_connection() -> None:
    async def run() -> list[tuple[int, bytes]]:
        server = await echo_server()
        async with server, LoopbackClient("127.0.0.1", port_of(server)) as client:
            return [await client.post_json("/double", {"n": n}) for n in (1, 2, 3)]

    answers = asyncio.run(run())

    assert [(code, json.loads(body)) for code, body in answers] == [
        (201, {"twice": 2}),
        (201, {"twice": 4}),
        (201, {"twice": 6}),
    ]


def test_a_connection_the_server_closed_is_an_error() -> None:
    async def run() -> None:
        server = await echo_server(close_after=1)
        async with server, LoopbackClient("127.0.0.1", port_of(server)) as client:
            await client.post_json("/double", {"n": 1})
            await client.post_json("/double", {"n": 2})

    with pytest.raises(ConnectionError):
        asyncio.run(run())
