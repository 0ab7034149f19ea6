"""Virtual time: tasks run one at a time, wake in time order, and the bound holds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetledger.adapters.simulator import VirtualTime
from tests.adapters.machines.support import EPOCH


def run_until_done(clock: VirtualTime) -> None:
    """What the scenario runner does: settle, jump to the next wake-up, repeat."""
    while True:
        clock.settle()
        wake = clock.next_wakeup()
        if wake is None:
            return
        clock.advance_to(wake)


class TestVirtualTime:
    def test_sleepers_wake_in_time_order_at_their_virtual_time(self) -> None:
        """A task that sleeps longer wakes later, and each sees the time it asked for."""
        clock = VirtualTime(EPOCH)
        woke: list[tuple[str, float]] = []

        def sleeper(name: str, seconds: float) -> None:
            clock.sleep(seconds)
            woke.append((name, (clock.now() - EPOCH).total_seconds()))

        clock.submit(lambda: sleeper("slow", 3))
        clock.submit(lambda: sleeper("fast", 1))
        run_until_done(clock)

        assert woke == [("fast", 1.0), ("slow", 3.0)]

    def test_at_most_max_concurrent_tasks_are_started(self) -> None:
        """The third task starts only when one of the first two finishes."""
        clock = VirtualTime(EPOCH, max_concurrent=2)
        started: list[float] = []

        def task() -> None:
            started.append((clock.now() - EPOCH).total_seconds())
            clock.sleep(5)

        for _ in range(3):
            clock.submit(task)
        run_until_done(clock)

        assert started == [0.0, 0.0, 5.0]

    def test_one_task_runs_at_a_time_so_runs_repeat_exactly(self) -> None:
        """Interleavings depend only on virtual time and submission order."""

        def trace() -> list[str]:
            clock = VirtualTime(EPOCH, max_concurrent=4)
            steps: list[str] = []

            def task(name: str) -> None:
                for step in range(3):
                    steps.append(f"{name}{step}")
                    clock.sleep(1)

            for name in "abcd":
                clock.submit(lambda name=name: task(name))  # type: ignore[misc]
            run_until_done(clock)
            return steps

        assert trace() == trace()
        assert trace()[:4] == ["a0", "b0", "c0", "d0"]

    def test_sleep_outside_a_task_moves_time_forward(self) -> None:
        """The scheduler's own thread never parks: its sleep just advances the clock."""
        clock = VirtualTime(EPOCH)

        clock.sleep(2.5)

        assert clock.now() == EPOCH + timedelta(seconds=2.5)

    def test_an_escaped_exception_surfaces_in_settle(self) -> None:
        """A task's bug is not lost in its thread."""
        clock = VirtualTime(EPOCH)

        def broken() -> None:
            raise RuntimeError("bug in a task")

        clock.submit(broken)

        with pytest.raises(RuntimeError, match="bug in a task"):
            clock.settle()
