"""Acknowledged workloads: one ``workload-<id>`` stream per workload submitted for placement.

A workload's reservation is a fact of its node's stream (the pod is the workload id, see
:mod:`fleetledger.domain.placement`); what happens to the workload is a fact of its own stream,
so that nothing acknowledged lives only in a process's memory:

* :class:`WorkloadSubmitted` — accepted for placement, carrying the whole request (the answer to
  ``POST /v1/workloads`` is sent only once it is in the log);
* :class:`WorkloadPlaced` — the batch that planned it reserved it on ``node``, in the same
  append as the node's reservation (recorded where several controllers share the log): a second
  placer of the same workload — another process that recovered it too — conflicts on this
  stream's expected version and leaves it where it is;
* :class:`WorkloadWaiting` — the batch that planned it found no room and it waits for ``worker``
  of ``pool``, a machine requested for overflow and not yet joined;
* :class:`WorkloadRejected` — no pool could ever hold it, with the reason;
* :class:`WorkloadReleased` — its capacity was given back (from its node, its worker on the way,
  or the backlog).

:func:`decide` keeps submissions idempotent: the same request sent again under the same id is a
repeat (nothing to record; a rejected one keeps its rejection), a different one is refused; a
rejected workload may be submitted again with a different request, a released one with any.
:func:`recover` turns the folded streams (and which workloads a node holds) into
what a restarted placement service needs: the backlog to plan again, the workers still awaited
with the capacity their workloads take of them, and the final answers.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias

from fleetledger.domain.errors import Rejected
from fleetledger.domain.placement.model import PendingWorker, Pool, WorkloadRequest
from fleetledger.domain.placement.pools import worker_room

__all__ = [
    "STREAM_PREFIX",
    "RecordPlacement",
    "RecordRejection",
    "RecordWaiting",
    "Recovery",
    "ReleaseWorkload",
    "SubmitWorkload",
    "Workload",
    "WorkloadCommand",
    "WorkloadEvent",
    "WorkloadPhase",
    "WorkloadPlaced",
    "WorkloadRejected",
    "WorkloadReleased",
    "WorkloadSubmitted",
    "WorkloadWaiting",
    "decide",
    "evolve",
    "initial_state",
    "recover",
    "stream_id",
    "workload_of_stream",
]

STREAM_PREFIX = "workload-"

WorkloadPhase: TypeAlias = Literal["new", "submitted", "placed", "waiting", "rejected", "released"]
"""Where a workload's own stream leaves it. ``submitted`` with no outcome yet is queued — or
placed by a batch that did not record it on this stream (a placement made without a
submission): the node's stream says which."""


def stream_id(workload_id: str) -> str:
    return f"{STREAM_PREFIX}{workload_id}"


def workload_of_stream(stream: str) -> str | None:
    """The workload a ``workload-<id>`` stream holds, or ``None`` for any other stream."""
    return stream[len(STREAM_PREFIX) :] if stream.startswith(STREAM_PREFIX) else None


# -- commands --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmitWorkload:
    request: WorkloadRequest
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordPlacement:
    workload_id: str
    node: str
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordWaiting:
    workload_id: str
    worker: str
    pool: str
    at: datetime


@dataclass(frozen=True, slots=True)
class RecordRejection:
    workload_id: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ReleaseWorkload:
    workload_id: str
    at: datetime


WorkloadCommand: TypeAlias = (
    SubmitWorkload | RecordPlacement | RecordWaiting | RecordRejection | ReleaseWorkload
)

# -- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadSubmitted:
    request: WorkloadRequest
    at: datetime

    @property
    def workload_id(self) -> str:
        return self.request.id


@dataclass(frozen=True, slots=True)
class WorkloadPlaced:
    workload_id: str
    node: str
    at: datetime


@dataclass(frozen=True, slots=True)
class WorkloadWaiting:
    workload_id: str
    worker: str
    pool: str
    at: datetime


@dataclass(frozen=True, slots=True)
class WorkloadRejected:
    workload_id: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class WorkloadReleased:
    workload_id: str
    at: datetime


WorkloadEvent: TypeAlias = (
    WorkloadSubmitted | WorkloadPlaced | WorkloadWaiting | WorkloadRejected | WorkloadReleased
)

# -- state -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One workload's stream, folded: its latest request and where its own stream leaves it."""

    phase: WorkloadPhase = "new"
    request: WorkloadRequest | None = None
    node: str | None = None
    worker: str | None = None
    pool: str | None = None
    reason: str | None = None


def initial_state() -> Workload:
    return Workload()


def evolve(state: Workload, event: WorkloadEvent) -> Workload:
    if isinstance(event, WorkloadSubmitted):
        return Workload(phase="submitted", request=event.request)
    if isinstance(event, WorkloadPlaced):
        return Workload(phase="placed", request=state.request, node=event.node)
    if isinstance(event, WorkloadWaiting):
        return Workload(
            phase="waiting", request=state.request, worker=event.worker, pool=event.pool
        )
    if isinstance(event, WorkloadRejected):
        return Workload(phase="rejected", request=state.request, reason=event.reason)
    return Workload(phase="released", request=state.request)


