"""Virtual time for the simulator: a clock and a task runner that run code deterministically.

The runtime's code waits in two ways — the grouper driver waits for a deadline, and the coordinator
(through the cloud adapter) sleeps on its ``Clock`` while a create is in progress. The simulator
must run that very code, with batches overlapping in time, yet stay deterministic and take no real
time. :class:`VirtualTime` does it as a discrete-event scheduler over ordinary threads:

- it is the coordinator's :class:`~fleetledger.adapters.runtime.runners.TaskRunner`: ``submit``
  queues a
  batch execution, started (on its own thread) when the scheduler says so, at most
  ``max_concurrent`` at once — the bound on cloud calls in flight;
- it is the :class:`~fleetledger.adapters.clock.Clock` those tasks see: ``sleep`` parks the calling
  task until
  the scheduler has moved virtual time to its wake-up;
- **exactly one task runs at any moment**: :meth:`settle` starts or wakes one task and waits until
  it parks or finishes before touching the next. Wake-ups are ordered by (time, order of the sleep
  call), tasks start in submission order, so every run of a seed interleaves identically.

The scheduler's own thread (the scenario runner) advances time with :meth:`advance_to` and runs
arrivals and ticks between ``settle`` calls, while every task is parked. Should code on that
thread call ``sleep`` (a log retry back-off, never expected with a local SQLite file), time simply
moves forward, as with ``ManualClock``.

A task must not block on anything but the virtual clock (a lock held across a ``sleep`` by another
task, a future of another task): only one task runs, so that would deadlock. The runtime's
coordinator is written to that rule (see :mod:`fleetledger.adapters.runtime.runners`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["VirtualTime"]

_in_task = threading.local()


class VirtualTime:
    """A deterministic virtual clock and task runner; see the module docstring."""

    def __init__(self, start: datetime, *, max_concurrent: int = 4) -> None:
        if start.utcoffset() is None:
            raise ValueError("VirtualTime needs a timezone-aware start, e.g. 2025-01-01T00:00Z")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._now = start.astimezone(UTC)
        self._max_concurrent = max_concurrent
        self._state = threading.Condition()
        self._queued: deque[Callable[[], None]] = deque()
        self._sleepers: list[tuple[datetime, int, threading.Event]] = []
        self._order = itertools.count()
        self._running = 0  # tasks executing right now (0 or 1 outside settle's hand-over)
        self._started = 0  # tasks started and not finished: running or parked
        self._failures: list[BaseException] = []
        self.tasks_run = 0

    # -- Clock -------------------------------------------------------------------------------

    def now(self) -> datetime:
        with self._state:
            return self._now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot wait a negative time ({seconds} s)")
        step = timedelta(seconds=seconds)
        if not getattr(_in_task, "active", False):
            with self._state:
                self._now += step
            return
        wake = threading.Event()
        with self._state:
            heapq.heappush(self._sleepers, (self._now + step, next(self._order), wake))
            self._running -= 1
            self._state.notify_all()
        wake.wait()

    # -- TaskRunner --------------------------------------------------------------------------

    def submit(self, task: Callable[[], None]) -> None:
        """Queue ``task``; it starts in a later :meth:`settle`, in submission order."""
        with self._state:
            self._queued.append(task)

    # -- the scheduler's side ----------------------------------------------------------------

    def settle(self) -> None:
        """Run tasks, one at a time, until each is parked in the future or done.

        Raises the first exception a task let escape (a bug: the coordinator handles its own).
        """
        while True:
            with self._state:
                self._state.wait_for(lambda: self._running == 0)
                if self._failures:
                    raise self._failures[0]
                if self._queued and self._started < self._max_concurrent:
                    task = self._queued.popleft()
                    self._started += 1
                    self._running += 1
                    self.tasks_run += 1
                    threading.Thread(
                        target=self._run, args=(task,), name="virtual-task", daemon=True
                    ).start()
                    continue
                if self._sleepers and self._sleepers[0][0] <= self._now:
                    _, _, wake = heapq.heappop(self._sleepers)
                    self._running += 1
                    wake.set()
                    continue
                return

    def next_wakeup(self) -> datetime | None:
        """When the earliest parked task wakes, if any."""
        with self._state:
            return self._sleepers[0][0] if self._sleepers else None

    def advance_to(self, when: datetime) -> None:
        """Move virtual time forward to ``when`` (never backwards)."""
        with self._state:
            self._now = max(self._now, when)

    @property
    def busy(self) -> bool:
        """True while any task is queued, running or parked."""
        with self._state:
            return bool(self._queued) or self._started > 0

    def _run(self, task: Callable[[], None]) -> None:
        _in_task.active = True
        try:
            task()
        except BaseException as e:
            with self._state:
                self._failures.append(e)
        finally:
            with self._state:
                self._running -= 1
                self._started -= 1
                self._state.notify_all()
