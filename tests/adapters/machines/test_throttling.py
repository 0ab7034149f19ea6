"""Waiting for the cloud's write budget: recorded before waiting, paced by the budget, paused by
a 429, ended by a halt; a high ceiling of batches in flight; ``BatchThrottled`` in the log."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleetledger.adapters.clock import ManualClock, SystemClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
    Throttled,
)
from fleetledger.adapters.machines import (
    DEFAULT_MAX_CONCURRENT_BATCHES,
    BatchThrottled,
    CoordinatorOptions,
    MachinesRuntime,
    batch_stream_id,
)
from fleetledger.adapters.machines.aggregates import batch_aggregate
from fleetledger.adapters.machines.records import decode_batch_event, encode
from fleetledger.adapters.machines.throttled import RecordThrottle
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.machines import BatchMachine, BatchOpened, BatchState
from fleetledger.domain.template import template_hash
from fleetledger.eventstore import EventStore, RecordedEvent

from .support import CONFIG, D4, EPOCH, HeldCloud, manual_runtime, request


class TimedCloud:
    """The fake cloud, noting when (on the clock) each create call arrived."""

    def __init__(self, inner: FakeCloud, clock: ManualClock) -> None:
        self.inner = inner
        self._clock = clock
        self.call_times: list[datetime] = []

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self.call_times.append(self._clock.now())
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class RefusingOnce:
    """The fake cloud, whose first call is answered as the VM adapter answers a 429: every
    machine of the call failed with ``Throttled`` in the result (4 s), none created."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner
        self._refused = False

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        if not self._refused:
            self._refused = True
            error = Throttled(retry_after=4.0, provider_code="TooManyRequests")
            return BatchCreateResult(failed=dict.fromkeys(request.machine_names, error))
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class HaltingClock(ManualClock):
    """A manual clock that runs ``on_sleep`` at the first sleep (a stop arriving mid-wait)."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.on_sleep: list[object] = []

    def sleep(self, seconds: float) -> None:
        while self.on_sleep:
            action = self.on_sleep.pop()
            assert callable(action)
            action()
        super().sleep(seconds)


def stream(store: EventStore, batch_id: str) -> list[RecordedEvent]:
    return list(store.read_stream(batch_stream_id("default", batch_id)))


def types(store: EventStore, batch_id: str) -> list[str]:
    return [e.type for e in stream(store, batch_id)]


def throttled(store: EventStore, batch_id: str) -> list[BatchThrottled]:
    events = [decode_batch_event(e) for e in stream(store, batch_id)]
    return [e for e in events if isinstance(e, BatchThrottled)]


def budget(rate: float | None, burst: int, **more: object) -> CoordinatorOptions:
    return CoordinatorOptions(write_rate=rate, write_burst=burst, **more)  # type: ignore[arg-type]


class TestWaitingForTheBudget:
    def test_a_batch_over_the_budget_records_its_wait_then_dispatches_after_it(
        self, sqlite_store: EventStore
    ) -> None:
        """One write a second, one at once: the second batch records a 1 s wait for the local
        budget before its dispatch, and its call leaves 1 s after the first."""
        clock = ManualClock(EPOCH)
        cloud = TimedCloud(FakeCloud(clock=clock), clock)
        runtime = manual_runtime(sqlite_store, cloud, clock, coordinator_options=budget(1.0, 1))

        first, second = (
            runtime.machines.enqueue(request(n, skip_batching=True)).result(timeout=5)
            for n in (1, 2)
        )

        assert "vm.BatchThrottled" not in types(sqlite_store, first.batch_id)
        assert types(sqlite_store, second.batch_id)[:3] == [
            "vm.BatchOpened",
            "vm.BatchThrottled",
            "vm.BatchDispatched",
        ]
        (wait,) = throttled(sqlite_store, second.batch_id)
        assert (wait.reason, wait.wait_seconds, wait.writes, wait.write_rate, wait.attempt) == (
            "write_budget",
            1.0,
            1,
            1.0,
            1,
        )
        assert cloud.call_times == [EPOCH, EPOCH + timedelta(seconds=1)]
        assert second.status == "created"

    def test_per_machine_calls_cost_a_write_per_machine(self, sqlite_store: EventStore) -> None:
        """Three VMs by per-machine PUTs are three writes: with one at once, 2 s to wait."""
        clock = ManualClock(EPOCH)
        options = budget(1.0, 1, dispatch_mode="per_machine")
        runtime = manual_runtime(
            sqlite_store, FakeCloud(clock=clock), clock, coordinator_options=options
        )
        futures = runtime.machines.enqueue_many([request(1), request(2), request(3)])
        runtime.service.shutdown()

        batch_id = futures[0].result(timeout=5).batch_id

        (wait,) = throttled(sqlite_store, batch_id)
        assert (wait.writes, wait.wait_seconds) == (3, 2.0)

    def test_without_a_rate_nothing_waits(self, sqlite_store: EventStore) -> None:
        clock = ManualClock(EPOCH)
        runtime = manual_runtime(
            sqlite_store, FakeCloud(clock=clock), clock, coordinator_options=budget(None, 1)
        )

        outcomes = [
            runtime.machines.enqueue(request(n, skip_batching=True)).result(timeout=5)
            for n in range(1, 6)
        ]

        assert all(not throttled(sqlite_store, o.batch_id) for o in outcomes)
        assert clock.now() == EPOCH


class TestAfterA429:
    def test_a_429_fails_its_batch_and_pauses_the_next_for_its_retry_after(
        self, sqlite_store: EventStore
    ) -> None:
        """The refused batch's callers learn it (retryable, 7 s); the next batch, with tokens
        to spare, still waits out the 7 s, at half the rate, and is recorded doing so."""
        clock = ManualClock(EPOCH)
        fake = FakeCloud(clock=clock)
        cloud = TimedCloud(fake, clock)
        runtime = manual_runtime(sqlite_store, cloud, clock)  # ARM's budget: 200, 10/s
        fake.throttle(retry_after=7.0)

        refused = runtime.machines.enqueue(request(1, skip_batching=True)).result(timeout=5)
        later = runtime.machines.enqueue(request(2, skip_batching=True)).result(timeout=5)

        assert refused.error is not None
        assert (refused.error.code, refused.error.retry_after_seconds) == ("throttled", 7.0)
        (wait,) = throttled(sqlite_store, later.batch_id)
        assert (wait.reason, wait.wait_seconds, wait.write_rate) == ("retry_after", 7.0, 5.0)
        assert cloud.call_times == [EPOCH, EPOCH + timedelta(seconds=7)]
        assert later.status == "created"

    def test_429s_reported_per_machine_pause_the_budget_too(self, sqlite_store: EventStore) -> None:
        """The VM adapter reports a 429 in the result, per machine, not raised: the budget
        hears it once, and the next batch waits out its Retry-After."""
        clock = ManualClock(EPOCH)
        cloud = RefusingOnce(FakeCloud(clock=clock))
        runtime = manual_runtime(sqlite_store, cloud, clock)
        futures = runtime.machines.enqueue_many([request(1), request(2)])
        runtime.service.shutdown()
        assert {f.result(timeout=5).error.code for f in futures} == {"throttled"}  # type: ignore[union-attr]

        later = runtime.machines.enqueue(request(3, skip_batching=True)).result(timeout=5)

        (wait,) = throttled(sqlite_store, later.batch_id)
        assert (wait.reason, wait.wait_seconds) == ("retry_after", 4.0)
        assert runtime.coordinator.write_budget.refusals == 1


class TestHalting:
    def test_a_halt_ends_the_wait_and_leaves_the_dispatch_to_the_next_leader(
        self, sqlite_store: EventStore
    ) -> None:
        """The wait is recorded, the halt comes during it: nothing is dispatched or sent, and
        the caller is still waiting (the request resumes on the next leader)."""
        clock = HaltingClock(EPOCH)
        fake = FakeCloud(clock=clock)
        runtime = manual_runtime(sqlite_store, fake, clock, coordinator_options=budget(1.0, 1))
        runtime.machines.enqueue(request(1, skip_batching=True)).result(timeout=5)
        clock.on_sleep.append(runtime.coordinator.halt)

        pending = runtime.machines.enqueue(request(2, skip_batching=True))

        found = runtime.service.status("r-2")
        assert found is not None
        assert types(sqlite_store, found[1]) == ["vm.BatchOpened", "vm.BatchThrottled"]
        assert len(fake.calls) == 1
        assert not pending.done()


class TestCeiling:
    def test_by_default_many_more_batches_than_the_old_four_are_in_the_cloud_at_once(
        self, sqlite_store: EventStore
    ) -> None:
        """Twelve batches sealed together are all in flight together: the ceiling is not what
        paces them."""
        cloud = HeldCloud()
        runtime = MachinesRuntime(sqlite_store, cloud, clock=SystemClock(), config=CONFIG).start()
        try:
            futures = [runtime.machines.enqueue(request(n, skip_batching=True)) for n in range(12)]

            cloud.wait_entered(12, timeout=30)
            cloud.release.set()

            assert {f.result(timeout=30).status for f in futures} == {"created"}
        finally:
            cloud.release.set()
            runtime.stop()


class TestOptions:
    def test_the_defaults_are_azures_write_budget_and_a_high_ceiling(self) -> None:
        options = CoordinatorOptions()

        assert (options.write_rate, options.write_burst) == (10.0, 200)
        assert options.max_concurrent_batches == DEFAULT_MAX_CONCURRENT_BATCHES == 1200

    def test_a_call_costs_a_write_per_put(self) -> None:
        """Batch mode: one write per 50 machines (rounded up); per machine: one each."""
        assert CoordinatorOptions().writes_for(120) == 3
        assert CoordinatorOptions().writes_for(50) == 1
        assert CoordinatorOptions(dispatch_mode="per_machine").writes_for(120) == 120

    @pytest.mark.parametrize(
        "settings",
        [
            {"max_concurrent_batches": 0},
            {"write_burst": 0},
            {"write_rate": 0.0},
            {"write_rate": float("nan")},
            {"machines_per_write": 0},
            {"write_recovery_seconds": 0.0},
        ],
    )
    def test_nonsense_is_refused(self, settings: dict[str, object]) -> None:
        with pytest.raises(ValueError):
            CoordinatorOptions(**settings)  # type: ignore[arg-type]


def opened_state(batch_id: str = "b-1") -> BatchState:
    opened = BatchOpened(
        batch_id,
        template_hash(D4),
        D4,
        (BatchMachine("r-1", "m-1"),),
        "skip",
        EPOCH,
        3,
        EPOCH,
    )
    return batch_aggregate("default").fold(BatchState(), [opened])


def wait(attempt: int = 1, seconds: float = 2.0, **more: object) -> RecordThrottle:
    fields: dict[str, object] = {
        "reason": "write_budget",
        "writes": 1,
        "write_rate": 10.0,
        **more,
    }
    return RecordThrottle("b-1", attempt, wait_seconds=seconds, at=EPOCH, **fields)  # type: ignore[arg-type]


class TestEvent:
    def test_it_round_trips_through_the_batch_codec(self, sqlite_store: EventStore) -> None:
        event = BatchThrottled("b-1", 2, "retry_after", 7.25, 3, None, EPOCH)
        records = encode(
            "vmbatch-default-b-1", 1, [event], causation_ids=["c"], actor="t", grouper="default"
        )
        sqlite_store.append("vmbatch-default-b-1", records)

        (record,) = sqlite_store.read_stream("vmbatch-default-b-1")

        assert record.type == "vm.BatchThrottled"
        assert decode_batch_event(record) == event

    def test_a_wait_changes_nothing_of_the_batch(self) -> None:
        aggregate = batch_aggregate("default")
        state = opened_state()

        (event,) = aggregate.decide(state, wait())

        assert isinstance(event, BatchThrottled)
        assert aggregate.fold(state, [event]) == state

    def test_a_batch_not_open_has_nothing_to_wait_for(self) -> None:
        with pytest.raises(Rejected, match="not open"):
            batch_aggregate("default").decide(BatchState(), wait())

    @pytest.mark.parametrize(
        ("command", "message"),
        [
            (wait(attempt=2), "before dispatch 1"),
            (wait(seconds=0.0), "wait_seconds must be > 0"),
            (wait(reason="bored"), "reason must be one of"),
            (wait(writes=0), "writes"),
            (wait(write_rate=-1.0), "write_rate"),
        ],
    )
    def test_a_malformed_wait_is_refused(self, command: RecordThrottle, message: str) -> None:
        with pytest.raises(InvalidCommand, match=message):
            batch_aggregate("default").decide(opened_state(), command)
