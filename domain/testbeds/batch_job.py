"""A batch job wrapping a Spark or Flink application, one stream per job (``batch-job-<name>``).

Lifecycle (seed 05, "Batch Job Operator")::

    ready --claim--> in_queue --request--> submitted --> scheduled --> running --> completed
      ^  ^              |   ^                    |             |            |     (or failed)
      |  |              |   +-- application disappeared -------+------------+
      |  +-- deleted ---+------------------------+-------------+------------+----------+
      +---- release (pending deletion of the application, then ready) -----------------+

* A scheduling claims a ready job (:class:`JobClaimed`); only one scheduling holds a job, which the
  log enforces: the claim is appended with the stream's expected version.
* The holder requests the application's creation with its slots (:class:`ApplicationRequested`);
  the adapter's manifest builder (``fleetledger.adapters.testbeds.manifests``) makes the Spark
  or Flink resource from it. The process records the creation (:class:`ApplicationCreated`, also
  recorded when the application is first observed present): an application is created once per
  request.
* Observations of the application move the job on. ``scheduled`` (every pod has a node) and
  ``running`` may be skipped, and an application observed completed goes straight to
  ``completed`` from any earlier state of the run: the controller may have been down while it ran.
* An application that disappears after its creation while it ran (observed absent) sends the job
  back to Ready (:class:`ApplicationLost`); its scheduling still holds it, so — as the original's
  Ready state moves on at once when an active scheduling is set — it is ``in_queue`` again, and
  the scheduling puts it back in its queue. A finished job's outcome is a fact: its application
  may go without changing it.
* Released by its scheduling at any point — finished or not — the job is Ready again once the
  application it requested is deleted (the seed's release → pending deletion → ready cycle):
  :func:`application_to_delete` names it, and the job cannot be claimed until the deletion is
  observed. Each run that ended (released or lost) stays in ``JobState.runs``.
* :class:`DeleteJob` is refused while a scheduling holds the job; a deleted job cannot be claimed
  until :class:`DefineJob` defines it again.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from fleetledger.domain.errors import InvalidCommand, Rejected

__all__ = [
    "AppKind",
    "ApplicationCreated",
    "ApplicationDeleted",
    "ApplicationLost",
    "ApplicationPhase",
    "ApplicationRequest",
    "ApplicationRequested",
    "ClaimJob",
    "DefineJob",
    "DeleteJob",
    "JobClaimed",
    "JobCommand",
    "JobCompleted",
    "JobDefined",
    "JobDeleted",
    "JobEvent",
    "JobFailed",
    "JobReleased",
    "JobRun",
    "JobRunning",
    "JobScheduled",
    "JobState",
    "JobStatus",
    "ObserveApplication",
    "RecordApplicationCreated",
    "RecordApplicationRefused",
    "ReleaseJob",
    "RequestCreation",
    "RunOutcome",
    "application_name",
    "application_to_delete",
    "decide",
    "evolve",
    "initial_state",
    "stream_name",
]

AppKind = Literal["spark", "flink"]
JobStatus = Literal["ready", "in_queue", "submitted", "scheduled", "running", "completed", "failed"]
# What the application's operator reports, reduced to what the job needs: Spark's COMPLETED and
# Flink's Stopped are both "completed" (seed 05).
ApplicationPhase = Literal["absent", "pending", "scheduled", "running", "completed", "failed"]
RunOutcome = Literal["completed", "failed", "released", "lost"]

_WITH_APPLICATION: frozenset[JobStatus] = frozenset({"submitted", "scheduled", "running"})
_OUTCOMES: dict[JobStatus, RunOutcome] = {"completed": "completed", "failed": "failed"}


def stream_name(job: str) -> str:
    """The job's stream."""
    return f"batch-job-{job}"