def decide(state: Workload, command: WorkloadCommand) -> list[WorkloadEvent]:
    """What ``command`` records on a workload in ``state``; :class:`Rejected` with the reason
    when it cannot be."""
    if isinstance(command, SubmitWorkload):
        return _submit(state, command)
    if isinstance(command, ReleaseWorkload):
        # Nothing to release on a stream never opened (a placement made without a submission,
        # released through its node alone) or already released.
        if state.phase in ("new", "released"):
            return []
        return [WorkloadReleased(command.workload_id, command.at)]
    if state.phase == "new":
        raise Rejected(
            f"workload {command.workload_id} was never submitted; submit it before recording "
            "a batch's outcome for it"
        )
    if isinstance(command, RecordPlacement):
        return _place(state, command)
    if state.phase in ("released", "placed"):
        return []  # released, or placed by another batch, while this one planned it: moot
    if isinstance(command, RecordWaiting):
        if (state.phase, state.worker, state.pool) == ("waiting", command.worker, command.pool):
            return []
        return [WorkloadWaiting(command.workload_id, command.worker, command.pool, command.at)]
    if (state.phase, state.reason) == ("rejected", command.reason):
        return []
    return [WorkloadRejected(command.workload_id, command.reason, command.at)]


def _place(state: Workload, command: RecordPlacement) -> list[WorkloadEvent]:
    if state.phase in ("submitted", "waiting"):
        return [WorkloadPlaced(command.workload_id, command.node, command.at)]
    # Placed already (even on the same node): by another batch, so the pod is that batch's.
    where = f"placed on {state.node}" if state.phase == "placed" else state.phase
    raise Rejected(f"workload {command.workload_id} is {where}; it cannot be placed again")


def _submit(state: Workload, command: SubmitWorkload) -> list[WorkloadEvent]:
    if state.phase in ("new", "released"):
        return [WorkloadSubmitted(command.request, command.at)]
    if state.request == command.request:
        # The same request sent again: the first submission answers it — a rejection too, as a
        # client retrying a submission whose answer it lost must not have it judged twice.
        return []
    if state.phase == "rejected":
        return [WorkloadSubmitted(command.request, command.at)]
    raise Rejected(
        f"workload {command.request.id} was already submitted with a different request "
        f"({_describe(state.request)}, now {_describe(command.request)}); send it with a new "
        "id, or release it first"
    )


def _describe(request: WorkloadRequest | None) -> str:
    if request is None:
        return "unknown"
    return f"cpu_milli={request.cpu_milli} memory_bytes={request.memory_bytes} gpu={request.gpu}"


# -- recovery --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What the log says about every workload not on a node: to plan again (``queued``, in
    submission order), awaiting a worker (``waiting``, with ``pending`` the workers as the
    planner counts them) and answered for good (``rejected`` with reasons, ``released``)."""

    queued: tuple[WorkloadRequest, ...] = ()
    waiting: Mapping[str, WorkloadRequest] = field(default_factory=dict)
    pending: tuple[PendingWorker, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
    released: tuple[str, ...] = ()


def recover(
    workloads: Mapping[str, Workload],
    *,
    placed: Container[str],
    pools: Sequence[Pool],
    failed: Container[str] = frozenset(),
) -> Recovery:
    """Sort the folded ``workloads`` (in submission order) by what a restart must do with them.

    A workload placed by a batch that recorded it, or submitted or waiting and held by a node
    (``placed``), needs nothing. A
    waiting one comes back onto its worker, whose free capacity is an empty worker of its pool
    less every workload waiting for it — what the planner counted when it asked for the worker;
    if its pool is no longer configured, or its worker's machine ``failed`` (it will never
    join), it is planned again instead.
    """
    by_pool = {p.name: p for p in pools}
    queued: list[WorkloadRequest] = []
    waiting: dict[str, WorkloadRequest] = {}
    on_worker: dict[str, list[WorkloadRequest]] = {}
    pool_of: dict[str, str] = {}
    rejected: dict[str, str] = {}
    released: list[str] = []
    for workload_id, workload in workloads.items():
        if workload.phase == "rejected":
            rejected[workload_id] = workload.reason or ""
        elif workload.phase == "released":
            released.append(workload_id)
        elif workload.request is None or workload.phase == "placed" or workload_id in placed:
            continue
        elif (
            workload.phase == "waiting"
            and workload.worker is not None
            and workload.pool is not None
            and workload.pool in by_pool
            and workload.worker not in failed
            and pool_of.get(workload.worker, workload.pool) == workload.pool
        ):
            waiting[workload_id] = workload.request
            on_worker.setdefault(workload.worker, []).append(workload.request)
            pool_of[workload.worker] = workload.pool
        else:
            queued.append(workload.request)
    pending = tuple(
        _pending(name, by_pool[pool_of[name]], on_worker[name]) for name in sorted(on_worker)
    )
    return Recovery(
        queued=tuple(queued),
        waiting=waiting,
        pending=pending,
        rejected=rejected,
        released=tuple(released),
    )


def _pending(name: str, pool: Pool, requests: Iterable[WorkloadRequest]) -> PendingWorker:
    cpu, memory, gpu = worker_room(pool)
    ids = []
    for request in requests:
        ids.append(request.id)
        cpu -= request.cpu_milli
        memory -= request.memory_bytes
        gpu -= request.gpu
    return PendingWorker(
        name=name,
        pool=pool.name,
        request_ids=tuple(ids),
        free_cpu_milli=cpu,
        free_memory_bytes=memory,
        free_gpu=gpu,
    )
