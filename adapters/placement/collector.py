"""The collector: workload requests gathered into batches (seed 02, ``collectRequestBatch``).

A batch takes what is queued, up to ``max_batch`` requests. A lone request that finds the backlog
empty is a batch of one, processed at once: waiting a window for company would only add latency
when the system is idle. Otherwise a burst is arriving, and the batch collects until it is full or
``window_seconds`` have passed since it started.
Requests that arrive while a batch is being planned and committed queue up for the next one, so
batches grow with the load by themselves (the store's group commit does the same one layer down).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

from fleetledger.domain.placement import WorkloadRequest

__all__ = ["Collector"]


class Collector:
    """A thread-safe backlog of workload requests, taken out in batches."""

    def __init__(self, *, max_batch: int = 100, window_seconds: float = 0.05) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(
                f"max_batch must be a positive integer (100 is typical), got {max_batch!r}"
            )
        if window_seconds < 0:
            raise ValueError(
                f"window_seconds must be >= 0 (0.05 is typical), got {window_seconds!r}"
            )
        self.max_batch = max_batch
        self.window_seconds = window_seconds
        self._backlog: deque[WorkloadRequest] = deque()
        self._arrived = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        with self._arrived:
            return len(self._backlog)

    def put(self, requests: Iterable[WorkloadRequest], *, first: bool = False) -> None:
        """Queue ``requests`` (at the front with ``first``: requests a batch could not commit)."""
        with self._arrived:
            if first:
                self._backlog.extendleft(reversed(list(requests)))
            else:
                self._backlog.extend(requests)
            self._arrived.notify_all()

    def discard(self, request_id: str) -> bool:
        """Drop a queued request; whether it was queued."""
        with self._arrived:
            for request in self._backlog:
                if request.id == request_id:
                    self._backlog.remove(request)
                    return True
        return False

    def close(self) -> None:
        """Wake every waiting :meth:`take`; they return what is queued (possibly nothing)."""
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()

    def take_ready(self) -> list[WorkloadRequest]:
        """The next batch from what is queued now, without waiting."""
        with self._arrived:
            return self._drain([])

    def take(self, *, timeout: float | None = None) -> list[WorkloadRequest]:
        """The next batch: wait (up to ``timeout``) for a first request, then collect as above."""
        with self._arrived:
            if not self._backlog and not self._closed:
                self._arrived.wait(timeout)
            batch = self._drain([])
            if not batch:
                return batch
            if len(batch) > 1 or self._backlog:
                # A burst is arriving: give it the window to fill the batch.
                deadline = time.monotonic() + self.window_seconds
                while len(batch) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    if not self._backlog:
                        self._arrived.wait(left)
                    self._drain(batch)
            return batch

    def _drain(self, batch: list[WorkloadRequest]) -> list[WorkloadRequest]:
        while self._backlog and len(batch) < self.max_batch:
            batch.append(self._backlog.popleft())
        return batch
