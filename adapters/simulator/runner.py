"""The scenario runner: executes a script on virtual time against the fake cloud, then reports.

It runs the real runtime — :class:`~fleetledger.adapters.machines.MachineService`, the
:class:`~fleetledger.adapters.machines.Coordinator`, the driver's
:meth:`~fleetledger.adapters.machines.GrouperDriver.step` and the read model — with
:class:`~fleetledger.adapters.simulator.virtual_time.VirtualTime` as both their clock and the
coordinator's task runner, and the :class:`~fleetledger.adapters.cloud.FakeCloud` sleeping its
latency on that same clock. The loop is a discrete-event simulation: at each step it lets the
running batches settle, then jumps to the earliest of the next parked task's wake-up, the grouper's
next deadline, and the next scripted arrival or injection (in that order on ties), and does it.

The log is embedded SQLite by default: a fresh scratch file per run, in RAM-backed ``/dev/shm``
when there is one (a throwaway log gains nothing from ``fsync``), removed afterwards. With ``url``
(e.g. Postgres) the run appends to that database instead, under a grouper name unique to the run,
so reruns never collide; nothing is deleted there.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from random import Random

import structlog

from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CloudMachines,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
)
from fleetledger.adapters.machines import MachineRequest, MachinesRuntime
from fleetledger.adapters.simulator.logs import simulation_store
from fleetledger.projections.machine_requests import RequestView

from .catalog import get_scenario
from .report import ComparisonReport, Latency, SimulationReport
from .scenarios import Scenario, Script
from .virtual_time import VirtualTime

__all__ = ["COMPARE_MODES", "EPOCH", "compare_scenario", "run_scenario", "run_script"]

log = structlog.get_logger(__name__)

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
"""Virtual time zero of every run (fixed, so event times are a function of the seed)."""
COMPARE_MODES = ("naive",)


def run_scenario(
    name: str, *, seed: int = 1, url: str | None = None, definition: Scenario | None = None
) -> SimulationReport:
    """Run scenario ``name`` with ``seed``; on a scratch SQLite log unless ``url`` is given.
    ``definition`` is the scenario itself when it is not the catalog's (another cloud profile)."""
    scenario = definition if definition is not None else get_scenario(name)
    return run_script(scenario.build(Random(seed)), scenario=name, seed=seed, url=url)


def compare_scenario(
    name: str,
    *,
    seed: int = 1,
    url: str | None = None,
    against: str = "naive",
    definition: Scenario | None = None,
) -> ComparisonReport:
    """The scenario with batching, then the same arrivals with batching off."""
    if against not in COMPARE_MODES:
        raise ValueError(f"cannot compare against {against!r}; choose {', '.join(COMPARE_MODES)}")
    scenario = definition if definition is not None else get_scenario(name)
    script = scenario.build(Random(seed))
    batched = run_script(script, scenario=name, seed=seed, url=url)
    naive = run_script(script.without_batching(), scenario=name, seed=seed, url=url, mode="naive")
    return ComparisonReport(batched, naive)


def run_script(
    script: Script, *, scenario: str, seed: int, url: str | None = None, mode: str = "batched"
) -> SimulationReport:
    """Execute ``script`` and report; see the module docstring."""
    started = time.perf_counter()
    with simulation_store(url) as store:
        # Named from the seed and where the log stood, not at random: the same seed on the same
        # log writes the same streams, and a second run on a shared log gets streams of its own.
        grouper = f"sim-{mode}-{seed}-{store.head()}"
        clock = VirtualTime(EPOCH, max_concurrent=script.max_concurrent_batches)
        # As the real adapters do, failed machines are deleted (they would stay billed).
        fake = FakeCloud(clock=clock, latency=script.cloud_latency_seconds, delete_failed=True)
        cloud = _MeteredCloud(fake)
        runtime = MachinesRuntime(
            store,
            cloud,
            clock=clock,
            config=script.config,
            grouper_name=grouper,
            threads=False,
            runner=clock,
        )
        log.info(
            "simulating",
            scenario=scenario,
            seed=seed,
            mode=mode,
            requests=len(script.arrivals),
            bursts=script.bursts,
            grouper=grouper,
            log=store,
        )
        runtime.start()
        _drive(script, runtime, clock, fake)
        runtime.stop(timeout=5.0)
        runtime.projection.catch_up(store)
        report = _report(
            script, runtime, fake, cloud, scenario=scenario, seed=seed, mode=mode, end=clock.now()
        )
    log.info(
        "simulation finished",
        scenario=scenario,
        mode=mode,
        wall_seconds=round(time.perf_counter() - started, 2),
        cloud_calls=report.cloud_calls,
        requests=report.requests,
    )
    return report


# -- the event loop --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Action:
    at: datetime
    order: int
    run: Callable[[], None]


