"""The assembled workload placement: collector, batches, overflow into machine requests.

``PlacementRuntime`` runs placement over the node accounting service::

    runtime = PlacementRuntime(store, nodes_runtime.service, pools, machines=machines.service)
    with runtime:                                   # start(): the batching thread
        [wid] = runtime.submit([WorkloadRequest(id="w-1", cpu_milli=500, memory_bytes=GIB)])
        print(runtime.wait(wid, timeout=1.0))       # placed on a node, waiting, or rejected

Every workload accepted is in the log before ``submit`` returns, and ``start`` rebuilds the
queue, the workers awaited and the answers from it, so a restart loses nothing acknowledged
(:mod:`.service`). Between batches, every ``join_poll_seconds`` and at once when this process is
elected, a leader catches up with the log (workloads other processes accepted are placed here
too), and every runtime plans again the workloads whose worker's machine failed.

Any process may place: every reservation is appended with the node stream's expected version,
so two placers can never overbook a node, they only conflict and re-plan. With a
``leadership`` (run by the caller) appends made while leading carry the leader term and a
deposed leader's appends are refused, and placements are recorded on the workloads' streams
too (``record_placements``, on unless told otherwise), so two controllers never place one
workload twice. ``threads=False`` wires the same without a thread: tests and the simulator call
:meth:`step`.

A batch that fails goes back to the queue and is tried again, so a failure that never goes away
(a log that refuses every append) would show only as a log line per retry: once batches have
failed ``stall_failures`` times in a row, or for ``stall_seconds``, :meth:`stalls` names it, for
readiness to report, until a batch succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.adapters.nodes.port import NodeStreams
from fleetledger.adapters.runtime import DutyFencing, NoFencing, RetryPolicy, Writer
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.domain.placement import (
    DEFAULT_SEARCH_STEPS,
    Pool,
    WorkerStatus,
    WorkloadRequest,
    check_request,
)
from fleetledger.eventstore import EventStore
from fleetledger.projections._reading import bulk_read

from .collector import Collector
from .errors import InvalidWorkload, PlacementError, RuntimeStopped
from .service import BatchReport, MachineRequester, PlacementService, WorkloadStatus

__all__ = ["PlacementRuntime"]

log = structlog.get_logger(__name__)

_MAX_ERROR_LENGTH = 500
"""A stall's error as reported: enough to name the cause, not a whole traceback's worth."""


@dataclass(frozen=True, slots=True)
class _Failing:
    """Batches failing since ``since``: ``failures`` in a row, the last with ``error``."""

    failures: int
    since: datetime
    error: str


class PlacementRuntime:
    """Workload placement over one store and the node accounting service."""

    def __init__(
        self,
        store: EventStore,
        nodes_service: NodeStreams,
        pools: Sequence[Pool],
        *,
        machines: MachineRequester | None = None,
        clock: Clock | None = None,
        pool_of: Callable[[str], str | None] | None = None,
        max_batch: int = 100,
        max_conflict_retries: int = 5,
        threads: bool = True,
        leadership: Leadership | None = None,
        actor: str = "fleetledger",
        retry: RetryPolicy | None = None,
        join_poll_seconds: float = 0.5,
        record_placements: bool | None = None,
        search_steps: int = DEFAULT_SEARCH_STEPS,
        stall_failures: int = 3,
        stall_seconds: float = 30.0,
    ) -> None:
        if join_poll_seconds <= 0:
            raise ValueError(f"join_poll_seconds must be positive, got {join_poll_seconds}")
        if type(stall_failures) is not int or stall_failures < 1:
            raise ValueError(f"stall_failures must be a positive integer, got {stall_failures!r}")
        if not stall_seconds > 0:
            raise ValueError(f"stall_seconds must be a positive number, got {stall_seconds!r}")
        if record_placements is None:
            # Several controllers share the log when there is a leadership: each may recover
            # the same workloads, so placements are guarded on the workloads' own streams.
            record_placements = leadership is not None
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.collector = Collector(max_batch=max_batch)
        writer = Writer(
            actor=actor,
            labels=(("capability", "placement"),),
            fencing=DutyFencing(leadership) if leadership is not None else NoFencing(),
        )
        self.service = PlacementService(
            store,
            nodes_service,
            pools,
            clock=self.clock,
            machines=machines,
            pool_of=pool_of,
            writer=writer,
            retry=retry,
            max_conflict_retries=max_conflict_retries,
            record_placements=record_placements,
            search_steps=search_steps,
        )
        self.service.requeue = lambda requests: self.collector.put(requests, first=True)
        self._threads = threads
        self._join_poll = join_poll_seconds
        self._follow_every = timedelta(seconds=join_poll_seconds)
        self._running = False
        self._recovered = False
        self._leadership = leadership
        self._followed_term: int | None = None
        self._followed_at: datetime | None = None
        self._thread: threading.Thread | None = None
        self.reports: list[BatchReport] = []
        self._stall_failures = stall_failures
        self._stall_age = timedelta(seconds=stall_seconds)
        self._failing: _Failing | None = None

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> PlacementRuntime:
        """Host every logged node (the snapshot's nodes), rebuild the workloads from the log
        (the first time: queued ones go back in the queue, waiting ones onto their workers,
        answers stay answered), then start batching (a thread unless ``threads=False``)."""
        if self._running:
            return self
        nodes_service = self.service.nodes_service
        for node in nodes_service.logged_nodes():
            nodes_service.stream(node)
        if not self._recovered:
            with bulk_read():  # every workload's events folded once: no collections meanwhile
                self.collector.put(self.service.recover())
            self._recovered = True
            self._followed_term = self._leadership.term() if self._leadership else None
            self._followed_at = self.clock.now()
        self._running = True
        if self._threads:
            self._thread = threading.Thread(
                target=self._loop, name="placement-batches", daemon=True
            )
            self._thread.start()
        log.info("placement runtime started", threads=self._threads)
        return self

    def stop(self) -> None:
        """Stop batching after the batch in flight; queued requests stay queued."""
        if not self._running:
            return
        self._running = False
        self.collector.close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10.0)
        log.info("placement runtime stopped", queued=len(self.collector))

    def __enter__(self) -> PlacementRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- requests ----------------------------------------------------------------------------

    def submit(self, requests: Sequence[WorkloadRequest]) -> tuple[str, ...]:
        """Record ``requests`` in the log and queue them for placement; their ids. A workload
        already queued, waiting or placed with the same request is not queued again;
        :class:`WorkloadConflict` if one was submitted with a different request,
        :class:`InvalidWorkload` naming the first malformed one (nothing is recorded or queued
        then)."""
        if not self._running:
            raise RuntimeStopped("the placement runtime is not running; start() it first")
        if not requests:
            raise InvalidWorkload("send at least one workload")
        for index, request in enumerate(requests):
            problem = check_request(request)
            if problem is not None:
                raise InvalidWorkload(f"workload {index}: {problem}")
        self.collector.put(self.service.accept(requests))
        return tuple(r.id for r in requests)

    def status(self, workload_id: str) -> WorkloadStatus:
        return self.service.status(workload_id)

    def wait(self, workload_id: str, *, timeout: float) -> WorkloadStatus:
        return self.service.wait(workload_id, timeout=timeout)

    def release(self, workload_id: str) -> None:
        """Return the workload's capacity (its node's stream records the release)."""
        self.service.release(workload_id, discard=self.collector.discard)

    def release_each(self, workload_ids: Sequence[str]) -> dict[str, PlacementError]:
        """:meth:`release` each workload, the placed ones in one append; those that could not
        be released, with why."""
        return self.service.release_each(workload_ids, discard=self.collector.discard)

    def set_worker_status(self, node: str, status: WorkerStatus) -> None:
        self.service.set_worker_status(node, status)

    # -- batches -----------------------------------------------------------------------------

    def step(self) -> list[BatchReport]:
        """Without threads: place everything queued (and what waits for joined workers)."""
        if not self._running:
            raise RuntimeStopped("the placement runtime is not running; start() it first")
        self._follow(when_due=False)
        reports: list[BatchReport] = []
        while True:
            batch = self.collector.take_ready() or self.service.joined_waiting()
            if not batch:
                return reports
            reports.append(self._batch(batch))

    def stalls(self) -> list[str]:
        """The batching duty, described, while batches keep failing (see the module docstring);
        empty while they succeed."""
        failing = self._failing
        if failing is None:
            return []
        if failing.failures < self._stall_failures and (
            self.clock.now() - failing.since < self._stall_age
        ):
            return []
        return [
            f"placement batches failed {failing.failures} time(s) in a row since "
            f"{failing.since.isoformat()}: {failing.error}"
        ]

    def _batch(self, batch: list[WorkloadRequest]) -> BatchReport:
        try:
            report = self.service.place_batch(batch)
        except RuntimeStopped:
            raise  # deposed: the batches are the new leader's now, not a stall of this one
        except Exception as e:
            self._failed(e)
            raise
        self._failing = None
        self.reports.append(report)
        del self.reports[:-1000]
        return report

    def _failed(self, error: Exception) -> None:
        # Only the batch thread (or the caller of step) writes this; readers take one snapshot.
        text = f"{type(error).__name__}: {error}"[:_MAX_ERROR_LENGTH]
        before = self._failing
        self._failing = (
            _Failing(1, self.clock.now(), text)
            if before is None
            else _Failing(before.failures + 1, before.since, text)
        )
        if self._failing.failures == self._stall_failures:
            # Once per stall: the batch loop logs every retry.
            log.error("placement batches keep failing; readiness reports it", error=text)

    def _follow(self, *, when_due: bool) -> None:
        """Catch up with the log (:meth:`PlacementService.follow`): what other processes
        accepted, placed or released, and which pending workers' machines failed — every
        ``join_poll_seconds`` (``when_due``) or now, and at once when this process is elected.
        A follower does not: it places what it accepted itself, and catches up once elected.
        A runtime without a leadership is alone on the log: it only asks about its workers."""
        term = None
        if self._leadership is not None:
            term = self._leadership.term()
            if term is None:
                return
        elected = term != self._followed_term
        now = self.clock.now()
        last = self._followed_at
        if when_due and not elected and last is not None and now - last < self._follow_every:
            return
        self._followed_at = now
        alone = self._leadership is None
        self.collector.put(self.service.follow(read_log=not alone, term_started=elected))
        self._followed_term = term

    def _loop(self) -> None:
        while self._running:
            try:
                self._follow(when_due=True)
            except PlacementError as e:
                log.warning("could not catch up with the log; retrying", error=str(e))
            batch = self.collector.take(timeout=self._join_poll)
            if not batch and self._running and self.service.pending_workers():
                batch = self.service.joined_waiting()
            if not batch:
                continue
            try:
                self._batch(batch)
            except PlacementError as e:
                # The batch was put back in the queue; back off so an outage is not a busy loop.
                log.warning("placement batch failed; retrying", error=str(e))
                self.clock.sleep(self._join_poll)
            except Exception:
                log.exception("placement batch failed unexpectedly")
                self.clock.sleep(self._join_poll)
