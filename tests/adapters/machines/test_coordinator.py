"""The Coordinator: header, dispatch-before-call, per-machine results, reads, failures."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CapacityUnavailable,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
    ProgressNote,
    QuotaExceeded,
)
from fleetledger.adapters.machines import (
    BatchMetadata,
    CoordinatorOptions,
    MachineOutcome,
    batch_stream_id,
    current_batch,
)
from fleetledger.eventstore import EventStore, RecordedEvent

from .support import (
    EPOCH,
    CountingCloud,
    HeldRunner,
    LostCalls,
    events_of,
    manual_runtime,
    request,
    terminal_outcomes,
)


def outcomes_of(
    store: EventStore, cloud: object, *requests_: object, **options: object
) -> list[MachineOutcome]:
    """Run the requests as one skip-free batch (sealed by shutdown) and return their outcomes."""
    clock = ManualClock(EPOCH)
    runtime = manual_runtime(store, cloud, clock, **options)  # type: ignore[arg-type]
    futures = runtime.machines.enqueue_many(list(requests_))  # type: ignore[arg-type]
    runtime.service.shutdown()
    return [future.result(timeout=5) for future in futures]


def batch_events(store: EventStore, batch_id: str) -> list[str]:
    return events_of(store, batch_stream_id("default", batch_id))


class RecordingCloud:
    """The fake cloud, noting what the log and the context held when each create arrived."""

    def __init__(self, inner: FakeCloud, store: EventStore) -> None:
        self._inner = inner
        self._store = store
        self.log_at_call: list[list[str]] = []
        self.batch_at_call: list[BatchMetadata | None] = []
        self.noted: list[list[RecordedEvent]] = []
        """What each progress call had appended when it returned."""

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        self.log_at_call.append(batch_events(self._store, request.batch_id))
        self.batch_at_call.append(current_batch())

        def noting(notes: Sequence[ProgressNote]) -> None:
            assert on_progress is not None
            head = self._store.head()
            on_progress(notes)
            self.noted.append(self._store.read_all(after=head))

        return self._inner.create_batch(request, on_progress=noting)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self._inner.read_machine(machine_name, resume_token=resume_token)


class TestDispatch:
    def test_the_header_lists_every_machine_in_order_tagged_with_its_request(
        self, sqlite_store: EventStore
    ) -> None:
        """Absent zones are [], every machine carries its request id as the
        ``fleetledger-request`` tag; the recorded header is the one sent."""
        fake = FakeCloud()
        (outcome, *_) = outcomes_of(
            sqlite_store,
            fake,
            request(1, zones=("1", "2"), tags={"team": "a"}),
            request(2),
            request(3, zones=("3",)),
        )

        expected = {
            "vmSkus": {"value": []},
            "batchMachines": [
                {
                    "machineName": "m-1",
                    "zones": ["1", "2"],
                    "tags": {"team": "a", "fleetledger-request": "r-1"},
                },
                {"machineName": "m-2", "zones": [], "tags": {"fleetledger-request": "r-2"}},
                {"machineName": "m-3", "zones": ["3"], "tags": {"fleetledger-request": "r-3"}},
            ],
        }
        dispatched = sqlite_store.read_all(types=["vm.BatchDispatched"])[0]
        assert fake.calls[0].header == expected
        assert json.loads(str(dispatched.data["header"])) == expected
        assert outcome.batch_id == dispatched.data["batch_id"]

    def test_the_dispatch_is_recorded_before_the_cloud_call(self, sqlite_store: EventStore) -> None:
        """When the create arrives, BatchDispatched is already in the batch's stream."""
        cloud = RecordingCloud(FakeCloud(), sqlite_store)

        outcomes_of(sqlite_store, cloud, request(1))

        assert cloud.log_at_call == [["vm.BatchOpened", "vm.BatchDispatched"]]

    def test_the_cloud_adapter_sees_the_batch_in_its_context(
        self, sqlite_store: EventStore
    ) -> None:
        """The seed's BatchMetadata travels with the call, for code below the port."""
        cloud = RecordingCloud(FakeCloud(), sqlite_store)

        (outcome, _) = outcomes_of(sqlite_store, cloud, request(1), request(2))

        assert cloud.batch_at_call == [
            BatchMetadata(batch_id=outcome.batch_id, machine_names=("m-1", "m-2"), attempt=1)
        ]

    def test_machines_accepted_together_are_noted_in_one_commit(
        self, sqlite_store: EventStore
    ) -> None:
        """A batch PUT's notes are one append, not a commit per machine, and in the log before
        the create is awaited further."""
        cloud = RecordingCloud(FakeCloud(), sqlite_store)

        outcomes_of(sqlite_store, cloud, request(1), request(2), request(3))

        [noted] = cloud.noted
        assert [e.type for e in noted] == ["vm.MachineCreateAccepted"] * 3
        assert [e.data["machine_name"] for e in noted] == ["m-1", "m-2", "m-3"]
        assert len({e.recorded_at for e in noted}) == 1  # one commit's timestamp

    def test_per_machine_mode_records_each_call_and_no_header(
        self, sqlite_store: EventStore
    ) -> None:
        """Adapters without a batch API (plain VMs) record one call per machine, header None."""
        outcomes_of(
            sqlite_store,
            FakeCloud(),
            request(1),
            request(2),
            coordinator_options=CoordinatorOptions(dispatch_mode="per_machine"),
        )

        dispatched = sqlite_store.read_all(types=["vm.BatchDispatched"])[0]
        assert dispatched.data["header"] is None
        assert len(dispatched.data["calls"]) == 2


