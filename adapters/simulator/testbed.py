"""The ``testbed`` scenario: three jobs on a testbed of 2 nodes × 2 slots, placed by the extender.

The world: a :class:`~fleetledger.adapters.cluster.FakeCluster` of two labelled nodes, each with
room for exactly its two slots (so a job pod only fits once its slot's ghost pod is preempted),
and the job pods' priority class, :class:`~fleetledger.adapters.testbeds.FakeApplications` as the
Spark operator, and a small fake kube-scheduler that asks the real extender app over HTTP
(``POST /filter``, then, when the node has no room, ``POST /preempt`` with the nodes where lower
priority pods could make room as candidates, evicting the victims it answers) for every pending
pod.

The script: jobs ``j1``, ``j2`` and ``j3``; scheduling ``s1`` with the queue ``[j2, j1, j2, j1]``
(so ``j2`` gets free slots 0 and 2, ``j1`` slots 1 and 3). Once ``s1`` holds its claims a second
scheduling ``s2`` is created with the interleaved queue ``[j1, j3, j1, j3, j1, j3]``: it reuses
``j1``, and it is longer than the testbed. ``s2`` waits in ``acquire``, holding nothing, while
``s1`` holds ``j1``; once ``s1`` is released and ``j1``'s application deleted it claims ``j1``
again and runs it on three slots (its third queue index never exists on four slots, so it takes
the lowest free slot left), then ``j3`` once those are free. Each pass advances virtual time by
one second, runs the controller until it settles, lets the fake scheduler place pending pods, and
lets applications run: one starts the pass after its pods are all placed and completes after a
seeded 2–5 passes. Completed schedulings are released.

Figures: ``assignments`` (``s1``'s job → slot ids) and ``second_assignments`` (``s2``'s), the
jobs' final states and each job's runs, whether ``s2`` waited in ``acquire`` holding nothing
while ``s1`` held the shared job (and tried again once released), ``slots_held_by_two_pods`` —
slots that at some pass had two pods in them (two ghosts, or a ghost and the job pod bound there),
plus reservations of a slot already reserved for another pod in the log —,
``deadlocked_schedulings`` (schedulings not finished at the end although nothing blocked them),
``applications_leaked`` (applications still there at the end for jobs released or finished), and
the extender's p99 answer time over HTTP. That last one is wall-clock time (in-process HTTP), the
only figure that varies between runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from random import Random
from typing import TypeVar

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node, NoRoom
from fleetledger.adapters.extender import wire
from fleetledger.adapters.extender.server import create_extender_app
from fleetledger.adapters.http.in_process import TestClient
from fleetledger.adapters.runtime import Leadership, MemoryLease
from fleetledger.adapters.simulator.logs import simulation_store
from fleetledger.adapters.testbeds import (
    GHOST_LABEL,
    FakeApplications,
    TestbedsRuntime,
    TestbedsService,
)
from fleetledger.adapters.testbeds.aggregates import BATCH_JOB, TESTBED
from fleetledger.adapters.testbeds.reconciler import POSITION_ANNOTATION
from fleetledger.domain.testbeds import batch_job, testbed
from fleetledger.eventstore import EventStore

from .faults import ControllerCrashed
from .report import percentile

__all__ = ["ControllerFaults", "TestbedReport", "double_reservations", "run_testbed_scenario"]

_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_BED = "bed"
_LABEL = "testbed"
_SCHEDULER = "fleetledger"
_JOB_PRIORITY_CLASS = "fleetledger-batch"
_JOB_PRIORITY = 1000
_JOBS = ("j1", "j2", "j3")
_QUEUE = ("j2", "j1", "j2", "j1")
_SECOND_QUEUE = ("j1", "j3", "j1", "j3", "j1", "j3")
_MAX_PASSES = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class TestbedReport:
    """What the ``testbed`` scenario measured."""

    __test__ = False  # its name starts with Test; pytest must not collect it

    seed: int
    passes: int
    assignments: Mapping[str, tuple[int, ...]]
    second_assignments: Mapping[str, tuple[int, ...]]
    job_states: Mapping[str, str]
    job_runs: Mapping[str, tuple[tuple[str, str, tuple[int, ...]], ...]]
    """Per job, each run that ended: (scheduling, outcome, slot ids)."""
    run_passes: Mapping[str, int]
    first_scheduling_phase: str
    second_scheduling_phase: str
    second_scheduling_waited: bool
    second_scheduling_conflict: str
    slots_held_by_two_pods: int
    deadlocked_schedulings: int
    applications_leaked: int
    ghost_pods_created: int
    preemptions: int
    extender_calls: int
    extender_p50_ms: float
    extender_p99_ms: float
    controller_crashes: int = 0
    """Controller processes that died (:class:`ControllerFaults`); 0 in the plain scenario."""
    leader_changes: int = 0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``."""
        return {
            "scenario": "testbed",
            "seed": self.seed,
            "passes": self.passes,
            "assignments": {job: list(slots) for job, slots in sorted(self.assignments.items())},
            "second_assignments": {
                job: list(slots) for job, slots in sorted(self.second_assignments.items())
            },
            "job_states": dict(sorted(self.job_states.items())),
            "job_runs": {
                job: [
                    {"scheduling": scheduling, "outcome": outcome, "slots": list(slots)}
                    for scheduling, outcome, slots in runs
                ]
                for job, runs in sorted(self.job_runs.items())
            },
            "run_passes": dict(sorted(self.run_passes.items())),
            "first_scheduling_phase": self.first_scheduling_phase,
            "second_scheduling_phase": self.second_scheduling_phase,
            "second_scheduling_waited": self.second_scheduling_waited,
            "second_scheduling_conflict": self.second_scheduling_conflict,
            "slots_held_by_two_pods": self.slots_held_by_two_pods,
            "deadlocked_schedulings": self.deadlocked_schedulings,
            "applications_leaked": self.applications_leaked,
            "ghost_pods_created": self.ghost_pods_created,
            "preemptions": self.preemptions,
            "extender_calls": self.extender_calls,
            "extender_p50_ms": round(self.extender_p50_ms, 3),
            "extender_p99_ms": round(self.extender_p99_ms, 3),
        }

    def render(self) -> str:
        """A readable report."""

        def runs(job: str) -> str:
            return "; ".join(
                f"{scheduling} on slots {list(slots)}: {outcome}"
                for scheduling, outcome, slots in self.job_runs.get(job, ())
            )

        lines = [
            f"scenario testbed (seed {self.seed}): 2 nodes x 2 slots, s1 queue "
            f"[{', '.join(_QUEUE)}], s2 queue [{', '.join(_SECOND_QUEUE)}], "
            f"{self.passes} passes",
            *(
                f"  {job}: slots {list(slots)}, {self.job_states.get(job, '?')} after "
                f"{self.run_passes.get(job, 0)} passes running"
                for job, slots in sorted(self.assignments.items())
            ),
            *(f"  {job} runs: {runs(job) or '-'}" for job in sorted(self.job_runs)),
            f"  s1: {self.first_scheduling_phase}; s2 (shares j1): {self.second_scheduling_phase}"
            f", waited in acquire: {'yes' if self.second_scheduling_waited else 'NO'}",
            f"    s2's last conflict: {self.second_scheduling_conflict or '-'}",
            "    s2's assignments: "
            + (
                ", ".join(
                    f"{job} {list(slots)}" for job, slots in sorted(self.second_assignments.items())
                )
                or "-"
            ),
            f"  slots held by two pods: {self.slots_held_by_two_pods}",
            f"  deadlocked schedulings: {self.deadlocked_schedulings}, applications leaked: "
            f"{self.applications_leaked}",
            f"  ghost pods created: {self.ghost_pods_created}, preemptions: {self.preemptions}",
            f"  extender: {self.extender_calls} calls, p50 {self.extender_p50_ms:.2f} ms, "
            f"p99 {self.extender_p99_ms:.2f} ms (wall clock, in-process HTTP)",
        ]
        return "\n".join(lines)


