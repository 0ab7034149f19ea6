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

Several simulated processes may share one virtual time: each submits through its own
:meth:`runner` (an *owner*), and when one of them crashes, :meth:`abandon` ends its tasks — queued
ones never start, parked ones raise :class:`TaskAbandoned` from their ``sleep`` so their threads
unwind — while the other processes' tasks carry on. A crashed process runs no more code, so
nothing an abandoned task does while unwinding may reach the log (the runtime catches
``Exception`` only; :class:`TaskAbandoned` is a ``BaseException``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["SimulationStuck", "TaskAbandoned", "VirtualTime"]

_in_task = threading.local()


class TaskAbandoned(BaseException):
    """Raised in a parked task's ``sleep`` when :meth:`VirtualTime.abandon` ends its owner."""


class SimulationStuck(RuntimeError):
    """A task neither parked nor finished within ``stuck_after`` wall seconds: it blocks on
    something other than the virtual clock (see the module docstring), so the run cannot go on."""


class _Parked:
    """A task parked in ``sleep``: its wake-up, and whether its owner was abandoned meanwhile."""

    __slots__ = ("abandoned", "owner", "wake")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.wake = threading.Event()
        self.abandoned = False


class _OwnedRunner:
    """The :class:`~fleetledger.adapters.runtime.runners.TaskRunner` of one simulated process."""

    __slots__ = ("_owner", "_time")

    def __init__(self, time: VirtualTime, owner: str) -> None:
        self._time = time
        self._owner = owner

    def submit(self, task: Callable[[], None]) -> None:
        self._time._queue(self._owner, task)


class VirtualTime:
    """A deterministic virtual clock and task runner; see the module docstring."""

    def __init__(
        self, start: datetime, *, max_concurrent: int = 4, stuck_after: float | None = None
    ) -> None:
        if start.utcoffset() is None:
            raise ValueError("VirtualTime needs a timezone-aware start, e.g. 2025-01-01T00:00Z")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._now = start.astimezone(UTC)
        self._max_concurrent = max_concurrent
        self._stuck_after = stuck_after
        self._state = threading.Condition()
        self._queued: deque[tuple[str, Callable[[], None]]] = deque()
        self._sleepers: list[tuple[datetime, int, _Parked]] = []
        self._order = itertools.count()
        self._running = 0  # tasks executing right now (0 or 1 outside settle's hand-over)
        self._started = 0  # tasks started and not finished: running or parked
        self._failures: list[tuple[str, BaseException]] = []
        self.failed_owner = ""
        """The owner of the task whose exception :meth:`settle` raised last."""
        self._abandoned: set[str] = set()
        self.tasks_run = 0

    # -- Clock -------------------------------------------------------------------------------

    def now(self) -> datetime:
        with self._state:
            return self._now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot wait a negative time ({seconds} s)")
        step = timedelta(seconds=seconds)
        if not step:
            return  # nothing can fall due in no time: a zero wait yields to no one
        if not getattr(_in_task, "active", False):
            with self._state:
                self._now += step
            return
        parked = _Parked(getattr(_in_task, "owner", ""))
        with self._state:
            heapq.heappush(self._sleepers, (self._now + step, next(self._order), parked))
            self._running -= 1
            self._state.notify_all()
        parked.wake.wait()
        if parked.abandoned:
            raise TaskAbandoned(parked.owner)

    # -- TaskRunner --------------------------------------------------------------------------

    def submit(self, task: Callable[[], None]) -> None:
        """Queue ``task``; it starts in a later :meth:`settle`, in submission order."""
        self._queue("", task)

    def runner(self, owner: str) -> _OwnedRunner:
        """A task runner whose tasks belong to ``owner`` (one simulated process), so that
        :meth:`abandon` can end them alone."""
        if not owner:
            raise ValueError("an owner needs a non-empty name")
        return _OwnedRunner(self, owner)

    def _queue(self, owner: str, task: Callable[[], None]) -> None:
        with self._state:
            if owner in self._abandoned:
                return  # a crashed process submits nothing (its unwinding task may try)
            self._queued.append((owner, task))

    # -- the scheduler's side ----------------------------------------------------------------

    def settle(self) -> None:
        """Run tasks, one at a time, until each is parked in the future or done.

        Raises the first exception a task let escape (a bug: the coordinator handles its own; or a
        crash a simulation injected), once: the tasks still parked stay parked.
        """
        while True:
            with self._state:
                self._wait_for_no_task_running()
                if self._failures:
                    self.failed_owner, failure = self._failures.pop(0)
                    raise failure
                if self._queued and self._started < self._max_concurrent:
                    owner, task = self._queued.popleft()
                    self._started += 1
                    self._running += 1
                    self.tasks_run += 1
                    threading.Thread(
                        target=self._run, args=(owner, task), name="virtual-task", daemon=True
                    ).start()
                    continue
                if self._sleepers and self._sleepers[0][0] <= self._now:
                    _, _, parked = heapq.heappop(self._sleepers)
                    self._running += 1
                    parked.wake.set()
                    continue
                return

    def abandon(self, owner: str) -> int:
        """End every task of ``owner`` (a crashed process): drop its queued tasks and unwind its
        parked ones, one at a time. Returns how many tasks were ended."""
        ended = 0
        with self._state:
            self._abandoned.add(owner)
            kept = deque(item for item in self._queued if item[0] != owner)
            ended += len(self._queued) - len(kept)
            self._queued = kept
            mine = [entry for entry in self._sleepers if entry[2].owner == owner]
            self._sleepers = [entry for entry in self._sleepers if entry[2].owner != owner]
            heapq.heapify(self._sleepers)
        for _, _, parked in sorted(mine, key=lambda entry: (entry[0], entry[1])):
            with self._state:
                self._wait_for_no_task_running()
                parked.abandoned = True
                self._running += 1
                parked.wake.set()
            ended += 1
        with self._state:
            self._wait_for_no_task_running()
        return ended

    def _wait_for_no_task_running(self) -> None:
        """(Holding the state lock.) ``SimulationStuck`` after ``stuck_after`` wall seconds."""
        if not self._state.wait_for(lambda: self._running == 0, timeout=self._stuck_after):
            raise SimulationStuck(
                f"a task has neither parked nor finished in {self._stuck_after:g} s of wall "
                "time: it waits for something other than the virtual clock (a lock another "
                "parked task holds?)"
            )

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

    def _run(self, owner: str, task: Callable[[], None]) -> None:
        _in_task.active = True
        _in_task.owner = owner
        try:
            task()
        except TaskAbandoned:
            pass
        except BaseException as e:
            with self._state:
                self._failures.append((owner, e))
        finally:
            with self._state:
                self._running -= 1
                self._started -= 1
                self._state.notify_all()
