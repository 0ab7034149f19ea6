"""The watch websocket: every testbed, job and scheduling event in log order, resumable from a
position, refused for a bad ``from``, dropping a client that stops reading."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import secrets
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from starlette.types import Message
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.http import create_app
from fleetledger.adapters.http import testbeds as testbeds_http
from fleetledger.adapters.http.watch import WatchStats, watch_router
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.testbeds import (
    BATCH_JOB,
    SCHEDULING,
    TESTBED,
    FakeApplications,
    TestbedsRuntime,
    TestbedsService,
)
from fleetledger.domain.testbeds import JobDefined
from fleetledger.eventstore import EventStore, NewEvent, StreamAppend, open_store
from tests.adapters.testbeds.support import two_nodes
from tests.waiting import eventually

TOKEN = "watch-token-0123456789abcdef"
WATCHED = sorted(
    {*TESTBED.codec.type_names(), *BATCH_JOB.codec.type_names(), *SCHEDULING.codec.type_names()}
)


def watched_positions(store: EventStore) -> list[int]:
    """The positions the watch must send, read from the log itself."""
    positions: list[int] = []
    while True:
        page = store.read_all(after=positions[-1] if positions else 0, types=WATCHED)
        positions += [r.global_position for r in page]
        if len(page) < 1000:
            return positions


def define_jobs(service: TestbedsService, *names: str) -> None:
    for name in names:
        service.define_job(name, kind="spark", image="spark:3.5", main_file=f"/{name}.py")


@contextlib.contextmanager
def running_testbeds(store: EventStore) -> Iterator[TestbedsRuntime]:
    cluster = two_nodes()
    runtime = TestbedsRuntime(
        store, cluster, FakeApplications(cluster), clock=SystemClock(), threads=False
    ).start()
    try:
        yield runtime
    finally:
        runtime.stop()


def app_for(runtime: TestbedsRuntime, *, tokens: list[str] | None = None) -> FastAPI:
    machines = MachinesRuntime(runtime.store, FakeCloud(), clock=SystemClock())
    return create_app(machines, routers=[testbeds_http.testbeds_router(runtime)], api_tokens=tokens)


def receive(session: Any, *, timeout: float = 10.0) -> dict[str, Any]:
    """The next message, or a failure after ``timeout`` (the test client's receive blocks)."""
    box: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=lambda: box.put(session.receive_json()), daemon=True).start()
    return box.get(timeout=timeout)


# -- in process --------------------------------------------------------------------------------


@pytest.fixture
def runtime(store: EventStore) -> Iterator[TestbedsRuntime]:
    with running_testbeds(store) as running:
        yield running


@pytest.fixture
def client(runtime: TestbedsRuntime) -> Iterator[TestClient]:
    with TestClient(app_for(runtime)) as test_client:
        yield test_client


