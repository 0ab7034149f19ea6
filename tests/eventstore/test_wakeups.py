"""Wake-ups across processes on Postgres: NOTIFY after commits, at most once per window."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from fleetledger.eventstore import EventStore, RecordedEvent, open_store
from fleetledger.eventstore._engine import libpq_conninfo
from fleetledger.eventstore._postgres_append import NOTIFY_CHANNEL
from fleetledger.eventstore._wakeups import Notifier
from tests.eventstore.support import new_events

WAIT = 10.0
QUIET = 0.5
"""How long a notification that must not come is waited for."""
END = "end-of-test"


@pytest.fixture
def listener(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(libpq_conninfo(postgres_url), autocommit=True) as conn:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        yield conn


def notifications_before_end(listener: psycopg.Connection[Any], postgres_url: str) -> int:
    """How many wake-ups arrived before a marker NOTIFY sent now.

    Notifications are delivered in commit order, so everything committed before the marker is
    counted without waiting for time to pass.
    """
    with psycopg.connect(libpq_conninfo(postgres_url), autocommit=True) as other:
        other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, END))
    for count, notify in enumerate(listener.notifies(timeout=WAIT)):
        if notify.payload == END:
            return count
    raise AssertionError(f"the marker notification did not arrive within {WAIT} s")


def next_notification(listener: psycopg.Connection[Any]) -> str:
    for notify in listener.notifies(timeout=WAIT, stop_after=1):
        return notify.payload
    raise AssertionError(f"no notification arrived within {WAIT} s")


class TestNotifier:
    def test_a_poke_after_a_quiet_spell_is_sent_at_once(
        self, postgres_url: str, listener: psycopg.Connection[Any]
    ) -> None:
        """The window throttles bursts; it does not delay a lone commit's wake-up."""
        notifier = Notifier(libpq_conninfo(postgres_url), NOTIFY_CHANNEL, window=3600)
        try:
            notifier.poke()

            assert next_notification(listener) == ""
        finally:
            notifier.close()

    def test_pokes_during_the_window_share_one_notification(
        self, postgres_url: str, listener: psycopg.Connection[Any]
    ) -> None:
        notifier = Notifier(libpq_conninfo(postgres_url), NOTIFY_CHANNEL, window=3600)
        notifier.poke()
        next_notification(listener)  # sent: the hour-long window has begun
        for _ in range(50):
            notifier.poke()

        # Held back: an unthrottled notifier sends within milliseconds of a poke.
        assert list(listener.notifies(timeout=QUIET, stop_after=1)) == []
        notifier.close()  # cuts the window short and sends what is pending
        assert notifications_before_end(listener, postgres_url) == 1

    def test_nothing_is_sent_without_a_poke(
        self, postgres_url: str, listener: psycopg.Connection[Any]
    ) -> None:
        notifier = Notifier(libpq_conninfo(postgres_url), NOTIFY_CHANNEL)
        notifier.close()

        assert notifications_before_end(listener, postgres_url) == 0

    def test_a_poke_after_close_starts_the_notifier_again(
        self, postgres_url: str, listener: psycopg.Connection[Any]
    ) -> None:
        """The store closes the notifier only when it closes, but a reused backend keeps working."""
        notifier = Notifier(libpq_conninfo(postgres_url), NOTIFY_CHANNEL, window=3600)
        notifier.poke()
        notifier.close()
        notifier.poke()
        notifier.close()

        assert notifications_before_end(listener, postgres_url) == 2

    def test_an_unreachable_server_is_logged_and_never_raised(self) -> None:
        notifier = Notifier(
            "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2", NOTIFY_CHANNEL
        )
        with capture_logs() as logs:
            notifier.poke()
            notifier.close()

        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "wake-up notification failed; listeners in other processes will notice new events "
            "by polling until it works again"
        ]


