"""/healthz and /readyz: liveness, readiness, and the role and term of the process."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.http import create_app
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.eventstore import NewEvent, open_store

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@contextlib.contextmanager
def serving(
    url: str, *, elected: bool, readiness_checks: Sequence[Callable[[], list[str]]] = ()
) -> Iterator[TestClient]:
    with contextlib.closing(open_store(url)) as store:
        board: dict[str, str] = {} if elected else {"leader": "someone-else"}
        clock = ManualClock(EPOCH)
        leadership = Leadership(store, MemoryLease(board, holder="me"), clock=clock, holder="me")
        runtime = MachinesRuntime(
            store, FakeCloud(), clock=clock, threads=False, leadership=leadership
        )
        app = create_app(runtime, manage_runtime=True, readiness_checks=readiness_checks)
        with TestClient(app) as client:
            yield client


class TestHealth:
    def test_the_leader_reports_its_role_and_term(self, sqlite_url: str) -> None:
        """An elected process says it leads, in term 1."""
        with serving(sqlite_url, elected=True) as client:
            body = client.get("/healthz").json()

        assert (body["status"], body["role"], body["term"]) == ("ok", "leader", 1)

    def test_a_follower_is_alive_and_says_so(self, sqlite_url: str) -> None:
        """A process that did not win the lease is alive, following, without a term."""
        with serving(sqlite_url, elected=False) as client:
            answer = client.get("/healthz")

        assert answer.status_code == 200
        assert (answer.json()["role"], answer.json()["term"]) == ("follower", None)


class TestReadiness:
    def test_a_problem_another_check_names_makes_it_not_ready(self, sqlite_url: str) -> None:
        """A companion's check (a stale cluster cache, a stalled duty) fails readiness with its
        words, and readiness returns once the check is satisfied."""
        problems = ["the Pod cache is stale: nothing from the API server for 200 s"]
        with serving(sqlite_url, elected=True, readiness_checks=[lambda: list(problems)]) as client:
            stale = client.get("/readyz")
            problems.clear()
            fresh = client.get("/readyz")

        assert stale.status_code == 503
        assert stale.json()["problems"] == [
            "the Pod cache is stale: nothing from the API server for 200 s"
        ]
        assert fresh.status_code == 200

    def test_ready_when_the_read_model_has_caught_up(self, sqlite_url: str) -> None:
        """Schema at head and the read model at the log's head: 200, with role and term."""
        with serving(sqlite_url, elected=True) as client:
            answer = client.get("/readyz")

        assert answer.status_code == 200
        assert answer.json()["read_model_lag"] == 0
        assert answer.json()["role"] == "leader"

    def test_events_of_other_capabilities_do_not_hold_readiness_back(self, sqlite_url: str) -> None:
        """The read model's position moves past events it does not fold, so a log busy with
        other streams is not mistaken for a read model behind."""
        with contextlib.closing(open_store(sqlite_url)) as store:
            store.append("other-1", [NewEvent("other.Thing", {"n": n}) for n in range(5)])
        with serving(sqlite_url, elected=True) as client:
            body = client.get("/readyz").json()

        assert (body["status"], body["read_model_lag"]) == ("ready", 0)

    @pytest.mark.postgres
    def test_not_ready_on_an_unmigrated_schema(self, postgres_url: str) -> None:
        """A schema behind the code is reported with the command that fixes it."""
        with serving(postgres_url, elected=True) as client:
            with contextlib.closing(open_store(postgres_url)) as store, store.engine.begin() as c:
                c.exec_driver_sql("UPDATE alembic_version SET version_num = '0001'")
            answer = client.get("/readyz")

        assert answer.status_code == 503
        assert "fleetledger db upgrade" in " ".join(answer.json()["problems"])


class TestDeadlines:
    def test_both_probes_answer_within_a_second_while_the_log_is_locked(
        self, postgres_url: str
    ) -> None:
        """With the events table locked (a hung database), readiness is a 503 saying the check
        did not finish, and liveness still answers, each within a second."""
        with (
            serving(postgres_url, elected=True) as client,
            contextlib.closing(open_store(postgres_url)) as other,
            other.engine.connect() as locker,
        ):
            locker.exec_driver_sql("BEGIN")
            locker.exec_driver_sql("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            ready = client.get("/readyz")
            ready_seconds = time.monotonic() - started
            started = time.monotonic()
            live = client.get("/healthz")
            live_seconds = time.monotonic() - started
            locker.exec_driver_sql("ROLLBACK")

        assert ready.status_code == 503
        assert "did not finish within" in ready.json()["detail"]
        assert ready_seconds < 1.0 and live_seconds < 1.0
        assert live.status_code == 200