def application_name(job: str) -> str:
    """The name of the Spark or Flink resource built for the job."""
    return f"{job}-app"


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DefineJob:
    """Submit a job: what to run. Everything that depends on a scheduling comes later."""

    name: str
    kind: AppKind
    image: str
    main_file: str
    arguments: tuple[str, ...] = ()
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ClaimJob:
    """A scheduling takes the job (appended atomically with its other claims)."""

    job: str
    scheduling: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ApplicationRequest:
    """The scheduling-dependent part of the application (seed 05): slot ids, slot size, the
    slots' nodes (the pods' node affinity), priority class and scheduler name."""

    testbed: str
    slot_ids: tuple[int, ...]
    nodes: tuple[str, ...]
    cpu_millis: int
    memory_mib: int
    priority_class: str
    scheduler_name: str


@dataclass(frozen=True, slots=True)
class RequestCreation:
    """The holding scheduling asks for the application; replication is the slot count."""

    job: str
    scheduling: str
    request: ApplicationRequest
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ObserveApplication:
    """What the application's operator reports now."""

    job: str
    phase: ApplicationPhase
    message: str = ""
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReleaseJob:
    """The holding scheduling lets the job go; a no-op for anyone else."""

    job: str
    scheduling: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordApplicationCreated:
    """The process created the application of the job's current request."""

    job: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordApplicationRefused:
    """The current request's application cannot be created: it could not be built, or its
    operator refused it. The job fails with ``message``."""

    job: str
    message: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """Delete the job: refused while a scheduling holds it, a no-op once deleted."""

    name: str
    _: KW_ONLY
    at: datetime


