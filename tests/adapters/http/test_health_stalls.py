"""Readiness names a leader duty that keeps failing, on SQLite and Postgres.

The failure is the database's own: a trigger refuses every ``vm.BatchSealed`` insert, as a log
that cannot take the grouper's seals would, until it is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.http import create_app
from fleetledger.adapters.machines import MachineRequest, MachinesRuntime
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore, open_store

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
IDLE = timedelta(seconds=1)
CONFIG = GrouperConfig(idle_timeout=IDLE, max_timeout=timedelta(seconds=5), max_batch_size=50)

_REFUSE = {
    "sqlite": [
        "CREATE TRIGGER refuse_seals BEFORE INSERT ON events WHEN NEW.type = 'vm.BatchSealed' "
        "BEGIN SELECT RAISE(ABORT, 'seals refused by the test'); END"
    ],
    "postgres": [
        "CREATE FUNCTION refuse_seals() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.type = 'vm.BatchSealed' THEN RAISE EXCEPTION 'seals refused by the test'; "
        "END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_seals BEFORE INSERT ON events FOR EACH ROW "
        "EXECUTE FUNCTION refuse_seals()",
    ],
}
_ALLOW = {
    "sqlite": ["DROP TRIGGER refuse_seals"],
    "postgres": ["DROP TRIGGER refuse_seals ON events", "DROP FUNCTION refuse_seals()"],
}


@dataclass
class Served:
    client: TestClient
    runtime: MachinesRuntime
    store: EventStore
    clock: ManualClock
    backend: str

    def refuse_seals(self) -> None:
        self._run(_REFUSE[self.backend])

    def allow_seals(self) -> None:
        self._run(_ALLOW[self.backend])

    def _run(self, statements: list[str]) -> None:
        with self.store.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)

    def tick_after_idle(self) -> Exception | None:
        """Let a pending batch fall due and give the driver its step; what the tick raised."""
        self.clock.advance(IDLE)
        try:
            self.runtime.driver.step()
        except Exception as e:
            return e
        return None


@pytest.fixture
def served(backend: str, store_url: str) -> Iterator[Served]:
    clock = ManualClock(EPOCH)
    with contextlib.closing(open_store(store_url)) as store:
        runtime = MachinesRuntime(
            store, FakeCloud(clock=clock), clock=clock, config=CONFIG, threads=False
        )
        with TestClient(create_app(runtime, manage_runtime=True)) as client:
            yield Served(client, runtime, store, clock, backend)


def request(n: int) -> MachineRequest:
    return MachineRequest(
        request_id=f"r-{n}", machine_name=f"m-{n}", template=MachineTemplate(vm_size="D4")
    )


class TestSealingStalled:
    def test_readyz_names_the_stalled_duty_then_recovers(self, served: Served) -> None:
        """Three failed ticks in a row: 503 naming the sealing duty and the database's
        refusal; once the database takes seals again, the next tick seals and readiness is
        back to 200."""
        served.runtime.service.request([request(1)])
        served.refuse_seals()
        failures = [served.tick_after_idle() for _ in range(3)]

        stalled = served.client.get("/readyz")

        served.allow_seals()
        recovered = served.tick_after_idle()
        ready = served.client.get("/readyz")
        outcome = served.runtime.machines.outcome("r-1").result(timeout=10)

        assert all(failure is not None for failure in failures)
        assert stalled.status_code == 503
        [problem] = stalled.json()["problems"]
        assert problem.startswith("duty stalled: sealing due batches failed 3 time(s) in a row")
        assert "seals refused by the test" in problem
        assert recovered is None
        assert (ready.status_code, ready.json()["problems"]) == (200, [])
        assert outcome.created

    def test_healthz_stays_alive_and_lists_the_stall(self, served: Served) -> None:
        """Liveness does not fail on a stall (a restart would not cure it) but carries it."""
        served.runtime.service.request([request(1)])
        served.refuse_seals()
        for _ in range(3):
            served.tick_after_idle()

        answer = served.client.get("/healthz")

        assert answer.status_code == 200
        [stall] = answer.json()["stalls"]
        assert stall.startswith("sealing due batches failed 3 time(s)")

    def test_a_failure_or_two_is_not_yet_a_stall(self, served: Served) -> None:
        """A duty that failed twice may be having a blip: still ready."""
        served.runtime.service.request([request(1)])
        served.refuse_seals()
        for _ in range(2):
            served.tick_after_idle()

        answer = served.client.get("/readyz")

        assert answer.status_code == 200
        assert served.client.get("/healthz").json()["stalls"] == []

    def test_a_duty_failing_for_long_is_a_stall_however_few_its_tries(self, served: Served) -> None:
        """One failure, then half a minute without the duty succeeding: not ready."""
        served.runtime.service.request([request(1)])
        served.refuse_seals()
        served.tick_after_idle()
        served.clock.advance(timedelta(seconds=30))

        answer = served.client.get("/readyz")

        assert answer.status_code == 503
        assert "sealing due batches failed 1 time(s)" in answer.json()["problems"][0]
