"""The assembled vertical slice: service, coordinator, driver, read model and facade.

``MachinesRuntime`` wires one grouper to one cloud::

    with MachinesRuntime(store, FakeCloud()) as runtime:      # start(): load, resume, follow
        future = runtime.machines.enqueue(MachineRequest(machine_name="m-1", template=t))
        print(future.result(timeout=30))
                                                              # stop(): Shutdown, drain, stop

``start`` loads the grouper stream, catches the read model up and starts the follower thread;
then the process leads: it resubmits every batch the grouper has no outcome for (crash recovery)
and starts the driver. ``stop`` is the graceful stop: no more ticks, ``Shutdown`` seals whatever is
pending, in-flight batches get up to ``timeout`` seconds to finish (the rest resume on the next
leader), and every caller still waiting is answered that the controller is shutting down.

With a :class:`~fleetledger.adapters.runtime.leadership.Leadership` several processes share one
database: each accepts requests, but only the elected one leads — runs the driver and the
coordinator, which executes batches sealed by any process — and its duty appends carry its term,
so once deposed it can no longer write a side effect's result (see
:mod:`fleetledger.adapters.runtime.leadership`). Without one the process simply leads.

Every process's grouper learns of the others' appends through the read model's follower: when
the model has read further into the grouper stream than the grouper has folded, the grouper
catches up, and what it folds is announced as its own decisions are (the driver sees the new
deadlines; a leader's coordinator gets the batches sealed elsewhere).

Batches run on a thread pool of ``coordinator_options.max_concurrent_batches`` threads (a
ceiling set high: the cloud's write budget paces them, see
:mod:`~fleetledger.adapters.machines.write_budget`); give ``write_budget`` to share one budget
between runtimes writing to the same subscription.

``threads=False`` gives the same wiring without any thread: batches run inline (or on the given
runner) and nothing ticks by itself — tests and the simulator call ``driver.step()`` at the times
they choose.
"""

from __future__ import annotations

import structlog

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.adapters.cloud import CloudMachines
from fleetledger.adapters.runtime import (
    InlineRunner,
    LogFollower,
    NoFencing,
    RetryPolicy,
    TaskRunner,
    ThreadRunner,
    Writer,
)
from fleetledger.adapters.runtime.duties import Duties
from fleetledger.adapters.runtime.leadership import DutyFencing, Leadership
from fleetledger.domain.machines import DEFAULT_MAX_ATTEMPTS, GrouperConfig
from fleetledger.eventstore import EventStore
from fleetledger.projections.machine_requests import REQUEST_EVENT_TYPES, MachineRequestsProjection

from .coordinator import Coordinator, CoordinatorOptions
from .driver import GrouperDriver
from .errors import RuntimeStopped
from .facade import Machines
from .outcomes import MachineOutcome
from .service import MachineService
from .stalls import DutyWatch
from .streams import DEFAULT_GROUPER, batch_stream_prefix, grouper_stream_id
from .write_budget import WriteBudget

__all__ = ["SHUTTING_DOWN", "MachinesRuntime"]

SHUTTING_DOWN = (
    "controller shutting down; the request is kept in the log and resumes on the next leader — "
    "ask for its outcome again (GET /v1/machines/{id}) in a moment"
)

log = structlog.get_logger(__name__)

_FOLLOW_INTERVAL_SECONDS = 0.05
"""While requests keep coming, the read model reads the log at most this often: a burst is folded
a page at a time, not an append at a time. A status read sees the model as of at most this long
ago; one for a request not folded yet reads the log first. Another process's request reaches
this process's grouper at most this much later."""