def _actions(script: Script, runtime: MachinesRuntime, fake: FakeCloud) -> list[_Action]:
    actions: list[_Action] = []
    for injection in script.injections:

        def inject(apply: Callable[[FakeCloud], None] = injection.apply) -> None:
            apply(fake)

        at = EPOCH + timedelta(seconds=injection.at_seconds)
        actions.append(_Action(at, len(actions), inject))
    burst = 0
    for arrival in script.arrivals:
        if arrival.burst != burst:
            burst = arrival.burst
            size = sum(1 for a in script.arrivals if a.burst == burst)

            def announce(burst: int = burst, size: int = size) -> None:
                log.info("burst arriving", burst=burst, of=script.bursts, requests=size)

            actions.append(
                _Action(EPOCH + timedelta(seconds=arrival.at_seconds), len(actions), announce)
            )

        def enqueue(request: MachineRequest = arrival.request) -> None:
            runtime.machines.enqueue(request)

        actions.append(
            _Action(EPOCH + timedelta(seconds=arrival.at_seconds), len(actions), enqueue)
        )
    actions.sort(key=lambda a: (a.at, a.order))
    return actions


def _drive(script: Script, runtime: MachinesRuntime, clock: VirtualTime, fake: FakeCloud) -> None:
    actions = _actions(script, runtime, fake)
    next_action = 0
    while True:
        clock.settle()
        # Ties: wake-ups first (a create finishing at t is seen by what happens at t), then the
        # grouper's deadline, then scripted arrivals.
        candidates: list[tuple[datetime, int]] = []
        wake = clock.next_wakeup()
        if wake is not None:
            candidates.append((wake, 0))
        deadline = runtime.service.next_deadline()
        if deadline is not None:
            candidates.append((deadline, 1))
        if next_action < len(actions):
            candidates.append((actions[next_action].at, 2))
        if not candidates:
            return
        when, kind = min(candidates)
        clock.advance_to(when)
        if kind == 1:
            runtime.driver.step()
        elif kind == 2:
            actions[next_action].run()
            next_action += 1


# -- measuring -------------------------------------------------------------------------------


class _MeteredCloud:
    """Counts the calls made to the cloud port, then passes them on."""

    def __init__(self, inner: CloudMachines) -> None:
        self._inner = inner
        self.creates = 0
        self.reads = 0

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        self.creates += 1
        return self._inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        self.reads += 1
        return self._inner.read_machine(machine_name, resume_token=resume_token)


def _report(
    script: Script,
    runtime: MachinesRuntime,
    fake: FakeCloud,
    cloud: _MeteredCloud,
    *,
    scenario: str,
    seed: int,
    mode: str,
    end: datetime,
) -> SimulationReport:
    views = list(runtime.projection.views().values())
    batches: dict[str, list[RequestView]] = {}
    for view in views:
        batches.setdefault(view.batch_id, []).append(view)
    sizes = [len(members) for members in batches.values()]
    reasons = Counter(members[0].seal_reason or "pending" for members in batches.values())
    waited = [
        (v.sealed_at - v.requested_at).total_seconds() for v in views if v.sealed_at is not None
    ]
    total = [
        (v.completed_at - v.requested_at).total_seconds()
        for v in views
        if v.completed_at is not None
    ]
    failures = Counter(v.error.code for v in views if v.error is not None)
    creations = Counter(fake.creations)
    deletions = Counter(fake.deletions)
    last = max((v.completed_at for v in views if v.completed_at is not None), default=end)
    first = min((v.requested_at for v in views), default=last)
    config = script.config
    return SimulationReport(
        scenario=scenario,
        seed=seed,
        mode=mode,
        idle_timeout_s=config.idle_timeout.total_seconds(),
        max_timeout_s=config.max_timeout.total_seconds(),
        max_batch_size=config.max_batch_size,
        cloud_latency_s=script.cloud_latency_seconds,
        max_concurrent_batches=script.max_concurrent_batches,
        bursts=script.bursts,
        requests=len(views),
        skip_batching_requests=sum(1 for v in views if v.skip_batching),
        cloud_calls=cloud.creates,
        machine_reads=cloud.reads,
        batches=len(batches),
        seal_reasons=tuple(sorted(reasons.items())),
        mean_batch_size=sum(sizes) / len(sizes) if sizes else 0.0,
        largest_batch=max(sizes, default=0),
        batching_latency=Latency.of(waited),
        end_to_end_latency=Latency.of(total),
        created=sum(1 for v in views if v.status == "created"),
        failed=sum(1 for v in views if v.status == "failed"),
        failures=tuple(sorted(failures.items())),
        without_outcome=sum(1 for v in views if not v.terminal),
        machines_created=len(creations),
        # A name made again after its failed machine was deleted is not a duplicate.
        duplicate_machines=sum(max(0, n - 1 - deletions[name]) for name, n in creations.items()),
        machines_in_cloud=len(fake.machine_names()),
        failed_leftovers_deleted=sum(deletions.values()),
        virtual_seconds=(last - EPOCH).total_seconds(),
        seconds_to_all_outcomes=(last - first).total_seconds(),
        injections=tuple(i.description for i in script.injections),
    )
