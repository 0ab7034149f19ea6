"""The Kubernetes Lease as the leader lease: two candidates against the loopback fake API
server, through the official client; terms still recorded in the log and fenced there."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from fleetledger.adapters.cli import EXIT_USAGE, main, serve
from fleetledger.adapters.cli.serve_capabilities import build_lease
from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.kubernetes.lease import (
    KubernetesLease,
    check_lease_name,
    check_namespace,
    pod_namespace,
)
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.eventstore import EventStore, Fenced, NewEvent, open_store
from tests.waiting import wait_until

from .fake_api import FakeApiServer, fake_api_server

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
LEASE_SECONDS = 4


class Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Candidate:
    """One process's lease: its own API client, wall clock and monotonic clock."""

    def __init__(self, api: FakeApiServer, holder: str, clock: ManualClock) -> None:
        self.clock = clock
        self.monotonic = Monotonic()
        self.lease = KubernetesLease(
            client.ApiClient(client.Configuration(host=api.url)),
            name="fleetledger",
            namespace="controllers",
            holder=holder,
            lease_seconds=LEASE_SECONDS,
            clock=clock,
            monotonic=self.monotonic,
        )

    def wait(self, seconds: float) -> None:
        self.monotonic.now += seconds


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        yield server


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


def holder(api: FakeApiServer) -> str | None:
    lease = api.get("leases", "fleetledger", namespace="controllers")
    return None if lease is None else lease["spec"].get("holderIdentity")


def transitions(api: FakeApiServer) -> int:
    lease = api.get("leases", "fleetledger", namespace="controllers")
    assert lease is not None
    return int(lease["spec"]["leaseTransitions"])


def expire(clock: ManualClock, *candidates: Candidate, seconds: float = LEASE_SECONDS) -> None:
    """``seconds`` pass for everyone: the wall clock and each candidate's monotonic one."""
    clock.advance(seconds)
    for candidate in candidates:
        candidate.wait(seconds)


class TestElection:
    def test_the_first_candidate_creates_the_lease_and_the_other_does_not_lead(
        self, api: FakeApiServer, clock: ManualClock
    ) -> None:
        """a creates the Lease naming itself; b, finding it held and fresh, does not lead."""
        a, b = Candidate(api, "a", clock), Candidate(api, "b", clock)

        assert a.lease.try_acquire()
        assert not b.lease.try_acquire()

        lease = api.get("leases", "fleetledger", namespace="controllers")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "a"
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
        assert lease["spec"]["acquireTime"] == lease["spec"]["renewTime"]
        assert lease["spec"]["leaseTransitions"] == 0

    def test_the_other_takes_over_only_once_the_lease_has_expired(
        self, api: FakeApiServer, clock: ManualClock
    ) -> None:
        """The holder stops renewing: b is refused just before the lease duration has passed
        and takes over once it has, counting one more transition."""
        a, b = Candidate(api, "a", clock), Candidate(api, "b", clock)
        a.lease.try_acquire()
        assert not b.lease.try_acquire()  # b first sees the record now

        expire(clock, b, seconds=LEASE_SECONDS - 0.5)
        assert not b.lease.try_acquire()
        expire(clock, b, seconds=0.5)
        assert b.lease.try_acquire()

        assert holder(api) == "b"
        assert transitions(api) == 1
        assert not a.lease.check()

    def test_a_renewal_keeps_the_lease_from_being_taken(
        self, api: FakeApiServer, clock: ManualClock
    ) -> None:
        """A holder renewing within the duration keeps it, however long b has watched."""
        a, b = Candidate(api, "a", clock), Candidate(api, "b", clock)
        a.lease.try_acquire()
        b.lease.try_acquire()
        for _ in range(3):
            expire(clock, a, b, seconds=LEASE_SECONDS / 2)
            assert a.lease.check()
            assert not b.lease.try_acquire()

        assert holder(api) == "a"

    def test_an_old_renew_time_alone_does_not_hand_the_lease_over(
        self, api: FakeApiServer, clock: ManualClock
    ) -> None:
        """Expiry is measured from when this candidate saw the record, as client-go does: a
        renewTime that looks old (a holder whose clock lags) is not enough by itself."""
        a = Candidate(api, "a", clock)
        a.lease.try_acquire()
        clock.advance(LEASE_SECONDS * 10)
        b = Candidate(api, "b", clock)

        assert not b.lease.try_acquire()
        b.wait(LEASE_SECONDS)
        assert b.lease.try_acquire()

    def test_a_conflict_on_replace_loses(self, api: FakeApiServer, clock: ManualClock) -> None:
        """Two candidates read the expired Lease; a writes first, so b's replace carries a stale
        resourceVersion: the API server answers 409 and b does not lead."""
        old, a = Candidate(api, "old", clock), Candidate(api, "a", clock)
        old.lease.try_acquire()
        b_clock = RacingClock(clock, before_write=a.lease.try_acquire)
        b = Candidate(api, "b", b_clock)
        assert not a.lease.try_acquire() and not b.lease.try_acquire()
        expire(clock, a, b)

        assert not b.lease.try_acquire()  # a took it between b's read and b's write

        assert holder(api) == "a"
        assert transitions(api) == 1
        puts = [r for r in api.requests if r.startswith("PUT ")]
        assert len(puts) == 2  # a's accepted replace, b's refused one

    def test_a_released_lease_is_taken_at_once(
        self, api: FakeApiServer, clock: ManualClock
    ) -> None:
        """Releasing clears the holder: the next candidate need not wait the lease out."""
        a, b = Candidate(api, "a", clock), Candidate(api, "b", clock)
        a.lease.try_acquire()

        a.lease.release()

        assert holder(api) in (None, "")
        assert b.lease.try_acquire()
        assert holder(api) == "b"

    def test_an_unreachable_api_server_is_a_lost_lease(self, clock: ManualClock) -> None:
        """A renewal nobody answers loses the lease (the process steps down)."""
        with fake_api_server() as api:
            a = Candidate(api, "a", clock)
            assert a.lease.try_acquire()
        # The server is gone: nothing listens on its port any more.

        assert not a.lease.check()
        assert not a.lease.try_acquire()


