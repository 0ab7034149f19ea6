"""Wall-clock time as a port, so tests and the simulator can own time.

The domain never reads a clock (time arrives on commands); adapters that wait — polling a cloud
operation, honouring a ``Retry-After``, simulating latency — take a :class:`Clock` instead of
calling :func:`time.sleep`. :class:`ManualClock` makes every such wait free and deterministic.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Reads the time and waits."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (non-negative)."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(_non_negative(seconds))


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it instantly.

    Thread-safe: concurrent sleepers each add their own wait, as if they slept one after the
    other. That over-counts parallel waits, which is harmless for the uses it has (latency and
    back-off in tests and the single-threaded simulator) and keeps it free of real waiting.
    """

    __slots__ = ("_lock", "_now")

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError(
                "ManualClock needs a timezone-aware start, e.g. datetime(2025, 1, 1, tzinfo=UTC)"
            )
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move time forward and return the new time."""
        step = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        delta = timedelta(seconds=_non_negative(step))
        with self._lock:
            self._now += delta
            return self._now


def _non_negative(seconds: float) -> float:
    if seconds < 0:
        raise ValueError(f"cannot wait a negative time ({seconds} s); time only moves forward")
    return seconds
