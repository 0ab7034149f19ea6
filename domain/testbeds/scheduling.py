"""A scheduling: runs a set of batch jobs on one testbed, one stream per scheduling
(``scheduling-<name>``).

Phases (seed 05, "Scheduler Reconciler")::

    acquire --> submission <--> confirmation --> awaiting_completion --> completed --> finished
                    ^                                    |                   |
                    +------------ online extension ------+-------------------+

**Acquire.** The scheduling claims every job and the testbed. A claim is a decision on the
claimed aggregate (:class:`~fleetledger.domain.testbeds.ClaimJob`,
:class:`~fleetledger.domain.testbeds.ClaimTestbed`); the host appends all claims of one attempt
together with :class:`ClaimsGranted` here, each with its stream's expected version, so a claim
never half-succeeds behind our back. When a claim is refused (another scheduling holds the job or
testbed), :class:`RecordClaimConflict` records it and, in this phase, releases everything the
scheduling holds (:class:`HoldingsReleased`): it stays in ``acquire`` holding nothing, so two
schedulings that share a job never deadlock — the later one waits for the other to finish.

**Submission ⇄ confirmation.** With the free slots of the testbed, :class:`AssignSlots` picks the
jobs to start (:func:`queue_assignments` or :func:`slot_assignments`); the host then requests each
application (:class:`~fleetledger.domain.testbeds.RequestCreation`, appended with
:class:`JobsAssigned`). The scheduling waits in ``confirmation`` until every job of that round is
scheduled — slot reservation is not instantaneous, so the free slots are only known again then —
and returns to ``submission`` while the queue is not empty.

**Never stuck with every slot free.** A job that no state of the testbed can run — it needs more
slots than the testbed has that can hold a job, or names slots it does not have — is recorded
(:class:`SchedulingBlocked`, ``SchedulingState.blocked``) when :class:`AssignSlots` carries the
testbed's usable slots, and the record is lifted (:class:`SchedulingUnblocked`) once the testbed
can run it. The testbed may grow, so such a scheduling is not refused at creation; it waits,
saying why.

**Lost applications.** A started job whose application disappeared is back in the queue
(:class:`ObserveJobs` sees it ``in_queue`` again and records :class:`JobRequeued`): it keeps its
place in the queue as given and starts again on the slots free then.

**Completion.** With the queue empty it awaits its jobs; when all have finished (completed or
failed) it is ``completed``; once released (:class:`ReleaseScheduling`, which the host fans out as
:class:`~fleetledger.domain.testbeds.ReleaseJob` and
:class:`~fleetledger.domain.testbeds.ReleaseTestbed`) it is ``finished``. Release also cancels a
scheduling in any earlier phase.

**Online extension.** :class:`ExtendQueue` adds jobs to a scheduling that has not finished. The
new jobs are claimed like the first ones; a conflict on them after ``acquire`` is recorded but
releases nothing, since the scheduling's other jobs may be running.

Streams each command's events go to (the host appends them together):

===========================  ======================================================
on this stream               with, on other streams
===========================  ======================================================
:class:`ClaimsGranted`       ``JobClaimed`` per job, ``TestbedClaimed`` if the testbed
:class:`HoldingsReleased`    ``JobReleased`` per job, ``TestbedReleased`` if the testbed
:class:`JobsAssigned`        ``ApplicationRequested`` per assignment
:class:`SchedulingReleased`  ``JobReleased`` per job, ``TestbedReleased`` if the testbed
===========================  ======================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds.batch_job import JobStatus

__all__ = [
    "AssignSlots",
    "Assignment",
    "ClaimConflicted",
    "ClaimsGranted",
    "CreateScheduling",
    "ExtendQueue",
    "HoldingsReleased",
    "JobRequeued",
    "JobsAssigned",
    "Mode",
    "ObserveJobs",
    "Phase",
    "QueueExtended",
    "RecordClaimConflict",
    "RecordClaimsGranted",
    "ReleaseScheduling",
    "SchedulingCommand",
    "SchedulingCompleted",
    "SchedulingCreated",
    "SchedulingBlocked",
    "SchedulingEvent",
    "SchedulingReleased",
    "SchedulingState",
    "SchedulingUnblocked",
    "SlotItem",
    "SubmissionConfirmed",
    "decide",
    "evolve",
    "initial_state",
    "pending_claims",
    "queue_assignments",
    "slot_assignments",
    "stream_name",
]

Mode = Literal["queue", "slots_strict", "slots_relaxed"]
Phase = Literal[
    "new", "acquire", "submission", "confirmation", "awaiting_completion", "completed", "finished"
]

_SCHEDULED: frozenset[JobStatus] = frozenset({"scheduled", "running", "completed", "failed"})
_FINISHED: frozenset[JobStatus] = frozenset({"completed", "failed"})


def stream_name(scheduling: str) -> str:
    """The scheduling's stream."""
    return f"scheduling-{scheduling}"


