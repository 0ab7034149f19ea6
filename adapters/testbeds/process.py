"""The scheduling process and the jobs' applications: what the leader does, step by step.

Every method reads the log's state first and acts only on what is still to do, so calling it
again (after a crash, on a second leader, twice in a row) does nothing more — the reactions are
idempotent, as the host's reactors require.

:meth:`SchedulingProcess.advance` moves one scheduling as far as it can now:

* **claims** (``acquire``, or new jobs after an online extension): every pending ``ClaimJob`` and
  the ``ClaimTestbed`` are decided on their streams and appended with ``ClaimsGranted`` in one
  transaction, each stream at the version it was read at. A refusal is recorded
  (``RecordClaimConflict``) and, in ``acquire``, what the scheduling held is released in the
  same append — two schedulings sharing a job never deadlock, the later one waits. A conflict
  already recorded for the same reason is not recorded again.
* **submission**: ``ObserveJobs`` first (a started job whose application disappeared goes back in
  the queue), then ``AssignSlots`` with the testbed's free and usable slots, and
  ``RequestCreation`` for each assigned job, appended together.
* **confirmation / awaiting completion**: ``ObserveJobs`` with the jobs' statuses.
* **completed**: released, if the process releases completed schedulings (``ReleaseScheduling``
  with ``ReleaseJob`` per job and ``ReleaseTestbed``, appended together).

:meth:`SchedulingProcess.advance_job` looks after one job's application:

* a released job's application (finished or not) is deleted until it is observed gone
  (``ApplicationDeleted``), and only then can the job be claimed again;
* a requested application is created once per request: only while no ``ApplicationCreated`` is
  recorded for the request and the operator shows none, and ``RecordApplicationCreated`` is
  appended right after. A crash between the two is healed by the next observation (the
  application is there, so its creation is recorded), never by creating it again; an application
  that disappears after its creation sends the job back to its queue (``ApplicationLost``)
  instead of being re-created behind the scheduling's back. An application that cannot be built
  or that its operator refuses fails the job (``RecordApplicationRefused``), so its scheduling
  does not wait for it;
* its phase is reported (``ObserveApplication``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from fleetledger.domain.errors import Rejected
from fleetledger.domain.testbeds import batch_job, scheduling, testbed

from .applications import Applications, InvalidApplication
from .errors import CommandRejected
from .manifests import ManifestError, application_manifest
from .service import Part, Reads, TestbedsService

__all__ = ["SchedulingProcess"]

log = structlog.get_logger(__name__)

_LIVE = frozenset({"submitted", "scheduled", "running"})
_OBSERVING = frozenset({"submission", "confirmation", "awaiting_completion"})


class _Conflict(Exception):
    def __init__(self, resource: str, reason: str) -> None:
        super().__init__(reason)
        self.resource = resource
        self.reason = reason


class SchedulingProcess:
    """Advances schedulings and their jobs' applications against the log."""

    def __init__(
        self,
        service: TestbedsService,
        applications: Applications,
        *,
        namespace: str = "default",
        priority_class: str = "fleetledger-batch",
        scheduler_name: str = "fleetledger",
        release_completed: bool = True,
    ) -> None:
        self._service = service
        self._apps = applications
        self._namespace = namespace
        self._priority_class = priority_class
        self._scheduler_name = scheduler_name
        self._release_completed = release_completed

    # -- schedulings -----------------------------------------------------------------------------

    def advance(self, name: str) -> int:
        """Move the scheduling on as far as it can now; returns how many events it appended."""
        appended = 0
        for _ in range(8):
            step = self._advance_once(name)
            if step == 0:
                return appended
            appended += step
        return appended

    def _advance_once(self, name: str) -> int:
        state = self._service.scheduling(name).state
        if state.created is None or state.phase == "finished":
            return 0
        jobs, bed = scheduling.pending_claims(state)
        if jobs or bed:
            claimed = self._claim(name)
            if claimed or state.phase == "acquire":
                return claimed
        if state.phase in _OBSERVING:
            observed = self._observe_jobs(name)
            if observed or state.phase != "submission":
                return observed
            return self._submit(name)
        if state.phase == "completed" and self._release_completed:
            return self.release(name)
        return 0

    def _claim(self, name: str) -> int:
        sched_stream = self._service.scheduling(name)
        try:
            parts = self._service.decide_together(
                lambda at, reads: self._claims(name, at, reads), cause=f"claim:{name}"
            )
        except _Conflict as conflict:
            return self._record_conflict(name, conflict)
        if parts:
            log.info("scheduling holds its claims", scheduling=name, phase=sched_stream.state.phase)
        return _count(parts)

    def _claims(self, name: str, at: datetime, reads: Reads) -> list[Part]:
        service = self._service
        sched_stream = service.scheduling(name)
        state = reads(sched_stream)
        assert state.created is not None
        jobs, bed = scheduling.pending_claims(state)
        parts: list[Part] = []
        for job in jobs:
            job_stream = service.job(job)
            try:
                events = batch_job.decide(reads(job_stream), batch_job.ClaimJob(job, name, at=at))
            except Rejected as e:
                raise _Conflict(job, e.reason) from e
            parts.append(Part(job_stream, tuple(events)))
        if bed:
            bed_stream = service.testbed(state.created.testbed)
            try:
                bed_events = testbed.decide(reads(bed_stream), testbed.ClaimTestbed(name, at=at))
            except Rejected as e:
                raise _Conflict(state.created.testbed, e.reason) from e
            parts.append(Part(bed_stream, tuple(bed_events)))
        granted = scheduling.decide(state, scheduling.RecordClaimsGranted(jobs, bed, at=at))
        return [*parts, Part(sched_stream, tuple(granted))]

    def _record_conflict(self, name: str, conflict: _Conflict) -> int:
        state = self._service.scheduling(name).state
        last = state.last_conflict
        holds = state.phase == "acquire" and (state.held_jobs or state.holds_testbed)
        if (
            not holds
            and last is not None
            and (last.resource, last.reason) == (conflict.resource, conflict.reason)
        ):
            return 0
        log.info(
            "scheduling waits for a claim",
            scheduling=name,
            resource=conflict.resource,
            reason=conflict.reason,
        )

        def plan(at: datetime, reads: Reads) -> list[Part]:
            sched_stream = self._service.scheduling(name)
            events = scheduling.decide(
                reads(sched_stream),
                scheduling.RecordClaimConflict(conflict.resource, conflict.reason, at=at),
            )
            released = [e for e in events if isinstance(e, scheduling.HoldingsReleased)]
            parts = [Part(sched_stream, tuple(events))]
            for event in released:
                parts.extend(self._release_parts(name, event.jobs, event.testbed, at, reads))
            return parts

        return _count(self._service.decide_together(plan, cause=f"conflict:{name}"))

    def _release_parts(
        self, name: str, jobs: Sequence[str], bed: bool, at: datetime, reads: Reads
    ) -> list[Part]:
        service = self._service
        parts = []
        for job in jobs:
            stream = service.job(job)
            events = batch_job.decide(reads(stream), batch_job.ReleaseJob(job, name, at=at))
            parts.append(Part(stream, tuple(events)))
        if bed:
            created = service.scheduling(name).state.created
            assert created is not None
            stream_bed = service.testbed(created.testbed)
            events_bed = testbed.decide(reads(stream_bed), testbed.ReleaseTestbed(name, at=at))
            parts.append(Part(stream_bed, tuple(events_bed)))
        return parts

    def _submit(self, name: str) -> int:
        service = self._service

        def plan(at: datetime, reads: Reads) -> list[Part]:
            sched_stream = service.scheduling(name)
            state = reads(sched_stream)
            if state.phase != "submission" or state.created is None:
                return []
            bed = reads(service.testbed(state.created.testbed))
            if bed.defined is None:
                return []
            events = scheduling.decide(
                state,
                scheduling.AssignSlots(
                    testbed.free_slot_ids(bed),
                    at=at,
                    # Before the first observation the testbed's size is unknown, not zero.
                    usable_slots=None if bed.observed_at is None else testbed.usable_slot_ids(bed),
                ),
            )
            parts: list[Part] = []
            for event in events:
                if not isinstance(event, scheduling.JobsAssigned):
                    continue
                for assignment in event.assignments:
                    request = batch_job.ApplicationRequest(
                        bed.defined.name,
                        assignment.slot_ids,
                        testbed.nodes_of(bed, assignment.slot_ids),
                        bed.defined.cpu_millis,
                        bed.defined.memory_mib,
                        self._priority_class,
                        self._scheduler_name,
                    )
                    job_stream = service.job(assignment.job)
                    job_events = batch_job.decide(
                        reads(job_stream),
                        batch_job.RequestCreation(assignment.job, name, request, at=at),
                    )
                    parts.append(Part(job_stream, tuple(job_events)))
            return [Part(sched_stream, tuple(events)), *parts]

        parts = service.decide_together(plan, cause=f"assign:{name}")
        for part in parts:
            for event in part.events:
                if isinstance(event, scheduling.JobsAssigned):
                    log.info(
                        "jobs assigned to slots",
                        scheduling=name,
                        assignments={a.job: list(a.slot_ids) for a in event.assignments},
                    )
                elif isinstance(event, scheduling.SchedulingBlocked):
                    log.warning("scheduling blocked", scheduling=name, reason=event.reason)
        return _count(parts)

    def _observe_jobs(self, name: str) -> int:
        service = self._service
        state = service.scheduling(name).state
        statuses = {job: service.job(job).state.status for job in state.jobs}
        decision = service.execute(
            service.scheduling(name),
            lambda at: scheduling.ObserveJobs(statuses, at=at),
            cause=f"observe-jobs:{name}",
            duty=True,
        )
        return len(decision.events)

    def release(self, name: str, *, duty: bool = True) -> int:
        """Release the scheduling: every job it holds (deleting live applications) and the
        testbed, in one append. Returns how many events it appended (0 if already finished).

        ``duty=False`` for a user's request (the API's ``DELETE``): it is not the leader's work,
        so it is not fenced by the leader's term and any process may take it."""
        service = self._service

        def plan(at: datetime, reads: Reads) -> list[Part]:
            sched_stream = service.scheduling(name)
            events = scheduling.decide(reads(sched_stream), scheduling.ReleaseScheduling(at=at))
            parts = [Part(sched_stream, tuple(events))]
            for event in events:
                if isinstance(event, scheduling.SchedulingReleased):
                    parts.extend(self._release_parts(name, event.jobs, event.testbed, at, reads))
            return parts

        parts = service.decide_together(plan, cause=f"release:{name}", duty=duty)
        if parts:
            log.info("scheduling released", scheduling=name)
        return _count(parts)

    # -- jobs ------------------------------------------------------------------------------------

    def advance_job(self, name: str) -> int:
        """Create, observe or delete the job's application as its state asks; returns how many
        events and cluster actions that took."""
        service = self._service
        stream = service.job(name)
        state = stream.state
        if state.defined is None:
            return 0
        app = batch_job.application_name(name)
        actions = 0
        if batch_job.application_to_delete(state) is not None:
            if self._apps.phase(app) != "absent":
                self._apps.delete(app)
                log.info("application deleted", job=name, application=app)
                actions += 1
        elif (
            state.status in _LIVE
            and not state.application_created
            and self._apps.phase(app) == "absent"
        ):
            try:
                manifest = application_manifest(state, namespace=self._namespace)
                assert manifest is not None
                self._apps.create(manifest)
            except (ManifestError, InvalidApplication) as e:
                # No operator would run it: the job fails, and its scheduling goes on.
                reason = str(e)
                log.error("application refused", job=name, application=app, error=reason)
                return actions + self._record(
                    name,
                    lambda at: batch_job.RecordApplicationRefused(name, reason, at=at),
                    cause=f"refuse-application:{app}",
                )
            log.info("application created", job=name, application=app)
            actions += 1 + self._record(
                name,
                lambda at: batch_job.RecordApplicationCreated(name, at=at),
                cause=f"create-application:{app}",
            )
        phase = self._apps.phase(app)
        return actions + self._record(
            name,
            lambda at: batch_job.ObserveApplication(name, phase, at=at),
            cause=f"observe-application:{app}",
        )

    def _record(
        self, job: str, command: Callable[[datetime], batch_job.JobCommand], *, cause: str
    ) -> int:
        try:
            decision = self._service.execute(
                self._service.job(job), command, cause=cause, duty=True
            )
        except CommandRejected as e:
            log.warning("could not record the application's state", job=job, reason=e.reason)
            return 0
        return len(decision.events)


def _count(parts: Sequence[Part]) -> int:
    return sum(len(p.events) for p in parts)