class TestInProcess:
    def test_an_append_wakes_a_waiter_for_its_types(self, store: EventStore) -> None:
        seen = store.wake_sequence()
        store.append("vm-1", new_events(1, type="Wanted"))

        assert store.wait_for_wake(seen, timeout=0, types=["Wanted", "Also"])

    def test_an_append_of_other_types_lets_a_typed_waiter_sleep(self, store: EventStore) -> None:
        """A reader of some types is not sent to read after another capability's append."""
        seen = store.wake_sequence()
        store.append("vm-1", new_events(1, type="Other"))

        assert not store.wait_for_wake(seen, timeout=0, types=["Wanted"])
        assert store.wait_for_wake(seen, timeout=0)

    def test_an_explicit_wake_reaches_every_waiter(self, store: EventStore) -> None:
        seen = store.wake_sequence()
        store.wake()

        assert store.wait_for_wake(seen, timeout=0, types=["Wanted"])


class Counter:
    """Counts calls; a test waits for a count without sleeping."""

    def __init__(self) -> None:
        self.calls = 0
        self._changed = threading.Condition()

    def __call__(self) -> None:
        with self._changed:
            self.calls += 1
            self._changed.notify_all()

    def wait_for(self, calls: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.calls >= calls, timeout=WAIT)


class TestWaiters:
    def test_a_waiter_sleeps_through_other_types_until_its_own_arrive(
        self, sqlite_store: EventStore
    ) -> None:
        """A parked reader of some types is not woken by another capability's append (each
        such wake-up was a thread switch for nothing), and is by one of its own. (SQLite: no
        listener thread whose wake-ups on connecting would reach every waiter meanwhile.)"""
        store = sqlite_store
        seen = store.wake_sequence()
        woken: list[bool] = []
        waiter = threading.Thread(
            target=lambda: woken.append(store.wait_for_wake(seen, timeout=WAIT, types=["Wanted"]))
        )
        waiter.start()
        wait_until(lambda: len(store._waiters) == 1)

        store.append("vm-1", new_events(1, type="Other"))
        [parked] = store._waiters
        slept_through = not parked.event.is_set()
        store.append("vm-2", new_events(1, type="Wanted"))
        waiter.join(WAIT)

        assert slept_through
        assert woken == [True]


class TestListening:
    def test_only_other_processes_notifications_wake_the_store(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """This store's own NOTIFYs come back to its listener, which skips them: its waiters
        were woken at commit, and a broadcast would send every reader to read again."""
        backend = postgres_store.backend
        own = backend._sender
        counter = Counter()
        stop = threading.Event()
        listening = threading.Thread(
            target=backend.listen, args=(counter, stop), kwargs={"timeout": 0.1}
        )
        listening.start()
        counter.wait_for(1)  # the call made on connecting, for whatever came before
        with psycopg.connect(libpq_conninfo(postgres_url)) as other:
            for _ in range(50):
                other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, own))
            other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, "another-process"))
        # Delivered in order: once the marker below is counted, every notification above is.
        counter.wait_for(2)
        with psycopg.connect(libpq_conninfo(postgres_url), autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, END))
        counter.wait_for(3)
        stop.set()
        listening.join(WAIT)

        assert counter.calls == 3


class TestAcrossStores:
    def test_an_append_wakes_a_subscriber_of_another_store_before_its_poll(
        self, postgres_url: str
    ) -> None:
        """Store B polls once a minute; B must learn of A's append from the wake-up."""
        seen: list[int] = []

        def handler(event: RecordedEvent, conn: sa.Connection) -> None:
            seen.append(event.global_position)

        with (
            contextlib.closing(open_store(postgres_url)) as writer,
            contextlib.closing(open_store(postgres_url)) as reader,
        ):
            subscription = reader.subscribe("follow", handler, poll_interval=60.0)
            assert subscription.wait_for(0, timeout=WAIT)  # caught up and sleeping
            result = writer.append("vm-1", new_events(1))

            assert subscription.wait_for(result.last_position, timeout=WAIT)
        assert seen == [result.last_position]

    def test_a_store_notifies_once_it_has_appended(
        self, postgres_store: EventStore, postgres_url: str, listener: psycopg.Connection[Any]
    ) -> None:
        postgres_store.append("vm-1", new_events(3))
        postgres_store.close()  # flushes the pending wake-up

        assert notifications_before_end(listener, postgres_url) == 1


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.001)
