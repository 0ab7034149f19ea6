"""Checkpointed subscriptions: catch up from the checkpoint, then follow the log live.

Each page of events is handled in one database transaction that also advances the checkpoint,
with a savepoint per event. A handler that raises is rolled back to its savepoint, the checkpoint
is stored just before the failing event, and the subscription stops there (logged, and kept in
``failure``); starting it again resumes at that event. Handlers therefore see every event once in
effect, in global order, across crashes and restarts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import sqlalchemy as sa
import structlog

from fleetledger.eventstore._sql import SqlBackend
from fleetledger.eventstore._types import RecordedEvent, TypesPage
from fleetledger.eventstore.errors import InvalidEvent, StoreUnavailable, SubscriptionFailed

__all__ = ["Handler", "Subscription"]

Handler = Callable[[RecordedEvent, sa.Connection], None]
log = structlog.get_logger("eventstore.subscription")


class SubscribedLog(Protocol):
    """What a subscription reads and waits on: the event store, named by its use here so this
    module need not import the store that creates subscriptions."""

    @property
    def backend(self) -> SqlBackend: ...

    def head(self) -> int: ...

    def read_all(
        self, *, after: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]: ...

    def read_types(self, *, after: int, types: Sequence[str], limit: int = 1000) -> TypesPage: ...

    def wake(self) -> None: ...

    def wake_sequence(self) -> int: ...

    def wait_for_wake(
        self, seen: int, timeout: float, *, types: Collection[str] | None = None
    ) -> bool: ...


class Subscription:
    """A named, checkpointed reader of the global log; see :meth:`EventStore.subscribe`."""

    def __init__(
        self,
        store: SubscribedLog,
        name: str,
        handler: Handler,
        *,
        types: Sequence[str] | None,
        batch_size: int,
        poll_interval: float,
        handler_writes: bool = True,
    ) -> None:
        if not name or not isinstance(name, str):
            raise InvalidEvent("a subscription needs a non-empty name")
        if batch_size < 1 or poll_interval <= 0:
            raise InvalidEvent("batch_size must be >= 1 and poll_interval > 0")
        self.name = name
        self._store = store
        self._handler = handler
        self._types = list(types) if types is not None else None
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._handler_writes = handler_writes
        self._position = store.backend.load_checkpoint(name)
        self._scanned = self._position
        """How far the log holds no unhandled event of the subscription's types: past the
        checkpoint, which moves only with those events (see :meth:`_read_page`)."""
        self._progress = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: SubscriptionFailed | None = None

    @property
    def position(self) -> int:
        """Global position of the last event handled (the checkpoint)."""
        with self._progress:
            return self._position

    def run_until_caught_up(self) -> int:
        """Handle events until the head as it was when called; returns how many were handled.

        Raises SubscriptionFailed if the handler raises.
        """
        target = self._store.head()
        handled = 0
        while max(self.position, self._scanned) < target:
            count = self._handle_page()
            if count == 0:
                break
            handled += count
        return handled

    def start(self) -> Subscription:
        """Run in a background thread: catch up, then follow live until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            if self.failure is None and not self._stop.is_set():
                return self  # already running
            # A thread that failed or was told to stop may still be winding down: let it end,
            # so this start really starts (and resumes at the failed event).
            self._thread.join()
        self._stop.clear()
        self.failure = None
        self._thread = threading.Thread(
            target=self._run, name=f"subscription-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self._store.wake()  # so the loop sees the stop flag now
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until the checkpoint reaches ``position`` (True) or the subscription fails or
        ``timeout`` seconds pass (False)."""
        with self._progress:
            return (
                self._progress.wait_for(
                    lambda: (
                        self._position >= position
                        or self.failure is not None
                        or self._stop.is_set()
                    ),
                    timeout=timeout,
                )
                and self._position >= position
            )

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Subscription:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        log.info("subscription started", subscription=self.name, position=self.position)
        while not self._stop.is_set():
            seen = self._store.wake_sequence()
            try:
                handled = self._handle_page()
            except SubscriptionFailed:
                return
            except Exception as e:
                # Store unreachable and the like: keep the checkpoint, retry after the interval.
                log.warning(
                    "subscription read failed; retrying", subscription=self.name, error=str(e)
                )
                self._stop.wait(self._poll_interval)
                continue
            if handled == 0:
                self._store.wait_for_wake(seen, self._poll_interval, types=self._types)
        log.info("subscription stopped", subscription=self.name, position=self.position)

    def _read_page(self) -> tuple[list[RecordedEvent], int]:
        """The next events to handle, and how far the log has been read once they are. A
        subscription to some types reads on from where its last read ended, not from its last
        event: one of a rare type would otherwise read every event appended since, each time."""
        if self._types is None:
            events = self._store.read_all(after=self.position, limit=self._batch_size)
            return events, events[-1].global_position if events else self.position
        page = self._store.read_types(
            after=max(self.position, self._scanned), types=self._types, limit=self._batch_size
        )
        return page.events, page.through

    def _handle_page(self) -> int:
        events, through = self._read_page()
        if not events:
            self._scanned = max(self._scanned, through)
            return 0
        failed: tuple[RecordedEvent, Exception] | None = None
        last = self.position
        handled = 0
        with self._store.backend.checkpoint_transaction(self.name) as (conn, stored):
            if stored != self.position:
                # Someone else (another process with the same name) moved the checkpoint:
                # adopt theirs and read again rather than handle events twice.
                self._set_position(stored)
                return 0
            for event in events:
                # A savepoint per event undoes a failing handler's own writes while keeping the
                # earlier events'; a handler that writes nothing needs none (two round trips
                # fewer per event).
                savepoint = conn.begin_nested() if self._handler_writes else None
                try:
                    self._handler(event, conn)
                except Exception as e:
                    if _caused_by_outage(e):
                        # The log, not the handler, failed (a handler that reads it, whatever
                        # its own error says): the page is rolled back, checkpoint included,
                        # and read again once the store answers.
                        raise
                    if savepoint is not None:
                        savepoint.rollback()
                    failed = (event, e)
                    break
                if savepoint is not None:
                    savepoint.commit()
                last = event.global_position
                handled += 1
            if last != stored:
                self._store.backend.store_checkpoint(conn, self.name, last)
        self._set_position(last)
        if failed is None:
            self._scanned = max(self._scanned, through)
        else:
            event, error = failed
            failure = SubscriptionFailed(self.name, event.global_position, error)
            log.error(
                "subscription handler failed; stopped before the event",
                subscription=self.name,
                position=event.global_position,
                event_type=event.type,
                stream_id=event.stream_id,
                error=repr(error),
            )
            with self._progress:
                self.failure = failure
                self._progress.notify_all()
            raise failure from error
        return handled

    def _set_position(self, position: int) -> None:
        with self._progress:
            self._position = position
            self._progress.notify_all()


def _caused_by_outage(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, the store being unreachable."""
    seen: BaseException | None = error
    for _ in range(10):  # a cause chain is short; the bound guards against a cycle
        if seen is None:
            return False
        if isinstance(seen, StoreUnavailable):
            return True
        seen = seen.__cause__
    return False
