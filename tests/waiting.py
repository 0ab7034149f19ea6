"""Waiting on a condition with a deadline, for tests whose subject has no signal to wait on
(another process, a server's counters, a fake cluster): polled, never slept through blindly."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually", "wait_until"]


def eventually(
    condition: Callable[[], bool], *, timeout: float = 10.0, every: float = 0.02
) -> bool:
    """Whether ``condition`` holds within ``timeout`` seconds (checked every ``every``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def wait_until(
    condition: Callable[[], bool], *, timeout: float, what: str, every: float = 0.05
) -> None:
    """Return once ``condition`` holds; ``AssertionError`` naming ``what`` after ``timeout``."""
    if not eventually(condition, timeout=timeout, every=every):
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