@dataclass(frozen=True, slots=True)
class SlotItem:
    """Slot-based mode: run ``job`` on exactly these slots."""

    job: str
    slot_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A job started on these slots (ascending); their count is the job's replication."""

    job: str
    slot_ids: tuple[int, ...]


# -- the strategies ------------------------------------------------------------------------------


def queue_assignments(
    queue: Sequence[str], free_slots: Iterable[int], *, capacity: int | None = None
) -> tuple[Assignment, ...]:
    """Queue-based, as the original: a job named k times has replication k.

    The runnable jobs are the longest prefix of the queue's distinct jobs whose replications,
    summed in queue order, fit the free slots. They start one after another; each takes the free
    slots (ascending) at the indexes where it appears in the queue, and it and its slots then
    leave the queue and the free slots before the next job's indexes are read.

    A job whose last index lies past the free slots waits, and the jobs after it with it, while
    that many slots can still come free (``capacity``, the slots that can ever be free at once;
    ``None``: only those free now): the positions the queue asks for are honoured then. When no
    state of the testbed has that many, waiting would never end — the original stops there for
    good — so the occurrences past the end take the lowest free slots left, and the job starts.

    Over free slots 0–7, ``[j2, j1, j1, j2, j1, j2, j1, j2]`` starts j2 on 0, 3, 5, 7 and j1 on
    1, 2, 4, 6. ``[a, b, a, b]`` over three free slots starts a on the first and third; b follows
    on the slots free once a is done.
    """
    free = sorted(set(free_slots))
    ceiling = len(free) if capacity is None else max(capacity, len(free))
    pending = list(queue)
    counts = Counter(pending)
    runnable: list[str] = []
    needed = 0
    for job in dict.fromkeys(pending):
        needed += counts[job]
        if needed > len(free):
            break
        runnable.append(job)
    started: list[Assignment] = []
    for job in runnable:
        indexes = [i for i, j in enumerate(pending) if j == job]
        inside = [free[i] for i in indexes if i < len(free)]
        if len(inside) < len(indexes):
            if indexes[-1] < ceiling:
                break
            rest = [slot for slot in free if slot not in inside]
            inside += rest[: len(indexes) - len(inside)]
        taken = set(inside)
        started.append(Assignment(job, tuple(sorted(taken))))
        pending = [j for j in pending if j != job]
        free = [slot for slot in free if slot not in taken]
    return tuple(started)


