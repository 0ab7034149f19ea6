"""Keeps an in-memory read model up to date with the log, in a background thread.

The thread reads everything new (``catch_up``), then waits for the store's wake-up signal — bumped
by every append of this process and, on Postgres, by ``NOTIFY`` from others — with a timeout that
is only the fallback for a missed notification. No sleep loop: an idle follower is parked on a
condition. Given the event ``types`` its model reads, it sleeps through this process's appends
of other types: with several capabilities in one process, each read model is not sent to read
(and find nothing) after every append of the others.

A model whose every read catches up first anyway (``min_interval_seconds``) need not chase each
append: the follower then reads at most that often, so a burst is read in a few pages instead of
a query per append, and the model is never further behind than the interval when it is read
without catching up.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import structlog

from fleetledger.eventstore import EventStore

__all__ = ["LogFollower", "ReadModel"]

log = structlog.get_logger(__name__)


class ReadModel(Protocol):
    """Something folded from the log that can read what is new."""

    def catch_up(self, store: EventStore) -> int:
        """Apply every event after the model's position; return how many were read."""
        ...


class LogFollower:
    """Runs ``model.catch_up(store)`` whenever the log may have grown, until stopped."""

    def __init__(
        self,
        store: EventStore,
        model: ReadModel,
        *,
        types: Sequence[str] | None = None,
        fallback_poll_seconds: float = 1.0,
        min_interval_seconds: float = 0.0,
    ) -> None:
        if min_interval_seconds < 0:
            raise ValueError(f"min_interval_seconds must be >= 0, got {min_interval_seconds}")
        self._store = store
        self._model = model
        self._types = types
        self._fallback = fallback_poll_seconds
        self._min_interval = min_interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LogFollower:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="log-follower", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        # Without this nudge a stop would wait out the fallback poll.
        self._store.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            seen = self._store.wake_sequence()
            try:
                read = self._model.catch_up(self._store)
            except Exception as e:
                log.warning("read model could not catch up; retrying", error=str(e))
                self._stop.wait(self._fallback)
                continue
            if read == 0:
                self._store.wait_for_wake(seen, timeout=self._fallback, types=self._types)
            elif self._min_interval:
                self._stop.wait(self._min_interval)