class _FakeScheduler:
    """The kube-scheduler's part: place pending pods of our scheduler through the extender."""

    def __init__(self, cluster: FakeCluster, client: TestClient) -> None:
        self._cluster = cluster
        self.client = client  # the extender of the process the scheduler reaches
        self.latencies_ms: list[float] = []
        self.preemptions = 0

    def _post(self, path: str, body: dict[str, object]) -> Mapping[str, object]:
        started = time.perf_counter()
        response = self.client.post(path, json=body)
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
        answer = response.json()
        assert isinstance(answer, Mapping)
        return answer

    def _candidates(self, preemptor: str, priority: int) -> dict[str, wire.MetaVictims]:
        """The nodes where evicting lower-priority pods would make room for the pod, with those
        pods: what the scheduler's post-filter offers the extender (never a node without a
        victim)."""
        pods = self._cluster.list_pods()
        pod = next(p for p in pods if p.name == preemptor)
        candidates = {}
        for node in self._cluster.list_nodes():
            victims = [p for p in pods if p.node == node.name and p.priority < priority]
            cpu, memory = self._cluster.free_on(node.name)
            cpu += sum(v.cpu_millis for v in victims)
            memory += sum(v.memory_mib for v in victims)
            if victims and cpu >= pod.cpu_millis and memory >= pod.memory_mib:
                candidates[node.name] = wire.MetaVictims(tuple(v.uid for v in victims))
        return candidates

    def place_pending(self) -> int:
        placed = 0
        nodes = tuple(n.name for n in self._cluster.list_nodes())
        for pod in self._cluster.list_pods():
            if pod.node is not None or pod.scheduler_name != _SCHEDULER:
                continue
            extender_pod = wire.ExtenderPod(pod.name, "default", pod.uid, dict(pod.annotations))
            answer = wire.parse_filter_result(
                self._post("/filter", wire.encode_filter_args(wire.FilterArgs(extender_pod, nodes)))
            )
            if answer.node_names:
                try:
                    self._cluster.bind(pod.name, answer.node_names[0])
                    placed += 1
                    continue
                except NoRoom:
                    pass
            # No node fits as is: the scheduler's post-filter asks the extender whom to preempt.
            candidates = self._candidates(pod.name, pod.priority)
            if not candidates:
                continue
            preempt = wire.parse_preempt_result(
                self._post(
                    "/preempt", wire.encode_preempt_args(wire.PreemptArgs(extender_pod, candidates))
                )
            )
            for node, victims in preempt.victims.items():
                doomed = [p.name for p in self._cluster.list_pods() if p.uid in victims.pod_uids]
                for name in doomed:
                    self._cluster.delete_pod(name)
                    self.preemptions += 1
                try:
                    self._cluster.bind(pod.name, node)
                    placed += 1
                except NoRoom:
                    continue
        return placed