def slot_assignments(
    items: Sequence[SlotItem], free_slots: Iterable[int], *, strict: bool
) -> tuple[Assignment, ...]:
    """Slot-based: each item starts when all its slots are free, counting slots given to earlier
    items of this round as taken; ``strict`` stops at the first item that cannot start, relaxed
    mode skips it."""
    available = set(free_slots)
    started: list[Assignment] = []
    for item in items:
        wanted = set(item.slot_ids)
        if wanted <= available:
            available -= wanted
            started.append(Assignment(item.job, tuple(sorted(wanted))))
        elif strict:
            break
    return tuple(started)


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateScheduling:
    """Schedule jobs on a testbed: ``queue`` in queue mode, ``items`` in the slot modes."""

    name: str
    testbed: str
    mode: Mode
    queue: tuple[str, ...] = ()
    items: tuple[SlotItem, ...] = ()
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordClaimsGranted:
    """The host claimed these jobs (and the testbed, if ``testbed``) in the same append."""

    jobs: tuple[str, ...]
    testbed: bool
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordClaimConflict:
    """A claim was refused: ``resource`` (a job name, or the testbed's) is held elsewhere."""

    resource: str
    reason: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class AssignSlots:
    """Start what can start on the testbed's free slots now.

    ``usable_slots``: every slot of the testbed that can hold a job, free or not (``None``: not
    known). With it, a queue that asks for positions past the free slots waits only while those
    positions can come free, and a job no state of the testbed can run is recorded as blocked.
    """

    free_slots: tuple[int, ...]
    _: KW_ONLY
    at: datetime
    usable_slots: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ObserveJobs:
    """The statuses of the scheduling's jobs, as their streams show them."""

    statuses: Mapping[str, JobStatus]
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ExtendQueue:
    """Online extension: append jobs to the queue (queue mode) or items (slot modes)."""

    queue: tuple[str, ...] = ()
    items: tuple[SlotItem, ...] = ()
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReleaseScheduling:
    """Let go of every job and the testbed; the scheduling is finished."""

    _: KW_ONLY
    at: datetime