class TestResults:
    def test_a_machine_missing_from_the_result_is_read_not_assumed(
        self, sqlite_store: EventStore
    ) -> None:
        """The original counted unreported machines as created; here they are read back."""
        fake = FakeCloud()
        fake.omit_from_result("m-2")
        cloud = CountingCloud(fake)

        outcomes = outcomes_of(sqlite_store, cloud, request(1), request(2), request(3))

        assert cloud.reads == ["m-2"]
        assert [o.status for o in outcomes] == ["created"] * 3

    def test_a_per_machine_failure_fails_only_that_request(self, sqlite_store: EventStore) -> None:
        """Each request gets its own outcome, not the batch's."""
        fake = FakeCloud()
        fake.fail_machine("m-2", CapacityUnavailable("no capacity", zone="2"))

        outcomes = outcomes_of(sqlite_store, fake, request(1), request(2, zones=("2",)))

        assert [o.status for o in outcomes] == ["created", "failed"]
        error = outcomes[1].error
        assert error is not None and error.code == "capacity_unavailable"

    def test_a_failed_leftover_deleted_by_a_read_is_recorded_deleted(
        self, sqlite_store: EventStore
    ) -> None:
        """A failed machine the batch result left out is read; the adapter deletes it there,
        and its failure records the deletion as a result's would."""
        fake = FakeCloud(delete_failed=True)
        fake.fail_machine("m-2", CapacityUnavailable("no capacity", zone="2"))
        fake.omit_from_result("m-2")

        outcomes = outcomes_of(sqlite_store, fake, request(1), request(2, zones=("2",)))

        assert [o.status for o in outcomes] == ["created", "failed"]
        (failed,) = sqlite_store.read_all(types=["vm.MachineFailed"])
        assert (failed.data["machine_name"], failed.data["deleted"]) == ("m-2", True)
        assert (fake.deletions, fake.failed_leftovers()) == (("m-2",), ())

    def test_a_whole_call_refusal_fails_every_request_with_its_error(
        self, sqlite_store: EventStore
    ) -> None:
        """A refused call created nothing: every request fails with the classified error."""
        fake = FakeCloud()
        fake.fail_next_calls(QuotaExceeded("regional cores quota exceeded"))

        outcomes = outcomes_of(sqlite_store, fake, request(1), request(2))

        assert {(o.status, o.error.code if o.error else None) for o in outcomes} == {
            ("failed", "quota_exceeded")
        }
        assert fake.creations == ()

    def test_throttling_is_reported_as_retryable_with_its_delay(
        self, sqlite_store: EventStore
    ) -> None:
        """The requester learns it may ask again, and when."""
        fake = FakeCloud()
        fake.throttle(retry_after=7.0)

        (outcome,) = outcomes_of(sqlite_store, fake, request(1))

        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.retryable) == ("throttled", True)
        assert outcome.error.retry_after_seconds == 7.0

    def test_a_call_that_never_left_is_dispatched_again_up_to_max_attempts(
        self, sqlite_store: EventStore
    ) -> None:
        """Unclassified errors leave machines in doubt: read, not found, send again, give up."""
        cloud = LostCalls(FakeCloud())

        (outcome,) = outcomes_of(sqlite_store, cloud, request(1), max_attempts=3)

        assert cloud.attempts == 3
        assert outcome.error is not None and outcome.error.code == "not_created"
        assert batch_events(sqlite_store, outcome.batch_id).count("vm.BatchDispatched") == 3