@dataclass(frozen=True, slots=True)
class ControllerFaults:
    """What the deterministic simulation does to the scenario's controller, pass by pass: at
    the start of a pass in ``crashes`` the leading process dies (another one starts on the log,
    is elected and rebuilds everything from it); in ``leader_changes`` the leader loses its
    lease to another process and carries on as a follower, its passes running all the same (a
    deposed leader must not act). A ``ControllerCrashed`` raised by the store (a crash inside a
    group commit) kills the leading process at that point, as a crash between passes does."""

    crashes: frozenset[int] = frozenset()
    leader_changes: frozenset[int] = frozenset()


class _Controllers:
    """The controller processes of the scenario on one log: each a testbeds runtime with a
    leadership of its own, on one lease board; one leads, the deposed ones follow. A process
    whose step meets a ``ControllerCrashed`` dies there; when none leads, a new one starts."""

    def __init__(
        self,
        store: EventStore,
        cluster: FakeCluster,
        apps: FakeApplications,
        clock: ManualClock,
    ) -> None:
        self._store, self._cluster, self._apps, self._clock = store, cluster, apps, clock
        self._board: dict[str, str] = {}
        self._started = 0
        self.processes: list[_Controller] = []
        self.crashes = 0
        self.leader_changes = 0
        self.elect()

    def _start(self) -> _Controller:
        self._started += 1
        name = f"p{self._started}"
        lease = MemoryLease(self._board, holder=name)
        leadership = Leadership(self._store, lease, clock=self._clock, holder=name)
        runtime = TestbedsRuntime(
            self._store,
            self._cluster,
            self._apps,
            clock=self._clock,
            threads=False,
            leadership=leadership,
            manage_leadership=False,
            priority_class=_JOB_PRIORITY_CLASS,
            scheduler_name=_SCHEDULER,
        )
        process = _Controller(name, runtime, leadership, lease)
        self.processes.append(process)
        runtime.start()
        return process

    @property
    def leader(self) -> TestbedsRuntime:
        return next(p.runtime for p in self.processes if p.runtime.leading)

    def elect(self) -> None:
        """Every live process renews or tries its lease; a new one starts while none leads."""
        for _ in range(_MAX_PASSES):
            for process in list(self.processes):
                self._guarded(process, process.leadership.step)
            if any(p.runtime.leading for p in self.processes):
                return
            self._guarded(None, self._start)
        raise RuntimeError("no controller process could be elected")

    def crash(self) -> None:
        """The leader dies without a word: its lease lapses and another process takes over."""
        self._kill(next(p for p in self.processes if p.runtime.leading))
        self.elect()

    def change_leader(self) -> None:
        """The leader's lease passes to a new process; the old one follows from now on."""
        successor = self._guarded(None, self._start)
        if successor is None:
            return
        for process in self.processes:
            if process.leadership.term() is not None:
                process.lease.expire()
        self._board["leader"] = successor.name
        self.leader_changes += 1
        self.elect()

    def run_until_settled(self) -> None:
        """Each process's passes: the leader's act, the followers' must not."""
        for process in list(self.processes):
            self._guarded(process, process.runtime.run_until_settled)
        self.elect()

    def _guarded(self, process: _Controller | None, step: Callable[[], T]) -> T | None:
        """``step`` of ``process`` (``None``: a process being started), which dies if the step
        meets a crash."""
        try:
            return step()
        except ControllerCrashed:
            if process is None:
                process = self.processes[-1]
            self._kill(process)
            return None

    def _kill(self, process: _Controller) -> None:
        self.processes.remove(process)
        process.lease.expire()
        self.crashes += 1


