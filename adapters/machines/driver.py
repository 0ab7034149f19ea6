"""The grouper driver: runs the Grouper's clock.

Time is logical in the domain: a batch falls due at ``next_deadline(state, config)`` and is sealed
by the next command stamped at or after it. The driver makes sure such a command comes: it waits,
on a condition, for the *earlier* of a change to the grouper (a new request may bring a nearer
deadline — or the first one) and the next deadline, then sends ``Tick``. There is no polling loop:
with nothing pending it waits without a timeout, and 100 rapid requests coalesce into at most a
few wake-ups, like the seed's trigger channel of size one.

:meth:`GrouperDriver.step` is the whole decision ("tick if due, say when next"); the thread calls
it in a loop, the simulator calls it directly at virtual times. The thread waits in real seconds,
so run it with a real clock (``SystemClock``); drive a ``ManualClock`` with ``step`` instead.
"""

from __future__ import annotations

import threading
from datetime import datetime

import structlog

from fleetledger.adapters.clock import Clock

from .service import MachineService

__all__ = ["GrouperDriver"]

log = structlog.get_logger(__name__)

_RETRY_AFTER_ERROR_SECONDS = 1.0


class GrouperDriver:
    """Sends ``Tick`` to the service when a batch deadline passes."""

    def __init__(self, service: MachineService, *, clock: Clock) -> None:
        self._service = service
        self._clock = clock
        self._changed = threading.Condition()
        self._sequence = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.ticks = 0
        """How many ``Tick`` commands were sent (the simulator and tests read it)."""

    def wake(self) -> None:
        """Something changed: recompute the deadline (the service's ``on_change`` observer)."""
        with self._changed:
            self._sequence += 1
            self._changed.notify_all()

    def step(self) -> datetime | None:
        """Tick if the next deadline has passed; return the (new) next deadline, if any."""
        deadline = self._service.next_deadline()
        if deadline is not None and self._clock.now() >= deadline:
            self.ticks += 1
            self._service.tick()
            deadline = self._service.next_deadline()
        return deadline

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> GrouperDriver:
        """Run :meth:`step` in a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return self
        with self._changed:
            self._stopping = False
        self._thread = threading.Thread(target=self._run, name="grouper-driver", daemon=True)
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
        log.debug("grouper driver started", grouper=self._service.grouper_name)
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
                    "grouper tick failed; retrying",
                    error=str(e),
                    retry_in_seconds=_RETRY_AFTER_ERROR_SECONDS,
                )
                wait = _RETRY_AFTER_ERROR_SECONDS
            self._wait_for_change(seen, wait)
        log.debug("grouper driver stopped", grouper=self._service.grouper_name)

    def _wait_for_change(self, seen: int, timeout: float | None) -> None:
        """Park until a change after ``seen``, a stop, or ``timeout`` seconds (None: forever)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._stopping or self._sequence != seen, timeout=timeout
            )

    def _seconds_until(self, deadline: datetime) -> float:
        return max(0.0, (deadline - self._clock.now()).total_seconds())
