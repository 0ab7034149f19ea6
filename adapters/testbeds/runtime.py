"""The assembled testbeds capability: service, ghost-pod reconciler, scheduling process.

``TestbedsRuntime`` wires one store to one cluster and its application operators::

    with TestbedsRuntime(store, cluster, applications) as runtime:    # start(): catch up, lead
        runtime.service.define_testbed("bed", node_label="testbed", slots_per_node=2,
                                       cpu_millis=1000, memory_mib=2048)
        ...

A pass (:meth:`TestbedsRuntime.step`) learns of new testbeds, jobs and schedulings from the log,
reconciles every testbed's ghost pods, looks after every job's application and advances every
scheduling. The leader runs passes in a thread: woken by every append the store signals (its own,
and other processes' on Postgres), and at least every ``poll_seconds`` for what only the cluster
shows (a pod bound, an application finished). ``threads=False`` runs no thread: tests and the
simulator call :meth:`step` / :meth:`run_until_settled` when they choose.

With a :class:`~fleetledger.adapters.runtime.leadership.Leadership` only the elected process runs
passes, and its duty appends carry its term; every process answers the extender (reservations
are appended with expected versions, not as duties).
"""

from __future__ import annotations

import threading

import structlog

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.adapters.cluster import ClusterGateway, PriorityClassConflict
from fleetledger.adapters.runtime import DutyFencing, NoFencing, RetryPolicy, Writer
from fleetledger.adapters.runtime.duties import Duties
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.eventstore import EventStore

from .applications import Applications
from .process import SchedulingProcess
from .reconciler import GHOST_PRIORITY, GhostPodReconciler
from .service import TestbedsService

__all__ = ["JOB_PRIORITY", "JOB_PRIORITY_CLASS", "TestbedsRuntime"]

JOB_PRIORITY_CLASS = "fleetledger-batch"
"""The PriorityClass of the jobs' executor / task-manager pods (created if absent)."""
JOB_PRIORITY = 1000
"""Its value: above the ghost pods' (:data:`~.reconciler.GHOST_PRIORITY`), so a job pod preempts
a ghost, and low enough to leave room above it for a cluster's own important workloads."""

log = structlog.get_logger(__name__)


class TestbedsRuntime:
    """Testbeds, batch jobs and schedulings on one store and one cluster."""

    __test__ = False  # its name starts with Test; pytest must not collect it

    def __init__(
        self,
        store: EventStore,
        cluster: ClusterGateway,
        applications: Applications,
        *,
        clock: Clock | None = None,
        threads: bool = True,
        leadership: Leadership | None = None,
        manage_leadership: bool = True,
        actor: str = "fleetledger",
        namespace: str = "default",
        priority_class: str = JOB_PRIORITY_CLASS,
        priority: int = JOB_PRIORITY,
        scheduler_name: str = "fleetledger",
        release_completed: bool = True,
        poll_seconds: float = 1.0,
        retry: RetryPolicy | None = None,
    ) -> None:

        self.store = store
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.leadership = leadership
        self._threads = threads
        self._poll_seconds = poll_seconds
        writer = Writer(
            actor=actor,
            labels=(("capability", "testbeds"),),
            fencing=DutyFencing(leadership) if leadership is not None else NoFencing(),
        )
        self.service = TestbedsService(store, clock=self.clock, writer=writer, retry=retry)
        self.reconciler = GhostPodReconciler(self.service, cluster)
        self.process = SchedulingProcess(
            self.service,
            applications,
            namespace=namespace,
            priority_class=priority_class,
            scheduler_name=scheduler_name,
            release_completed=release_completed,
        )
        self._cluster = cluster
        self._job_class = (priority_class, priority)
        self._job_class_ensured = False
        self._running = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.duties = Duties(
            leadership,
            on_lead=self._lead,
            on_follow=self._follow,
            manage_leadership=manage_leadership,
        )

    @property
    def running(self) -> bool:
        return self._running

    @property
    def leading(self) -> bool:
        return self.duties.leading

    # -- one pass --------------------------------------------------------------------------------

    def step(self) -> int:
        """One pass over every testbed, job and scheduling; returns how many events and cluster
        actions it took (0: nothing to do now, or this process does not lead)."""
        if not self.leading:
            return 0
        service = self.service
        service.catch_up()
        # Other processes append too (users' commands, the extender's reservations): fold every
        # stream's new tail before acting on it.
        for name in service.testbeds():
            service.testbed(name).load()
        for name in service.jobs():
            service.job(name).load()
        for name in service.schedulings():
            service.scheduling(name).load()
        changes = 0
        for name in service.testbeds():
            changes += self.reconciler.reconcile(name)
        if service.jobs():
            self._ensure_job_priority_class()
        for name in service.jobs():
            changes += self.process.advance_job(name)
        for name in service.schedulings():
            changes += self.process.advance(name)
        return changes

    def _ensure_job_priority_class(self) -> None:
        # Job pods name this class: without it admission refuses them, and with a priority at
        # or below the ghosts' the kube-scheduler never preempts a ghost for them.
        if self._job_class_ensured:
            return
        name, value = self._job_class
        try:
            self._cluster.ensure_priority_class(
                name, value, description="fleetledger batch jobs: preempt testbed ghost pods"
            )
        except PriorityClassConflict as e:
            # An administrator's own class of that name is theirs to keep; say what it means.
            log.warning(
                "job priority class exists with another value; keeping it (job pods preempt "
                f"ghost pods only if it is above {GHOST_PRIORITY})",
                priority_class=name,
                error=str(e),
            )
        self._job_class_ensured = True

    def run_until_settled(self, *, max_passes: int = 50) -> int:
        """Passes until one changes nothing (at most ``max_passes``); returns the total."""
        total = 0
        for _ in range(max_passes):
            changes = self.step()
            total += changes
            if changes == 0:
                break
        return total

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> TestbedsRuntime:
        """Catch up with the log; lead now (no leadership configured) or once elected."""
        if self._running:
            return self
        self.service.catch_up()
        self._running = True
        self.duties.start(threads=self._threads)
        log.info("testbeds runtime started", testbeds=list(self.service.testbeds()))
        return self

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the passes (the one in hand finishes) and release the lease."""
        if not self._running:
            return
        self._running = False
        self.duties.relinquish()
        self._follow("stopping")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.duties.release(timeout)
        log.info("testbeds runtime stopped")

    def __enter__(self) -> TestbedsRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _lead(self, term: int | None) -> None:
        if not self._threads:
            return
        # Cleared first: a pass thread still winding down from a previous term keeps running.
        self._stopping.clear()
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="testbeds-passes", daemon=True)
        self._thread.start()

    def _follow(self, reason: str) -> None:
        self._stopping.set()
        self.store.wake()

    def _run(self) -> None:
        while not self._stopping.is_set():
            seen = self.store.wake_sequence()
            try:
                changes = self.step()
            except Exception as e:
                # A failed pass (log or cluster unreachable) is retried on the next wake-up or
                # poll; the thread must outlive it, as the clock driver does.
                log.error("testbeds pass failed; retrying", error=str(e), kind=type(e).__name__)
                changes = 0
            if changes == 0 and not self._stopping.is_set():
                # Woken by this process's testbed, job and scheduling events only: a serve
                # creating machines appends hundreds of times a second, and a pass after each
                # append (the catalog read, every stream's tail) cost it nearly a tenth of its
                # CPU with no testbed defined. The poll catches the cluster's changes.
                self.store.wait_for_wake(
                    seen, timeout=self._poll_seconds, types=self.service.event_types
                )