@dataclass(frozen=True, slots=True)
class _Controller:
    name: str
    runtime: TestbedsRuntime
    leadership: Leadership
    lease: MemoryLease


def _two_pod_slots(cluster: FakeCluster, state: testbed.TestbedState) -> set[int]:
    """Slots with more than one pod in them now."""
    pods = cluster.list_pods()
    crowded = set()
    for slot in testbed.slots(state):
        ghosts = [
            p
            for p in pods
            if p.labels.get(GHOST_LABEL) == _BED
            and p.node == slot.node
            and p.annotations.get(POSITION_ANNOTATION) == str(slot.position_on_node)
        ]
        tenants = [
            p
            for p in pods
            if slot.reserved_for is not None and p.name == slot.reserved_for and p.node == slot.node
        ]
        if len(ghosts) + len(tenants) > 1:
            crowded.add(slot.slot_id)
    return crowded


def _double_reservations(store: EventStore) -> int:
    """Reservations in the log of a slot still reserved for another pod."""
    events = (TESTBED.codec.decode(r) for r in store.read_stream(testbed.stream_name(_BED)))
    return len(double_reservations(events))


def double_reservations(events: Iterable[testbed.TestbedEvent]) -> list[str]:
    """One testbed's events in order: each reservation of a slot still reserved for another
    pod, described (a slot held by two pods through the log)."""
    held: dict[tuple[str, int], str] = {}
    doubled: list[str] = []
    for event in events:
        if isinstance(event, testbed.SlotReserved):
            key = (event.node, event.position_on_node)
            holder = held.get(key, event.pod_name)
            if holder != event.pod_name:
                doubled.append(
                    f"slot {event.slot_id} ({event.node}/{event.position_on_node}) reserved "
                    f"for {event.pod_name} while {holder} held it"
                )
            held[key] = event.pod_name
        elif isinstance(event, testbed.ReservationCleared):
            held.pop((event.node, event.position_on_node), None)
    return doubled


