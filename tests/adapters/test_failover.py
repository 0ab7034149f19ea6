"""Two ``fleetledger serve`` processes on one Postgres: one leader, failover, fencing, SIGTERM.

Real processes, a real database and one fake cloud shared through a file (so a machine one
controller created is visible to the other, as in one Azure subscription). Waits poll a condition
with a deadline; nothing sleeps to order events.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from fleetledger.adapters.benchmarks.partition import StallingProxy, measure_partition
from fleetledger.adapters.cloud.shared_fake import SharedFakeCloud
from fleetledger.eventstore import open_store
from tests.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE_SECONDS = 2
TEMPLATE = {"vm_size": "Standard_D4s_v5"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Controller:
    """One ``fleetledger serve`` process."""

    def __init__(
        self, url: str, cloud_file: Path, log_file: Path, *, cloud_latency: float = 0.5
    ) -> None:
        self.port = _free_port()
        self.log_file = log_file
        self._log = log_file.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "fleetledger", "serve",
                "--url", url,
                "--port", str(self.port),
                "--fake-cloud-file", str(cloud_file),
                "--fake-latency", str(cloud_latency),
                "--idle-timeout", "0.1",
                "--lease-seconds", str(LEASE_SECONDS),
                "--grace-seconds", "10",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def health(self) -> dict[str, object] | None:
        try:
            return dict(self.client.get("/healthz").json())
        except httpx.HTTPError:
            return None

    def role(self) -> object:
        health = self.health()
        return None if health is None else health["role"]

    def term(self) -> int | None:
        health = self.health()
        term = None if health is None else health["term"]
        return term if isinstance(term, int) else None

    def request(self, name: str) -> str:
        answer = self.client.post("/v1/machines", json={"machine_name": name, "template": TEMPLATE})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["request_ids"][0])

    def outcome(self, request_id: str) -> str | None:
        view = self.client.get(f"/v1/machines/{request_id}", params={"wait": 5}).json()
        outcome = view.get("outcome")
        return None if outcome is None else str(outcome["status"])

    def output(self) -> str:
        self._log.flush()
        return self.log_file.read_text()

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def controllers(postgres_url: str, tmp_path: Path) -> Iterator[list[Controller]]:
    cloud_file = tmp_path / "cloud.db"
    running = [Controller(postgres_url, cloud_file, tmp_path / f"serve-{n}.log") for n in (1, 2)]
    try:
        wait_until(
            lambda: (
                all(c.health() is not None for c in running)
                and sorted(str(c.role()) for c in running) == ["follower", "leader"]
            ),
            timeout=30,
            what="both controllers up, one of them leading",
        )
        yield running
    finally:
        for controller in running:
            controller.stop()


def _leader_and_follower(controllers: list[Controller]) -> tuple[Controller, Controller]:
    leader = next(c for c in controllers if c.role() == "leader")
    follower = next(c for c in controllers if c is not leader)
    return leader, follower


def _terminal_events(url: str) -> Counter[str]:
    with contextlib.closing(open_store(url)) as store:
        types = ["vm.MachineCreated", "vm.MachineFailed"]
        return Counter(str(e.data["request_id"]) for e in store.read_all(types=types))


def _check_the_log(url: str, request_ids: list[str], cloud_file: Path) -> None:
    """Each request has exactly one outcome, each created machine exists once in the cloud,
    and the hash chain verifies."""
    terminal = _terminal_events(url)
    assert {r: terminal[r] for r in request_ids} == dict.fromkeys(request_ids, 1)
    machines = SharedFakeCloud(cloud_file).machine_names()
    assert len(machines) == len(set(machines)) == len(request_ids)
    with contextlib.closing(open_store(url)) as store:
        assert store.verify().ok


def _all_created(controller: Controller, request_ids: list[str]) -> bool:
    return all(controller.outcome(r) == "created" for r in request_ids)


class TestOneLeader:
    def test_a_frozen_leader_is_replaced_and_fenced_when_it_wakes(
        self, controllers: list[Controller], postgres_url: str, tmp_path: Path
    ) -> None:
        """kill -STOP the leader: the other takes over after the lease; kill -CONT: the old one
        steps down without a traceback, and every request gets exactly one outcome."""
        leader, follower = _leader_and_follower(controllers)
        first = [leader.request(f"a-{n}") for n in range(5)]
        first += [follower.request(f"b-{n}") for n in range(5)]

        os.kill(leader.process.pid, signal.SIGSTOP)
        wait_until(lambda: follower.role() == "leader", timeout=LEASE_SECONDS * 5, what="failover")
        second = [follower.request(f"c-{n}") for n in range(5)]
        os.kill(leader.process.pid, signal.SIGCONT)
        wait_until(
            lambda: leader.role() == "follower", timeout=30, what="the old leader to step down"
        )

        request_ids = first + second
        wait_until(lambda: _all_created(follower, request_ids), timeout=60, what="every outcome")
        assert "Traceback" not in leader.output()
        assert "stepped down; following" in leader.output()
        _check_the_log(postgres_url, request_ids, tmp_path / "cloud.db")

    def test_a_leader_whose_lease_connection_is_killed_steps_down(
        self, controllers: list[Controller], postgres_url: str, tmp_path: Path
    ) -> None:
        """pg_terminate_backend on the leader's lease: it steps down, the other leads with the
        next term, and requests keep getting their outcomes."""
        leader, follower = _leader_and_follower(controllers)
        term = leader.term()
        assert term is not None
        before = [leader.request(f"d-{n}") for n in range(5)]

        engine = sa.create_engine(postgres_url)
        with engine.begin() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'fleetledger-leader-lease' "
                    "AND datname = current_database()"
                )
            ).scalar()
        engine.dispose()
        assert killed == 1

        wait_until(
            lambda: (
                {c.role() for c in controllers} == {"leader", "follower"}
                and any(c.term() == term + 1 for c in controllers)
            ),
            timeout=30,
            what="the next term",
        )
        new_leader, _ = _leader_and_follower(controllers)
        after = [new_leader.request(f"e-{n}") for n in range(5)]
        request_ids = before + after
        wait_until(lambda: _all_created(new_leader, request_ids), timeout=60, what="outcomes")
        assert "Traceback" not in leader.output() + follower.output()
        _check_the_log(postgres_url, request_ids, tmp_path / "cloud.db")


class TestGracefulStop:
    def test_sigterm_during_a_burst_loses_nothing_acknowledged(
        self, controllers: list[Controller], postgres_url: str, tmp_path: Path
    ) -> None:
        """Every request acknowledged before and during the SIGTERM gets its outcome (from the
        next leader if need be), and the stopped controller exits 0."""
        leader, follower = _leader_and_follower(controllers)
        acknowledged = [leader.request(f"f-{n}") for n in range(10)]

        leader.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(AssertionError, httpx.HTTPError):
            # Until it stops accepting: these are either acknowledged (and must complete) or
            # refused — never lost.
            for n in range(10):
                acknowledged.append(leader.request(f"g-{n}"))

        assert leader.process.wait(30) == 0
        wait_until(lambda: follower.role() == "leader", timeout=30, what="the follower to lead")
        wait_until(lambda: _all_created(follower, acknowledged), timeout=60, what="every outcome")
        _check_the_log(postgres_url, acknowledged, tmp_path / "cloud.db")

    def test_a_second_sigterm_exits_at_once(self, postgres_url: str, tmp_path: Path) -> None:
        """With a cloud call in flight the first SIGTERM waits (up to the grace period); a
        second one ends the process at once, and the request stays in the log for later."""
        controller = Controller(
            postgres_url, tmp_path / "cloud.db", tmp_path / "serve.log", cloud_latency=60
        )
        try:
            wait_until(lambda: controller.role() == "leader", timeout=30, what="the leader")
            request_id = controller.request("slow-1")
            wait_until(
                lambda: "vm.BatchDispatched" in _types(postgres_url),
                timeout=30,
                what="the cloud call to start",
            )

            controller.process.send_signal(signal.SIGTERM)
            with pytest.raises(subprocess.TimeoutExpired):
                controller.process.wait(1)  # still finishing what is in flight
            controller.process.send_signal(signal.SIGTERM)

            assert controller.process.wait(5) == 130
            assert "second signal: exiting at once" in controller.output()
            assert _terminal_events(postgres_url)[request_id] == 0
        finally:
            controller.stop()


class TestPartition:
    """A leader cut off from the database for three leases while a burst goes to the other
    controller: two in-process controllers, each through its own proxy to one Postgres, one
    fake cloud that records which controller create-called each machine name."""

    def test_a_partitioned_leader_stops_calling_the_cloud_before_its_lease_passes(
        self, postgres_url: str
    ) -> None:
        """Nothing passes and nothing is closed: the leader's renewal just waits. It says
        ``stepping down`` once its acting deadline passes, and no machine name is
        create-called by both controllers."""
        figures = measure_partition(postgres_url, lease_seconds=LEASE_SECONDS, requests=40)

        assert figures["partition_double_attempts"] == 0, figures["double_attempted_names"]
        assert "stepping down" in figures["old_leader_roles"]
        assert figures["machine_names_attempted"] == figures["requests"] == 80
        assert figures["takeover_seconds"] is not None

    def test_a_partitioned_serve_says_stepping_down_and_the_other_takes_over(
        self, postgres_url: str, tmp_path: Path
    ) -> None:
        """Two ``serve`` processes, each through its own proxy: the leader's stalls. Its health
        says ``stepping down`` while the other leads; healed, it follows, and every request
        has one outcome and one machine."""
        target = sa.engine.make_url(postgres_url)
        proxies = [StallingProxy(target.host or "127.0.0.1", target.port or 5432) for _ in "ab"]
        urls = [
            target.set(host=p.host, port=p.port).render_as_string(hide_password=False)
            for p in proxies
        ]
        cloud_file = tmp_path / "cloud.db"
        running = [
            Controller(url, cloud_file, tmp_path / f"serve-{n}.log") for n, url in enumerate(urls)
        ]
        try:
            wait_until(
                lambda: sorted(str(c.role()) for c in running) == ["follower", "leader"],
                timeout=30,
                what="one of the two to lead",
            )
            leader, follower = _leader_and_follower(running)
            before = [leader.request(f"p-{n}") for n in range(5)]
            proxy = proxies[running.index(leader)]

            proxy.stall()
            wait_until(lambda: leader.role() == "stepping down", timeout=10, what="self-fencing")
            wait_until(lambda: follower.role() == "leader", timeout=20, what="the takeover")
            during = [follower.request(f"q-{n}") for n in range(5)]
            assert leader.role() == "stepping down"
            proxy.resume()

            wait_until(lambda: leader.role() == "follower", timeout=30, what="the old leader")
            request_ids = before + during
            wait_until(lambda: _all_created(follower, request_ids), timeout=60, what="outcomes")
            assert "Traceback" not in leader.output()
            _check_the_log(postgres_url, request_ids, cloud_file)
        finally:
            for controller in running:
                controller.stop()
            for proxy in proxies:
                proxy.close()

    def test_a_leader_whose_connections_are_reset_makes_no_double_attempt(
        self, postgres_url: str
    ) -> None:
        """Every connection reset and new ones refused: both sides learn at once, the lease
        passes at once, and still no name is create-called by both."""
        figures = measure_partition(
            postgres_url, lease_seconds=LEASE_SECONDS, requests=40, fault="cut"
        )

        assert figures["partition_double_attempts"] == 0, figures["double_attempted_names"]
        assert figures["machine_names_attempted"] == 80


def _types(url: str) -> set[str]:
    with contextlib.closing(open_store(url)) as store:
        return {e.type for e in store.read_all()}
