"""Health checks with a deadline: a probe answers within :data:`PROBE_DEADLINE_SECONDS` whatever
the database does.

An orchestrator's probe has a timeout of its own (Kubernetes' default is one second); a probe
that hangs with a hung database is a probe that failed without saying why, and every further
probe would start another read that hangs too. :class:`SingleFlightCheck` runs a blocking check
on a thread of its own with at most one run in flight: probes arriving meanwhile join it, and
whoever waits past the deadline gets :class:`ProbeTimeout` with what was being checked and for
how long — the reason the ``503`` states.

The checks do not take the server's shared thread pool: when every worker of it is held by
requests waiting on the database, a probe queued behind them would time out without its check
ever starting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["PROBE_DEADLINE_SECONDS", "ProbeTimeout", "SingleFlightCheck"]

PROBE_DEADLINE_SECONDS = 0.8
"""Under a second, with room for the answer's own way back within Kubernetes' default
``timeoutSeconds: 1``."""

T = TypeVar("T")


class ProbeTimeout(Exception):
    """A check did not finish within the probe's deadline; the message says which and how long
    it has been running."""


class SingleFlightCheck(Generic[T]):
    """``check`` (blocking) run on a thread of its own, at most once at a time, awaited with a
    deadline."""

    def __init__(
        self, check: Callable[[], T], *, what: str, deadline: float = PROBE_DEADLINE_SECONDS
    ) -> None:
        self._check = check
        self._what = what
        self._deadline = deadline
        self._flight: tuple[float, Future[T]] | None = None

    async def run(self) -> T:
        """The check's result, or its exception; :class:`ProbeTimeout` past the deadline."""
        flight = self._flight
        if flight is None or flight[1].done():
            flight = self._flight = (time.monotonic(), self._start())
        started, future = flight
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(future)), timeout=self._deadline
            )
        except TimeoutError:
            running = time.monotonic() - started
            raise ProbeTimeout(
                f"{self._what} did not finish within {self._deadline:g} s "
                f"(running for {running:.1f} s); the database may be hung"
            ) from None

    def _start(self) -> Future[T]:
        # A daemon thread per run (never more than one at a time): a check that hangs on a
        # hung database must not hold up the process's exit, as a pool's worker would.
        future: Future[T] = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._check())
            except BaseException as e:
                future.set_exception(e)

        threading.Thread(target=work, name="probe", daemon=True).start()
        return future
