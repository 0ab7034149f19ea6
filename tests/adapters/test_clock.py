"""The clock port: the system clock and the manual clock that tests and the simulator drive.

(The clock lives in ``adapters/clock.py``; its tests sit with the cloud tests, its first users.)
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleetledger.adapters.clock import ManualClock, SystemClock
from tests.adapters.cloud.support import EPOCH


class TestSystemClock:
    def test_now_is_timezone_aware_utc(self) -> None:
        """Naive datetimes never leave the clock."""
        now = SystemClock().now()

        assert now.utcoffset() == timedelta(0)


class TestManualClock:
    def test_sleep_moves_time_instantly(self) -> None:
        """Sleeping advances the clock by exactly the time asked for."""
        clock = ManualClock(EPOCH)

        clock.sleep(2.5)

        assert clock.now() == EPOCH + timedelta(seconds=2.5)

    def test_advance_accepts_a_timedelta_and_returns_the_new_time(self) -> None:
        """advance() takes seconds or a timedelta."""
        clock = ManualClock(EPOCH)

        assert clock.advance(timedelta(minutes=1)) == EPOCH + timedelta(minutes=1)

    def test_refuses_a_naive_start(self) -> None:
        """A start without a timezone would make every comparison ambiguous."""
        with pytest.raises(ValueError, match="timezone-aware"):
            ManualClock(datetime(2025, 1, 1))

    def test_refuses_to_go_backwards(self) -> None:
        """Time only moves forward."""
        with pytest.raises(ValueError, match="negative"):
            ManualClock(EPOCH).sleep(-1)
