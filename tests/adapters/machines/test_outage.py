"""A database outage must not leave work hanging: the runtime reconnects and resumes by itself.

The runtime runs on a real Postgres, either through a loopback TCP proxy that cuts every
connection and refuses new ones for a while (a lost network), or with its sessions killed by
``pg_terminate_backend`` (a restarted or failed-over server). Batches are caught in flight — their
dispatch recorded, the cloud call held — when the fault strikes; the cloud then answers while the
log is unreachable, so the results cannot be recorded. Once the database is back every request
must reach exactly one outcome within a bounded wait, without a restart, no machine may be
created twice, and the hash chain must verify.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future

import psycopg
import psycopg.sql
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from fleetledger.adapters.benchmarks.tcp_proxy import TcpProxy, proxied_url
from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import (
    FakeCloud,
)
from fleetledger.adapters.http import create_app
from fleetledger.adapters.machines import (
    Coordinator,
    CoordinatorOptions,
    MachineOutcome,
    MachinesRuntime,
)
from fleetledger.adapters.runtime import Leadership, PostgresLease
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import libpq_conninfo

from .support import CONFIG, HeldCloud, HeldRunner, request, terminal_outcomes

REQUESTS = 150
BATCHES = 3  # CONFIG seals at 50: three full batches, sealed at once
OUTAGE_SECONDS = 3.0
"""Longer than the runtime's whole re-send budget for one append (RetryPolicy: 5 attempts,
0.75 s of back-off in all), as the reported 10 s outage was."""
OUTCOME_TIMEOUT = 30.0
"""The bounded wait for every outcome once the database is back."""


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[TcpProxy]:
    target = make_url(postgres_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        yield proxy


def _burst(runtime: MachinesRuntime) -> list[Future[MachineOutcome]]:
    return runtime.machines.enqueue_many([request(n) for n in range(REQUESTS)])


def _outcomes(futures: list[Future[MachineOutcome]]) -> list[MachineOutcome]:
    return [future.result(timeout=OUTCOME_TIMEOUT) for future in futures]


def _check_the_log(store: EventStore, cloud: HeldCloud) -> None:
    """Exactly one outcome per request, no machine created twice, a chain that verifies."""
    assert terminal_outcomes(store) == Counter({f"r-{n}": 1 for n in range(REQUESTS)})
    creations = Counter(cloud.inner.creations)
    assert [name for name, count in creations.items() if count > 1] == []
    assert len(creations) == REQUESTS
    assert store.verify().ok


class ServerSide:
    """Faults played by the server: sessions killed, the database closed to new ones."""

    def __init__(self, postgres_url: str) -> None:
        url = make_url(postgres_url)
        self._database = url.database
        self._conninfo = libpq_conninfo(url.set(database="postgres"))

    def terminate_sessions(self) -> int:
        """``pg_terminate_backend`` on every session of the database; how many there were."""
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (self._database,),
            ).fetchall()
        return len(rows)

    def allow_connections(self, allowed: bool) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            name = psycopg.sql.Identifier(str(self._database))
            value = psycopg.sql.SQL("true" if allowed else "false")
            conn.execute(
                psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(name, value)
            )

    @contextlib.contextmanager
    def failover(self) -> Iterator[threading.Timer]:
        """Kill every session and refuse new ones; connections are allowed again when the
        timer it gives (``OUTAGE_SECONDS``, to be started) fires, or on leaving at the latest."""
        self.allow_connections(False)
        back = threading.Timer(OUTAGE_SECONDS, self.allow_connections, args=(True,))
        try:
            assert self.terminate_sessions() > 0
            yield back
        finally:
            back.cancel()
            self.allow_connections(True)


@pytest.mark.postgres
class TestConnectionsCut:
    def test_batches_in_flight_finish_after_the_network_comes_back(
        self, postgres_url: str, proxy: TcpProxy
    ) -> None:
        """Every connection cut and new ones refused for longer than the re-send budget while
        three batches are in the cloud: readiness is false meanwhile, and once the network is
        back all 150 requests reach one outcome without a restart."""
        cloud = HeldCloud()
        with contextlib.closing(open_store(proxied_url(postgres_url, proxy))) as store:
            runtime = MachinesRuntime(store, cloud, clock=SystemClock(), config=CONFIG)
            with runtime, TestClient(create_app(runtime)) as client:
                futures = _burst(runtime)
                cloud.wait_entered(BATCHES, timeout=10)

                proxy.cut()
                assert client.get("/readyz").status_code == 503
                restore = threading.Timer(OUTAGE_SECONDS, proxy.restore)
                restore.start()
                cloud.release.set()  # the cloud answers while the log is unreachable
                try:
                    outcomes = _outcomes(futures)
                finally:
                    restore.cancel()
                    proxy.restore()

                assert [o.status for o in outcomes] == ["created"] * REQUESTS
                assert client.get("/readyz").status_code == 200
            _check_the_log(store, cloud)
        assert proxy.refused > 0  # the outage was real: the runtime tried and was refused


@pytest.mark.postgres
class TestStopDuringAnOutage:
    def test_a_stop_does_not_wait_for_the_log_beyond_its_grace(
        self, postgres_url: str, proxy: TcpProxy
    ) -> None:
        """Stopped while the log is unreachable, the runtime's batches stop waiting for it (they
        would otherwise retry for ever in the background); the next runtime finishes them."""
        cloud = HeldCloud()
        with contextlib.closing(open_store(proxied_url(postgres_url, proxy))) as store:
            runtime = MachinesRuntime(store, cloud, clock=SystemClock(), config=CONFIG).start()
            _burst(runtime)
            cloud.wait_entered(BATCHES, timeout=10)
            proxy.cut()
            cloud.release.set()

            runtime.stop(timeout=0.5)

            assert runtime.coordinator.wait_idle(10), "batches kept waiting for the log"
            proxy.restore()
            with MachinesRuntime(store, cloud, clock=SystemClock(), config=CONFIG) as again:
                outcomes = _outcomes([again.machines.outcome(f"r-{n}") for n in range(REQUESTS)])
            assert [o.status for o in outcomes] == ["created"] * REQUESTS
            _check_the_log(store, cloud)


@pytest.mark.postgres
class TestSessionsTerminated:
    def test_batches_in_flight_finish_after_their_sessions_are_killed(
        self, postgres_url: str
    ) -> None:
        """``pg_terminate_backend`` on all of the runtime's sessions, and the database closed to
        new ones for a while (a failover), while three batches are in the cloud: every request
        still reaches one outcome, nothing is created twice."""
        cloud = HeldCloud()
        server = ServerSide(postgres_url)
        with contextlib.closing(open_store(postgres_url)) as store:
            with MachinesRuntime(store, cloud, clock=SystemClock(), config=CONFIG) as runtime:
                futures = _burst(runtime)
                cloud.wait_entered(BATCHES, timeout=10)

                with server.failover() as back:
                    back.start()
                    cloud.release.set()
                    outcomes = _outcomes(futures)

            assert [o.status for o in outcomes] == ["created"] * REQUESTS
            _check_the_log(store, cloud)

    def test_a_lease_lost_with_its_session_is_won_again(self, postgres_url: str) -> None:
        """The leader's lease session is killed with the others: the process steps down, wins
        the lease again with the next term once the database takes connections again, and
        finishes the batches it had in flight."""
        cloud = HeldCloud()
        server = ServerSide(postgres_url)
        elected: list[int] = []
        elections = threading.Semaphore(0)

        def note(term: int) -> None:
            elected.append(term)
            elections.release()

        with contextlib.closing(open_store(postgres_url)) as store:
            leadership = Leadership(
                store,
                PostgresLease(postgres_url, lease_seconds=2),
                clock=SystemClock(),
                holder="outage-test",
                check_interval=0.1,
            )
            leadership.on_elected(note)
            runtime = MachinesRuntime(
                store, cloud, clock=SystemClock(), config=CONFIG, leadership=leadership
            )
            with runtime:
                assert elections.acquire(timeout=10), "never elected"
                futures = _burst(runtime)
                cloud.wait_entered(BATCHES, timeout=10)

                with server.failover() as back:
                    back.start()
                    cloud.release.set()
                    assert elections.acquire(timeout=15), "the lease was never won again"
                    outcomes = _outcomes(futures)

                assert runtime.leading
            assert elected[:2] == [1, 2]
            assert [o.status for o in outcomes] == ["created"] * REQUESTS
            _check_the_log(store, cloud)


class TestResubmission:
    """A new term resubmits the unfinished batches while the old term's runs may still be
    ending (halted by the step-down): such a batch must run once more, not be dropped by both."""

    def _coordinator(self, store: EventStore, runner: HeldRunner) -> Coordinator:
        return Coordinator(
            store,
            FakeCloud(),
            clock=SystemClock(),
            runner=runner,
            on_complete=lambda *_: None,
            grouper_name="default",
        )

    def test_a_batch_submitted_while_it_runs_runs_once_more_after(
        self, sqlite_store: EventStore
    ) -> None:
        """The second submission waits for the first run to end, then runs; the batch stays
        in flight (nobody else starts it) until that second run ends."""
        runner = HeldRunner()
        coordinator = self._coordinator(sqlite_store, runner)
        coordinator.submit(["b-1"])
        coordinator.submit(["b-1"])
        assert len(runner.held) == 1  # never twice at once

        runner.held[0]()  # the first run ends (the batch has no stream: left incomplete)

        assert len(runner.held) == 2
        assert coordinator.in_flight() == ("b-1",)
        runner.held[1]()
        assert coordinator.in_flight() == ()

    def test_a_halted_coordinator_does_not_run_it_again(self, sqlite_store: EventStore) -> None:
        """After a step-down the second submission is the next leader's to make."""
        runner = HeldRunner()
        coordinator = self._coordinator(sqlite_store, runner)
        coordinator.submit(["b-1"])
        coordinator.submit(["b-1"])
        coordinator.halt()

        runner.held[0]()

        assert len(runner.held) == 1
        assert coordinator.in_flight() == ()


class TestOptions:
    def test_the_outage_waits_must_make_sense(self) -> None:
        """The first wait after a log outage must be positive and at most the longest."""
        with pytest.raises(ValueError, match="log_retry_seconds must be > 0"):
            CoordinatorOptions(log_retry_seconds=0)
        with pytest.raises(ValueError, match="at most log_retry_max_seconds"):
            CoordinatorOptions(log_retry_seconds=10, log_retry_max_seconds=5)
