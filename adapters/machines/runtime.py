"""The assembled vertical slice: service, coordinator, driver, read model and facade.

``MachinesRuntime`` wires one grouper to one cloud::

    with MachinesRuntime(store, FakeCloud()) as runtime:      # start(): load, resume, follow
        future = runtime.machines.enqueue(MachineRequest(machine_name="m-1", template=t))
        print(future.result(timeout=30))
                                                              # stop(): Shutdown, drain, stop

``start`` loads the grouper stream, resubmits every batch the grouper has no outcome for (crash
recovery), catches the read model up and starts the driver and follower threads. ``stop`` is the
graceful stop: no more ticks, ``Shutdown`` seals whatever is pending, in-flight batches get up to
``timeout`` seconds to finish (the rest resume on the next start).

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
    RetryPolicy,
    TaskRunner,
    ThreadRunner,
)
from fleetledger.domain.grouper import GrouperConfig
from fleetledger.domain.machine_batch import DEFAULT_MAX_ATTEMPTS
from fleetledger.eventstore import EventStore
from fleetledger.projections.machine_requests import MachineRequestsProjection

from .coordinator import Coordinator, CoordinatorOptions
from .driver import GrouperDriver
from .facade import Machines
from .outcomes import MachineOutcome
from .service import MachineService
from .streams import DEFAULT_GROUPER, batch_stream_prefix, grouper_stream_id

__all__ = ["MachinesRuntime"]

log = structlog.get_logger(__name__)


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
        max_concurrent_batches: int = 4,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        coordinator_options: CoordinatorOptions | None = None,
        retry: RetryPolicy | None = None,
        actor: str = "fleetledger",
    ) -> None:
        self.store = store
        self.cloud = cloud
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._threads = threads
        if runner is None:
            runner = ThreadRunner(max_workers=max_concurrent_batches) if threads else InlineRunner()
        self._runner = runner
        self.service = MachineService(
            store,
            clock=self.clock,
            config=config or GrouperConfig.default(),
            grouper_name=grouper_name,
            max_attempts=max_attempts,
            actor=actor,
            retry=retry,
        )
        self.coordinator = Coordinator(
            store,
            cloud,
            clock=self.clock,
            runner=runner,
            on_complete=self._completed,
            grouper_name=grouper_name,
            options=coordinator_options,
            actor=actor,
            retry=retry,
        )
        self.driver = GrouperDriver(self.service, clock=self.clock)
        self.projection = MachineRequestsProjection(
            grouper_stream=grouper_stream_id(grouper_name),
            batch_stream_prefix=batch_stream_prefix(grouper_name),
        )
        self._follower = LogFollower(store, self.projection)
        self.machines = Machines(self.service, running=lambda: self._running)
        self._running = False
        self.service.on_change(self.driver.wake)
        self.service.on_sealed(self.coordinator.submit)

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> MachinesRuntime:
        """Load, resume unfinished batches, and (with threads) start ticking and following."""
        if self._running:
            return self
        self.service.load()
        self._running = True
        unfinished = self.service.unfinished_batches()
        if unfinished:
            log.info(
                "resuming batches left unfinished by an earlier run",
                grouper=self.service.grouper_name,
                batches=len(unfinished),
            )
        self.coordinator.submit(unfinished)
        self.projection.catch_up(self.store)
        if self._threads:
            self._follower.start()
            self.driver.start()
        log.info(
            "machines runtime started",
            grouper=self.service.grouper_name,
            stream_version=self.service.version,
        )
        return self

    def stop(self, *, timeout: float = 30.0) -> None:
        """Graceful stop: seal everything pending and give in-flight batches ``timeout`` s."""
        if not self._running:
            return
        self._running = False
        self.driver.stop()
        try:
            self.service.shutdown()
        except Exception as e:
            log.error(
                "could not seal pending batches at shutdown; they resume on start", error=str(e)
            )
        if not self.coordinator.wait_idle(timeout):
            log.warning(
                "batches still in flight at shutdown; they resume on the next start",
                batches=list(self.coordinator.in_flight()),
            )
        if isinstance(self._runner, ThreadRunner):
            self._runner.shutdown(wait=False)
        self._follower.stop()
        log.info("machines runtime stopped", grouper=self.service.grouper_name)

    def __enter__(self) -> MachinesRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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
        self.service.record_batch_outcomes(batch_id, outcomes, causation_id=completed_event_id)
