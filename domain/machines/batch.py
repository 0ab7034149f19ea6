"""The life of one sealed batch, one stream per batch: opened, dispatched, one outcome per machine.

Lifecycle::

    (new) --OpenBatch--> sealed --RecordDispatch--> dispatched --...--> completed
                                                      |    ^
          results / a read that finds the machine ----+    |  a read that does not find it puts
          a whole-call failure (fails all unresolved)      |  the machine back to "to dispatch"
                                                           +-- (up to ``max_attempts`` dispatches)

Every request ends with exactly one terminal event, :class:`MachineCreated` or
:class:`MachineFailed`; the decision that records the last of them also emits
:class:`BatchCompleted`. A second, different outcome for a request is refused; the same one again
changes nothing.

Crash safety rests on one rule for the runtime: **append** :class:`BatchDispatched` **before**
making the cloud call. Then, on restart,

* a batch with machines to dispatch and no dispatch recorded for them never reached the cloud:
  dispatch them (:func:`needs_dispatch`, :func:`machines_to_dispatch`);
* a machine that was dispatched but has no outcome is *in doubt*: the call may or may not have
  happened, so read it (:func:`unresolved_machines`) and record what the read saw with
  :class:`RecordMachineRead`. It is never re-created blindly — create-only semantics.

A read that does not find the machine means the create did not take effect (the cloud call never
left, or was refused before creating anything): the machine goes back to "to dispatch" and the
next :class:`RecordDispatch` creates it again. After ``max_attempts`` dispatches a machine that is
still not found fails with code ``not_created`` (retryable), so a batch always terminates.

The original fanned one error out to all callers and treated machines missing from a partial error
map as created (docs/ARCHITECTURE.md, "VM creation batching"). Here a whole-call failure fails
each unresolved request with that error explicitly, and a machine missing from a per-machine
result map stays unresolved until read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal, Protocol, TypeAlias, get_args

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.machines.grouper import BatchMachine, BatchSealed, SealReason
from fleetledger.domain.template import MachineTemplate

__all__ = [
    "BatchCommand",
    "BatchCompleted",
    "BatchDispatched",
    "BatchEvent",
    "BatchOpened",
    "BatchState",
    "BatchStatus",
    "DEFAULT_MAX_ATTEMPTS",
    "ERROR_CODES",
    "ErrorCode",
    "MachineCreated",
    "MachineError",
    "MachineFailed",
    "MachineCreateAccepted",
    "MachineNotFound",
    "OpenBatch",
    "ReadResult",
    "RecordCallFailure",
    "RecordCreateAccepted",
    "RecordDispatch",
    "RecordMachineRead",
    "RecordMachineResults",
    "REQUEST_TAG",
    "batch_put_machine_header",
    "decide",
    "MachineVariation",
    "encode_batch_put_machine_header",
    "evolve",
    "initial_state",
    "is_complete",
    "machines_to_dispatch",
    "needs_dispatch",
    "resume_token",
    "status",
    "unresolved_machines",
]

ErrorCode = Literal[
    "quota_exceeded",
    "capacity_unavailable",
    "sku_unavailable",
    "throttled",
    "unknown",
    "not_created",
    "not_allowed",
    "name_in_use",
]
ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)
BatchStatus = Literal["new", "sealed", "dispatched", "completed"]
ReadResult = Literal["created", "failed", "not_found"]
DEFAULT_MAX_ATTEMPTS = 3

#: The per-machine tag naming the request a machine was made for. Per-machine tags travel in the
#: header, so the header is where it goes; Azure refuses tag names containing ``/``.
REQUEST_TAG = "fleetledger-request"


# -- the BatchPutMachine header ------------------------------------------------------------------


class MachineVariation(Protocol):
    """What the header needs of a machine: its per-machine variations (seed 01)."""

    @property
    def machine_name(self) -> str: ...
    @property
    def zones(self) -> tuple[str, ...]: ...
    @property
    def tags(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def request_id(self) -> str | None: ...


def batch_put_machine_header(machines: Sequence[MachineVariation]) -> dict[str, object]:
    """The ``BatchPutMachine`` header (seed 01) for ``machines``, in their order.

    Every machine is listed; absent zones are ``[]`` and absent tags ``{}``, never omitted, so the
    cloud never has to guess what a missing key means. A machine that knows its request carries
    it as :data:`REQUEST_TAG` (over a caller's tag of that name: ownership is ours to state).
    """
    return {
        "vmSkus": {"value": []},
        "batchMachines": [
            {"machineName": m.machine_name, "zones": list(m.zones), "tags": _tags_of(m)}
            for m in machines
        ],
    }


def _tags_of(machine: MachineVariation) -> dict[str, str]:
    tags = dict(machine.tags)
    if machine.request_id is not None:
        tags[REQUEST_TAG] = machine.request_id
    return tags


def encode_batch_put_machine_header(machines: Sequence[MachineVariation]) -> str:
    """The header as the one compact JSON text to send and to record in :class:`RecordDispatch`."""
    return json.dumps(batch_put_machine_header(machines), separators=(",", ":"), ensure_ascii=False)


# -- value objects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MachineError:
    """A classified failure to create a machine, as the cloud adapter reports it."""

    code: ErrorCode
    message: str
    retryable: bool = False
    retry_after_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.code not in ERROR_CODES:
            raise InvalidCommand(
                f"error code must be one of {', '.join(ERROR_CODES)}, got {self.code!r}; "
                "classify unrecognised cloud errors as 'unknown'"
            )
        if self.retry_after_seconds is not None and not self.retry_after_seconds >= 0:
            raise InvalidCommand(
                f"retry_after_seconds must be zero or more, got {self.retry_after_seconds!r}"
            )


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenBatch:
    """Start the batch's stream from the grouper's
    :class:`~fleetledger.domain.machines.BatchSealed`."""

    sealed: BatchSealed
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordDispatch:
    """The runtime is about to make the cloud call(s) for every machine still to dispatch.

    ``calls`` describes each call (e.g. ``"PUT …/agentPools/np1/machines (BatchPutMachine)"``);
    ``header`` is the exact ``BatchPutMachine`` header value sent, or ``None`` when the machines
    are created by per-machine PUTs. Append the resulting event *before* calling the cloud.
    """

    batch_id: str
    attempt: int
    calls: tuple[str, ...]
    header: str | None = None
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordCallFailure:
    """The whole call of ``attempt`` failed definitively: every unresolved request fails with it.

    Only for errors that prove nothing was created (a classified refusal). A timeout or a lost
    connection is not one: read the machines instead.
    """

    batch_id: str
    attempt: int
    error: MachineError
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordMachineResults:
    """Per-machine results by machine name: ``created`` to provider id, ``failed`` to the error.

    Machines absent from both maps are *not* assumed created; they stay unresolved until read.
    ``deleted`` names failed machines the cloud adapter deleted because they remained as failed
    resources (so nothing billed stays behind); their failures record the deletion.
    """

    batch_id: str
    created: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, MachineError] = field(default_factory=dict)
    _: KW_ONLY
    at: datetime
    deleted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordMachineRead:
    """What reading one machine from the cloud showed.

    ``created`` needs ``provider_id``; ``failed`` needs ``error``; ``not_found`` needs neither.
    A ``not_found`` read after a create call that ended without a classified answer (an
    unexpected exception) carries that exception as ``call_error`` (``"Type: message"``): if the
    batch gives up on the machine, its failure says what the first such call raised.
    ``deleted`` (``failed`` reads only): the read found a failed leftover and the cloud adapter
    deleted it, as :class:`RecordMachineResults` ``deleted`` does for a batch's results.
    """

    batch_id: str
    machine_name: str
    result: ReadResult
    provider_id: str | None = None
    error: MachineError | None = None
    _: KW_ONLY
    at: datetime
    call_error: str | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class RecordCreateAccepted:
    """The cloud accepted the create of a dispatched machine and gave a token to resume waiting
    for it (an Azure long-running operation's continuation token).

    Recorded as soon as it is known, so a controller that restarts mid-create resumes polling
    that operation instead of guessing from a plain read.
    """

    batch_id: str
    machine_name: str
    resume_token: str
    _: KW_ONLY
    at: datetime


BatchCommand: TypeAlias = (
    OpenBatch
    | RecordDispatch
    | RecordCallFailure
    | RecordMachineResults
    | RecordMachineRead
    | RecordCreateAccepted
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchOpened:
    """The batch stream's first event: a copy of the seal, so the stream stands on its own."""

    batch_id: str
    template_hash: str
    template: MachineTemplate
    machines: tuple[BatchMachine, ...]
    seal_reason: SealReason
    sealed_at: datetime
    max_attempts: int
    at: datetime


@dataclass(frozen=True, slots=True)
class BatchDispatched:
    """Cloud call(s) for ``request_ids`` are being made (recorded before they are)."""

    batch_id: str
    attempt: int
    request_ids: tuple[str, ...]
    calls: tuple[str, ...]
    header: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class MachineCreated:
    """Terminal: the machine exists."""

    batch_id: str
    request_id: str
    machine_name: str
    provider_id: str
    at: datetime


@dataclass(frozen=True, slots=True)
class MachineFailed:
    """Terminal: the machine was not created and will not be by this batch.

    ``deleted``: what the failed create left in the cloud (a failed resource) was deleted.
    """

    batch_id: str
    request_id: str
    machine_name: str
    code: ErrorCode
    message: str
    retryable: bool
    retry_after_seconds: float | None
    at: datetime
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class MachineNotFound:
    """A read found no trace of a dispatched machine: it must be dispatched again.

    ``call_error`` is what the create call raised when it ended without a classified answer.
    """

    batch_id: str
    request_id: str
    machine_name: str
    at: datetime
    call_error: str | None = None


@dataclass(frozen=True, slots=True)
class MachineCreateAccepted:
    """The cloud accepted a machine's create; ``resume_token`` resumes waiting for it."""

    batch_id: str
    request_id: str
    machine_name: str
    resume_token: str
    at: datetime


@dataclass(frozen=True, slots=True)
class BatchCompleted:
    """Every request of the batch has its one outcome."""

    batch_id: str
    created_request_ids: tuple[str, ...]
    failed_request_ids: tuple[str, ...]
    at: datetime


BatchEvent: TypeAlias = (
    BatchOpened
    | BatchDispatched
    | MachineCreated
    | MachineFailed
    | MachineNotFound
    | MachineCreateAccepted
    | BatchCompleted
)
_Outcome: TypeAlias = MachineCreated | MachineFailed


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchState:
    """One batch. ``to_dispatch`` holds request ids that need a create call; a request that is in
    neither ``to_dispatch`` nor ``outcomes`` has been dispatched and is in doubt."""

    opened: BatchOpened | None = None
    dispatches: tuple[BatchDispatched, ...] = ()
    to_dispatch: frozenset[str] = frozenset()
    outcomes: Mapping[str, _Outcome] = field(default_factory=dict)
    completed: BatchCompleted | None = None
    resume_tokens: Mapping[str, str] = field(default_factory=dict)
    """Request id to the token of its accepted, still unresolved create."""
    first_call_error: str | None = None
    """The first create call's unexpected exception (``"Type: message"``), kept for the log."""


def initial_state() -> BatchState:
    """A batch stream with no events."""
    return BatchState()


def evolve(state: BatchState, event: BatchEvent) -> BatchState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if isinstance(event, BatchOpened):
        return BatchState(opened=event, to_dispatch=frozenset(m.request_id for m in event.machines))
    if isinstance(event, BatchDispatched):
        return replace(
            state,
            dispatches=(*state.dispatches, event),
            to_dispatch=state.to_dispatch - set(event.request_ids),
        )
    if isinstance(event, MachineCreated | MachineFailed):
        return replace(
            state,
            to_dispatch=state.to_dispatch - {event.request_id},
            outcomes={**state.outcomes, event.request_id: event},
            resume_tokens=_without(state.resume_tokens, event.request_id),
        )
    if isinstance(event, MachineNotFound):
        return replace(
            state,
            to_dispatch=state.to_dispatch | {event.request_id},
            resume_tokens=_without(state.resume_tokens, event.request_id),
            first_call_error=state.first_call_error or event.call_error,
        )
    if isinstance(event, MachineCreateAccepted):
        return replace(
            state, resume_tokens={**state.resume_tokens, event.request_id: event.resume_token}
        )
    if isinstance(event, BatchCompleted):
        return replace(state, completed=event)
    raise TypeError(f"not a machine batch event: {event!r}")


def _without(tokens: Mapping[str, str], request_id: str) -> Mapping[str, str]:
    return {k: v for k, v in tokens.items() if k != request_id} if request_id in tokens else tokens


# -- queries -------------------------------------------------------------------------------------


def resume_token(state: BatchState, machine_name: str) -> str | None:
    """The token to resume waiting for an unresolved machine's create, if the cloud gave one."""
    if state.opened is None:
        return None
    for machine in state.opened.machines:
        if machine.machine_name == machine_name:
            return state.resume_tokens.get(machine.request_id)
    return None


def status(state: BatchState) -> BatchStatus:
    """Where the batch is in its lifecycle."""
    if state.opened is None:
        return "new"
    if state.completed is not None:
        return "completed"
    return "dispatched" if state.dispatches else "sealed"


def is_complete(state: BatchState) -> bool:
    """True once every request has its outcome (and :class:`BatchCompleted` is recorded)."""
    return state.completed is not None


def needs_dispatch(state: BatchState) -> bool:
    """True when some machine has never been sent, or was read back as not found."""
    return state.completed is None and bool(state.to_dispatch)


def machines_to_dispatch(state: BatchState) -> tuple[BatchMachine, ...]:
    """The machines the next :class:`RecordDispatch` covers, in batch order."""
    if state.opened is None:
        return ()
    return tuple(m for m in state.opened.machines if m.request_id in state.to_dispatch)


def unresolved_machines(state: BatchState) -> tuple[BatchMachine, ...]:
    """Dispatched machines with no outcome yet, in batch order: read these, do not re-create."""
    if state.opened is None:
        return ()
    return tuple(
        m
        for m in state.opened.machines
        if m.request_id not in state.outcomes and m.request_id not in state.to_dispatch
    )


# -- decide --------------------------------------------------------------------------------------


def decide(state: BatchState, command: BatchCommand) -> list[BatchEvent]:
    """Decide what ``command`` means for this batch. Raises :class:`Rejected` /
    :class:`InvalidCommand` with a reason that says what to do instead."""
    at = _utc(command.at)
    if isinstance(command, OpenBatch):
        return _decide_open(state, command, at)
    opened = state.opened
    if opened is None:
        raise Rejected(f"batch {command.batch_id} is not open; open it from its BatchSealed first")
    if command.batch_id != opened.batch_id:
        raise InvalidCommand(
            f"command for batch {command.batch_id} sent to the stream of batch {opened.batch_id}"
        )
    if isinstance(command, RecordDispatch):
        return _decide_dispatch(state, opened, command, at)
    if isinstance(command, RecordCallFailure):
        return _decide_call_failure(state, opened, command, at)
    if isinstance(command, RecordMachineResults):
        return _decide_results(state, opened, command, at)
    if isinstance(command, RecordMachineRead):
        return _decide_read(state, opened, command, at)
    if isinstance(command, RecordCreateAccepted):
        return _decide_accepted(state, opened, command, at)
    raise InvalidCommand(f"a machine batch does not handle {type(command).__name__}")


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC) if at.utcoffset() else at


def _decide_open(state: BatchState, command: OpenBatch, at: datetime) -> list[BatchEvent]:
    sealed = command.sealed
    if type(command.max_attempts) is not int or command.max_attempts < 1:
        raise InvalidCommand(f"max_attempts must be at least 1, got {command.max_attempts!r}")
    if not sealed.machines:
        raise InvalidCommand(f"batch {sealed.batch_id} has no machines; nothing to open")
    for what, values in (
        ("request id", [m.request_id for m in sealed.machines]),
        ("machine name", [m.machine_name for m in sealed.machines]),
    ):
        if len(set(values)) != len(values):
            raise InvalidCommand(f"batch {sealed.batch_id} lists a {what} twice; it cannot be sent")
    event = BatchOpened(
        sealed.batch_id,
        sealed.template_hash,
        sealed.template,
        sealed.machines,
        sealed.reason,
        sealed.at,
        command.max_attempts,
        at,
    )
    if state.opened is not None:
        if _same_opening(state.opened, event):
            return []
        raise Rejected(
            f"batch {state.opened.batch_id} is already open with different content; "
            "a batch id names exactly one sealed batch"
        )
    return [event]


def _same_opening(a: BatchOpened, b: BatchOpened) -> bool:
    # ``at`` is when the runtime opened the stream; a retried open may carry a later one.
    return (
        a.batch_id,
        a.template_hash,
        a.template,
        a.machines,
        a.seal_reason,
        a.sealed_at,
        a.max_attempts,
    ) == (
        b.batch_id,
        b.template_hash,
        b.template,
        b.machines,
        b.seal_reason,
        b.sealed_at,
        b.max_attempts,
    )


def _decide_dispatch(
    state: BatchState, opened: BatchOpened, command: RecordDispatch, at: datetime
) -> list[BatchEvent]:
    done = len(state.dispatches)
    if type(command.attempt) is int and 1 <= command.attempt <= done:
        earlier = state.dispatches[command.attempt - 1]
        if (earlier.calls, earlier.header) == (tuple(command.calls), command.header):
            return []
        raise Rejected(
            f"attempt {command.attempt} of batch {opened.batch_id} was already recorded with "
            "different calls; record a new attempt instead"
        )
    if state.completed is not None:
        raise Rejected(f"batch {opened.batch_id} is complete; there is nothing left to create")
    if command.attempt != done + 1:
        raise InvalidCommand(
            f"batch {opened.batch_id} has {done} dispatch(es); the next attempt is {done + 1}, "
            f"not {command.attempt!r}"
        )
    machines = machines_to_dispatch(state)
    if not machines:
        in_doubt = ", ".join(m.machine_name for m in unresolved_machines(state))
        raise Rejected(
            f"no machine of batch {opened.batch_id} needs dispatching; read the unresolved "
            f"machines ({in_doubt}) and record what you find before creating anything again"
        )
    if command.attempt > opened.max_attempts:
        raise Rejected(  # pragma: no cover - reads fail machines before this can happen
            f"batch {opened.batch_id} allows {opened.max_attempts} attempt(s)"
        )
    if not command.calls or not all(isinstance(c, str) and c for c in command.calls):
        raise InvalidCommand("calls must describe each cloud call made, e.g. 'PUT …/machines'")
    if command.header is not None:
        _check_header(opened.batch_id, command.header, machines)
    return [
        BatchDispatched(
            opened.batch_id,
            command.attempt,
            tuple(m.request_id for m in machines),
            tuple(command.calls),
            command.header,
            at,
        )
    ]


def _check_header(batch_id: str, header: str, machines: Sequence[BatchMachine]) -> None:
    # The original built the header from whichever requests it had at hand; recording it here and
    # checking it against the batch catches a header that drops, reorders or invents a machine.
    # Only new dispatches are checked: a recorded header (one from before machines carried their
    # request tag, say) is a fact, and folds as it was written.
    try:
        sent = json.loads(header)
    except ValueError as e:
        raise InvalidCommand(f"header is not valid JSON: {e}") from e
    expected = batch_put_machine_header(machines)
    if sent != expected:
        raise InvalidCommand(
            f"header does not match batch {batch_id}: it must list exactly the machines to "
            f"dispatch, in batch order; build it with batch_put_machine_header (expected "
            f"{json.dumps(expected, separators=(',', ':'))})"
        )


def _decide_call_failure(
    state: BatchState, opened: BatchOpened, command: RecordCallFailure, at: datetime
) -> list[BatchEvent]:
    if not isinstance(command.error, MachineError):
        raise InvalidCommand("error must be a MachineError")
    if not state.dispatches:
        raise Rejected(f"batch {opened.batch_id} has no dispatch; a call cannot have failed")
    if command.attempt != len(state.dispatches):
        if state.completed is not None:
            return []
        raise Rejected(
            f"attempt {command.attempt!r} is not the latest dispatch of batch {opened.batch_id} "
            f"(that is {len(state.dispatches)}); its machines may have moved on — read them"
        )
    events: list[BatchEvent] = [
        _failed(opened.batch_id, machine, command.error, at)
        for machine in opened.machines
        if machine.request_id not in state.outcomes
    ]
    if not events:
        # A repeat of a failure already applied is a no-op; it cannot undo created machines.
        return []
    return _with_completion(state, opened, events, at)


def _failed(
    batch_id: str,
    machine: BatchMachine,
    error: MachineError,
    at: datetime,
    *,
    deleted: bool = False,
) -> MachineFailed:
    return MachineFailed(
        batch_id,
        machine.request_id,
        machine.machine_name,
        error.code,
        error.message,
        error.retryable,
        error.retry_after_seconds,
        at,
        deleted,
    )


def _decide_results(
    state: BatchState, opened: BatchOpened, command: RecordMachineResults, at: datetime
) -> list[BatchEvent]:
    if not state.dispatches:
        raise Rejected(
            f"batch {opened.batch_id} has no dispatch; record the dispatch before its results"
        )
    created = dict(command.created)
    failed = dict(command.failed)
    by_name = {m.machine_name: m for m in opened.machines}
    unknown = sorted((set(created) | set(failed)) - set(by_name))
    if unknown:
        raise InvalidCommand(
            f"machine(s) {', '.join(unknown)} are not in batch {opened.batch_id}; "
            "results must name the batch's machines"
        )
    both = sorted(set(created) & set(failed))
    if both:
        raise InvalidCommand(
            f"machine(s) {', '.join(both)} reported both created and failed; give one result each"
        )
    deleted = command.deleted
    if type(deleted) is not tuple or not set(deleted) <= set(failed):
        raise InvalidCommand(
            f"deleted must be a tuple of machines reported failed, got {deleted!r}; only a "
            "failed machine's leftover is deleted"
        )
    events: list[BatchEvent] = []
    for machine in opened.machines:
        if machine.machine_name in created:
            provider_id = created[machine.machine_name]
            if not isinstance(provider_id, str) or not provider_id:
                raise InvalidCommand(f"provider id for {machine.machine_name} must be non-empty")
            outcome: _Outcome = MachineCreated(
                opened.batch_id, machine.request_id, machine.machine_name, provider_id, at
            )
        elif machine.machine_name in failed:
            error = failed[machine.machine_name]
            if not isinstance(error, MachineError):
                raise InvalidCommand(f"error for {machine.machine_name} must be a MachineError")
            outcome = _failed(
                opened.batch_id, machine, error, at, deleted=machine.machine_name in deleted
            )
        else:
            continue  # not reported: stays unresolved until read
        if _is_new_outcome(state, outcome):
            events.append(outcome)
    return _with_completion(state, opened, events, at)


def _machine_named(opened: BatchOpened, machine_name: str) -> BatchMachine:
    for machine in opened.machines:
        if machine.machine_name == machine_name:
            return machine
    raise InvalidCommand(f"machine {machine_name!r} is not in batch {opened.batch_id}")


def _decide_accepted(
    state: BatchState, opened: BatchOpened, command: RecordCreateAccepted, at: datetime
) -> list[BatchEvent]:
    machine = _machine_named(opened, command.machine_name)
    if not isinstance(command.resume_token, str) or not command.resume_token:
        raise InvalidCommand("resume_token must be a non-empty string")
    if machine.request_id in state.to_dispatch:
        raise Rejected(
            f"machine {machine.machine_name} of batch {opened.batch_id} is not dispatched; "
            "record the dispatch before the cloud call"
        )
    if (
        machine.request_id in state.outcomes
        or state.resume_tokens.get(machine.request_id) == command.resume_token
    ):
        return []  # a late or repeated note: the machine's fate is already known or recorded
    return [
        MachineCreateAccepted(
            opened.batch_id, machine.request_id, machine.machine_name, command.resume_token, at
        )
    ]


def _decide_read(
    state: BatchState, opened: BatchOpened, command: RecordMachineRead, at: datetime
) -> list[BatchEvent]:
    machine = _machine_named(opened, command.machine_name)
    if type(command.deleted) is not bool or (command.deleted and command.result != "failed"):
        raise InvalidCommand(
            f"deleted must be a bool and only true on a 'failed' read, got {command.deleted!r} "
            f"on a {command.result!r} read; only a failed machine's leftover is deleted"
        )
    outcome: _Outcome
    if command.result == "created":
        if not command.provider_id or command.error is not None:
            raise InvalidCommand("a 'created' read needs a provider_id and no error")
        outcome = MachineCreated(
            opened.batch_id, machine.request_id, machine.machine_name, command.provider_id, at
        )
    elif command.result == "failed":
        if not isinstance(command.error, MachineError) or command.provider_id is not None:
            raise InvalidCommand("a 'failed' read needs an error and no provider_id")
        outcome = _failed(opened.batch_id, machine, command.error, at, deleted=command.deleted)
    elif command.result == "not_found":
        if command.provider_id is not None or command.error is not None:
            raise InvalidCommand("a 'not_found' read carries neither provider_id nor error")
        if command.call_error is not None and not (
            isinstance(command.call_error, str) and command.call_error
        ):
            raise InvalidCommand("call_error must be a non-empty 'Type: message' string or None")
        return _decide_not_found(state, opened, machine, at, command.call_error)
    else:
        raise InvalidCommand(
            f"result must be 'created', 'failed' or 'not_found', got {command.result!r}"
        )
    if not _is_new_outcome(state, outcome):
        return []
    return _with_completion(state, opened, [outcome], at)


def _decide_not_found(
    state: BatchState,
    opened: BatchOpened,
    machine: BatchMachine,
    at: datetime,
    call_error: str | None = None,
) -> list[BatchEvent]:
    known = state.outcomes.get(machine.request_id)
    if known is not None:
        raise Rejected(
            f"machine {machine.machine_name} already ended {_describe(known)}; a read that does "
            "not find it cannot change that (was it deleted since?)"
        )
    if machine.request_id in state.to_dispatch:
        return []  # never sent, or already known to be missing: nothing new
    if len(state.dispatches) >= opened.max_attempts:
        # Giving up keeps the batch finite; "retryable" tells the requester a new request may work.
        message = f"machine not found after {len(state.dispatches)} create attempt(s)"
        first = state.first_call_error or call_error
        if first is not None:
            # The attempts count is no diagnosis; what the cloud call raised is.
            message += f"; the first create call ended with {first}"
        failed = MachineFailed(
            opened.batch_id,
            machine.request_id,
            machine.machine_name,
            "not_created",
            message,
            True,
            None,
            at,
        )
        return _with_completion(state, opened, [failed], at)
    return [
        MachineNotFound(opened.batch_id, machine.request_id, machine.machine_name, at, call_error)
    ]


def _is_new_outcome(state: BatchState, outcome: _Outcome) -> bool:
    """False if the request already has this outcome; raises if it has a different one.

    "The same" means the same kind and the same provider id or error code; a reworded message on
    a later read is not a second outcome, and the first wording is kept.
    """
    known = state.outcomes.get(outcome.request_id)
    if known is None:
        return True
    if isinstance(known, MachineCreated) and isinstance(outcome, MachineCreated):
        same = known.provider_id == outcome.provider_id
    elif isinstance(known, MachineFailed) and isinstance(outcome, MachineFailed):
        same = known.code == outcome.code
    else:
        same = False
    if same:
        return False
    raise Rejected(
        f"machine {outcome.machine_name} already ended {_describe(known)}; it cannot also end "
        f"{_describe(outcome)} — a request has exactly one outcome"
    )


def _describe(outcome: _Outcome) -> str:
    if isinstance(outcome, MachineCreated):
        return f"created ({outcome.provider_id})"
    return f"failed ({outcome.code})"


def _with_completion(
    state: BatchState, opened: BatchOpened, events: list[BatchEvent], at: datetime
) -> list[BatchEvent]:
    """Append :class:`BatchCompleted` if ``events`` give the last requests their outcomes."""
    if not events or state.completed is not None:
        return events
    outcomes: dict[str, _Outcome] = dict(state.outcomes)
    for event in events:
        if isinstance(event, MachineCreated | MachineFailed):
            outcomes[event.request_id] = event
    if len(outcomes) < len(opened.machines):
        return events
    created = tuple(
        m.request_id for m in opened.machines if isinstance(outcomes[m.request_id], MachineCreated)
    )
    failed = tuple(
        m.request_id for m in opened.machines if isinstance(outcomes[m.request_id], MachineFailed)
    )
    return [*events, BatchCompleted(opened.batch_id, created, failed, at)]
