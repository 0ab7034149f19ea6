"""A leader partitioned from its database: does any machine get create-called by two processes?

Two controllers (two machines runtimes, each with its own store, lease and leadership, as two
``serve`` processes would have) share one Postgres scratch database — each through a loopback TCP
proxy of its own — and one fake cloud. A burst goes to the leader; once its batches are in the
cloud, its network to the database fails for ``partition_seconds`` (three leases by default),
in one of two ways:

- ``stall`` (the default): a partition. Nothing passes either way, but no connection is closed:
  no reset reaches either side (:class:`StallingProxy`). The server ends the leader's lease
  session once it has been idle for the lease time and the lock passes on; the leader's own
  renewal just waits, so it believes it leads until the network comes back — then every write it
  had queued goes out at once. Only its acting deadline stops it meanwhile.
- ``cut``: every connection reset, new ones refused (:class:`~.tcp_proxy.TcpProxy`). Both
  sides learn at once; the lock passes immediately, and the leader's next renewal fails.

A second burst goes to the other controller, which takes the lease over. Then the network comes
back and every request is waited for.

The cloud keeps a record of which controller create-called each machine name (the calls that
got past the controller's self-fencing guard, i.e. that reached the cloud). A name create-called
by both is a *partition double attempt*: create-only semantics keep it from becoming two
machines, but it is a write the old leader had no right to make. The figure must be 0.

:func:`measure_partition` returns the figures as a dict, for ``bench reliability``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, Literal, Protocol

import structlog
from sqlalchemy.engine import make_url

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CloudMachines,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
)
from fleetledger.adapters.machines import (
    CoordinatorOptions,
    MachineOutcome,
    MachineRequest,
    MachinesRuntime,
)
from fleetledger.adapters.runtime.leadership import Leadership, PostgresLease
from fleetledger.adapters.runtime.self_fencing import FencedCloud, SelfFence
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import normalise_url

from .scratch import scratch_database
from .tcp_proxy import TcpProxy

__all__ = ["CloudCalls", "Fault", "StallingProxy", "measure_partition"]

Fault = Literal["stall", "cut"]

log = structlog.get_logger("bench.partition")

_TEMPLATE = MachineTemplate(vm_size="Standard_D4s_v5")
_CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=100), max_timeout=timedelta(seconds=1), max_batch_size=10
)
_TERMINAL = ["vm.MachineCreated", "vm.MachineFailed"]


class CloudCalls:
    """Which controller create-called which machine name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callers: dict[str, set[str]] = defaultdict(set)
        self._calls: dict[str, int] = defaultdict(int)

    def note(self, controller: str, names: tuple[str, ...]) -> None:
        with self._lock:
            self._calls[controller] += 1
            for name in names:
                self._callers[name].add(controller)

    def calls(self, controller: str) -> int:
        """The create calls ``controller`` made."""
        with self._lock:
            return self._calls[controller]

    def double_attempts(self) -> list[str]:
        """The names create-called by more than one controller."""
        with self._lock:
            return sorted(name for name, who in self._callers.items() if len(who) > 1)

    def names(self) -> int:
        with self._lock:
            return len(self._callers)


class StallingProxy:
    """A loopback TCP proxy to ``target`` that can stop forwarding without closing anything:
    :meth:`stall` holds every byte (either way) and every new connection's first byte until
    :meth:`resume`, as a network partition does — no reset, no FIN, nothing."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="stalling-proxy", daemon=True).start()

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65_536)
                # Held, not dropped: what was sent during the partition arrives after it, as
                # TCP's retransmissions would deliver it.
                self._flowing.wait()
                if not data or self._closed.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


class _Network(Protocol):
    host: str
    port: int

    def close(self) -> None: ...


class _RecordingCloud:
    """One controller's view of the shared cloud, noting its create calls."""

    def __init__(self, cloud: CloudMachines, calls: CloudCalls, controller: str) -> None:
        self._cloud = cloud
        self._calls = calls
        self._controller = controller

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self._calls.note(self._controller, request.machine_names)
        return self._cloud.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self._cloud.read_machine(machine_name, resume_token=resume_token)


class _Controller:
    """One controller: its proxy to the database, store, lease, leadership and runtime."""

    def __init__(
        self,
        name: str,
        url: str,
        cloud: CloudMachines,
        calls: CloudCalls,
        *,
        lease_seconds: float,
        self_fencing: bool,
        fault: Fault,
    ) -> None:
        target = make_url(url)
        self.name = name
        self._fault = fault
        host, port = target.host or "127.0.0.1", target.port or 5432
        self.proxy: _Network = (
            StallingProxy(host, port) if fault == "stall" else TcpProxy(host, port)
        )
        through = (
            make_url(url)
            .set(host=self.proxy.host, port=self.proxy.port)
            .render_as_string(hide_password=False)
        )
        self.store: EventStore = open_store(through)
        clock = SystemClock()
        self.leadership = Leadership(
            self.store,
            PostgresLease(through, lease_seconds=lease_seconds, connect_timeout=2),
            clock=clock,
            holder=name,
            check_interval=max(0.2, lease_seconds / 5),
            lease_seconds=lease_seconds if self_fencing else None,
        )
        seen: CloudMachines = _RecordingCloud(cloud, calls, name)
        if self_fencing:
            seen = FencedCloud(seen, SelfFence(self.leadership))
        self.runtime = MachinesRuntime(
            self.store,
            seen,
            clock=clock,
            config=_CONFIG,
            coordinator_options=CoordinatorOptions(
                write_rate=None, read_poll_seconds=0.2, read_timeout_seconds=120
            ),
            leadership=self.leadership,
            stop_timeout=5,
        )

    def partition(self) -> None:
        if isinstance(self.proxy, StallingProxy):
            self.proxy.stall()
        elif isinstance(self.proxy, TcpProxy):
            self.proxy.cut()

    def heal(self) -> None:
        if isinstance(self.proxy, StallingProxy):
            self.proxy.resume()
        elif isinstance(self.proxy, TcpProxy):
            self.proxy.restore()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.runtime.stop(timeout=5)
        self.proxy.close()
        self.store.close()


