"""The clock driver's thread: woken by changes that may bring its deadline nearer, only."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.runtime import ClockDriver

from .test_stream import wait_for

WAIT = 10.0


class Deadlines:
    """A settable next deadline; counts the ticks sent."""

    def __init__(self, first: datetime) -> None:
        self.next: datetime | None = first
        self.ticked = threading.Event()

    def tick(self) -> None:
        self.next = None
        self.ticked.set()


def parked_driver(deadlines: Deadlines) -> ClockDriver:
    driver = ClockDriver(
        next_deadline=lambda: deadlines.next,
        tick=deadlines.tick,
        clock=SystemClock(),
        name="test",
    ).start()
    wait_for(lambda: driver._parked_until is not None)
    return driver


class TestWake:
    def test_a_change_with_no_nearer_deadline_lets_the_thread_sleep(self) -> None:
        """A later deadline (a batch's idle window moving on) costs no wake-up."""
        now = SystemClock().now()
        deadlines = Deadlines(now + timedelta(hours=1))
        driver = parked_driver(deadlines)
        try:
            changes = driver._sequence
            deadlines.next = now + timedelta(hours=2)
            driver.wake()

            assert driver._sequence == changes
            assert driver._parked_until == now + timedelta(hours=1)
        finally:
            driver.stop()

    def test_a_nearer_deadline_wakes_the_thread_which_ticks(self) -> None:
        now = SystemClock().now()
        deadlines = Deadlines(now + timedelta(hours=1))
        driver = parked_driver(deadlines)
        try:
            deadlines.next = now - timedelta(seconds=1)
            driver.wake()

            assert deadlines.ticked.wait(WAIT)
        finally:
            driver.stop()

    def test_a_first_deadline_wakes_a_thread_that_had_none(self) -> None:
        """Parked without a deadline, the thread waits for any: every change wakes it."""
        deadlines = Deadlines(SystemClock().now())
        deadlines.next = None
        driver = ClockDriver(
            next_deadline=lambda: deadlines.next, tick=deadlines.tick, clock=SystemClock(), name="t"
        ).start()
        try:
            deadlines.next = SystemClock().now() - timedelta(seconds=1)
            driver.wake()

            assert deadlines.ticked.wait(WAIT)
        finally:
            driver.stop()