SchedulingCommand: TypeAlias = (
    CreateScheduling
    | RecordClaimsGranted
    | RecordClaimConflict
    | AssignSlots
    | ObserveJobs
    | ExtendQueue
    | ReleaseScheduling
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedulingCreated:
    """The scheduling exists and starts acquiring."""

    name: str
    testbed: str
    mode: Mode
    queue: tuple[str, ...]
    items: tuple[SlotItem, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class ClaimsGranted:
    """These jobs (and the testbed, if ``testbed``) are now held by the scheduling."""

    jobs: tuple[str, ...]
    testbed: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class ClaimConflicted:
    """A claim was refused; the scheduling waits and tries again."""

    resource: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class HoldingsReleased:
    """After a conflict in ``acquire``, everything held is given back."""

    jobs: tuple[str, ...]
    testbed: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class JobsAssigned:
    """These jobs start on these slots; the scheduling awaits their confirmation."""

    assignments: tuple[Assignment, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class SubmissionConfirmed:
    """Every job of the last round is scheduled."""

    jobs: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class SchedulingCompleted:
    """Every job has finished."""

    completed: tuple[str, ...]
    failed: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class QueueExtended:
    """Jobs were added while the scheduling ran."""

    queue: tuple[str, ...]
    items: tuple[SlotItem, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class SchedulingReleased:
    """The scheduling let go of these jobs and (if ``testbed``) the testbed: it is finished."""

    jobs: tuple[str, ...]
    testbed: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class JobRequeued:
    """A started job lost its application: it is back in the queue, at its place."""

    job: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class SchedulingBlocked:
    """``job`` can never start on the testbed as it is: why, and what would unblock it."""

    job: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class SchedulingUnblocked:
    """The job recorded as blocked can start on the testbed as it is now (or left the queue)."""

    job: str
    at: datetime


SchedulingEvent: TypeAlias = (
    SchedulingCreated
    | ClaimsGranted
    | ClaimConflicted
    | HoldingsReleased
    | JobsAssigned
    | SubmissionConfirmed
    | SchedulingCompleted
    | QueueExtended
    | SchedulingReleased
    | JobRequeued
    | SchedulingBlocked
    | SchedulingUnblocked
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SchedulingState:
    """One scheduling. ``queue``/``items`` hold what is still to start; ``assignments`` the jobs
    started and not lost since."""

    created: SchedulingCreated | None = None
    phase: Phase = "new"
    jobs: tuple[str, ...] = ()
    """Every job of the scheduling, in order of first appearance."""
    queue: tuple[str, ...] = ()
    items: tuple[SlotItem, ...] = ()
    held_jobs: frozenset[str] = frozenset()
    holds_testbed: bool = False
    assignments: tuple[Assignment, ...] = ()
    round: tuple[str, ...] = ()
    """The jobs started in the last round, awaiting confirmation."""
    last_conflict: ClaimConflicted | None = None
    planned_queue: tuple[str, ...] = ()
    planned_items: tuple[SlotItem, ...] = ()
    """The queue and items as created and extended: where a requeued job returns to."""
    blocked: SchedulingBlocked | None = None
    """The job the testbed cannot run as it is, if any, and why."""


def initial_state() -> SchedulingState:
    """A scheduling stream with no events."""
    return SchedulingState()


def _jobs_of(queue: Iterable[str], items: Iterable[SlotItem]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*queue, *(i.job for i in items)]))


def _after_confirmation(state: SchedulingState) -> Phase:
    return "submission" if state.queue or state.items else "awaiting_completion"


def _still_to_start(state: SchedulingState) -> SchedulingState:
    started = {a.job for a in state.assignments}
    return replace(
        state,
        queue=tuple(j for j in state.planned_queue if j not in started),
        items=tuple(i for i in state.planned_items if i.job not in started),
    )


def evolve(state: SchedulingState, event: SchedulingEvent) -> SchedulingState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if isinstance(event, SchedulingCreated):
        return SchedulingState(
            created=event,
            phase="acquire",
            jobs=_jobs_of(event.queue, event.items),
            queue=event.queue,
            items=event.items,
            planned_queue=event.queue,
            planned_items=event.items,
        )
    if isinstance(event, ClaimsGranted):
        state = replace(
            state,
            held_jobs=state.held_jobs | set(event.jobs),
            holds_testbed=state.holds_testbed or event.testbed,
        )
        if state.phase == "acquire" and not any(pending_claims(state)):
            return replace(state, phase="submission")
        return state
    if isinstance(event, ClaimConflicted):
        return replace(state, last_conflict=event)
    if isinstance(event, HoldingsReleased):
        return replace(
            state,
            held_jobs=state.held_jobs - set(event.jobs),
            holds_testbed=state.holds_testbed and not event.testbed,
        )
    if isinstance(event, JobsAssigned):
        return _still_to_start(
            replace(
                state,
                phase="confirmation",
                assignments=(*state.assignments, *event.assignments),
                round=tuple(a.job for a in event.assignments),
            )
        )
    if isinstance(event, SubmissionConfirmed):
        return replace(state, phase=_after_confirmation(state), round=())
    if isinstance(event, SchedulingCompleted):
        return replace(state, phase="completed")
    if isinstance(event, QueueExtended):
        phase = state.phase
        if phase in ("awaiting_completion", "completed"):
            phase = "submission"
        return replace(
            state,
            phase=phase,
            jobs=(*state.jobs, *_jobs_of(event.queue, event.items)),
            queue=(*state.queue, *event.queue),
            items=(*state.items, *event.items),
            planned_queue=(*state.planned_queue, *event.queue),
            planned_items=(*state.planned_items, *event.items),
        )
    if isinstance(event, SchedulingReleased):
        return replace(state, phase="finished", held_jobs=frozenset(), holds_testbed=False)
    if isinstance(event, JobRequeued):
        round_left = tuple(j for j in state.round if j != event.job)
        phase = state.phase
        if phase in ("awaiting_completion", "completed") or (
            phase == "confirmation" and not round_left
        ):
            phase = "submission"
        return _still_to_start(
            replace(
                state,
                phase=phase,
                round=round_left,
                assignments=tuple(a for a in state.assignments if a.job != event.job),
            )
        )
    if isinstance(event, SchedulingBlocked):
        return replace(state, blocked=event)
    if isinstance(event, SchedulingUnblocked):
        return replace(state, blocked=None)
    raise TypeError(f"not a scheduling event: {event!r}")


# -- queries -------------------------------------------------------------------------------------


def pending_claims(state: SchedulingState) -> tuple[tuple[str, ...], bool]:
    """The jobs and whether the testbed still to claim: what the host claims next, all in one
    append with :class:`RecordClaimsGranted`."""
    if state.created is None or state.phase == "finished":
        return (), False
    jobs = tuple(j for j in state.jobs if j not in state.held_jobs)
    return jobs, not state.holds_testbed


# -- decide --------------------------------------------------------------------------------------


def decide(state: SchedulingState, command: SchedulingCommand) -> list[SchedulingEvent]:
    """Decide what ``command`` means for the scheduling. Raises :class:`Rejected` /
    :class:`InvalidCommand` with a reason that says what to do instead."""
    at = _utc(command.at)
    if isinstance(command, CreateScheduling):
        return _decide_create(state, command, at)
    created = state.created
    if created is None:
        raise Rejected("the scheduling does not exist; create it first")
    if state.phase == "finished":
        if isinstance(command, ReleaseScheduling):
            return []
        raise Rejected(f"scheduling {created.name} is finished; create a new one")
    if isinstance(command, RecordClaimsGranted):
        return _decide_granted(state, command, at)
    if isinstance(command, RecordClaimConflict):
        return _decide_conflict(state, command, at)
    if isinstance(command, AssignSlots):
        return _decide_assign(state, created, command, at)
    if isinstance(command, ObserveJobs):
        return _decide_observe(state, command, at)
    if isinstance(command, ExtendQueue):
        _check_jobs(created.mode, command.queue, command.items, known=state.jobs)
        if not command.queue and not command.items:
            return []
        return [QueueExtended(command.queue, command.items, at)]
    if isinstance(command, ReleaseScheduling):
        return [SchedulingReleased(tuple(sorted(state.held_jobs)), state.holds_testbed, at)]
    raise InvalidCommand(f"a scheduling does not handle {type(command).__name__}")


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC)


def _check_jobs(
    mode: Mode, queue: Sequence[str], items: Sequence[SlotItem], *, known: Sequence[str]
) -> None:
    if mode == "queue" and items:
        raise InvalidCommand("a queue-based scheduling takes a queue of job names, not slot items")
    if mode != "queue" and queue:
        raise InvalidCommand("a slot-based scheduling takes slot items, not a queue")
    names = [*dict.fromkeys(queue), *(i.job for i in items)]
    if any(not name for name in names):
        raise InvalidCommand("job names must not be empty")
    again = sorted({n for n in names if n in known or names.count(n) > 1})
    if again:
        raise InvalidCommand(
            f"job(s) {', '.join(again)} already in the scheduling; a job runs once per scheduling"
            " (in queue mode, repeat its name within one queue to raise its replication)"
        )
    for item in items:
        ids = item.slot_ids
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
            raise InvalidCommand(
                f"job {item.job} needs distinct, non-negative slot ids, got {list(ids)}"
            )


def _decide_create(
    state: SchedulingState, command: CreateScheduling, at: datetime
) -> list[SchedulingEvent]:
    if not command.name or not command.testbed:
        raise InvalidCommand("a scheduling needs a name and a testbed")
    if command.mode not in ("queue", "slots_strict", "slots_relaxed"):
        raise InvalidCommand(
            f"mode must be 'queue', 'slots_strict' or 'slots_relaxed', got {command.mode!r}"
        )
    _check_jobs(command.mode, command.queue, command.items, known=())
    event = SchedulingCreated(
        command.name, command.testbed, command.mode, command.queue, command.items, at
    )
    if state.created is None:
        return [event]
    if replace(state.created, at=at) == event:
        return []
    raise Rejected(f"scheduling {command.name} already exists with other jobs; use a new name")


def _decide_granted(
    state: SchedulingState, command: RecordClaimsGranted, at: datetime
) -> list[SchedulingEvent]:
    wanted, testbed = pending_claims(state)
    strangers = sorted(set(command.jobs) - set(state.jobs))
    if strangers:
        raise InvalidCommand(f"job(s) {', '.join(strangers)} are not in this scheduling")
    jobs = tuple(j for j in command.jobs if j in wanted)
    testbed_granted = command.testbed and testbed
    if not jobs and not testbed_granted:
        return []
    return [ClaimsGranted(jobs, testbed_granted, at)]


def _decide_conflict(
    state: SchedulingState, command: RecordClaimConflict, at: datetime
) -> list[SchedulingEvent]:
    events: list[SchedulingEvent] = [ClaimConflicted(command.resource, command.reason, at)]
    # Only in acquire: what a later phase holds may be running, and releasing it would kill it.
    if state.phase == "acquire" and (state.held_jobs or state.holds_testbed):
        events.append(HoldingsReleased(tuple(sorted(state.held_jobs)), state.holds_testbed, at))
    return events


def _decide_assign(
    state: SchedulingState, created: SchedulingCreated, command: AssignSlots, at: datetime
) -> list[SchedulingEvent]:
    if state.phase != "submission":
        raise Rejected(f"scheduling {created.name} is in {state.phase}; it assigns in submission")
    if len(set(command.free_slots)) != len(command.free_slots):
        raise InvalidCommand(f"free slots must be distinct, got {list(command.free_slots)}")
    usable = command.usable_slots
    held = state.held_jobs
    assignments: tuple[Assignment, ...]
    if created.mode == "queue":
        # A job not claimed yet (online extension) ends the runnable prefix where it first appears.
        cut = next((i for i, j in enumerate(state.queue) if j not in held), len(state.queue))
        assignments = queue_assignments(
            state.queue[:cut],
            command.free_slots,
            capacity=None if usable is None else len(set(usable)),
        )
    else:
        strict = created.mode == "slots_strict"
        items = state.items
        if strict:
            items = items[: next((i for i, it in enumerate(items) if it.job not in held), None)]
        else:
            items = tuple(it for it in items if it.job in held)
        assignments = slot_assignments(items, command.free_slots, strict=strict)
    events: list[SchedulingEvent] = []
    if assignments:
        events.append(JobsAssigned(assignments, at))
    if usable is not None:
        events.extend(_blockage(state, created, set(usable), at))
    return events


def _blockage(
    state: SchedulingState, created: SchedulingCreated, usable: set[int], at: datetime
) -> list[SchedulingEvent]:
    """Record the first job still to start that no state of the testbed can run, or lift the
    record once there is none."""
    found: tuple[str, str] | None = None
    if created.mode == "queue":
        counts = Counter(state.queue)
        for job in dict.fromkeys(state.queue):
            if counts[job] > len(usable):
                found = (
                    job,
                    f"job {job} needs {counts[job]} slots but testbed {created.testbed} has "
                    f"{len(usable)} that can hold a job; grow the testbed (label more nodes, "
                    "raise slots_per_node) or release this scheduling",
                )
                break
    else:
        for item in state.items:
            missing = sorted(set(item.slot_ids) - usable)
            if missing:
                found = (
                    item.job,
                    f"job {item.job} names slots {', '.join(map(str, missing))} that testbed "
                    f"{created.testbed} does not have (or cannot use); grow the testbed or "
                    "release this scheduling",
                )
                break
    current = state.blocked
    if found is None:
        return [] if current is None else [SchedulingUnblocked(current.job, at)]
    if current is not None and (current.job, current.reason) == found:
        return []
    return [SchedulingBlocked(found[0], found[1], at)]


def _decide_observe(
    state: SchedulingState, command: ObserveJobs, at: datetime
) -> list[SchedulingEvent]:
    events: list[SchedulingEvent] = []
    statuses = command.statuses
    # A started job is in_queue again only when its application disappeared (its request and
    # the assignment are appended together, so a started job is never seen in_queue before).
    for assignment in state.assignments:
        if statuses.get(assignment.job) == "in_queue":
            requeued = JobRequeued(
                assignment.job, "its application disappeared; it starts again", at
            )
            events.append(requeued)
    for event in events:
        state = evolve(state, event)
    if state.phase == "confirmation" and all(statuses.get(j) in _SCHEDULED for j in state.round):
        confirmed = SubmissionConfirmed(state.round, at)
        events.append(confirmed)
        state = evolve(state, confirmed)
    if state.phase == "awaiting_completion" and all(
        statuses.get(j) in _FINISHED for j in state.jobs
    ):
        events.append(
            SchedulingCompleted(
                tuple(j for j in state.jobs if statuses[j] == "completed"),
                tuple(j for j in state.jobs if statuses[j] == "failed"),
                at,
            )
        )
    return events
