"""A live watch of testbeds, slots, batch jobs and schedulings: ``WS /v1/watch?from=POSITION``.

Every event of the testbed, batch job and scheduling streams is pushed as it is appended, in log
order, one JSON text message each::

    {"position": 42, "stream": "testbed-bed", "kind": "testbed", "name": "bed",
     "type": "testbed.SlotReserved", "recorded_at": "2025-01-01T00:00:00+00:00", "data": {...}}

``position`` is the event's global log position, ``type`` its stored name (the aggregates'
codecs in :mod:`fleetledger.adapters.testbeds.aggregates` list them), ``data`` its fields. Slots
change with a testbed's ``testbed.ClusterObserved``, ``testbed.SlotReserved`` and
``testbed.ReservationCleared`` events.

``from`` is the last position the client has seen: messages start strictly after it, so a client
that reconnects with the position of the last message it received misses nothing and sees
nothing twice. Without ``from`` the watch starts at the log's head (changes from now on).
``from=0`` replays everything. A ``from`` that is not a non-negative integer, or lies past the
log's head (a position of another log), is refused before the websocket opens: ``400`` with
``{"detail": …}``, or — on a server without the websocket denial extension — close code ``1008``
with the reason. Past ``max_clients`` watchers, or with the log unreachable, a connection is
refused with ``503`` (close code ``1013``): reconnect later.

Each client is served from the log itself: its handler reads a page of events after its
position, sends them, and reads on; once caught up it sleeps until the store signals an append
(one thread per watch relays the store's wake-ups to every waiting client, which reads the log
again only when woken, or after 5 s of quiet). So a client that reads slowly only falls behind
in the log, never in the server's memory: what the server holds per client is one page and the
connection's send buffer. A client that stops reading — a send does not complete within
``send_timeout`` — is closed with code ``1013`` and a reason such as ``client too slow: 5000
events behind; reconnect with from=1234`` (1234: the last position sent to it). A log that
cannot be read closes the watch with ``1013`` as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import structlog
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from fleetledger.adapters.testbeds import BATCH_JOB, SCHEDULING, TESTBED
from fleetledger.eventstore import EventStore, EventStoreError, RecordedEvent

__all__ = [
    "DEFAULT_MAX_CLIENTS",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_SEND_TIMEOUT",
    "WATCH_PATH",
    "WatchStats",
    "watch_router",
]

log = structlog.get_logger(__name__)

WATCH_PATH = "/v1/watch"
DEFAULT_PAGE_SIZE = 100
"""Events read from the log at once per client: what the server holds per client, at most."""
DEFAULT_MAX_CLIENTS = 256
"""Watchers served at once; more are refused (503) until some leave."""
DEFAULT_SEND_TIMEOUT = 10.0
"""Seconds a send may wait for a client that does not read before the client is dropped."""
_CLOSE_GRACE = 10.0
"""Seconds the closing frame may wait for a stalled client to read what was sent before it."""
_IDLE_SECONDS = 5.0
"""How long the wake-up relay's thread waits at once: waiting clients read the log at least this
often; the thread stops when nobody has been waiting."""
_MAX_REASON_BYTES = 123
"""A close frame's reason fits in a control frame: 125 bytes less the code's two."""
_POSITION = re.compile(r"[0-9]{1,19}")
_KINDS = ((TESTBED, "testbed"), (BATCH_JOB, "job"), (SCHEDULING, "scheduling"))


class WatchStats:
    """What the watch has done so far, for operators (and tests) to read."""

    __slots__ = ("_lock", "clients", "dropped_slow", "refused", "sent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.clients = 0
        """Clients connected now."""
        self.sent = 0
        """Messages sent, over all clients."""
        self.dropped_slow = 0
        """Clients closed because they did not read."""
        self.refused = 0
        """Connections refused: a bad ``from``, the log unreachable, too many clients."""

    def admit(self, limit: int) -> bool:
        """Count one more client if fewer than ``limit`` are connected."""
        with self._lock:
            if self.clients >= limit:
                return False
            self.clients += 1
            return True

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)


def watch_router(
    store: EventStore,
    *,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    page_size: int = DEFAULT_PAGE_SIZE,
    max_clients: int = DEFAULT_MAX_CLIENTS,
    stats: WatchStats | None = None,
) -> APIRouter:
    """The ``/v1/watch`` websocket over ``store`` (see the module docstring)."""
    if not send_timeout > 0:
        raise ValueError(f"send_timeout must be a positive number of seconds, got {send_timeout}")
    for what, value in (("page_size", page_size), ("max_clients", max_clients)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{what} must be a positive integer, got {value!r}")
    # Each watched event type's kind of resource, and the prefix of its streams' ids.
    kinds = {
        name: (kind, aggregate.stream_of(""))
        for aggregate, kind in _KINDS
        for name in aggregate.codec.type_names()
    }
    types = sorted(kinds)
    relay = _WakeRelay(store, types)
    counts = stats if stats is not None else WatchStats()
    router = APIRouter(tags=["testbeds"])

    @router.websocket(WATCH_PATH)
    async def watch(websocket: WebSocket) -> None:
        start = await _start(websocket, store)
        if start is None:
            counts.add(refused=1)
            return
        if not counts.admit(max_clients):
            counts.add(refused=1)
            await _refuse(websocket, 503, f"{max_clients} watchers already; reconnect later", 1013)
            return
        client = _Client(
            websocket, store=store, relay=relay, types=types, kinds=kinds, stats=counts
        )
        try:
            await websocket.accept()
            await client.serve(start, page_size=page_size, send_timeout=send_timeout)
        finally:
            counts.add(clients=-1)

    return router


async def _start(websocket: WebSocket, store: EventStore) -> int | None:
    """The position to start after, or ``None`` once the connection has been refused."""
    text = websocket.query_params.get("from")
    try:
        head = await run_in_threadpool(store.head)
    except EventStoreError as e:
        log.warning("watch refused: the log is unreachable", error=str(e))
        await _refuse(websocket, 503, "the event log is unreachable; reconnect later", 1013)
        return None
    if text is None:
        return head
    if _POSITION.fullmatch(text) is None:
        await _refuse(websocket, 400, "from must be a log position: an integer >= 0", 1008)
        return None
    position = int(text)
    if position > head:
        await _refuse(
            websocket,
            400,
            f"from={position} is past the log's head ({head}); "
            "is it a position of another database?",
            1008,
        )
        return None
    return position


async def _refuse(websocket: WebSocket, status: int, reason: str, code: int) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse({"detail": reason}, status_code=status))
        return
    # Without the extension a close before the handshake reaches the client as a bare 403:
    # accept, then close with the reason.
    await websocket.accept()
    await websocket.close(code, _fitting(reason))


class _Client:
    """One watching client: pages from the log, sent in order, waits for appends."""

    def __init__(
        self,
        websocket: WebSocket,
        *,
        store: EventStore,
        relay: _WakeRelay,
        types: Sequence[str],
        kinds: dict[str, tuple[str, str]],
        stats: WatchStats,
    ) -> None:
        self.websocket = websocket
        self.store = store
        self.relay = relay
        self.types = list(types)
        self.kinds = kinds
        self.stats = stats
        self.gone = asyncio.Event()

    async def serve(self, position: int, *, page_size: int, send_timeout: float) -> None:
        listener = asyncio.create_task(self._listen())
        try:
            while not self.gone.is_set():
                seen = self.relay.sequence()
                try:
                    page = await run_in_threadpool(
                        self.store.read_all, after=position, limit=page_size, types=self.types
                    )
                except EventStoreError as e:
                    log.warning("watch closed: the log is unreachable", error=str(e))
                    await self._close(
                        1013, f"the event log is unreachable; reconnect with from={position}"
                    )
                    return
                for record in page:
                    try:
                        await asyncio.wait_for(
                            self.websocket.send_text(self._message(record)), send_timeout
                        )
                    except TimeoutError:
                        await self._drop_slow(position)
                        return
                    except (WebSocketDisconnect, RuntimeError):
                        return  # the client went away mid-send
                    position = record.global_position
                    self.stats.add(sent=1)
                if len(page) < page_size:
                    await self.relay.wait(seen, self.gone)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self) -> None:
        # The client has nothing to say; reading tells when it leaves (and keeps the protocol's
        # pings answered). Whatever it sends is dropped.
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            self.gone.set()

    async def _drop_slow(self, position: int) -> None:
        try:
            head = await run_in_threadpool(self.store.head)
            behind = f"{max(0, head - position)} events behind"
        except EventStoreError:
            behind = "behind"
        reason = f"client too slow: {behind}; reconnect with from={position}"
        log.info("watch client dropped: it does not read", position=position, reason=reason)
        self.stats.add(dropped_slow=1)
        await self._close(1013, reason)

    async def _close(self, code: int, reason: str) -> None:
        # A stalled client may never make room for the closing frame: give up after a while;
        # the server then closes the connection.
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError):
            await asyncio.wait_for(self.websocket.close(code, _fitting(reason)), _CLOSE_GRACE)

    def _message(self, record: RecordedEvent) -> str:
        kind, prefix = self.kinds.get(record.type, ("", ""))
        message: dict[str, Any] = {
            "position": record.global_position,
            "stream": record.stream_id,
            "kind": kind,
            "name": record.stream_id.removeprefix(prefix),
            "type": record.type,
            "recorded_at": record.recorded_at.isoformat(),
            "data": record.data,
        }
        return orjson.dumps(message).decode()


class _WakeRelay:
    """The store's append signal, relayed to waiting coroutines on any event loop.

    One thread waits on the store (``wait_for_wake`` for the watched event types; other
    processes' appends on Postgres arrive as notifications) while any client waits, and bumps
    :meth:`sequence` for each wake-up, and every few seconds while clients wait (appends of
    other processes on SQLite are signalled to nobody). A client reads :meth:`sequence`
    *before* reading the log and then waits for it to move: an append it did not read was
    signalled after that, so the wait returns. The thread starts on demand, counts its start as
    a wake-up (appends made while nobody listened), and ends once nobody has waited for a while.
    """

    def __init__(self, store: EventStore, types: Sequence[str]) -> None:
        self._store = store
        self._types = tuple(types)
        self._lock = threading.Lock()
        self._sequence = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._thread: threading.Thread | None = None

    def sequence(self) -> int:
        with self._lock:
            return self._sequence

    async def wait(self, seen: int, stop: asyncio.Event) -> None:
        """Return once the sequence has moved past ``seen``, or ``stop`` is set."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (loop, future)
        with self._lock:
            if self._sequence != seen:
                return
            self._waiters.add(waiter)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="watch-wake-relay", daemon=True
                )
                self._thread.start()
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        either: set[asyncio.Future[Any]] = {future, stopped}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            with self._lock:
                self._waiters.discard(waiter)

    def _run(self) -> None:
        try:
            seen = self._store.wake_sequence()
            self._bump()
            while True:
                woken = self._store.wait_for_wake(seen, timeout=_IDLE_SECONDS, types=self._types)
                with self._lock:
                    if not woken and not self._waiters:
                        self._thread = None
                        return
                # Woken, or a quiet spell with clients waiting: they read the log once more
                # then, for appends no signal announces (another process's, on SQLite).
                seen = self._store.wake_sequence()
                self._bump()
        except Exception as e:
            # The next waiter starts a new thread; those waiting now read the log again (and
            # close their watch if it cannot be read).
            log.error("watch wake-up relay failed", error=str(e), kind=type(e).__name__)
            with self._lock:
                self._thread = None
            self._bump()

    def _bump(self) -> None:
        with self._lock:
            self._sequence += 1
            waiters = list(self._waiters)
        for loop, future in waiters:
            # A closed loop raises RuntimeError: nobody is left waiting there.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fitting(reason: str) -> str:
    encoded = reason.encode()
    if len(encoded) <= _MAX_REASON_BYTES:
        return reason
    return encoded[: _MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."