class TestMessages:
    def test_from_zero_replays_every_event_in_log_order(
        self, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        """Testbed, job and scheduling events, each with its position, stream, kind and type."""
        service = runtime.service
        service.define_testbed(
            "bed", node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
        )
        define_jobs(service, "j1")
        service.create_scheduling("s1", testbed="bed", queue=("j1",))
        expected = runtime.store.read_all(types=WATCHED)

        with client.websocket_connect("/v1/watch?from=0") as session:
            messages = [receive(session) for _ in expected]

        assert [m["position"] for m in messages] == [r.global_position for r in expected]
        assert [(m["stream"], m["type"]) for m in messages] == [
            ("testbed-bed", "testbed.TestbedDefined"),
            ("batch-job-j1", "batch_job.JobDefined"),
            ("scheduling-s1", "scheduling.SchedulingCreated"),
        ]
        assert [(m["kind"], m["name"]) for m in messages] == [
            ("testbed", "bed"),
            ("job", "j1"),
            ("scheduling", "s1"),
        ]
        assert messages[1]["data"]["main_file"] == "/j1.py"

    def test_messages_start_strictly_after_from(
        self, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        define_jobs(runtime.service, "j1", "j2", "j3")
        first, second, third = watched_positions(runtime.store)

        with client.websocket_connect(f"/v1/watch?from={first}") as session:
            positions = [receive(session)["position"], receive(session)["position"]]

        assert positions == [second, third]

    def test_changes_arrive_as_they_are_appended(
        self, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        """Without ``from`` the watch starts at the head; an append wakes it."""
        define_jobs(runtime.service, "old")

        with client.websocket_connect("/v1/watch") as session:
            define_jobs(runtime.service, "new")
            message = receive(session)

        assert (message["name"], message["position"]) == ("new", runtime.store.head())

    def test_other_capabilities_events_are_not_sent(
        self, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        """Only the testbeds' event types are watched."""
        with client.websocket_connect("/v1/watch") as session:
            runtime.store.append("elsewhere-1", [NewEvent("elsewhere.Happened", {"n": 1})])
            define_jobs(runtime.service, "j1")
            message = receive(session)

        assert message["type"] == "batch_job.JobDefined"


class TestOtherProcesses:
    def test_an_append_by_another_process_reaches_the_watch(
        self, store_url: str, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        """Another process's store appends: a notification on Postgres, the watch's periodic
        re-read on SQLite, brings it to the client."""
        with (
            client.websocket_connect("/v1/watch") as session,
            contextlib.closing(open_store(store_url)) as other,
        ):
            define_jobs(TestbedsService(other, clock=SystemClock()), "elsewhere")
            message = receive(session)

        assert (message["name"], message["position"]) == ("elsewhere", runtime.store.head())


class TestBadFrom:
    @pytest.mark.parametrize("value", ["abc", "-1", "1.5", ""])
    def test_a_non_position_is_refused_before_the_handshake(
        self, client: TestClient, value: str
    ) -> None:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect(f"/v1/watch?from={value}"),
        ):
            pass

        assert refused.value.status_code == 400
        assert "integer" in refused.value.json()["detail"]

    def test_a_position_past_the_head_is_refused(
        self, runtime: TestbedsRuntime, client: TestClient
    ) -> None:
        """A position this log never had: another database's, most likely."""
        define_jobs(runtime.service, "j1")

        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/watch?from=99"),
        ):
            pass

        assert refused.value.status_code == 400
        assert "past the log's head (1)" in refused.value.json()["detail"]

    def test_without_the_denial_extension_the_reason_comes_with_a_close(
        self, runtime: TestbedsRuntime
    ) -> None:
        """A server that cannot answer a handshake with HTTP gets a close (1008) with the
        reason instead of a bare 403."""
        app = FastAPI()
        app.include_router(watch_router(runtime.store))
        sent: list[Message] = []
        incoming = iter([{"type": "websocket.connect"}])

        async def receive_message() -> Message:
            return next(incoming, {"type": "websocket.disconnect", "code": 1000})

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {
            "type": "websocket",
            "path": "/v1/watch",
            "raw_path": b"/v1/watch",
            "query_string": b"from=abc",
            "headers": [],
            "scheme": "ws",
            "server": ("testserver", 80),
            "client": ("testclient", 50000),
            "root_path": "",
            "subprotocols": [],
            "asgi": {"version": "3.0", "spec_version": "2.4"},
        }
        asyncio.run(app(scope, receive_message, send))

        assert [m["type"] for m in sent] == ["websocket.accept", "websocket.close"]
        assert sent[1]["code"] == 1008
        assert "integer" in sent[1]["reason"]


class TestTokens:
    def test_a_handshake_without_a_token_is_401(self, runtime: TestbedsRuntime) -> None:
        """The API's tokens guard the watch too, before it is accepted."""
        with (
            TestClient(app_for(runtime, tokens=[TOKEN])) as client,
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/watch"),
        ):
            pass

        assert refused.value.status_code == 401
        assert refused.value.headers["www-authenticate"].startswith("Bearer")

    def test_a_handshake_with_a_token_is_served(self, runtime: TestbedsRuntime) -> None:
        with TestClient(app_for(runtime, tokens=[TOKEN])) as client:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with client.websocket_connect("/v1/watch", headers=headers) as session:
                define_jobs(runtime.service, "j1")
                message = receive(session)

        assert message["name"] == "j1"


# -- over a real server ------------------------------------------------------------------------


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn on a loopback port; yields its ws:// base URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: server.started), "uvicorn did not start"
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def open_watch(url: str, *, position: int) -> ClientConnection:
    return connect(
        f"{url}/v1/watch?from={position}",
        additional_headers={"Authorization": f"Bearer {TOKEN}"},
        compression=None,
        open_timeout=10,
        # Unbounded, so that closing mid-stream does not wait for the frames in flight to be
        # read: with a full queue the client stops reading and never sees the server's close.
        max_queue=None,
    )


def read_until(watch: ClientConnection, last: int) -> list[int]:
    """Positions received until ``last`` arrives (10 s at most between messages)."""
    positions: list[int] = []
    while not positions or positions[-1] < last:
        positions.append(json.loads(watch.recv(timeout=10))["position"])
    return positions


class TestOverTheNetwork:
    def test_a_client_that_reconnects_misses_nothing_and_sees_nothing_twice(
        self, runtime: TestbedsRuntime
    ) -> None:
        """Disconnected mid-stream, resumed from the last position it received: together the
        two connections deliver exactly the log's events, in order."""
        define_jobs(runtime.service, *(f"a{i}" for i in range(30)))
        with serving(app_for(runtime, tokens=[TOKEN])) as url:
            with open_watch(url, position=0) as watch:
                first = [json.loads(watch.recv(timeout=10))["position"] for _ in range(12)]
            # Gone: the log moves on without it.
            define_jobs(runtime.service, *(f"b{i}" for i in range(30)))
            with open_watch(url, position=first[-1]) as watch:
                rest = read_until(watch, runtime.store.head())
                # Live again: an append after it caught up arrives as well.
                define_jobs(runtime.service, "c0")
                rest += read_until(watch, runtime.store.head())

        assert first + rest == watched_positions(runtime.store)

    def test_a_handshake_without_a_token_is_refused_on_the_wire(
        self, runtime: TestbedsRuntime
    ) -> None:
        with (
            serving(app_for(runtime, tokens=[TOKEN])) as url,
            pytest.raises(InvalidStatus) as refused,
        ):
            connect(f"{url}/v1/watch", open_timeout=10)

        assert refused.value.response.status_code == 401


def bulky_jobs(store: EventStore, count: int, size: int) -> None:
    """``count`` jobs with an argument of ``size`` random characters each, in one append."""
    appends = []
    at = datetime.now(UTC)
    for index in range(count):
        name = f"bulk{index}"
        event = JobDefined(name, "spark", "spark:3.5", "/x.py", (secrets.token_hex(size // 2),), at)
        stream = BATCH_JOB.stream_of(name)
        records = BATCH_JOB.codec.encode(stream, 1, [event], causation_ids=["test"], actor="test")
        appends.append(StreamAppend(stream, records, expected_version=0))
    store.append_many(appends)


def test_a_client_that_stops_reading_is_dropped_with_where_to_resume(store: EventStore) -> None:
    """A client that reads nothing fills the connection; after the send timeout it is closed
    with 1013 and the position to reconnect from, which is the last message it was sent."""
    stats = WatchStats()
    app = FastAPI()
    app.include_router(watch_router(store, send_timeout=0.5, stats=stats))
    # More than the server's socket buffer (4 MiB at most here) and the client's can hold.
    bulky_jobs(store, count=120, size=100_000)
    with serving(app) as url:
        # A receive buffer set before connecting (a window the client drains at speed once it
        # reads) and a queue of one message: the client stops taking data off the socket.
        stalling = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalling.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        stalling.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        received: list[int] = []
        with connect(
            f"{url}/v1/watch?from=0", sock=stalling, compression=None, max_queue=1
        ) as stalled:
            assert eventually(lambda: stats.dropped_slow == 1), "the stalled client stayed"
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    received.append(json.loads(stalled.recv(timeout=10))["position"])

        close = closed.value.rcvd
        assert close is not None and close.code == 1013
        assert close.reason.startswith("client too slow:")
        assert close.reason.endswith(f"reconnect with from={received[-1]}")
        with connect(f"{url}/v1/watch?from={received[-1]}", compression=None) as watch:
            rest = read_until(watch, store.head())

    assert received + rest == watched_positions(store)
    assert len(received) < 120


def test_watchers_past_the_limit_are_refused_until_one_leaves(store: EventStore) -> None:
    """The server's work is bounded in clients too: 503, then served once there is room."""
    stats = WatchStats()
    app = FastAPI()
    app.include_router(watch_router(store, max_clients=1, stats=stats))
    with TestClient(app) as client, client.websocket_connect("/v1/watch"):
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/watch"),
        ):
            pass
        assert refused.value.status_code == 503
    with TestClient(app) as client, client.websocket_connect("/v1/watch"):
        assert eventually(lambda: stats.clients == 1)
    assert eventually(lambda: stats.clients == 0)
