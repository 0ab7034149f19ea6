"""The machine-requests read model: lifecycle statuses, rebuild equality, waiting."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import CapacityUnavailable, FakeCloud
from fleetledger.adapters.machines import MachinesRuntime, batch_stream_id, grouper_stream_id
from fleetledger.adapters.machines.streams import batch_stream_prefix
from fleetledger.eventstore import EventStore
from fleetledger.projections.machine_requests import (
    REQUEST_EVENT_TYPES,
    MachineRequestsProjection,
)
from tests.adapters.machines.support import (
    D8,
    EPOCH,
    LostCalls,
    manual_runtime,
    pass_idle_timeout,
    request,
)


def projection(grouper: str = "default") -> MachineRequestsProjection:
    return MachineRequestsProjection(
        grouper_stream=grouper_stream_id(grouper), batch_stream_prefix=batch_stream_prefix(grouper)
    )


def statuses(store: EventStore, request_id: str) -> list[str]:
    """The request's status after each event, folding the log one event at a time."""
    model = projection()
    seen: list[str] = []
    for event in store.read_all(after=0, limit=10_000):
        model.apply(event)
        view = model.get(request_id)
        if view is not None and (not seen or seen[-1] != view.status):
            seen.append(view.status)
    return seen


def idle(runtime: MachinesRuntime) -> None:
    """Let the runtime's manual clock pass the idle timeout and step the driver."""
    assert isinstance(runtime.clock, ManualClock)
    pass_idle_timeout(runtime, runtime.clock)


@pytest.fixture
def runtime(sqlite_store: EventStore) -> Iterator[MachinesRuntime]:
    clock = ManualClock(EPOCH)
    yield manual_runtime(sqlite_store, FakeCloud(clock=clock), clock)