def _job_pods_created(store: EventStore) -> int:
    """Job pods the operator made: the replication of every application created, by the log."""
    created = 0
    for job in _JOBS:
        replication = 0
        for record in store.read_stream(batch_job.stream_name(job)):
            event = BATCH_JOB.codec.decode(record)
            if isinstance(event, batch_job.ApplicationRequested):
                replication = event.replication
            elif isinstance(event, batch_job.ApplicationCreated):
                created += replication
    return created


class _Watch:
    """What the scenario checks pass by pass: ``s2`` waiting, slots crowded, jobs' run times."""

    def __init__(self, durations: Mapping[str, int]) -> None:
        self.durations = durations
        self.crowded: set[int] = set()
        self.started: dict[str, int] = {}
        self.ran: dict[str, int] = {}
        self.waited = True
        self.s2_created = False
        self.s1_released = False
        self.s2_retried = False

    def schedulings(self, runtime: TestbedsRuntime) -> None:
        service = runtime.service
        s1 = service.scheduling("s1").state
        # A controller that crashed right after recording it: the log has it already.
        self.s2_created = self.s2_created or "s2" in service.schedulings()
        if not self.s2_created and "j1" in s1.held_jobs:
            service.create_scheduling("s2", testbed=_BED, queue=_SECOND_QUEUE)
            self.s2_created = True
            runtime.run_until_settled()
            s1 = service.scheduling("s1").state
        s2 = service.scheduling("s2").state
        if self.s2_created and s1.phase != "finished":
            self.waited = self.waited and s2.phase == "acquire" and not s2.held_jobs
        self.s1_released = self.s1_released or s1.phase == "finished"
        conflict = s2.last_conflict
        if self.s1_released and (
            s2.held_jobs or (conflict is not None and "s1" not in conflict.reason)
        ):
            self.s2_retried = True

    def applications(self, apps: FakeApplications, at_pass: int) -> None:
        for job in _JOBS:
            app = batch_job.application_name(job)
            phase = apps.phase(app)
            if phase == "scheduled":
                apps.start(app)
                self.started[job] = at_pass
            elif phase == "running":
                self.ran[job] = at_pass - self.started[job]
                if self.ran[job] >= self.durations[job]:
                    apps.finish(app)

    def done(self, runtime: TestbedsRuntime) -> bool:
        s2 = runtime.service.scheduling("s2").state
        return self.s1_released and self.s2_retried and s2.phase == "finished"


def _deadlocked(runtime: TestbedsRuntime) -> int:
    """Schedulings not finished although nothing blocked them: every job could have run."""
    service = runtime.service
    return sum(
        1
        for name in service.schedulings()
        if service.scheduling(name).state.phase != "finished"
        and service.scheduling(name).state.blocked is None
    )


def _leaked(runtime: TestbedsRuntime, apps: FakeApplications) -> int:
    """Applications still there for jobs that are released or finished."""
    leaked = 0
    for job in _JOBS:
        state = runtime.service.job(job).state
        released = state.holder is None
        finished = state.status in ("completed", "failed")
        if (released or finished) and apps.phase(batch_job.application_name(job)) != "absent":
            leaked += 1
    return leaked


