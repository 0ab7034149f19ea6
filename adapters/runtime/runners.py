"""Where the coordinator's batch executions run: a port with one method, and two adapters.

The coordinator never blocks on a primitive shared with another batch (no semaphore inside a
task): the bound on concurrent batches is the runner's. That keeps the same coordinator usable on
a thread pool (:class:`ThreadRunner`), inline in the caller's thread (:class:`InlineRunner`, for
tests and scripts), and on the simulator's virtual-time scheduler, which runs one task at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

__all__ = ["InlineRunner", "TaskRunner", "ThreadRunner"]


class TaskRunner(Protocol):
    """Runs submitted tasks, some time soon, at most a bounded number at once."""

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task()``; its exceptions are the task's business (it logs its own)."""
        ...


class ThreadRunner:
    """At most ``max_workers`` tasks at once on a thread pool; the rest queue in order."""

    def __init__(self, *, max_workers: int = 4, name: str = "batch") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    def submit(self, task: Callable[[], None]) -> None:
        self._pool.submit(task)

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop taking tasks; with ``wait``, return once the running and queued ones are done."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


class InlineRunner:
    """Runs each task at once, in the submitting thread (deterministic; for tests and scripts)."""

    __slots__ = ()

    def submit(self, task: Callable[[], None]) -> None:
        task()