class TestLifecycle:
    def test_a_created_request_goes_pending_sealed_dispatched_created(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """Each step of the batch shows in the request's status, in order."""
        runtime.machines.enqueue(request(1))
        idle(runtime)

        assert statuses(sqlite_store, "r-1") == ["pending", "sealed", "dispatched", "created"]

    def test_a_failed_request_keeps_its_error(self, sqlite_store: EventStore) -> None:
        """The outcome's code and message are in the view."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        cloud.fail_machine("m-1", CapacityUnavailable("zone 2 is full", zone="2"))
        live = manual_runtime(sqlite_store, cloud, clock)
        live.machines.enqueue(request(1, zones=("2",), skip_batching=True))
        model = projection()

        model.catch_up(sqlite_store)

        view = model.get("r-1")
        assert view is not None and view.status == "failed"
        assert view.error is not None and view.error.code == "capacity_unavailable"
        outcome = view.to_dict()["outcome"]
        assert isinstance(outcome, dict) and outcome["status"] == "failed"

    def test_a_machine_not_found_goes_back_to_sealed_until_sent_again(
        self, sqlite_store: EventStore
    ) -> None:
        """A read that finds nothing returns the request to 'sealed'; attempts are counted."""
        clock = ManualClock(EPOCH)
        live = manual_runtime(sqlite_store, LostCalls(FakeCloud(clock=clock)), clock)
        live.machines.enqueue(request(1, skip_batching=True))

        sequence = statuses(sqlite_store, "r-1")
        model = projection()
        model.catch_up(sqlite_store)

        assert sequence[:5] == ["pending", "sealed", "dispatched", "sealed", "dispatched"]
        assert sequence[-1] == "failed"
        view = model.get("r-1")
        assert view is not None and view.attempts == 3

    def test_ignores_the_streams_of_another_grouper(self, sqlite_store: EventStore) -> None:
        """A grouper whose name starts like ours ("default-b") is not folded into ours."""
        clock = ManualClock(EPOCH)
        other = manual_runtime(
            sqlite_store, FakeCloud(clock=clock), clock, grouper_name="default-b"
        )
        other.machines.enqueue(request(1, skip_batching=True))
        model = projection()

        model.catch_up(sqlite_store)

        assert model.views() == {}
        assert batch_stream_id("default-b", "x").startswith(batch_stream_prefix("default"))


class TestGrouperVersion:
    def test_is_the_version_of_the_last_grouper_event_read(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """Of the events the model reads: batch streams' events move it on, not the grouper's
        version."""
        runtime.machines.enqueue(request(1))
        runtime.machines.enqueue(request(2))
        idle(runtime)
        model = projection()

        model.catch_up(sqlite_store)

        grouper = [
            e
            for e in sqlite_store.read_all(types=list(REQUEST_EVENT_TYPES))
            if e.stream_id == grouper_stream_id("default")
        ]
        assert model.grouper_version == grouper[-1].stream_version == 3  # two requests, a seal
        assert model.position > grouper[-1].global_position  # the batch's events came after


class TestRebuild:
    def test_rebuilt_from_zero_equals_the_incrementally_built_model(
        self, store: EventStore
    ) -> None:
        """Folding the whole log at once gives the same views as following it as it grew."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        cloud.fail_machine("m-3", CapacityUnavailable("full", zone="1"))
        cloud.omit_from_result("m-4")
        live = manual_runtime(store, cloud, clock)
        incremental = projection()
        steps: list[Callable[[], object]] = [
            lambda: live.machines.enqueue_many([request(n) for n in range(1, 6)]),
            lambda: live.machines.enqueue(request(6, D8, skip_batching=True)),
            lambda: pass_idle_timeout(live, clock),
            lambda: live.machines.enqueue_many([request(n, D8) for n in range(7, 10)]),
            live.service.shutdown,
        ]
        for step in steps:
            step()
            incremental.catch_up(store)
        rebuilt = projection()

        rebuilt.catch_up(store)

        assert rebuilt.views() == incremental.views()
        assert rebuilt.position == incremental.position
        assert rebuilt.counts() == {"created": 8, "failed": 1}


class TestViews:
    def test_a_view_read_earlier_does_not_change_under_its_reader(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """The model updates its requests in place; what it hands out is a copy as of then."""
        runtime.machines.enqueue(request(1))
        model = projection()
        model.catch_up(sqlite_store)
        pending = model.get("r-1")

        idle(runtime)
        model.catch_up(sqlite_store)

        assert pending is not None and pending.status == "pending"
        created = model.get("r-1")
        assert created is not None and created.status == "created"
        assert created.position > pending.position


class TestWaiting:
    def test_watch_resolves_when_the_request_reaches_its_outcome(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """A watcher registered while pending gets the terminal view."""
        runtime.machines.enqueue(request(1))
        model = projection()
        model.catch_up(sqlite_store)
        watched = model.watch("r-1")
        assert not watched.done()

        idle(runtime)
        model.catch_up(sqlite_store)

        assert watched.result(timeout=0).status == "created"

    def test_a_cancelled_watch_is_forgotten(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """A long-poll that gave up leaves nothing behind to resolve later."""
        runtime.machines.enqueue(request(1))
        model = projection()
        model.catch_up(sqlite_store)

        model.watch("r-1").cancel()

        assert model._watchers == {}

    def test_watching_an_unknown_request_is_a_key_error(self) -> None:
        """Nothing to wait for: say so at once."""
        with pytest.raises(KeyError):
            projection().watch("r-404")

    def test_wait_for_position_returns_once_read_that_far(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """Read-your-writes: True once the model has folded the position, False on timeout."""
        accepted = runtime.service.request([request(1)])
        model = projection()
        assert accepted.last_position is not None

        before = model.wait_for_position(accepted.last_position, timeout=0)
        model.catch_up(sqlite_store)
        after = model.wait_for_position(accepted.last_position, timeout=0)

        assert (before, after) == (False, True)

    def test_reached_resolves_once_read_that_far(
        self, sqlite_store: EventStore, runtime: MachinesRuntime
    ) -> None:
        """The non-blocking read-your-writes: the future resolves when the model gets there,
        and at once for a position already read."""
        accepted = runtime.service.request([request(1)])
        model = projection()
        assert accepted.last_position is not None

        pending = model.reached(accepted.last_position)
        assert not pending.done()
        model.catch_up(sqlite_store)

        assert pending.done()
        assert model.reached(accepted.last_position).done()


class TestFollower:
    def test_a_running_runtime_keeps_its_model_current(self, sqlite_url: str) -> None:
        """The follower thread folds new events without being asked (woken by the append)."""
        from fleetledger.adapters.clock import SystemClock
        from fleetledger.eventstore import open_store

        with (
            contextlib.closing(open_store(sqlite_url)) as store,
            MachinesRuntime(store, FakeCloud(), clock=SystemClock()) as live,
        ):
            accepted = live.service.request([request(1)])
            assert accepted.last_position is not None
            assert live.projection.wait_for_position(accepted.last_position, timeout=10)
            view = live.projection.get("r-1")

        assert view is not None and view.status == "pending"
