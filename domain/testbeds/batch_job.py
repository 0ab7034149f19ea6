"""A batch job wrapping a Spark or Flink application, one stream per job (``batch-job-<name>``).

Lifecycle (seed 05, "Batch Job Operator")::

    ready --claim--> in_queue --request--> submitted --> scheduled --> running --> completed
      ^                 |                        |             |            |
      +---- release ----+------------------------+-------------+------------+     (or failed)

* A scheduling claims a ready job (:class:`JobClaimed`); only one scheduling holds a job, which the
  log enforces: the claim is appended with the stream's expected version.
* The holder requests the application's creation with its slots (:class:`ApplicationRequested`);
  :func:`application_manifest` builds the Spark or Flink resource from it.
* Observations of the application move the job on. ``scheduled`` (every pod has a node) and
  ``running`` may be skipped, and an application observed completed goes straight to
  ``completed`` from any earlier state: the controller may have been down while it ran.
* Released by its scheduling at any point, an unfinished job goes back to ``ready``; an
  application it created must be deleted first (:func:`application_to_delete`), and the job
  cannot be claimed again until that deletion is observed.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds.testbed import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION

__all__ = [
    "AppKind",
    "ApplicationDeleted",
    "ApplicationPhase",
    "ApplicationRequest",
    "ApplicationRequested",
    "ClaimJob",
    "DefineJob",
    "JobClaimed",
    "JobCommand",
    "JobCompleted",
    "JobDefined",
    "JobEvent",
    "JobFailed",
    "JobReleased",
    "JobRunning",
    "JobScheduled",
    "JobState",
    "JobStatus",
    "ObserveApplication",
    "ReleaseJob",
    "RequestCreation",
    "application_manifest",
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

_TERMINAL: frozenset[JobStatus] = frozenset({"completed", "failed"})
_WITH_APPLICATION: frozenset[JobStatus] = frozenset({"submitted", "scheduled", "running"})


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


JobCommand: TypeAlias = DefineJob | ClaimJob | RequestCreation | ObserveApplication | ReleaseJob


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
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobState:
    """One job."""

    defined: JobDefined | None = None
    status: JobStatus = "ready"
    holder: str | None = None
    application: ApplicationRequested | None = None
    """The current (or last, for a finished job) application request."""
    deleting_application: bool = False
    started_at: datetime | None = None
    completed_at: datetime | None = None
    message: str = ""


def initial_state() -> JobState:
    """A job stream with no events."""
    return JobState()


def evolve(state: JobState, event: JobEvent) -> JobState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if isinstance(event, JobDefined):
        return JobState(defined=event)
    if isinstance(event, JobClaimed):
        return replace(state, status="in_queue", holder=event.scheduling)
    if isinstance(event, ApplicationRequested):
        return replace(state, status="submitted", application=event)
    if isinstance(event, JobScheduled):
        return replace(state, status="scheduled")
    if isinstance(event, JobRunning):
        return replace(state, status="running", started_at=event.at)
    if isinstance(event, JobCompleted):
        return replace(state, status="completed", completed_at=event.at)
    if isinstance(event, JobFailed):
        return replace(state, status="failed", completed_at=event.at, message=event.message)
    if isinstance(event, JobReleased):
        if state.status in _TERMINAL:
            return replace(state, holder=None)
        return replace(
            state,
            status="ready",
            holder=None,
            application=None,
            deleting_application=event.delete_application,
        )
    if isinstance(event, ApplicationDeleted):
        return replace(state, deleting_application=False)
    raise TypeError(f"not a batch job event: {event!r}")


# -- queries -------------------------------------------------------------------------------------


def application_to_delete(state: JobState) -> str | None:
    """The application a released job still has to delete, by name, if any."""
    if state.defined is None or not state.deleting_application:
        return None
    return application_name(state.defined.name)


def application_manifest(state: JobState, *, namespace: str) -> dict[str, object] | None:
    """The Spark or Flink resource to create for a submitted job (``None`` before a request).

    The executor (Spark) or task manager (Flink) pods get the slot size as resource requests,
    one replica per slot, the priority class (without one the kube-scheduler never preempts a
    ghost pod), the scheduler name (without it the default scheduler ignores the extender), the
    slot ids and testbed as annotations for the extender, and a node affinity to the slots' nodes.
    """
    defined, requested = state.defined, state.application
    if defined is None or requested is None:
        return None
    request = requested.request
    pod = {
        "schedulerName": request.scheduler_name,
        "priorityClassName": request.priority_class,
        "annotations": {
            TESTBED_ANNOTATION: request.testbed,
            SLOT_IDS_ANNOTATION: ",".join(str(s) for s in request.slot_ids),
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": list(request.nodes),
                                }
                            ]
                        }
                    ]
                }
            }
        },
    }
    metadata = {"name": application_name(defined.name), "namespace": namespace}
    cpu, memory = f"{request.cpu_millis}m", f"{request.memory_mib}Mi"
    if defined.kind == "spark":
        return {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": metadata,
            "spec": {
                "type": "Scala",
                "mode": "cluster",
                "image": defined.image,
                "mainApplicationFile": defined.main_file,
                "arguments": list(defined.arguments),
                "executor": {
                    **pod,
                    "instances": requested.replication,
                    "coreRequest": cpu,
                    "memory": memory,
                },
            },
        }
    return {
        "apiVersion": "flinkoperator.k8s.io/v1beta1",
        "kind": "FlinkCluster",
        "metadata": metadata,
        "spec": {
            "image": {"name": defined.image},
            "job": {"jarFile": defined.main_file, "args": list(defined.arguments)},
            "taskManager": {
                **pod,
                "replicas": requested.replication,
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            },
        },
    }


# -- decide --------------------------------------------------------------------------------------


def decide(state: JobState, command: JobCommand) -> list[JobEvent]:
    """Decide what ``command`` means for the job. Raises :class:`Rejected` /
    :class:`InvalidCommand` with a reason that says what to do instead."""
    at = _utc(command.at)
    if isinstance(command, DefineJob):
        return _decide_define(state, command, at)
    defined = state.defined
    if defined is None:
        raise Rejected(f"job {command.job} does not exist; define it first")
    if command.job != defined.name:
        raise InvalidCommand(f"command for job {command.job} sent to the stream of {defined.name}")
    if isinstance(command, ClaimJob):
        return _decide_claim(state, command, at)
    if isinstance(command, RequestCreation):
        return _decide_request(state, command, at)
    if isinstance(command, ObserveApplication):
        return _decide_observe(state, command, at)
    if isinstance(command, ReleaseJob):
        if state.holder != command.scheduling:
            return []
        return [JobReleased(command.job, command.scheduling, state.status in _WITH_APPLICATION, at)]
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
    if replace(state.defined, at=at) == event:
        return []
    raise Rejected(f"job {command.name} already exists with another spec; use a new name")


def _decide_claim(state: JobState, command: ClaimJob, at: datetime) -> list[JobEvent]:
    if state.holder == command.scheduling:
        return []
    if state.holder is not None:
        raise Rejected(
            f"job {command.job} is held by scheduling {state.holder}; "
            "wait until that scheduling releases it"
        )
    if state.status in _TERMINAL:
        raise Rejected(
            f"job {command.job} already {state.status}; define a new job to run it again"
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
    if status in _TERMINAL:
        return []
    if phase == "completed":
        return [JobCompleted(command.job, at)]
    if phase == "absent":
        return [ApplicationDeleted(command.job, at)] if state.deleting_application else []
    if status not in _WITH_APPLICATION:
        # Without a request of ours, a live application is not this job's run yet.
        return []
    if phase == "failed":
        return [JobFailed(command.job, command.message, at)]
    if phase == "running" and status != "running":
        return [JobRunning(command.job, at)]
    if phase == "scheduled" and status == "submitted":
        return [JobScheduled(command.job, at)]
    return []