def run_testbed_scenario(
    seed: int,
    *,
    url: str | None = None,
    store: EventStore | None = None,
    faults: ControllerFaults | None = None,
    extender_store: EventStore | None = None,
) -> TestbedReport:
    """Run the scenario on a scratch SQLite log (or the database at ``url``, or ``store``:
    an open store the caller owns, such as a fault-injecting one on a shared log). With
    ``faults`` the controller runs as processes on a lease that crash and change leader
    (:class:`ControllerFaults`). The scheduler asks the leader's own extender (as ``serve
    --extender-port`` runs it), or with ``extender_store`` a ``fleetledger extender`` of its
    own on that store: another process, which the controller's crashes do not reach."""
    rng = Random(seed)
    watch = _Watch({job: rng.randint(2, 5) for job in _JOBS})
    clock = ManualClock(_EPOCH)
    cluster = FakeCluster(
        [
            Node("n1", labels={_LABEL: "1"}, cpu_millis=2000, memory_mib=4096),
            Node("n2", labels={_LABEL: "2"}, cpu_millis=2000, memory_mib=4096),
        ],
        # Installed by an administrator with the runtime: job pods must outrank ghost pods.
        priority_classes={_JOB_PRIORITY_CLASS: _JOB_PRIORITY},
    )
    apps = FakeApplications(cluster)
    with contextlib.ExitStack() as scope:
        if store is None:
            store = scope.enter_context(simulation_store(url))
        faults = faults or ControllerFaults()
        controllers = _Controllers(store, cluster, apps, clock)
        service = controllers.leader.service
        standalone = (
            None if extender_store is None else TestbedsService(extender_store, clock=clock)
        )
        scheduler = _FakeScheduler(cluster, TestClient(create_extender_app(standalone or service)))
        service.define_testbed(
            _BED, node_label=_LABEL, slots_per_node=2, cpu_millis=1000, memory_mib=2048
        )
        for job in _JOBS:
            service.define_job(job, kind="spark", image="spark:3.5", main_file=f"local:///{job}.py")
        service.create_scheduling("s1", testbed=_BED, queue=_QUEUE)
        passes = 0
        for passes in range(1, _MAX_PASSES + 1):
            clock.advance(1)
            try:
                if passes in faults.crashes:
                    controllers.crash()
                if passes in faults.leader_changes:
                    controllers.change_leader()
                controllers.elect()
                if controllers.leader.service is not service:
                    service = controllers.leader.service
                    if standalone is None:
                        scheduler.client = TestClient(create_extender_app(service))
                controllers.run_until_settled()
                watch.schedulings(controllers.leader)
                scheduler.place_pending()
            except ControllerCrashed:
                # Inside one of the leader's group commits: the next pass goes on without it.
                controllers.crash()
                continue
            watch.applications(apps, passes)
            watch.crowded |= _two_pod_slots(cluster, service.testbed(_BED).state)
            if watch.done(controllers.leader):
                break
        clock.advance(1)
        controllers.run_until_settled()
        runtime = controllers.leader
        service = runtime.service
        s1 = service.scheduling("s1").state
        s2 = service.scheduling("s2").state
        jobs = {job: service.job(job).state for job in _JOBS}
        report = TestbedReport(
            seed=seed,
            passes=passes,
            assignments=_first_run_slots(jobs, "s1"),
            second_assignments=_first_run_slots(jobs, "s2"),
            job_states={job: state.status for job, state in jobs.items()},
            job_runs={
                job: tuple((r.scheduling, r.outcome, r.slot_ids) for r in state.runs)
                for job, state in jobs.items()
            },
            run_passes=dict(watch.ran),
            first_scheduling_phase=s1.phase,
            second_scheduling_phase=s2.phase,
            second_scheduling_waited=watch.s2_created and watch.waited and watch.s2_retried,
            second_scheduling_conflict="" if s2.last_conflict is None else s2.last_conflict.reason,
            slots_held_by_two_pods=len(watch.crowded) + _double_reservations(store),
            deadlocked_schedulings=_deadlocked(runtime),
            applications_leaked=_leaked(runtime, apps),
            ghost_pods_created=cluster.creations - _job_pods_created(store),
            preemptions=scheduler.preemptions,
            extender_calls=len(scheduler.latencies_ms),
            extender_p50_ms=percentile(scheduler.latencies_ms, 50),
            extender_p99_ms=percentile(scheduler.latencies_ms, 99),
            controller_crashes=controllers.crashes,
            leader_changes=controllers.leader_changes,
        )
        for process in controllers.processes:
            process.runtime.stop()
    return report


def _first_run_slots(
    jobs: Mapping[str, batch_job.JobState], scheduling: str
) -> dict[str, tuple[int, ...]]:
    """Each job's slots in its first run by ``scheduling`` (a released scheduling's assignments
    live on in its jobs' runs)."""
    slots: dict[str, tuple[int, ...]] = {}
    for job, state in jobs.items():
        for run in state.runs:
            if run.scheduling == scheduling:
                slots.setdefault(job, run.slot_ids)
    return slots