class MachinesRuntime:
    """One grouper, its coordinator and read model, on one store and one cloud."""

    def __init__(
        self,
        store: EventStore,
        cloud: CloudMachines,
        *,
        clock: Clock | None = None,
        config: GrouperConfig | None = None,
        grouper_name: str = DEFAULT_GROUPER,
        threads: bool = True,
        runner: TaskRunner | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        coordinator_options: CoordinatorOptions | None = None,
        write_budget: WriteBudget | None = None,
        retry: RetryPolicy | None = None,
        actor: str = "fleetledger",
        leadership: Leadership | None = None,
        stop_timeout: float = 30.0,
        manage_leadership: bool = True,
    ) -> None:
        self.store = store
        self.cloud = cloud
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.leadership = leadership
        self._stop_timeout = stop_timeout
        self._threads = threads
        coordinator_options = coordinator_options or CoordinatorOptions()
        if runner is None:
            runner = (
                ThreadRunner(max_workers=coordinator_options.max_concurrent_batches)
                if threads
                else InlineRunner()
            )
        self._runner = runner
        self.projection = MachineRequestsProjection(
            grouper_stream=grouper_stream_id(grouper_name),
            batch_stream_prefix=batch_stream_prefix(grouper_name),
        )
        writer = Writer(
            actor=actor,
            labels=(("grouper", grouper_name),),
            # After a step-down a duty still running appends with the term it was started in,
            # so the store refuses it once a newer term leads.
            fencing=DutyFencing(leadership) if leadership is not None else NoFencing(),
            recent=self.projection.recent,
        )
        self.service = MachineService(
            store,
            clock=self.clock,
            config=config or GrouperConfig.default(),
            grouper_name=grouper_name,
            max_attempts=max_attempts,
            retry=retry,
            writer=writer,
        )
        self.coordinator = Coordinator(
            store,
            cloud,
            clock=self.clock,
            runner=runner,
            on_complete=self._completed,
            grouper_name=grouper_name,
            options=coordinator_options,
            retry=retry,
            writer=writer,
            write_budget=write_budget,
        )
        # The leader's duties on the grouper stream, watched so that one failing for good (a
        # seal the log refuses) shows in readiness rather than only in a log line per retry.
        self.duty_watch = DutyWatch(clock=self.clock)
        self.driver = GrouperDriver(self.service, clock=self.clock, watch=self.duty_watch)
        self._follower = LogFollower(
            store,
            _ModelThenGrouper(self.projection, self.service),
            types=REQUEST_EVENT_TYPES,
            min_interval_seconds=_FOLLOW_INTERVAL_SECONDS,
        )
        self.machines = Machines(self.service, running=lambda: self._running)
        self._running = False
        self.duties = Duties(
            leadership,
            on_lead=self._lead,
            on_follow=self._follow,
            manage_leadership=manage_leadership,
        )
        self.service.on_change(self.driver.wake)
        self.service.on_sealed(self._sealed_here)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def leading(self) -> bool:
        """Whether this process runs the driver and the coordinator now."""
        return self.duties.leading

    @property
    def role(self) -> str:
        """``leader`` or ``follower`` (a runtime without leadership leads while it runs), or
        ``stepping down``: the lease's local deadline passed, so no more cloud calls are made
        and the lease is being given up."""
        if self.leadership is not None and self.leadership.role == "stepping down":
            return "stepping down"
        return self.duties.role

    @property
    def term(self) -> int | None:
        """The leader term this process leads in, if it was elected."""
        return self.duties.term

    def stalls(self) -> list[str]:
        """The leader's duties that keep failing, each named with its last error (for
        readiness); empty while they make progress."""
        return [stall.describe() for stall in self.duty_watch.stalls()]

    def start(self) -> MachinesRuntime:
        """Load, catch the read model up, follow the log; lead now (no leadership configured)
        or once elected."""
        if self._running:
            return self
        self.service.load()
        self._running = True
        self.duties.start(threads=self._threads)
        self.projection.catch_up(self.store)
        if self._threads:
            self._follower.start()
        log.info(
            "machines runtime started",
            grouper=self.service.grouper_name,
            stream_version=self.service.version,
        )
        return self

    def stop(self, *, timeout: float | None = None) -> None:
        """Graceful stop: seal everything pending (as leader), give in-flight batches
        ``timeout`` s (default: the runtime's ``stop_timeout``), answer every caller still
        waiting, release the lease."""
        if not self._running:
            return
        if timeout is None:
            timeout = self._stop_timeout
        self._running = False
        self.driver.stop()
        if self.leading:
            try:
                self.service.shutdown()
            except Exception as e:
                log.error(
                    "could not seal pending batches at shutdown; they resume on the next leader",
                    error=str(e),
                )
        if not self.coordinator.wait_idle(timeout):
            log.warning(
                "batches still in flight at shutdown; they resume on the next leader",
                batches=list(self.coordinator.in_flight()),
            )
        # Batches waiting out a log outage stop waiting (they resume on the next leader).
        self.coordinator.halt()
        self.duties.relinquish()
        if isinstance(self._runner, ThreadRunner):
            self._runner.shutdown(wait=False)
        answered = self.service.fail_waiting(RuntimeStopped(SHUTTING_DOWN))
        if answered:
            log.info("told waiting callers the controller is shutting down", callers=answered)
        self._follower.stop()
        self.duties.release()
        log.info("machines runtime stopped", grouper=self.service.grouper_name)

    def __enter__(self) -> MachinesRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- leading and following -------------------------------------------------------------------

    def _lead(self, term: int | None) -> None:
        self.duty_watch.clear()
        self.coordinator.resume()
        unfinished = self.service.unfinished_batches()
        if unfinished:
            log.info(
                "resuming batches left unfinished by an earlier leader",
                grouper=self.service.grouper_name,
                batches=len(unfinished),
                term=term,
            )
        self.coordinator.submit(unfinished)
        if self._threads:
            self.driver.start()

    def _follow(self, reason: str) -> None:
        # Called from whichever thread noticed (possibly the driver's or a batch's): signal the
        # duties to stop without waiting for them; a fenced append cannot land anyway.
        self.driver.stop(timeout=0)
        self.duty_watch.clear()
        self.coordinator.halt()

    def _sealed_here(self, batch_ids: tuple[str, ...]) -> None:
        if self.leading:
            self.coordinator.submit(batch_ids)

    def _completed(
        self, batch_id: str, outcomes: tuple[MachineOutcome, ...], completed_event_id: str
    ) -> None:
        created = sum(1 for o in outcomes if o.status == "created")
        # Routine completions are debug (a burst makes hundreds); failures are worth a line.
        report = log.debug if created == len(outcomes) else log.info
        report(
            "batch completed",
            batch_id=batch_id,
            created=created,
            failed=len(outcomes) - created,
        )
        self.duty_watch.run(
            "recording batch outcomes",
            lambda: self.service.record_batch_outcomes(
                batch_id, outcomes, causation_id=completed_event_id
            ),
        )


class _ModelThenGrouper:
    """The follower's model: the read model reads what is new, then the grouper folds what the
    model found of its stream that it has not folded yet (another process's requests and
    seals). Folding announces it: observers wake the driver and hand a sealed batch to the
    coordinator. Compared state to state on every read, not event by event, so a fold that
    failed (the log unreachable) is done at the next read."""

    def __init__(self, projection: MachineRequestsProjection, service: MachineService) -> None:
        self._projection = projection
        self._service = service

    def catch_up(self, store: EventStore) -> int:
        read = self._projection.catch_up(store)
        version = self._projection.grouper_version
        if version > self._service.version:
            # Unless the append in flight of this process holds it: then nothing is read.
            self._service.load(through_version=version)
        return read
