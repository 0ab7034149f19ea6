"""The clock driver: runs an aggregate's clock.

Time is logical in the domain: something falls due at ``next_deadline(state)`` and happens with
the next command stamped at or after it. The driver makes sure such a command comes: it waits, on
a condition, for the *earlier* of a change to the aggregate (a new command may bring a nearer
deadline — or the first one) and the next deadline, then sends the tick. There is no polling
loop: with nothing due it waits without a timeout, and 100 rapid changes coalesce into at most a
few wake-ups, like seed 01's trigger channel of size one.

:meth:`ClockDriver.step` is the whole decision ("tick if due, say when next"); the thread calls
it in a loop, the simulator calls it directly at virtual times. The thread waits in real seconds,
so run it with a real clock (``SystemClock``); drive a ``ManualClock`` with ``step`` instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

import structlog

from fleetledger.adapters.clock import Clock

__all__ = ["ClockDriver"]

log = structlog.get_logger(__name__)

_RETRY_AFTER_ERROR_SECONDS = 1.0


class ClockDriver:
    """Calls ``tick()`` when ``next_deadline()`` has passed; ``name`` labels its thread and logs."""

    def __init__(
        self,
        *,
        next_deadline: Callable[[], datetime | None],
        tick: Callable[[], object],
        clock: Clock,
        name: str,
    ) -> None:
        self._next_deadline = next_deadline
        self._tick = tick
        self._clock = clock
        self.name = name
        self._changed = threading.Condition()
        self._sequence = 0
        self._stopping = False
        # The deadline the parked thread wakes at by itself (None: not parked on one).
        self._parked_until: datetime | None = None
        self._thread: threading.Thread | None = None
        self.ticks = 0
        """How many ``Tick`` commands were sent (the simulator and tests read it)."""

    def wake(self) -> None:
        """Something changed: recompute the deadline (an observer of the aggregate's stream).

        A change whose deadline is no nearer than the one the thread is parked on needs no
        wake-up: the thread reads the state when it wakes at its own deadline anyway. Under a
        burst of commands that is most of them (each new request only moves its batch's idle
        deadline later), and each wake-up would be a thread switch for nothing.
        """
        with self._changed:
            parked_until = self._parked_until
        if parked_until is not None:
            deadline = self._next_deadline()
            if deadline is not None and deadline >= parked_until:
                return
        with self._changed:
            self._sequence += 1
            self._changed.notify_all()

    def step(self) -> datetime | None:
        """Tick if the next deadline has passed; return the (new) next deadline, if any."""
        deadline = self._next_deadline()
        if deadline is not None and self._clock.now() >= deadline:
            self.ticks += 1
            self._tick()
            deadline = self._next_deadline()
        return deadline

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> ClockDriver:
        """Run :meth:`step` in a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return self
        with self._changed:
            self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"driver-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        log.debug("clock driver started", driver=self.name)
        while True:
            with self._changed:
                if self._stopping:
                    break
                seen = self._sequence
            try:
                deadline = self.step()
                wait = None if deadline is None else self._seconds_until(deadline)
            except Exception as e:
                log.error(
                    "tick failed; retrying",
                    driver=self.name,
                    error=str(e),
                    retry_in_seconds=_RETRY_AFTER_ERROR_SECONDS,
                )
                deadline, wait = None, _RETRY_AFTER_ERROR_SECONDS
            self._wait_for_change(seen, wait, deadline)
        log.debug("clock driver stopped", driver=self.name)

    def _wait_for_change(
        self, seen: int, timeout: float | None, deadline: datetime | None = None
    ) -> None:
        """Park until a change after ``seen``, a stop, or ``timeout`` seconds (None: forever);
        ``deadline`` is the time the timeout ends at, when it is one."""
        with self._changed:
            self._parked_until = deadline
            try:
                self._changed.wait_for(
                    lambda: self._stopping or self._sequence != seen, timeout=timeout
                )
            finally:
                self._parked_until = None

    def _seconds_until(self, deadline: datetime) -> float:
        return max(0.0, (deadline - self._clock.now()).total_seconds())
