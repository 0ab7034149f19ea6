"""Checkpointed subscriptions: catch up, follow live, commit handler rows with the checkpoint."""

from __future__ import annotations

from typing import cast

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from fleetledger.eventstore import (
    EventStore,
    InvalidEvent,
    RecordedEvent,
    StoreUnavailable,
    Subscription,
    SubscriptionFailed,
)
from tests.counting_store import CountingStore
from tests.eventstore.support import new_events

WAIT = 20.0


class Recorder:
    """A handler that records what it saw and can be told to fail on one position."""

    def __init__(self, *, fail_at: int | None = None) -> None:
        self.seen: list[int] = []
        self.fail_at = fail_at

    def __call__(self, event: RecordedEvent, conn: sa.Connection) -> None:
        if event.global_position == self.fail_at:
            raise RuntimeError(f"cannot handle {event.global_position}")
        self.seen.append(event.global_position)


class RowWriter:
    """A handler that writes one row per event into ``handled`` through the given connection."""

    def __init__(self, *, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def __call__(self, event: RecordedEvent, conn: sa.Connection) -> None:
        conn.execute(
            sa.text("INSERT INTO handled (position, stream_id) VALUES (:p, :s)"),
            {"p": event.global_position, "s": event.stream_id},
        )
        if event.global_position == self.fail_at:
            # After its own write, so the test sees that write rolled back.
            raise RuntimeError(f"read model refuses {event.global_position}")


@pytest.fixture
def handled_table(store: EventStore) -> None:
    """A small read-model table in the store's database."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("CREATE TABLE handled (position BIGINT PRIMARY KEY, stream_id TEXT NOT NULL)")
        )


def handled_rows(store: EventStore) -> list[int]:
    with store.engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text("SELECT position FROM handled ORDER BY 1"))]


def subscribe(store: EventStore, name: str, handler: Recorder | RowWriter) -> Subscription:
    # poll_interval is long so that these tests prove the wake-ups work, not the polling.
    return store.subscribe(name, handler, poll_interval=30.0, start=False)


class TestCatchUpAndLive:
    def test_catches_up_then_follows_live(self, store: EventStore) -> None:
        """A started subscription handles old events, then ones appended after it started."""
        store.append("vm-1", new_events(3))
        recorder = Recorder()

        with subscribe(store, "projector", recorder) as subscription:
            assert subscription.wait_for(3, timeout=WAIT)
            store.append("vm-2", new_events(2))
            store.append("vm-1", new_events(1))
            assert subscription.wait_for(6, timeout=WAIT)

        assert recorder.seen == [1, 2, 3, 4, 5, 6]
        assert subscription.position == 6

    def test_starting_on_an_empty_log_then_live(self, store: EventStore) -> None:
        """A subscription started before any event handles the first ones as they come."""
        recorder = Recorder()

        with subscribe(store, "projector", recorder) as subscription:
            for n in range(5):
                store.append(f"vm-{n}", new_events(2))
            assert subscription.wait_for(10, timeout=WAIT)

        assert recorder.seen == list(range(1, 11))

    def test_run_until_caught_up(self, store: EventStore) -> None:
        """run_until_caught_up handles everything up to the head, in pages, and says how many."""
        for n in range(5):
            store.append(f"vm-{n}", new_events(3))
        recorder = Recorder()
        subscription = store.subscribe("projector", recorder, batch_size=4, start=False)

        assert subscription.run_until_caught_up() == 15
        assert subscription.run_until_caught_up() == 0
        assert recorder.seen == list(range(1, 16))

    def test_types_filter(self, store: EventStore) -> None:
        """A subscription with types sees only those events."""
        store.append("vm-1", new_events(2, type="Started"))
        store.append("vm-1", new_events(1, type="Stopped"))
        store.append("vm-2", new_events(1, type="Started"))
        recorder = Recorder()

        store.subscribe("starts", recorder, types=["Started"], start=False).run_until_caught_up()

        assert recorder.seen == [1, 2, 4]

    def test_a_rare_type_is_read_for_from_where_the_last_read_ended(
        self, store: EventStore
    ) -> None:
        """Not from its last event, which would read every other event appended since on each
        call: the checkpoint stays at the last event handled, the reads move on."""
        store.append("vm-1", new_events(1, type="Rare"))
        store.append("vm-2", new_events(3, type="Common"))
        reads = CountingStore(store)
        recorder = Recorder()
        subscription = Subscription(
            cast(EventStore, reads),
            "rare",
            recorder,
            types=["Rare"],
            batch_size=100,
            poll_interval=30.0,
        )

        assert subscription.run_until_caught_up() == 1
        store.append("vm-2", new_events(2, type="Common"))
        assert subscription.run_until_caught_up() == 0
        store.append("vm-1", new_events(1, type="Rare"))
        assert subscription.run_until_caught_up() == 1

        assert reads.types_reads_after == [0, 4, 6]
        assert recorder.seen == [1, 7]
        assert subscription.position == 7

    def test_two_names_are_independent(self, store: EventStore) -> None:
        """Each subscription name has its own checkpoint."""
        store.append("vm-1", new_events(3))
        first, second = Recorder(), Recorder()
        store.subscribe("first", first, start=False).run_until_caught_up()

        store.subscribe("second", second, start=False).run_until_caught_up()

        assert first.seen == second.seen == [1, 2, 3]

    def test_a_name_is_required(self, store: EventStore) -> None:
        """An empty subscription name is refused."""
        with pytest.raises(InvalidEvent, match="name"):
            store.subscribe("", Recorder(), start=False)


class TestCheckpoint:
    def test_a_new_subscription_resumes_after_the_checkpoint(self, store: EventStore) -> None:
        """The checkpoint is persisted: the same name picks up after what was handled."""
        store.append("vm-1", new_events(3))
        store.subscribe("projector", Recorder(), start=False).run_until_caught_up()
        store.append("vm-1", new_events(2))
        recorder = Recorder()

        resumed = store.subscribe("projector", recorder, start=False)

        assert resumed.position == 3
        assert resumed.run_until_caught_up() == 2
        assert recorder.seen == [4, 5]

    def test_the_checkpoint_survives_reopening_the_store(self, store_url: str) -> None:
        """A checkpoint written by one store is read by a store opened later."""
        from fleetledger.eventstore import open_store

        with open_store(store_url) as first:
            first.append("vm-1", new_events(4))
            first.subscribe("projector", Recorder(), start=False).run_until_caught_up()
        with open_store(store_url) as second:
            assert second.subscribe("projector", Recorder(), start=False).position == 4

    def test_live_subscription_persists_its_checkpoint(self, store: EventStore) -> None:
        """A background subscription stores its checkpoint as it goes."""
        store.append("vm-1", new_events(3))

        with subscribe(store, "projector", Recorder()) as subscription:
            assert subscription.wait_for(3, timeout=WAIT)

        assert subscribe(store, "projector", Recorder()).position == 3


class TestHandlerTransactions:
    def test_handler_rows_commit_with_the_checkpoint(
        self, store: EventStore, handled_table: None
    ) -> None:
        """Rows a handler writes through its connection are committed with the checkpoint."""
        store.append("vm-1", new_events(4))

        subscribe(store, "model", RowWriter()).run_until_caught_up()

        assert handled_rows(store) == [1, 2, 3, 4]
        assert subscribe(store, "model", RowWriter()).position == 4

    def test_a_failing_handlers_rows_are_rolled_back(
        self, store: EventStore, handled_table: None
    ) -> None:
        """The failing event's rows are rolled back; earlier events' rows and checkpoint stay."""
        store.append("vm-1", new_events(5))

        with pytest.raises(SubscriptionFailed):
            subscribe(store, "model", RowWriter(fail_at=3)).run_until_caught_up()

        assert handled_rows(store) == [1, 2]
        assert subscribe(store, "model", RowWriter()).position == 2

    def test_resumed_handler_writes_each_row_once(
        self, store: EventStore, handled_table: None
    ) -> None:
        """After the fix the subscription resumes at the failed event; no row is written twice."""
        store.append("vm-1", new_events(5))
        writer = RowWriter(fail_at=3)
        subscription = subscribe(store, "model", writer)
        with pytest.raises(SubscriptionFailed):
            subscription.run_until_caught_up()

        writer.fail_at = None
        assert subscription.run_until_caught_up() == 3

        assert handled_rows(store) == [1, 2, 3, 4, 5]


class TestFailure:
    def test_stops_at_the_failing_event(self, store: EventStore) -> None:
        """A handler error stops the subscription before that event, with failure set."""
        store.append("vm-1", new_events(5))
        recorder = Recorder(fail_at=4)
        subscription = subscribe(store, "projector", recorder)

        with pytest.raises(SubscriptionFailed) as raised:
            subscription.run_until_caught_up()

        assert raised.value.position == 4
        assert raised.value.name == "projector"
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert subscription.position == 3
        assert subscription.failure is not None
        assert subscription.failure.position == 4
        assert recorder.seen == [1, 2, 3]
        assert subscribe(store, "projector", Recorder()).position == 3

    def test_a_handler_that_writes_nothing_stops_at_the_failing_event_too(
        self, store: EventStore
    ) -> None:
        """Without savepoints (``handler_writes=False``) the checkpoint still stops just
        before the failing event."""
        store.append("vm-1", new_events(5))
        recorder = Recorder(fail_at=4)
        subscription = store.subscribe("reactor", recorder, start=False, handler_writes=False)

        with pytest.raises(SubscriptionFailed):
            subscription.run_until_caught_up()

        assert recorder.seen == [1, 2, 3]
        assert store.subscribe("reactor", Recorder(), start=False).position == 3

    def test_a_handler_failing_because_the_log_is_down_is_retried_not_stopped(
        self, store: EventStore
    ) -> None:
        """An outage seen by a handler (a StoreUnavailable, even wrapped in its own error) rolls
        the page back and leaves the subscription able to go on: it is not a poison event."""
        store.append("vm-1", new_events(3))
        outage = True

        class Wrapped(RuntimeError):
            pass

        def handler(event: RecordedEvent, conn: sa.Connection) -> None:
            if outage and event.global_position == 2:
                raise Wrapped("could not reload") from StoreUnavailable("server closed")
            seen.append(event.global_position)

        seen: list[int] = []
        subscription = store.subscribe("reader", handler, start=False)
        with pytest.raises(Wrapped):
            subscription.run_until_caught_up()
        assert subscription.failure is None
        assert subscription.position == 0

        outage = False
        assert subscription.run_until_caught_up() == 3
        assert seen == [1, 1, 2, 3]

    def test_resumes_at_the_failing_event_after_the_fix(self, store: EventStore) -> None:
        """Started again after the handler is fixed, it handles the failed event and the rest."""
        store.append("vm-1", new_events(5))
        recorder = Recorder(fail_at=4)
        subscription = subscribe(store, "projector", recorder)
        with pytest.raises(SubscriptionFailed):
            subscription.run_until_caught_up()

        recorder.fail_at = None

        assert subscription.run_until_caught_up() == 2
        assert recorder.seen == [1, 2, 3, 4, 5]

    def test_a_live_subscription_stops_and_restarts(self, store: EventStore) -> None:
        """In the background a failure stops the thread; start() after the fix resumes there."""
        store.append("vm-1", new_events(3))
        recorder = Recorder(fail_at=2)
        subscription = subscribe(store, "projector", recorder)

        with subscription:
            assert not subscription.wait_for(3, timeout=WAIT)
            assert subscription.failure is not None
            assert subscription.failure.position == 2
            assert subscription.position == 1
            recorder.fail_at = None
            # stop() joins the failed thread first: start() returns without restarting while
            # that thread is still alive, which it can be for a moment after failure is set.
            subscription.stop()
            subscription.start()
            assert subscription.wait_for(3, timeout=WAIT)
            store.append("vm-1", new_events(1))
            assert subscription.wait_for(4, timeout=WAIT)

        assert recorder.seen == [1, 2, 3, 4]
        assert subscription.failure is None

    def test_the_failure_is_logged(self, store: EventStore) -> None:
        """The handler's error is logged with the subscription, position and event."""
        store.append("vm-1", new_events(2, type="Boom"))
        subscription = subscribe(store, "projector", Recorder(fail_at=2))

        with capture_logs() as logs, pytest.raises(SubscriptionFailed):
            subscription.run_until_caught_up()

        [entry] = [e for e in logs if e["log_level"] == "error"]
        assert entry["subscription"] == "projector"
        assert entry["position"] == 2
        assert entry["event_type"] == "Boom"
        assert entry["stream_id"] == "vm-1"
        assert "cannot handle 2" in entry["error"]
