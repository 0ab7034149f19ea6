"""DutyWatch: when a leader duty that keeps failing counts as stalled, and when it stops."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.machines.stalls import DutyWatch
from fleetledger.adapters.runtime import Deposed

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def failing(message: str = "the log refused the seal") -> None:
    raise RuntimeError(message)


def fail(watch: DutyWatch, duty: str = "sealing", times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(RuntimeError):
            watch.run(duty, failing)


class TestDutyWatch:
    def test_a_duty_failing_max_failures_times_in_a_row_is_stalled(self) -> None:
        """The third failure in a row makes a stall, named with its count, start and error."""
        clock = ManualClock(EPOCH)
        watch = DutyWatch(clock=clock, max_failures=3)
        fail(watch, times=2)
        assert watch.stalls() == []

        fail(watch)

        [stall] = watch.stalls()
        assert (stall.duty, stall.failures, stall.since) == ("sealing", 3, EPOCH)
        assert stall.error == "RuntimeError: the log refused the seal"

    def test_a_success_ends_the_stall(self) -> None:
        """Progress again: nothing is reported, and counting starts over."""
        watch = DutyWatch(clock=ManualClock(EPOCH), max_failures=2)
        fail(watch, times=2)

        assert watch.run("sealing", lambda: "sealed") == "sealed"
        fail(watch)

        assert watch.stalls() == []

    def test_a_duty_failing_for_max_seconds_is_stalled(self) -> None:
        """However few its tries, a duty failing for max_seconds is stalled."""
        clock = ManualClock(EPOCH)
        watch = DutyWatch(clock=clock, max_failures=10, max_seconds=30)
        fail(watch)
        clock.advance(timedelta(seconds=29))
        assert watch.stalls() == []

        clock.advance(timedelta(seconds=1))

        assert [s.failures for s in watch.stalls()] == [1]

    def test_duties_are_counted_apart(self) -> None:
        """Another duty's success does not end this one's stall."""
        watch = DutyWatch(clock=ManualClock(EPOCH), max_failures=1)
        fail(watch, "sealing")

        watch.run("recording batch outcomes", lambda: None)

        assert [s.duty for s in watch.stalls()] == ["sealing"]

    def test_being_deposed_is_not_a_failure(self) -> None:
        """A duty refused to a deposed leader is the new leader's: raised on, not counted."""
        watch = DutyWatch(clock=ManualClock(EPOCH), max_failures=1)

        def deposed() -> None:
            raise Deposed("newer term", term=1, current_term=2)

        with pytest.raises(Deposed):
            watch.run("sealing", deposed)

        assert watch.stalls() == []

    def test_clear_forgets_every_failure(self) -> None:
        """Duties changing hands start from a clean slate."""
        watch = DutyWatch(clock=ManualClock(EPOCH), max_failures=1)
        fail(watch)

        watch.clear()

        assert watch.stalls() == []

    @pytest.mark.parametrize(
        ("options", "hint"),
        [
            ({"max_failures": 0}, "max_failures must be a positive integer"),
            ({"max_seconds": 0}, "max_seconds must be a positive number"),
        ],
    )
    def test_bad_thresholds_are_refused(self, options: dict[str, float], hint: str) -> None:
        """A watch that could never (or always) report is refused at construction."""
        with pytest.raises(ValueError, match=hint):
            DutyWatch(clock=ManualClock(EPOCH), **options)  # type: ignore[arg-type]