def measure_partition(
    url: str | None,
    *,
    lease_seconds: float = 4.0,
    partition_seconds: float | None = None,
    requests: int = 100,
    cloud_latency: float = 1.0,
    self_fencing: bool = True,
    fault: Fault = "stall",
    outcome_timeout: float = 120.0,
) -> dict[str, Any]:
    """Cut the leader off from the database for ``partition_seconds`` (default: three leases)
    while ``requests`` machines are in its hands and as many more go to the other controller;
    the figures (see the module docstring); ``fault`` is how the network fails (``stall`` or
    ``cut``, see there). ``self_fencing=False`` builds the controllers
    without the guard and the acting deadline, to show what they prevent.

    On a scratch database beside ``url``, which must be Postgres: an embedded SQLite database
    has no connection to cut."""
    partition = 3 * lease_seconds if partition_seconds is None else partition_seconds
    if partition <= 0 or requests < 1:
        raise ValueError("partition_seconds must be > 0 and requests at least 1")
    if fault not in ("stall", "cut"):
        raise ValueError(f"fault must be 'stall' or 'cut', not {fault!r}")
    with scratch_database(url) as scratch:
        if normalise_url(scratch).get_backend_name() != "postgresql":
            raise ValueError(
                "the partition bench needs Postgres: an embedded SQLite database has no "
                "connection to cut; give a postgresql:// URL"
            )
        cloud = FakeCloud(latency=cloud_latency)
        calls = CloudCalls()
        with _controllers(
            scratch,
            cloud=cloud,
            calls=calls,
            lease_seconds=lease_seconds,
            self_fencing=self_fencing,
            fault=fault,
        ) as controllers:
            return _run(
                controllers,
                calls,
                scratch,
                lease_seconds=lease_seconds,
                partition=partition,
                requests=requests,
                outcome_timeout=outcome_timeout,
                self_fencing=self_fencing,
                fault=fault,
            )


@contextlib.contextmanager
def _controllers(
    url: str,
    *,
    cloud: CloudMachines,
    calls: CloudCalls,
    lease_seconds: float,
    self_fencing: bool,
    fault: Fault,
) -> Iterator[list[_Controller]]:
    controllers: list[_Controller] = []
    try:
        for name in ("controller-1", "controller-2"):
            controllers.append(
                _Controller(
                    name,
                    url,
                    cloud,
                    calls,
                    lease_seconds=lease_seconds,
                    self_fencing=self_fencing,
                    fault=fault,
                )
            )
            # One after the other: the first to start leads.
            controllers[-1].runtime.start()
            _wait(lambda: controllers[0].leadership.term() is not None, 30, "a first leader")
        yield controllers
    finally:
        for controller in controllers:
            controller.close()


def _run(
    controllers: list[_Controller],
    calls: CloudCalls,
    url: str,
    *,
    lease_seconds: float,
    partition: float,
    requests: int,
    outcome_timeout: float,
    self_fencing: bool,
    fault: Fault,
) -> dict[str, Any]:
    leader, follower = controllers
    before = _burst(leader, "before", requests)
    _wait(lambda: calls.calls(leader.name) > 0, 30, "the leader's first create call")

    cut_at = time.monotonic()
    leader.partition()
    during = _burst(follower, "during", requests)
    roles: set[str] = set()
    takeover: float | None = None
    while time.monotonic() - cut_at < partition:
        roles.add(leader.runtime.role)
        if takeover is None and follower.leadership.term() is not None:
            takeover = time.monotonic() - cut_at
        # Sampling the roles of a partition that lasts a fixed time: waiting is the point.
        threading.Event().wait(0.05)
    leader.heal()

    request_ids = [f"{prefix}-{n}" for prefix in ("before", "during") for n in range(requests)]
    _wait(lambda: _settled(url, request_ids), outcome_timeout, "every request's outcome")
    doubles = calls.double_attempts()
    for future in before + during:
        # Answered by now (or told the controller stopped); only the log's outcomes count.
        future.cancel()
    log.info("partition measured", double_attempts=len(doubles), takeover_seconds=takeover)
    return {
        "partition_double_attempts": len(doubles),
        "double_attempted_names": doubles[:20],
        "machine_names_attempted": calls.names(),
        "create_calls": {c.name: calls.calls(c.name) for c in controllers},
        "requests": len(request_ids),
        "takeover_seconds": None if takeover is None else round(takeover, 3),
        "old_leader_roles": sorted(roles),
        "lease_seconds": lease_seconds,
        "partition_seconds": partition,
        "self_fencing": self_fencing,
        "fault": fault,
    }


def _burst(controller: _Controller, prefix: str, count: int) -> list[Future[MachineOutcome]]:
    return controller.runtime.machines.enqueue_many(
        [
            MachineRequest(
                machine_name=f"m-{prefix}-{n}", template=_TEMPLATE, request_id=f"{prefix}-{n}"
            )
            for n in range(count)
        ]
    )


def _settled(url: str, request_ids: list[str]) -> bool:
    with contextlib.closing(open_store(url)) as store:
        done = {str(e.data["request_id"]) for e in store.read_all(limit=100_000, types=_TERMINAL)}
    return done.issuperset(request_ids)


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"partition bench: no {what} within {timeout} s")
        threading.Event().wait(0.05)