class RacingClock(ManualClock):
    """A wall clock that runs ``before_write`` the first time it is read: a candidate reads it
    between reading the Lease and writing it, so another candidate's write lands in between."""

    def __init__(self, clock: ManualClock, *, before_write: Callable[[], object]) -> None:
        super().__init__(clock.now())
        self._clock = clock
        self._armed: Callable[[], object] | None = before_write
        self._reads = 0

    def now(self) -> datetime:
        self._reads += 1
        if self._reads == 2 and self._armed is not None:
            # The first read was the refused campaign; the second is the racing one.
            armed, self._armed = self._armed, None
            armed()
        return self._clock.now()

    def advance(self, seconds: float | timedelta) -> datetime:
        return self._clock.advance(seconds)


class TestFencingByTerm:
    def test_the_deposed_leaders_appends_are_refused(
        self, api: FakeApiServer, clock: ManualClock, store: EventStore
    ) -> None:
        """Leadership on Kubernetes Leases: a leads in term 1 and stalls; b takes the expired
        Lease and records term 2; a's duty append with term 1 is fenced, and its next renewal
        finds the Lease gone."""
        a, b = Candidate(api, "a", clock), Candidate(api, "b", clock)
        first = Leadership(store, a.lease, clock=clock, holder="a")
        second = Leadership(store, b.lease, clock=clock, holder="b")

        assert first.step() == "leader"
        assert second.step() == "follower"
        expire(clock, a, b)
        assert second.step() == "leader"

        with pytest.raises(Fenced) as refused:
            store.append("work-1", [NewEvent("Done", {}, metadata={"leader_term": 1})])
        assert (refused.value.term, refused.value.current_term) == (1, 2)
        assert first.step() == "follower"
        terms = [e.data["term"] for e in store.read_stream("leadership-default")]
        assert terms == [1, 2]


