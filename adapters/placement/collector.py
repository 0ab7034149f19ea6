"""The collector: workload requests gathered into batches (seed 02, ``collectRequestBatch``).

A batch is what is queued when it is taken, up to ``max_batch`` requests: a take waits (up to its
timeout) for a first request, drains the backlog and returns as soon as the backlog is empty —
seed 02's ``collectRequestBatch`` ("Stop if backlog is empty"), which beta9 leaves at once rather
than waiting out its 50 ms window. An idle system adds no latency, and a burst still batches:
requests arriving while a batch is planned and committed queue up and are taken whole by the
next one, so batches grow with the load by themselves (the store's group commit does the same one
layer down), each still planned on one snapshot that includes every batch before it.

Beta9 also bounds a collection by a 50 ms window; draining the backlog in one step never comes
near it, so there is no window to set.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from fleetledger.domain.placement import WorkloadRequest

__all__ = ["Collector"]


class Collector:
    """A thread-safe backlog of workload requests, taken out in batches."""

    def __init__(self, *, max_batch: int = 100) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(
                f"max_batch must be a positive integer (100 is typical), got {max_batch!r}"
            )
        self.max_batch = max_batch
        self._backlog: deque[WorkloadRequest] = deque()
        # A workload is queued once however many paths bring it (its submission, and the log
        # read back by a leader that follows what other processes accepted).
        self._queued: set[str] = set()
        self._arrived = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        with self._arrived:
            return len(self._backlog)

    def put(self, requests: Iterable[WorkloadRequest], *, first: bool = False) -> None:
        """Queue ``requests`` (at the front with ``first``: requests a batch could not commit);
        one already queued stays where it is."""
        with self._arrived:
            fresh = []
            for request in requests:
                if request.id not in self._queued:
                    self._queued.add(request.id)
                    fresh.append(request)
            if first:
                self._backlog.extendleft(reversed(fresh))
            else:
                self._backlog.extend(fresh)
            self._arrived.notify_all()

    def __contains__(self, request_id: object) -> bool:
        with self._arrived:
            return request_id in self._queued

    def discard(self, request_id: str) -> bool:
        """Drop a queued request; whether it was queued."""
        with self._arrived:
            for request in self._backlog:
                if request.id == request_id:
                    self._backlog.remove(request)
                    self._queued.discard(request_id)
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
        """The next batch: wait (up to ``timeout``) for a first request, then take what is
        queued, up to ``max_batch``, without waiting for more (see the module docstring)."""
        with self._arrived:
            if not self._backlog and not self._closed:
                self._arrived.wait(timeout)
            return self._drain([])

    def _drain(self, batch: list[WorkloadRequest]) -> list[WorkloadRequest]:
        while self._backlog and len(batch) < self.max_batch:
            request = self._backlog.popleft()
            self._queued.discard(request.id)
            batch.append(request)
        return batch
