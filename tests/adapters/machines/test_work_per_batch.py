"""A batch costs the same however many machines the runtime has seen before it.

``bench serve --driver wrk --runs 5`` once reported outcomes coming later run after run (1.6 s
to 8.7 s after the last POST), which looked like the coordinator's work per machine growing with
the machines the process had seen. It was the bench reading the whole log from position 0 after
every run; the server logged each run's last outcome within a fraction of a second. These tests
keep it that way without timing anything: one batch's whole life — the request that fills it,
the seal, the cloud call, the outcomes, the read model catching up, a driver step — is counted
in events the store hands back and in lines of Python run, after a few prior batches and after
many. A fold over every request, a status scan, a read from position 0 or a query returning the
whole stream would make the second count grow with the machines in between.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, cast

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.eventstore import EventStore, RecordedEvent, TypesPage

from .support import CONFIG, EPOCH, manual_runtime, request

_FEW_BEFORE = 10
_MANY_BEFORE = 100
"""Batches before each measurement: 500 machines, then 5,000 (4,500 more requests, names and
outcomes that any per-batch scan of them would visit)."""
_LINE_SLACK = 1.02
"""A batch runs about 80,000 lines; which ones varies by a few hundred between batches (how
many of the grouper's persistent-map runs an update merges grows with the log of the requests).
A Python loop over the 4,500 requests in between would add at least 4,500."""


class CountingReads:
    """The real store, counting the events its reads hand back."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.events_read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read_all(self, **options: Any) -> list[RecordedEvent]:
        return self._counted(self._inner.read_all(**options))

    def read_types(self, **options: Any) -> TypesPage:
        page = self._inner.read_types(**options)
        self._counted(page.events)
        return page

    def read_stream(self, stream_id: str, **options: Any) -> list[RecordedEvent]:
        return self._counted(self._inner.read_stream(stream_id, **options))

    def _counted(self, events: list[RecordedEvent]) -> list[RecordedEvent]:
        self.events_read += len(events)
        return events


@dataclass(frozen=True, slots=True)
class Work:
    events_read: int
    lines_run: int


@contextlib.contextmanager
def lines_counted() -> Iterator[list[int]]:
    """Count the lines of Python this thread runs (the runtime has no threads here)."""
    count = [0]

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            count[0] += 1
        return trace

    previous = sys.gettrace()  # a coverage tool's tracer, say: put back afterwards
    sys.settrace(trace)
    try:
        yield count
    finally:
        sys.settrace(previous)


class Batches:
    """Full batches of 50 through a manual runtime: each request call seals one, which the
    coordinator runs inline."""

    def __init__(self, store: CountingReads) -> None:
        self.store = store
        self.clock = ManualClock(EPOCH)
        self.runtime: MachinesRuntime = manual_runtime(
            cast(EventStore, store), FakeCloud(clock=self.clock, latency=0.0), self.clock
        )
        self.machines = 0

    def run(self, count: int) -> None:
        for _ in range(count):
            self._one()

    def measure(self, samples: int = 3) -> Work:
        """The least work of ``samples`` batches in a row."""
        works = []
        for _ in range(samples):
            before = self.store.events_read
            with lines_counted() as lines:
                self._one()
            works.append(Work(self.store.events_read - before, lines[0]))
        return min(works, key=lambda w: (w.lines_run, w.events_read))

    def _one(self) -> None:
        first = self.machines
        requests = [request(n) for n in range(first, first + CONFIG.max_batch_size)]
        self.machines += len(requests)
        accepted = self.runtime.service.request(requests)
        assert len(accepted.sealed_batch_ids) == 1, "a full batch is sealed by its last request"
        self.runtime.projection.catch_up(cast(EventStore, self.store))
        self.clock.advance(timedelta(milliseconds=100))
        self.runtime.driver.step()
        self._check_created(accepted.request_ids)

    def _check_created(self, request_ids: Sequence[str]) -> None:
        views = [self.runtime.projection.get(r) for r in request_ids]
        assert [v.status if v else None for v in views] == ["created"] * len(request_ids)


class TestWorkPerBatch:
    def test_a_batch_reads_and_runs_as_much_after_5000_machines_as_after_500(
        self, store: EventStore
    ) -> None:
        """The events read and the lines run for one batch, from its request to its outcomes
        in the read model, do not grow with the machines created before it."""
        batches = Batches(CountingReads(store))
        try:
            batches.run(_FEW_BEFORE)
            few = batches.measure()
            batches.run(_MANY_BEFORE - batches.machines // CONFIG.max_batch_size)
            many = batches.measure()
        finally:
            batches.runtime.stop()

        # The read model reads the batch's own events: 50 requests, the seal, the dispatch and
        # 50 outcomes (its other events change no request's view).
        assert few.events_read == many.events_read == 2 * CONFIG.max_batch_size + 2
        assert many.lines_run <= few.lines_run * _LINE_SLACK, (few, many)