JobCommand: TypeAlias = (
    DefineJob
    | ClaimJob
    | RequestCreation
    | ObserveApplication
    | ReleaseJob
    | RecordApplicationCreated
    | RecordApplicationRefused
    | DeleteJob
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobDefined:
    """The job exists and is ready."""

    name: str
    kind: AppKind
    image: str
    main_file: str
    arguments: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class JobClaimed:
    """A scheduling holds the job: it is in that scheduling's queue."""

    job: str
    scheduling: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ApplicationRequested:
    """The application must be created with these slots; ``replication`` pods, one per slot."""

    job: str
    scheduling: str
    request: ApplicationRequest
    replication: int
    at: datetime


@dataclass(frozen=True, slots=True)
class JobScheduled:
    """Every pod of the application has a node."""

    job: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobRunning:
    """The application runs; ``at`` is the job's start time."""

    job: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobCompleted:
    """The application completed; ``at`` is the job's completion time."""

    job: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobFailed:
    """The application failed."""

    job: str
    message: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobReleased:
    """The scheduling let the job go; ``delete_application`` when one was created for it."""

    job: str
    scheduling: str
    delete_application: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class ApplicationDeleted:
    """The application of a released job is gone: the job can be claimed again."""

    job: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ApplicationCreated:
    """The application of the current request exists (created by the process, or first seen)."""

    job: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ApplicationLost:
    """The application disappeared while the job ran: the job is Ready again and, still held by
    ``scheduling``, back in its queue."""

    job: str
    scheduling: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobDeleted:
    """The job is deleted; defining it again re-creates it."""

    name: str
    at: datetime


JobEvent: TypeAlias = (
    JobDefined
    | JobClaimed
    | ApplicationRequested
    | JobScheduled
    | JobRunning
    | JobCompleted
    | JobFailed
    | JobReleased
    | ApplicationDeleted
    | ApplicationCreated
    | ApplicationLost
    | JobDeleted
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRun:
    """One earlier run of the job: who ran it on which slots, when, and how it ended."""

    scheduling: str
    slot_ids: tuple[int, ...]
    requested_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    outcome: RunOutcome
    message: str


@dataclass(frozen=True, slots=True)
class JobState:
    """One job. ``started_at``/``completed_at``/``message`` describe the current run, or the
    last one until the next request; ``runs`` keeps every run that ended."""

    defined: JobDefined | None = None
    status: JobStatus = "ready"
    holder: str | None = None
    application: ApplicationRequested | None = None
    """The current run's application request (``None`` once released or lost)."""
    application_created: bool = False
    """Whether the current request's application was created."""
    deleting_application: bool = False
    started_at: datetime | None = None
    completed_at: datetime | None = None
    message: str = ""
    runs: tuple[JobRun, ...] = ()
    deleted: bool = False


def initial_state() -> JobState:
    """A job stream with no events."""
    return JobState()


def evolve(state: JobState, event: JobEvent) -> JobState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if isinstance(event, JobDefined):
        # A job defined again after its deletion keeps its history and any deletion still due.
        return replace(state, defined=event, deleted=False, status="ready", holder=None)
    if isinstance(event, JobClaimed):
        return replace(state, status="in_queue", holder=event.scheduling)
    if isinstance(event, ApplicationRequested):
        return replace(
            state,
            status="submitted",
            application=event,
            application_created=False,
            started_at=None,
            completed_at=None,
            message="",
        )
    if isinstance(event, ApplicationCreated):
        return replace(state, application_created=True)
    if isinstance(event, JobScheduled):
        return replace(state, status="scheduled")
    if isinstance(event, JobRunning):
        return replace(state, status="running", started_at=event.at)
    if isinstance(event, JobCompleted):
        return replace(state, status="completed", completed_at=event.at)
    if isinstance(event, JobFailed):
        return replace(state, status="failed", completed_at=event.at, message=event.message)
    if isinstance(event, JobReleased):
        return replace(
            state,
            status="ready",
            holder=None,
            application=None,
            application_created=False,
            deleting_application=state.deleting_application or event.delete_application,
            runs=_with_run(state, _OUTCOMES.get(state.status, "released")),
        )
    if isinstance(event, ApplicationLost):
        return replace(
            state,
            status="in_queue" if state.holder is not None else "ready",
            application=None,
            application_created=False,
            runs=_with_run(state, "lost"),
        )
    if isinstance(event, ApplicationDeleted):
        return replace(state, deleting_application=False)
    if isinstance(event, JobDeleted):
        return replace(state, deleted=True)
    raise TypeError(f"not a batch job event: {event!r}")


def _with_run(state: JobState, outcome: RunOutcome) -> tuple[JobRun, ...]:
    """The runs with the current one ended as ``outcome`` (unchanged without a request)."""
    requested = state.application
    if requested is None:
        return state.runs
    run = JobRun(
        requested.scheduling,
        requested.request.slot_ids,
        requested.at,
        state.started_at,
        state.completed_at,
        outcome,
        state.message,
    )
    return (*state.runs, run)


# -- queries -------------------------------------------------------------------------------------


def application_to_delete(state: JobState) -> str | None:
    """The application a released job still has to delete, by name, if any."""
    if state.defined is None or not state.deleting_application:
        return None
    return application_name(state.defined.name)


# -- decide --------------------------------------------------------------------------------------


def decide(state: JobState, command: JobCommand) -> list[JobEvent]:
    """Decide what ``command`` means for the job. Raises :class:`Rejected` /
    :class:`InvalidCommand` with a reason that says what to do instead."""
    at = _utc(command.at)
    if isinstance(command, DefineJob):
        return _decide_define(state, command, at)
    name = command.name if isinstance(command, DeleteJob) else command.job
    defined = state.defined
    if defined is None:
        raise Rejected(f"job {name} does not exist; define it first")
    if name != defined.name:
        raise InvalidCommand(f"command for job {name} sent to the stream of {defined.name}")
    if isinstance(command, DeleteJob):
        return _decide_delete(state, command, at)
    if isinstance(command, ObserveApplication):
        # Still decided for a deleted job: the deletion of its application must be recorded.
        return _decide_observe(state, command, at)
    if isinstance(command, ReleaseJob):
        if state.holder != command.scheduling:
            return []
        return [JobReleased(command.job, command.scheduling, state.application is not None, at)]
    if state.deleted:
        raise Rejected(f"job {name} is deleted; define it again to use it")
    if isinstance(command, ClaimJob):
        return _decide_claim(state, command, at)
    if isinstance(command, RequestCreation):
        return _decide_request(state, command, at)
    if isinstance(command, RecordApplicationCreated):
        if state.status not in _WITH_APPLICATION or state.application_created:
            return []
        return [ApplicationCreated(command.job, at)]
    if isinstance(command, RecordApplicationRefused):
        if state.status not in _WITH_APPLICATION or state.application_created:
            return []
        return [JobFailed(command.job, command.message, at)]
    raise InvalidCommand(f"a batch job does not handle {type(command).__name__}")


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC)


def _decide_define(state: JobState, command: DefineJob, at: datetime) -> list[JobEvent]:
    if command.kind not in ("spark", "flink"):
        raise InvalidCommand(f"kind must be 'spark' or 'flink', got {command.kind!r}")
    for what, value in (
        ("name", command.name),
        ("image", command.image),
        ("main_file", command.main_file),
    ):
        if not value:
            raise InvalidCommand(f"a job needs a {what}")
    event = JobDefined(
        command.name, command.kind, command.image, command.main_file, command.arguments, at
    )
    if state.defined is None:
        return [event]
    if state.defined.name != command.name:
        raise InvalidCommand(
            f"command for job {command.name} sent to the stream of {state.defined.name}"
        )
    if state.deleted:
        return [event]
    if replace(state.defined, at=at) == event:
        return []
    raise Rejected(f"job {command.name} already exists with another spec; use a new name")


def _decide_delete(state: JobState, command: DeleteJob, at: datetime) -> list[JobEvent]:
    if state.deleted:
        return []
    if state.holder is not None:
        raise Rejected(
            f"job {command.name} is held by scheduling {state.holder}; "
            "release that scheduling first"
        )
    return [JobDeleted(command.name, at)]


def _decide_claim(state: JobState, command: ClaimJob, at: datetime) -> list[JobEvent]:
    if state.holder == command.scheduling:
        return []
    if state.holder is not None:
        raise Rejected(
            f"job {command.job} is held by scheduling {state.holder}; "
            "wait until that scheduling releases it"
        )
    if state.deleting_application:
        raise Rejected(
            f"job {command.job} is still deleting its previous application; claim it once gone"
        )
    return [JobClaimed(command.job, command.scheduling, at)]


def _decide_request(state: JobState, command: RequestCreation, at: datetime) -> list[JobEvent]:
    if state.holder != command.scheduling:
        raise Rejected(
            f"job {command.job} is not held by scheduling {command.scheduling}; claim it first"
        )
    request = command.request
    slot_ids = request.slot_ids
    if not slot_ids or len(set(slot_ids)) != len(slot_ids) or min(slot_ids) < 0:
        raise InvalidCommand(f"slot ids must be distinct and non-negative, got {list(slot_ids)}")
    if request.cpu_millis < 1 or request.memory_mib < 1 or not request.nodes:
        raise InvalidCommand("the request needs the slot size and the slots' nodes")
    event = ApplicationRequested(command.job, command.scheduling, request, len(slot_ids), at)
    if state.status == "in_queue":
        return [event]
    if state.application is not None and state.application.request == request:
        return []
    raise Rejected(f"job {command.job} is {state.status}; only a queued job can be submitted")


def _decide_observe(state: JobState, command: ObserveApplication, at: datetime) -> list[JobEvent]:
    status, phase = state.status, command.phase
    if phase == "absent":
        if state.deleting_application:
            return [ApplicationDeleted(command.job, at)]
        if status in _WITH_APPLICATION and state.application_created and state.holder:
            return [ApplicationLost(command.job, state.holder, at)]
        return []
    if status not in _WITH_APPLICATION:
        # Without a request of this run, a live application is not this job's run: a finished
        # job's outcome stays, and a released job's old application is only waited on to go.
        return []
    events: list[JobEvent] = []
    if not state.application_created:
        # Present, so created: a crash between creating it and recording that is healed here.
        events.append(ApplicationCreated(command.job, at))
    if phase == "completed":
        events.append(JobCompleted(command.job, at))
    elif phase == "failed":
        events.append(JobFailed(command.job, command.message, at))
    elif phase == "running" and status != "running":
        events.append(JobRunning(command.job, at))
    elif phase == "scheduled" and status == "submitted":
        events.append(JobScheduled(command.job, at))
    return events
