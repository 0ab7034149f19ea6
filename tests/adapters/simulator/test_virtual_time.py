"""Virtual time: tasks run one at a time, wake in time order, and the bound holds."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from fleetledger.adapters.simulator import VirtualTime
from fleetledger.adapters.simulator.virtual_time import SimulationStuck
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

    def test_settle_raises_a_task_failure_once_and_names_its_owner(self) -> None:
        """After the failure is raised, the other tasks go on being run."""
        clock = VirtualTime(EPOCH)
        done: list[str] = []

        def broken() -> None:
            raise RuntimeError("crash")

        clock.runner("p1").submit(broken)
        clock.runner("p2").submit(lambda: done.append("p2"))

        with pytest.raises(RuntimeError):
            clock.settle()
        assert clock.failed_owner == "p1"
        clock.settle()
        assert done == ["p2"]

    def test_a_zero_sleep_does_not_yield(self) -> None:
        """Nothing can fall due in no time, so a task sleeping 0 s goes straight on."""
        clock = VirtualTime(EPOCH)
        steps: list[str] = []

        def first() -> None:
            steps.append("a")
            clock.sleep(0)
            steps.append("b")

        clock.submit(first)
        clock.submit(lambda: steps.append("other"))
        clock.settle()

        assert steps == ["a", "b", "other"]


class TestAbandon:
    def test_an_abandoned_owner_s_tasks_end_and_the_others_go_on(self) -> None:
        """A crashed process's parked task unwinds without running on; its queued task never
        starts; another process's parked task still wakes on time."""
        clock = VirtualTime(EPOCH, max_concurrent=1)
        steps: list[str] = []

        def task(name: str) -> None:
            steps.append(f"{name} starts")
            clock.sleep(1)
            steps.append(f"{name} wakes")

        clock.runner("dead").submit(lambda: task("dead-1"))
        clock.runner("dead").submit(lambda: task("dead-2"))
        clock.settle()  # dead-1 parks; dead-2 waits for a free slot

        assert clock.abandon("dead") == 2
        clock.runner("alive").submit(lambda: task("alive"))
        run_until_done(clock)

        assert steps == ["dead-1 starts", "alive starts", "alive wakes"]
        assert not clock.busy

    def test_an_abandoned_owner_submits_nothing_more(self) -> None:
        clock = VirtualTime(EPOCH)
        clock.abandon("dead")
        clock.runner("dead").submit(lambda: None)
        assert not clock.busy


class TestStuck:
    def test_a_task_blocked_off_the_virtual_clock_is_reported(self) -> None:
        """A task waiting on a real lock another parked task holds cannot be run past: after
        ``stuck_after`` wall seconds settle says so instead of hanging."""
        clock = VirtualTime(EPOCH, stuck_after=0.2)
        lock = threading.Lock()
        released = threading.Event()

        def holder() -> None:
            lock.acquire()  # and parks holding it
            clock.sleep(1)

        def waiter() -> None:
            with lock:
                released.set()

        clock.submit(holder)
        clock.submit(waiter)

        with pytest.raises(SimulationStuck):
            clock.settle()
        lock.release()  # on the holder's behalf: the waiter ends, then the holder unwinds
        assert released.wait(5)
        clock.abandon("")
        assert not clock.busy
