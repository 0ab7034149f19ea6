"""Duties that keep failing: how the machines runtime tells readiness it cannot make progress.

A leader's duty that fails is tried again — the clock driver ticks again a second later, a batch
completes again on the next start — so a failure that never goes away (a seal the log refuses, a
database that refuses the grouper's writes) shows only as a log line repeated for ever, while the
process is alive and the log reachable. :class:`DutyWatch` counts each duty's consecutive
failures: a duty that failed ``max_failures`` times in a row, or has kept failing for
``max_seconds``, is *stalled* until it next succeeds, and readiness names it.

A duty refused because a newer leader was elected (``Deposed``) is not a stall: this process
steps down, and the duty is the new leader's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import Deposed

__all__ = ["DutyWatch", "Stall"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

_MAX_ERROR_LENGTH = 500
"""A stall's error as reported: enough to name the cause, not a whole traceback's worth."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stall:
    """A duty failing since ``since``: ``failures`` times in a row, the last with ``error``."""

    duty: str
    failures: int
    since: datetime
    error: str

    def describe(self) -> str:
        return (
            f"{self.duty} failed {self.failures} time(s) in a row since "
            f"{self.since.isoformat()}: {self.error}"
        )


@dataclass(frozen=True, slots=True)
class _Failing:
    failures: int
    since: datetime
    error: str


class DutyWatch:
    """Consecutive failures of named duties; thread-safe."""

    def __init__(self, *, clock: Clock, max_failures: int = 3, max_seconds: float = 30.0) -> None:
        if type(max_failures) is not int or max_failures < 1:
            raise ValueError(f"max_failures must be a positive integer, got {max_failures!r}")
        if not max_seconds > 0:
            raise ValueError(f"max_seconds must be a positive number, got {max_seconds!r}")
        self._clock = clock
        self._max_failures = max_failures
        self._max_age = timedelta(seconds=max_seconds)
        self._lock = threading.Lock()
        self._failing: dict[str, _Failing] = {}

    def run(self, duty: str, call: Callable[[], T]) -> T:
        """``call()``, its failure or success counted against ``duty``; what it raises is
        raised on."""
        try:
            result = call()
        except Deposed:
            raise
        except Exception as e:
            self.failed(duty, e)
            raise
        self.succeeded(duty)
        return result

    def failed(self, duty: str, error: BaseException) -> None:
        """``duty`` failed with ``error``."""
        text = f"{type(error).__name__}: {error}"[:_MAX_ERROR_LENGTH]
        now = self._clock.now()
        with self._lock:
            before = self._failing.get(duty)
            failing = (
                _Failing(1, now, text)
                if before is None
                else _Failing(before.failures + 1, before.since, text)
            )
            self._failing[duty] = failing
        if failing.failures == self._max_failures:
            # Once per stall, not once per retry: the driver's own line says each retry.
            log.error(
                "duty keeps failing; readiness reports it",
                duty=duty,
                failures=failing.failures,
                since=failing.since.isoformat(),
                error=text,
            )

    def succeeded(self, duty: str) -> None:
        """``duty`` succeeded: it is no longer failing."""
        with self._lock:
            recovered = self._failing.pop(duty, None)
        if recovered is not None and self._stalled(recovered, self._clock.now()):
            log.info("duty recovered", duty=duty, failures=recovered.failures)

    def clear(self) -> None:
        """Forget every failure (the duties changed hands: a new term, or none to perform)."""
        with self._lock:
            self._failing.clear()

    def stalls(self) -> list[Stall]:
        """The duties stalled now, by name."""
        now = self._clock.now()
        with self._lock:
            failing = sorted(self._failing.items())
        return [
            Stall(duty=duty, failures=f.failures, since=f.since, error=f.error)
            for duty, f in failing
            if self._stalled(f, now)
        ]

    def _stalled(self, failing: _Failing, now: datetime) -> bool:
        return failing.failures >= self._max_failures or now - failing.since >= self._max_age