class TestOptions:
    def test_lease_names_and_namespaces_are_checked_as_the_api_server_would(self) -> None:
        assert check_lease_name("fleetledger.leader") == "fleetledger.leader"
        assert check_namespace("controllers") == "controllers"
        for bad in ("Fleet", "-x", "a_b", "x" * 254):
            with pytest.raises(ValueError, match="--lease-name"):
                check_lease_name(bad)
        for bad in ("a.b", "Default", "x" * 64):
            with pytest.raises(ValueError, match="--lease-namespace"):
                check_namespace(bad)

    def test_the_namespace_is_the_pods_own_else_default(self, tmp_path: Path) -> None:
        mounted = tmp_path / "namespace"
        mounted.write_text("controllers\n")

        assert pod_namespace(mounted) == "controllers"
        assert pod_namespace(tmp_path / "absent") == "default"

    def test_kubernetes_options_without_kubernetes_election_are_refused(
        self, sqlite_url: str
    ) -> None:
        with pytest.raises(ValueError, match="--leader-election kubernetes"):
            build_lease(
                sqlite_url,
                election="database",
                lease_seconds=10,
                holder="h",
                lease_name="other",
            )

    def test_an_unknown_election_is_refused(self, sqlite_url: str) -> None:
        with pytest.raises(ValueError, match="database, kubernetes"):
            build_lease(sqlite_url, election="etcd", lease_seconds=10, holder="h")

    def test_a_bad_lease_name_is_refused_before_any_client_is_made(self, sqlite_url: str) -> None:
        with pytest.raises(ValueError, match="--lease-name"):
            build_lease(
                sqlite_url,
                election="kubernetes",
                lease_seconds=10,
                holder="h",
                lease_name="Not_A_Name",
            )


class TestServeFlags:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--leader-election", "etcd"], "invalid choice: 'etcd'"),
            (["--leader-election", "kubernetes", "--lease-name", "Bad_Name"], "--lease-name"),
            (
                ["--leader-election", "kubernetes", "--lease-namespace", "a.b"],
                "--lease-namespace must be a Kubernetes namespace name",
            ),
            (["--lease-name", "other"], "give --leader-election kubernetes too"),
        ],
    )
    def test_bad_election_options_are_usage_errors(
        self,
        sqlite_url: str,
        options: list[str],
        message: str,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Refused with what to fix, before the log is opened or any API client made."""
        opened: list[object] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))

        try:
            code = main(["serve", "--url", sqlite_url, *options])
        except SystemExit as exited:  # refused by the parser itself
            code = exited.code  # type: ignore[assignment]

        assert code == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert opened == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``fleetledger serve --leader-election kubernetes`` in a process of its own, reaching
    the fake API server through a kubeconfig."""

    def __init__(self, url: str, kubeconfig: Path, log_file: Path) -> None:
        self.port = _free_port()
        self._log = log_file.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "fleetledger", "serve",
                "--url", url,
                "--port", str(self.port),
                "--leader-election", "kubernetes",
                "--lease-namespace", "controllers",
                "--lease-seconds", "2",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )  # fmt: skip
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)

    @property
    def holder(self) -> str:
        return f"{socket.gethostname()}:{self.process.pid}"

    def role(self) -> object:
        try:
            return self.client.get("/healthz").json()["role"]
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.mark.slow
class TestServeOnKubernetesLeases:
    def test_a_frozen_leader_is_replaced_once_its_lease_expires(
        self, api: FakeApiServer, store_url: str, tmp_path: Path
    ) -> None:
        """Two serve processes elect through the Lease; the holder is frozen (kill -STOP), the
        other takes the Lease over after it expires and records the next term; thawed, the
        old one finds the Lease taken and follows."""
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: fake, user: {token: fake}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        served = [Served(store_url, kubeconfig, tmp_path / f"serve-{n}.log") for n in (1, 2)]
        try:
            wait_until(
                lambda: sorted(str(s.role()) for s in served) == ["follower", "leader"],
                timeout=60,
                what="one of the two to lead",
            )
            leader = next(s for s in served if s.role() == "leader")
            follower = next(s for s in served if s is not leader)
            assert holder(api) == leader.holder

            os.kill(leader.process.pid, signal.SIGSTOP)
            wait_until(lambda: holder(api) == follower.holder, timeout=30, what="the takeover")
            wait_until(lambda: follower.role() == "leader", timeout=30, what="the next term")
            os.kill(leader.process.pid, signal.SIGCONT)
            wait_until(lambda: leader.role() == "follower", timeout=30, what="the step-down")

            assert transitions(api) == 1
            with contextlib.closing(open_store(store_url)) as store:
                terms = [e.data["term"] for e in store.read_stream("leadership-default")]
            assert terms == [1, 2]
        finally:
            for process in served:
                process.stop()
