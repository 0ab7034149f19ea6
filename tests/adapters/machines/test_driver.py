"""The grouper driver: Tick exactly when a deadline passes, woken by changes, never polling."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from fleetledger.adapters.clock import ManualClock, SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.domain.machines import GrouperConfig
from fleetledger.eventstore import EventStore, open_store

from .support import CONFIG, EPOCH, manual_runtime, request

FAST = GrouperConfig(
    idle_timeout=timedelta(milliseconds=50),
    max_timeout=timedelta(milliseconds=500),
    max_batch_size=50,
)


class TestStep:
    def test_does_not_tick_before_the_deadline(self, sqlite_store: EventStore) -> None:
        """A step before the idle deadline only reports when it is."""
        clock = ManualClock(EPOCH)
        runtime = manual_runtime(sqlite_store, FakeCloud(), clock)
        runtime.machines.enqueue(request(1))

        deadline = runtime.driver.step()

        assert deadline == EPOCH + CONFIG.idle_timeout
        assert runtime.driver.ticks == 0

    def test_ticks_once_the_deadline_has_passed(self, sqlite_store: EventStore) -> None:
        """At the deadline one Tick seals the batch and nothing is left to wait for."""
        clock = ManualClock(EPOCH)
        runtime = manual_runtime(sqlite_store, FakeCloud(), clock)
        future = runtime.machines.enqueue(request(1))
        clock.advance(CONFIG.idle_timeout)

        deadline = runtime.driver.step()

        assert deadline is None
        assert runtime.driver.ticks == 1
        assert future.result(timeout=5).created


class TestThread:
    def test_seals_at_the_idle_deadline_with_one_tick(self, sqlite_url: str) -> None:
        """The thread waits for the deadline (no polling): one batch costs exactly one Tick."""
        cloud = FakeCloud()
        with (
            contextlib.closing(open_store(sqlite_url)) as store,
            MachinesRuntime(store, cloud, clock=SystemClock(), config=FAST) as runtime,
        ):
            futures = runtime.machines.enqueue_many([request(n) for n in range(3)])
            outcomes = [future.result(timeout=10) for future in futures]
            ticks = runtime.driver.ticks

        assert [o.status for o in outcomes] == ["created"] * 3
        assert len(cloud.calls) == 1
        assert ticks == 1

    def test_a_graceful_stop_seals_and_finishes_what_is_pending(self, sqlite_url: str) -> None:
        """Stopping sends Shutdown and lets the sealed batch complete before returning."""
        slow = GrouperConfig(
            idle_timeout=timedelta(minutes=1), max_timeout=timedelta(minutes=5), max_batch_size=50
        )
        with contextlib.closing(open_store(sqlite_url)) as store:
            runtime = MachinesRuntime(store, FakeCloud(), clock=SystemClock(), config=slow).start()
            futures = runtime.machines.enqueue_many([request(1), request(2)])
            runtime.stop(timeout=10)
            outcomes = [future.result(timeout=0) for future in futures]
            sealed = store.read_all(types=["vm.BatchSealed"])

        assert [o.status for o in outcomes] == ["created", "created"]
        assert [e.data["reason"] for e in sealed] == ["shutdown"]