class TestScheduling:
    def test_executing_a_completed_batch_again_changes_nothing(
        self, sqlite_store: EventStore
    ) -> None:
        """Re-running a finished batch (a duplicate notification) appends and calls nothing."""
        fake = FakeCloud()
        clock = ManualClock(EPOCH)
        runtime = manual_runtime(sqlite_store, fake, clock)
        (future,) = runtime.machines.enqueue_many([request(1, skip_batching=True)])
        head = sqlite_store.head()

        runtime.coordinator.execute(future.result(timeout=5).batch_id)

        assert sqlite_store.head() == head
        assert len(fake.calls) == 1
        assert runtime.coordinator.in_flight() == ()


class ClockWithInterlude(ManualClock):
    """A manual clock whose first sleep lets something else happen meanwhile (another process
    acting while this one waits)."""

    def __init__(self, start: datetime, interlude: Callable[[], object]) -> None:
        super().__init__(start)
        self._interlude: Callable[[], object] | None = interlude

    def sleep(self, seconds: float) -> None:
        interlude, self._interlude = self._interlude, None
        if interlude is not None:
            interlude()
        super().sleep(seconds)


class CreatesOf:
    """One process's handle on the shared fake cloud, noting the creates it sends."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner
        self.sent: list[tuple[str, ...]] = []

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self.sent.append(request.machine_names)
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class TestAnotherProcessDispatches:
    def test_a_dispatch_another_process_recorded_first_is_read_not_sent_again(
        self, store: EventStore
    ) -> None:
        """While this process waits for its write budget, another executes the same batch. Its
        own dispatch then meets that one and is decided again to nothing: nothing of it is
        appended (so no fence could refuse it), and it must not make the create call either."""
        cloud = FakeCloud()
        here = CreatesOf(cloud)
        there = CreatesOf(cloud)
        other_clock = ManualClock(EPOCH)
        clock = ClockWithInterlude(
            EPOCH, interlude=lambda: manual_runtime(store, there, other_clock)
        )
        runner = HeldRunner()
        runtime = manual_runtime(
            store,
            here,
            clock,
            runner=runner,
            coordinator_options=CoordinatorOptions(write_rate=1.0, write_burst=1),
        )
        runtime.machines.enqueue_many([request(1), request(2)])
        runtime.service.shutdown()
        runtime.coordinator.write_budget.reserve(1, clock.now())  # another batch's write

        (task,) = runner.held
        task()

        assert there.sent == [("m-1", "m-2")]
        assert here.sent == []
        assert len(cloud.calls) == 1
        assert terminal_outcomes(store) == Counter({"r-1": 1, "r-2": 1})
