"""The placement service: a batch planned on one snapshot and committed in one append.

:meth:`PlacementService.place_batch` is seed 02's ``processBatch`` on the log:

1. **one snapshot** of every hosted node — its folded state and stream version, from memory (the
   node service's hosted streams, or this service's own fold of what it committed, whichever is
   newer; the version is read before the state, so a state newer than its version can only cause
   a conflict, never an overbooking). The snapshot is kept between batches (:mod:`.view`): a
   batch re-reads only the nodes that changed since the last, so it costs what it touches, not
   the size of the fleet;
2. the pure :func:`~fleetledger.domain.placement.plan`, its overflow packed exactly within
   ``search_steps`` (the batch's report carries the plan's ``optimality_gap``);
3. **one** ``append_many``: per touched node, the one event the node aggregate decides for its
   workloads as one ``ReservePods`` command, expected version = the snapshot's. A
   ``WrongExpectedVersion`` names one node: only the requests planned on it are planned again,
   on that node's fresh state and the others' state after this batch, and the append is sent
   again (bounded by ``max_conflict_retries``; what is still in conflict after that goes back to
   the backlog);
4. overflow: new workers are requested from the Grouper (one machine request each, with the
   pool's template; the worker name is the machine name, so a repeat is idempotent). The
   workloads wait for them; once a node of that name has joined, a batch places them on it
   before anything else.

Nothing acknowledged lives only in memory. Every workload has a ``workload-<id>`` stream
(:mod:`fleetledger.domain.placement.workloads`):

* :meth:`PlacementService.accept` appends one ``WorkloadSubmitted`` per new workload, all of a
  submission in one ``append_many``, before the caller is answered. The same request sent again
  under its id is answered by the first (nothing appended; a rejected one keeps its
  rejection, so a client retrying a submission whose answer it lost is not judged twice); a
  different one is refused whole with :class:`~.errors.WorkloadConflict`, unless the workload
  was rejected (a different request is a new submission) or released (any request is);
* a batch records its waiting (``WorkloadWaiting``: the worker and its pool) and rejected
  (``WorkloadRejected``: the reason) outcomes in the very ``append_many`` that carries its node
  reservations (step 3), one event per affected workload stream beside one per touched node,
  with expected versions. If that append fails for good, nothing of the batch is answered:
  every workload of it goes back to the queue and the book of pending workers is as it was
  before the batch. If the log refuses it for a value it holds (an event over its size limit,
  text it cannot store: :mod:`.refusals`), sending it again would fail for ever, so the batch is
  placed in halves instead, split again while refused: the workload the value belongs to, once
  alone, is rejected with a short reason naming the refusal, and the others are placed;
* a placement is the node's reservation (the pod is the workload id). With
  ``record_placements`` it is also a ``WorkloadPlaced`` on the workload's stream in that same
  append: a second process that recovered the same workload and places it too then conflicts
  on that stream, finds it placed (or released) and takes it out of its batch, so a workload is
  never reserved on two nodes. It costs an event per placed workload where the node's
  reservation carries all of a node's workloads in one, so it is off for a lone placer (the
  runtime turns it on with a ``leadership``: several controllers on one log);
* :meth:`~PlacementService.release` records ``WorkloadReleased``; for a placed workload in the
  same ``append_many`` as its node's ``PodDeleted``.

:meth:`~PlacementService.recover` (run by ``PlacementRuntime.start``) folds every workload stream
back: placed → nothing to do; submitted and on no node → queued again; waiting → its pending
worker, with the capacity its waiting workloads take, is in the book again (and its machine
request is sent again: the request id makes that a repeat for the Grouper, never a second
machine); rejected and released → their answers.

:meth:`~PlacementService.follow` keeps that up between batches: it folds the workload events
appended since (by any process) and asks the Grouper about the pending workers' machines. A
workload another process accepted is queued here too (a leader places what a follower or a dead
process acknowledged), one another process answered is answered here, and a workload whose
worker's machine failed — that worker will never join — is planned again, on a worker of
another name (the failed name is retired from planning, so the new machine is a new request).

Several processes may place on one log: node reservations conflict on expected versions, so a
node is never overbooked; with ``record_placements`` neither is a workload placed twice.
Without it, a process that restarts while another still holds the same workloads queued or
waiting may place them a second time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, Protocol

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.machines.port import MachineRequest
from fleetledger.adapters.nodes.port import NodeStreams, node_of_stream
from fleetledger.adapters.runtime import LogUnavailable as HostUnavailable
from fleetledger.adapters.runtime import RetryPolicy, Writer, append_decision
from fleetledger.domain import nodes
from fleetledger.domain.errors import Rejected
from fleetledger.domain.nodes import DeletePod, NodeEvent, NodeState
from fleetledger.domain.placement import (
    DEFAULT_SEARCH_STEPS,
    PendingWorker,
    PlacementPlan,
    Pool,
    RecordPlacement,
    RecordRejection,
    RecordWaiting,
    ReleaseWorkload,
    Snapshot,
    SubmitWorkload,
    Worker,
    WorkerStatus,
    Workload,
    WorkloadCommand,
    WorkloadRequest,
    check_search_steps,
    plan_on,
    workloads,
)
from fleetledger.eventstore import (
    AppendResult,
    EventStore,
    EventStoreError,
    Fenced,
    StoreUnavailable,
    StreamAppend,
    WrongExpectedVersion,
)

from . import refusals
from .capacity import reservation, worker_of
from .commit import NodeBatch, node_append, node_appends
from .errors import (
    InvalidWorkload,
    LogUnavailable,
    PlacementError,
    RuntimeStopped,
    UnknownWorkload,
    WorkloadConflict,
)
from .view import NodeView
from .waiting import WaitingBook
from .workloads import WorkloadLedger, read_workload, read_workload_events

__all__ = [
    "BatchReport",
    "MachineRequester",
    "PlacementService",
    "WorkloadState",
    "WorkloadStatus",
    "pool_by_prefix",
]

log = structlog.get_logger(__name__)

WorkloadState = Literal["queued", "placed", "pending-provisioning", "rejected", "released"]


class MachineRequester(Protocol):
    """Where overflow asks for machines: the Grouper's service
    (:class:`fleetledger.adapters.machines.MachineService`) or a fake. ``status`` is a
    request's ``(status, batch id)`` — ``"failed"`` once its machine will never come — or
    ``None`` for an id never accepted."""

    def request(self, requests: Sequence[MachineRequest]) -> object: ...

    def status(self, request_id: str) -> tuple[str, str] | None: ...


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    """Where a workload stands: ``node`` once placed, ``worker`` while it waits for one being
    provisioned, ``reason`` when rejected."""

    id: str
    state: WorkloadState
    node: str | None = None
    worker: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What one batch did, and what it cost: snapshots read and appends sent (retries count).
    ``optimality_gap`` is how many more workers than the minimum its overflow may have asked
    for (0: proven minimal)."""

    requests: int = 0
    placed: int = 0
    waiting: int = 0
    rejected: int = 0
    requeued: int = 0
    workers_requested: tuple[str, ...] = ()
    snapshot_reads: int = 0
    appends: int = 0
    conflicts: int = 0
    last_position: int | None = None
    optimality_gap: int = 0


def pool_by_prefix(pools: Sequence[Pool]) -> Callable[[str], str | None]:
    """Node name → pool: the longest pool name the node name starts with followed by ``-``
    (workers this service requests are named ``<pool>-<digest>``)."""
    names = sorted((p.name for p in pools), key=len, reverse=True)

    def pool_of(node: str) -> str | None:
        return next((name for name in names if node.startswith(f"{name}-")), None)

    return pool_of


@dataclass(slots=True)
class _Run:
    """One batch on its way to the log."""

    at: datetime
    by_id: dict[str, WorkloadRequest]
    result: PlacementPlan
    book: WaitingBook
    placed: dict[str, str] = field(default_factory=dict)
    touched: dict[str, NodeBatch] = field(default_factory=dict)
    provisions: list[tuple[str, str]] = field(default_factory=list)
    pools: dict[str, str] = field(default_factory=dict)
    requeued: list[WorkloadRequest] = field(default_factory=list)
    # Placements the workload's stream refused: the log's answer stands for them.
    dropped: list[str] = field(default_factory=list)
    # The workload streams the append carries: their state once it lands, and the version.
    recorded: dict[str, tuple[int, Workload]] = field(default_factory=dict)
    # The reservations the append carries, one per node stream.
    reservations: list[StreamAppend] = field(default_factory=list)
    reads: int = 1
    appends: int = 0
    conflicts: int = 0
    last_position: int | None = None


class PlacementService:
    """Plans and commits batches of workload requests; ``place_batch`` is serialised, the rest
    is thread-safe. ``record_placements`` writes each placement on the workload's stream too
    (see the module docstring): needed when several processes may place on the log.
    ``search_steps`` is each plan's budget for packing overflow exactly (0: first-fit
    decreasing alone)."""

    def __init__(
        self,
        store: EventStore,
        nodes_service: NodeStreams,
        pools: Sequence[Pool],
        *,
        clock: Clock,
        machines: MachineRequester | None = None,
        pool_of: Callable[[str], str | None] | None = None,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
        max_conflict_retries: int = 5,
        record_placements: bool = False,
        search_steps: int = DEFAULT_SEARCH_STEPS,
    ) -> None:
        if not pools:
            raise ValueError("give at least one Pool: workers are placed by their pool")
        if len({p.name for p in pools}) != len(pools):
            raise ValueError("pool names must be unique")
        if max_conflict_retries < 0:
            raise ValueError(f"max_conflict_retries must be >= 0, got {max_conflict_retries}")
        self._store = store
        self._nodes = nodes_service
        self._pools = tuple(pools)
        self._clock = clock
        self._machines = machines
        self._pool_of = pool_of or pool_by_prefix(pools)
        self._writer = writer or Writer(actor="fleetledger", labels=(("capability", "placement"),))
        self._retry = retry or RetryPolicy()
        self._max_retries = max_conflict_retries
        self._record_placements = record_placements
        self._search_steps = check_search_steps(search_steps)
        self._batch_lock = threading.Lock()
        self._lock = threading.Condition()
        # Only the batch thread writes these two: this service's own fold of the nodes it
        # reserved on, and the nodes as the batches plan on them.
        self._known: dict[str, tuple[int, NodeState]] = {}
        self._view = NodeView(nodes_service, self._pools, self._pool_of)
        self._worker_status: dict[str, WorkerStatus] = {}
        self._statuses: dict[str, WorkloadStatus] = {}
        self._requests: dict[str, WorkloadRequest] = {}
        self._waiting = WaitingBook(pools)
        self._ledger = WorkloadLedger()
        self._followed = 0  # the log position :meth:`follow` has read workload events up to
        self._retired: frozenset[str] = frozenset()  # pending workers whose machines failed
        self.requeue: Callable[[Sequence[WorkloadRequest]], None] | None = None

    @property
    def pools(self) -> tuple[Pool, ...]:
        return self._pools

    @property
    def nodes_service(self) -> NodeStreams:
        return self._nodes

    # -- workers -----------------------------------------------------------------------------

    def set_worker_status(self, node: str, status: WorkerStatus) -> None:
        """Mark a worker draining or disabled (no new workloads), or available again."""
        with self._lock:
            self._worker_status[node] = status
        self._view.changed(node)

    def pending_workers(self) -> tuple[PendingWorker, ...]:
        """Workers requested and not yet joined, with the workloads waiting for them."""
        with self._lock:
            return self._waiting.workers()

    def snapshot(self) -> tuple[Snapshot, dict[str, NodeBatch]]:
        """Every hosted node's free capacity as the next batch plans on it, and each node's
        state and version (see the module docstring). A report of the whole fleet: batches
        read only what changed (:mod:`.view`)."""
        with self._batch_lock:
            self._refresh()
            with self._lock:
                pending = self._waiting.workers()
                retired = self._retired
            workers = self._view.capacity.workers()
            bases = {w.name: self._view.base(w.name) for w in workers}
        return Snapshot(workers=workers, pending=pending, retired=retired), bases

    def _refresh(self) -> None:
        """Bring the batches' view of the nodes up to date (hold the batch lock)."""
        self._view.refresh(self._known.get, self._status_of)

    def _status_of(self, node: str) -> WorkerStatus:
        return self._worker_status.get(node, "available")

    # -- requests ----------------------------------------------------------------------------

    def accept(self, requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
        """Record ``requests`` as submitted, in one append; the ones to queue.

        A workload already submitted (queued, waiting, placed or rejected) with the same
        request is not taken twice: the first submission answers it. One submitted with a
        different request refuses the whole call with :class:`WorkloadConflict`, as does an id
        given twice with different requests; nothing is appended then. A rejected workload may
        be sent again with a different request, a released one with any. Raises
        :class:`LogUnavailable` when the log cannot record them (nothing is queued: send them
        again).
        """
        unique = _unique(requests)
        for _ in range(self._retry.conflict_attempts):
            at = self._clock.now()
            with self._lock:
                decided, decided_events = self._submissions(unique, at)
                appends = [
                    self._ledger.append_for(rid, events, writer=self._writer, cause=f"submit:{rid}")
                    for rid, events in decided_events.items()
                ]
            if not appends:
                return []
            try:
                self._append(appends)
            except WrongExpectedVersion as e:
                self._reload(e)
                continue
            except EventStoreError as e:
                if not refusals.refused_by_log(e):
                    raise
                raise InvalidWorkload(
                    f"the event log cannot store these workloads ({refusals.describe(e)}); "
                    "nothing was recorded: fix the field it names (an id too long to name a "
                    "stream, a value too large or holding text the log cannot store) and send "
                    "them again"
                ) from e
            fresh = []
            with self._lock:
                for rid, (request, version, state) in decided.items():
                    self._ledger.put(rid, version, state)
                    self._requests[rid] = request
                    self._statuses[rid] = WorkloadStatus(rid, "queued")
                    fresh.append(request)
                self._lock.notify_all()
            return fresh
        raise LogUnavailable(
            "the workloads' streams kept changing under this process (another controller is "
            "submitting the same ids); send them again"
        )

    def _submissions(
        self, requests: Sequence[WorkloadRequest], at: datetime
    ) -> tuple[
        dict[str, tuple[WorkloadRequest, int, Workload]],
        dict[str, list[workloads.WorkloadEvent]],
    ]:
        """What submitting ``requests`` records: per workload its request and the version and
        state its stream will have, and the events."""
        decided = {}
        events_of = {}
        for request in requests:
            if request.id not in self._ledger and self._nodes.node_of(request.id) is not None:
                continue  # placed without a submission of its own (before streams existed)
            try:
                events, state = self._ledger.decide(request.id, [SubmitWorkload(request, at)])
            except Rejected as e:
                raise WorkloadConflict(e.reason) from e
            if events:
                version = self._ledger.get(request.id)[0] + len(events)
                decided[request.id] = (request, version, state)
                events_of[request.id] = events
        return decided, events_of

    def _reload(self, conflict: WrongExpectedVersion) -> str:
        """Another writer moved a workload's stream: read it back; the workload's id."""
        workload_id = workloads.workload_of_stream(conflict.stream_id)
        if workload_id is None:
            raise PlacementError(
                f"the log reported a conflict on {conflict.stream_id!r}, outside the workloads"
            ) from conflict
        try:
            version, state = read_workload(self._store, workload_id)
        except StoreUnavailable as e:
            raise LogUnavailable(f"could not read {conflict.stream_id} back: {e}") from e
        with self._lock:
            self._ledger.put(workload_id, version, state)
        return workload_id

    def _append(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        """``appends`` in one transaction; raises ``WrongExpectedVersion``, ``InvalidEvent``,
        or :class:`LogUnavailable` / :class:`RuntimeStopped` translated."""
        try:
            return append_decision(self._store, appends, clock=self._clock, policy=self._retry)
        except Fenced as e:
            self._writer.fencing.deposed(e)
            raise RuntimeStopped(f"a newer leader holds the log ({e})") from e
        except (StoreUnavailable, HostUnavailable) as e:
            raise LogUnavailable(f"the event log is unreachable ({e}); send it again") from e

    def recover(self) -> list[WorkloadRequest]:
        """Rebuild what the log says about every workload (see the module docstring); the
        workloads to queue again, in submission order. Run it before the first batch, with the
        node streams hosted (placements are found there)."""
        return self.follow(term_started=True)

    def follow(self, *, read_log: bool = True, term_started: bool = False) -> list[WorkloadRequest]:
        """Catch up with the log: fold the workload events appended since the last call, by
        this process or any other (unless not ``read_log``: a process alone on the log has
        nothing to learn there), and ask which pending workers' machines failed. When
        another process moved a workload (submitted one to it, placed, released it), a worker
        failed or a term starts (``term_started``: this process was just elected, or starts),
        every workload is sorted again as a restart sorts them, and the book of pending workers
        is rebuilt from the log; the workloads to queue (again). Run it between batches.

        A workload whose worker's machine failed is planned again, never on a worker of that
        name (:attr:`Snapshot.retired`), so its machine request is a new one.
        """
        moved = self._fold_log() if read_log else False
        failed = self._failed_machines()
        if not (moved or failed or term_started):
            return []
        with self._lock:
            states = self._ledger.states()
            retired = self._retired
        on_nodes = {rid for rid in states if self._nodes.node_of(rid) is not None}
        recovery = workloads.recover(states, placed=on_nodes, pools=self._pools, failed=retired)
        worker_of_request = {rid: p.name for p in recovery.pending for rid in p.request_ids}
        with self._lock:
            known_workers = {w.name for w in self._waiting.workers()}
            for request in recovery.queued:
                self._requests[request.id] = request
                self._statuses[request.id] = WorkloadStatus(request.id, "queued")
            for rid, request in recovery.waiting.items():
                self._requests[rid] = request
                self._statuses[rid] = WorkloadStatus(
                    rid, "pending-provisioning", worker=worker_of_request[rid]
                )
            self._waiting = WaitingBook(self._pools)
            self._waiting.restore(recovery.pending)
            for rid, reason in recovery.rejected.items():
                self._statuses[rid] = WorkloadStatus(rid, "rejected", reason=reason)
                self._requests.pop(rid, None)
            for rid in recovery.released:
                self._statuses[rid] = WorkloadStatus(rid, "released")
                self._requests.pop(rid, None)
            for rid, state in states.items():
                if state.phase == "placed":
                    self._statuses[rid] = WorkloadStatus(rid, "placed", node=state.node)
                    self._requests.pop(rid, None)
            self._lock.notify_all()
        with self._batch_lock:
            self._refresh()
            present = self._view.present
            # The batch that recorded a waiting workload may have stopped before asking for
            # its machine: a new term asks for every pending worker again (a repeat under the
            # same request id), otherwise only for the ones this process had not counted yet.
            provisions = [
                (p.name, p.pool)
                for p in recovery.pending
                if not present(p.name) and (term_started or p.name not in known_workers)
            ]
        self._provision(provisions)
        # Following another process's submissions happens every few batches: quiet unless a
        # term starts or a worker failed.
        (log.info if term_started or failed else log.debug)(
            "workloads recovered from the log" if term_started else "workloads followed",
            queued=len(recovery.queued),
            waiting=len(recovery.waiting),
            pending_workers=len(recovery.pending),
            rejected=len(recovery.rejected),
            released=len(recovery.released),
            failed_workers=len(retired),
        )
        return list(recovery.queued)

    def _fold_log(self) -> bool:
        """Fold the workload events appended since the last call; whether any moved a workload
        this process had not moved itself."""
        moved = False
        gaps: set[str] = set()
        try:
            for page in read_workload_events(self._store, after=self._followed):
                with self._lock:
                    for record in page:
                        try:
                            moved = self._ledger.fold(record) is not None or moved
                        except LookupError as e:
                            gaps.add(str(e.args[0]))
                self._followed = page[-1].global_position
            for workload_id in gaps:
                version, state = read_workload(self._store, workload_id)
                with self._lock:
                    self._ledger.put(workload_id, version, state)
        except StoreUnavailable as e:
            raise LogUnavailable(f"could not read the workloads back: {e}") from e
        return moved or bool(gaps)

    def _failed_machines(self) -> list[str]:
        """Pending workers whose machines failed, newly noticed: retired from the book's names."""
        if self._machines is None:
            return []
        with self._lock:
            names = [w.name for w in self._waiting.workers() if w.name not in self._retired]
        failed = []
        for name in names:
            status = self._machines.status(_request_id(name))
            if status is not None and status[0] == "failed":
                failed.append(name)
        if failed:
            log.warning(
                "machines asked for overflow failed; their workloads are planned again",
                workers=failed,
            )
            with self._lock:
                self._retired |= frozenset(failed)
        return failed

    def status(self, workload_id: str) -> WorkloadStatus:
        """Where ``workload_id`` stands; :class:`UnknownWorkload` if nowhere."""
        with self._lock:
            known = self._statuses.get(workload_id)
        if known is not None:
            return known
        node = self._nodes.node_of(workload_id)
        if node is None:
            with self._lock:
                recorded = self._ledger.state(workload_id)
            node = recorded.node if recorded.phase == "placed" else None
        if node is not None:
            return WorkloadStatus(workload_id, "placed", node=node)
        raise UnknownWorkload(f"no workload {workload_id} was submitted or is placed on a node")

    def wait(self, workload_id: str, *, timeout: float) -> WorkloadStatus:
        """:meth:`status`, once it is no longer ``queued`` or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                current = self._statuses.get(workload_id)
                left = deadline - time.monotonic()
                if current is None or current.state != "queued" or left <= 0:
                    break
                self._lock.wait(left)
        return self.status(workload_id)

    def release_each(
        self, workload_ids: Sequence[str], *, discard: Callable[[str], bool] | None = None
    ) -> dict[str, PlacementError]:
        """:meth:`release` each of ``workload_ids``, the placed ones in one append for all of
        them and their nodes (a round of departures is one commit, not one each). The
        workloads that could not be released, with the error :meth:`release` would raise;
        the others are released."""
        placed: list[tuple[str, str]] = []
        errors: dict[str, PlacementError] = {}
        others: list[str] = []
        for workload_id in workload_ids:
            try:
                current = self.status(workload_id)
            except UnknownWorkload as e:
                errors[workload_id] = e
                continue
            if current.state == "placed" and current.node is not None:
                placed.append((workload_id, current.node))
            else:
                others.append(workload_id)
        errors.update(self._release_placed_each(placed))
        self._mark_released([w for w, _ in placed if w not in errors])
        for workload_id in others:
            try:
                self.release(workload_id, discard=discard)
            except PlacementError as e:
                errors[workload_id] = e
        return errors

    def release(self, workload_id: str, *, discard: Callable[[str], bool] | None = None) -> None:
        """Return the workload's capacity — from its node, from the worker it waits for, or
        from the backlog — and record the release on its stream (for a placed workload in the
        same append as its node's ``PodDeleted``)."""
        current = self.status(workload_id)
        if current.state == "placed" and current.node is not None:
            self._release_placed(workload_id, current.node)
        else:
            # Held against the batch thread: a batch that took the workload from the backlog
            # either placed it already (released from its node, below) or will skip it.
            with self._batch_lock:
                current = self.status(workload_id)
                if current.state == "placed" and current.node is not None:
                    self._release_placed(workload_id, current.node)
                else:
                    self._record_release(workload_id)
                    if current.state == "pending-provisioning":
                        with self._lock:
                            request = self._requests.get(workload_id)
                            if request is not None:
                                self._waiting.unwait(request)
                    elif current.state == "queued" and discard is not None:
                        discard(workload_id)
        self._mark_released([workload_id])

    def _mark_released(self, workload_ids: Sequence[str]) -> None:
        with self._lock:
            for workload_id in workload_ids:
                self._statuses[workload_id] = WorkloadStatus(workload_id, "released")
            self._lock.notify_all()

    def _record_release(self, workload_id: str) -> None:
        for _ in range(self._retry.conflict_attempts):
            appends, decided = self._release_appends(workload_id)
            if not appends:
                return
            try:
                self._append(appends)
            except WrongExpectedVersion as e:
                self._reload(e)
                continue
            self._recorded(decided)
            return
        raise LogUnavailable(f"{workload_id}'s stream kept changing; release it again")

    def _release_placed(self, workload_id: str, node: str) -> None:
        error = self._release_placed_each([(workload_id, node)]).get(workload_id)
        if error is not None:
            raise error

    def _release_placed_each(
        self, placed: Sequence[tuple[str, str]]
    ) -> dict[str, PlacementError | LogUnavailable]:
        """Release each placed ``(workload, node)``: its node's ``PodDeleted`` and its own
        release, all of them in one append. The workloads that could not be released, with
        why; the rest are released."""
        by_node: dict[str, list[str]] = {}
        for workload_id, node in placed:
            by_node.setdefault(node, []).append(workload_id)
        errors: dict[str, PlacementError | LogUnavailable] = {}

        def the_rest_failed(error: LogUnavailable) -> dict[str, PlacementError | LogUnavailable]:
            """Nothing was appended: every workload its node did not refuse gets ``error``."""
            return {w: error for w, _ in placed if w not in errors} | errors

        # A stream is decided on as hosted once it holds what this service appended to it;
        # after a conflict it is read back whole.
        stale: set[str] = set()
        for _ in range(self._retry.conflict_attempts):
            try:
                decided_nodes = self._decide_deletions(by_node, stale, errors)
            except StoreUnavailable as e:
                named = ", ".join(w for w, _ in placed[:3]) + (", …" if len(placed) > 3 else "")
                return the_rest_failed(LogUnavailable(f"could not release {named}: {e}"))
            appends: list[StreamAppend] = []
            decided: dict[str, tuple[int, Workload]] = {}
            for node, (version, events, released) in decided_nodes.items():
                if events:
                    causes = [f"release:{workload_id}" for workload_id in released]
                    appends.append(node_append(node, version, events, causes, writer=self._writer))
            for workload_id in (w for ids in by_node.values() for w in ids):
                if workload_id in errors:
                    continue
                more, state = self._release_appends(workload_id)
                appends.extend(more)
                decided.update(state)
            if not appends:
                return errors
            try:
                self._append(appends)
            except WrongExpectedVersion as e:
                moved = node_of_stream(e.stream_id)
                if moved is None:
                    self._reload(e)
                else:
                    stale.add(moved)
                continue
            except LogUnavailable as e:
                return the_rest_failed(e)
            self._recorded(decided)
            self._fold_deletions(decided_nodes, appends)
            return errors
        return the_rest_failed(
            LogUnavailable(
                f"nodes {', '.join(sorted(by_node))} kept changing while their workloads were "
                "released; release them again"
            )
        )

    def _decide_deletions(
        self,
        by_node: Mapping[str, list[str]],
        stale: set[str],
        errors: dict[str, PlacementError | LogUnavailable],
    ) -> dict[str, tuple[int, list[NodeEvent], list[str]]]:
        """Per node: the version decided on, the ``PodDeleted`` events of its workloads and
        which workloads they release; a workload its node refuses goes into ``errors``."""
        at = self._clock.now()
        decided: dict[str, tuple[int, list[NodeEvent], list[str]]] = {}
        for node, workload_ids in by_node.items():
            stream = self._nodes.stream(node)
            known = self._known.get(node)
            if node in stale or known is None:
                stream.load()
            else:
                # Holding this service's own reservations is all a release needs of the
                # hosted stream: a DeletePod decided on a state without the pod would release
                # nothing. Another writer's events make the append conflict (read back then).
                stream.load(through_version=known[0])
            version, state = stream.version, stream.state
            events: list[NodeEvent] = []
            released: list[str] = []
            for workload_id in workload_ids:
                try:
                    deleted = nodes.decide(state, DeletePod(workload_id, at=at))
                except Rejected as e:
                    errors[workload_id] = PlacementError(
                        f"node {node} could not release {workload_id}: {e}"
                    )
                    continue
                for event in deleted:
                    state = nodes.evolve(state, event)
                events.extend(deleted)
                released.extend([workload_id] * len(deleted))
            decided[node] = (version, events, released)
        return decided

    def _fold_deletions(
        self,
        decided: Mapping[str, tuple[int, list[NodeEvent], list[str]]],
        appends: Sequence[StreamAppend],
    ) -> None:
        """Hand the committed ``PodDeleted`` events to their hosted streams (their pod index
        forgets the workloads), reading back only a stream that moved meanwhile."""
        records = {append.stream_id: append.events for append in appends}
        for node, (version, events, _) in decided.items():
            if not events:
                continue
            stream = self._nodes.stream(node)
            ids = [str(record.event_id) for record in records[nodes.stream_id(node)]]
            if stream.fold_committed(events, first_version=version + 1, event_ids=ids):
                continue
            try:
                stream.load()
            except StoreUnavailable as e:
                # Released in the log all the same; the next load folds it.
                log.warning("released; the node's stream will catch up", node=node, error=str(e))

    def _release_appends(
        self, workload_id: str
    ) -> tuple[list[StreamAppend], dict[str, tuple[int, Workload]]]:
        with self._lock:
            command = ReleaseWorkload(workload_id, self._clock.now())
            events, state = self._ledger.decide(workload_id, [command])
            if not events:
                return [], {}
            version = self._ledger.get(workload_id)[0]
            append = self._ledger.append_for(
                workload_id, events, writer=self._writer, cause=f"release:{workload_id}"
            )
        return [append], {workload_id: (version + len(events), state)}

    def _recorded(self, decided: Mapping[str, tuple[int, Workload]]) -> None:
        with self._lock:
            for rid, (version, state) in decided.items():
                self._ledger.put(rid, version, state)

    def joined_waiting(self) -> list[WorkloadRequest]:
        """The workloads waiting for workers that have joined since: the next batch takes them
        first."""
        with self._batch_lock:
            self._refresh()
            return self._joined_waiting()

    def _joined_waiting(self) -> list[WorkloadRequest]:
        """:meth:`joined_waiting` on the view as last refreshed (hold the batch lock)."""
        with self._lock:
            ids = self._waiting.joined(self._view.present)
            return [self._requests[rid] for rid in ids if rid in self._requests]

    # -- the batch ---------------------------------------------------------------------------

    def place_batch(self, requests: Sequence[WorkloadRequest]) -> BatchReport:
        """Plan ``requests`` on one snapshot and commit them in one append (see the module
        docstring). Raises :class:`LogUnavailable` (the batch is requeued) when the log is
        unreachable."""
        with self._batch_lock:
            return self._place(list(requests))

    def _place(
        self, requests: list[WorkloadRequest], *, joined: bool = True, last_try: bool = False
    ) -> BatchReport:
        """Plan and commit ``requests`` (with the workloads waiting for joined workers unless
        ``joined`` is false: a part of a split batch brings its own). A batch the log refuses
        for a value it holds is split (see :meth:`_split`)."""
        at = self._clock.now()
        with self._lock:
            # Released after the batch thread took it from the backlog: nothing to place.
            requests = [
                r
                for r in requests
                if (known := self._statuses.get(r.id)) is None or known.state != "released"
            ]
            for request in requests:
                self._requests.setdefault(request.id, request)
            any_pending = bool(self._waiting)
        if not requests:
            return BatchReport()
        try:
            self._refresh()
        except BaseException:
            self._requeue(requests)
            raise
        waiting = self._joined_waiting() if joined and any_pending else []
        ids = {r.id for r in requests}
        batch = [r for r in waiting if r.id not in ids] + requests
        capacity = self._view.capacity
        try:
            first, pending = self._plan(batch)
        except BaseException:
            # Nothing is decided yet; the batch goes back to the queue rather than out of it
            # unanswered (the joined workloads wait in the book still).
            self._requeue(requests)
            raise
        with self._lock:
            run = _Run(at=at, by_id={r.id: r for r in batch}, result=first, book=self._waiting)
            self._waiting = self._waiting.copy()
            run.placed.update(first.placed)
            self._absorb(first, self._view.base, run.touched, at=at)
            self._planned(run, first, pending)
            # A joined worker's waiting workloads were just planned (on it first): they have
            # this batch's outcomes now, and its capacity is in the snapshot like any node's.
            self._waiting.drop(p.name for p in pending if p.name in capacity)
            self._waiting.record(first, self._requests)
        try:
            self._commit(run)
        except EventStoreError as e:
            if not refusals.refused_by_log(e):
                self._abandon(run)
                raise
            return self._split(run, batch, e, last_try=last_try)
        except PlacementError as e:
            self._abandon(run)
            raise type(e)(f"{e}; the batch's workloads were put back in the queue") from e
        except BaseException:
            # Whatever failed, nothing of the batch is in the log: an acknowledged workload
            # must never leave the queue unanswered.
            self._abandon(run)
            raise
        self._committed(run.touched, run.placed)
        self._fold_reservations(run)
        self._recorded(run.recorded)
        self._answered_elsewhere(run.dropped)
        if run.requeued:
            self._requeue(run.requeued)
        self._provision(run.provisions)
        self._finish(run.result, run.placed, run.requeued)
        return BatchReport(
            requests=len(batch),
            placed=len(run.placed),
            waiting=len(run.result.waiting)
            + sum(len(n.request_ids) for n in run.result.provisions),
            rejected=len(run.result.rejected),
            requeued=len(run.requeued),
            workers_requested=tuple(name for name, _ in run.provisions),
            snapshot_reads=run.reads,
            appends=run.appends,
            conflicts=run.conflicts,
            last_position=run.last_position,
            optimality_gap=run.result.optimality_gap,
        )

    def _plan(
        self, requests: Sequence[WorkloadRequest]
    ) -> tuple[PlacementPlan, tuple[PendingWorker, ...]]:
        """``requests`` planned on the nodes as the view has them and the workers pending now
        (hold the batch lock); the plan, and the pending workers it counted."""
        with self._lock:
            pending = self._waiting.workers()
            retired = self._retired
        result = plan_on(
            requests,
            self._view.capacity,
            pending=pending,
            retired=retired,
            search_steps=self._search_steps,
        )
        return result, pending

    def _commit(self, run: _Run) -> None:
        """Append the batch's reservations and outcomes, planned again on conflicts."""
        while True:
            outcomes = self._outcome_appends(run)  # first: it may take placements out
            run.reservations = node_appends(run.touched, self._writer)
            appends = run.reservations + outcomes
            if not appends:
                return
            try:
                run.appends += 1
                results = self._append(appends)
                run.last_position = results[-1].last_position
                return
            except WrongExpectedVersion as e:
                if node_of_stream(e.stream_id) is not None:
                    self._replan(run, node_of_stream(e.stream_id) or "")
                else:
                    self._outcome_conflict(run, e)

    def _split(
        self, run: _Run, batch: list[WorkloadRequest], error: EventStoreError, *, last_try: bool
    ) -> BatchReport:
        """The log refused the batch's append for a value it holds (see :mod:`.refusals`):
        nothing of it was written. Its halves are placed in turn, each split again while
        refused, so the workloads planned beside the offending value are placed and the
        workload it belongs to, once alone, is rejected with the reason."""
        with self._lock:
            self._waiting = run.book
        if len(batch) == 1:
            # A database refusal may have been another writer's value sharing the store's group
            # commit: a workload is rejected only once its append was refused with it alone.
            if last_try or refusals.decided_before_sending(error):
                return self._refuse(batch[0], error)
            return self._place(batch, joined=False, last_try=True)
        log.warning(
            "the event log refused a batch's append; placing it in halves",
            workloads=len(batch),
            error=refusals.describe(error),
        )
        middle = len(batch) // 2
        halves = (batch[:middle], batch[middle:])
        reports = []
        for index, half in enumerate(halves):
            try:
                reports.append(self._place(half, joined=False))
            except BaseException:
                for later in halves[index + 1 :]:
                    self._requeue(later)
                raise
        return _summed(reports, appends=run.appends, reads=run.reads)

    def _refuse(self, request: WorkloadRequest, error: EventStoreError) -> BatchReport:
        """Reject ``request``, whose outcome the log refused to record even alone, with a
        reason it can store (the value it refused is never quoted). Should the log refuse
        that too, the fault is not the workload's: it goes back to the queue."""
        rid = request.id
        reason = refusals.reason(rid, error)
        log.error(
            "the event log refuses a workload's outcome; it is rejected",
            workload=rid[:64],
            error=refusals.describe(error),
        )
        for attempt in range(1, self._retry.conflict_attempts + 1):
            with self._lock:
                version, known = self._ledger.get(rid)
                events, state = (
                    ([], known)
                    if known.phase == "new"
                    else self._ledger.decide(rid, [RecordRejection(rid, reason, self._clock.now())])
                )
            if known.phase == "new" or not events:
                # Never submitted (nothing in the log to answer), or answered meanwhile by
                # another process (placed or released): the log's answer stands.
                self._rejected_in_memory(request, reason, answered=known.phase != "new")
                return BatchReport(requests=1, rejected=int(known.phase == "new"))
            term = self._writer.fencing.term()
            append = self._ledger.append_for(
                rid, events, writer=self._writer, cause=f"refused:{rid}", term=term
            )
            try:
                self._append([append])
            except WrongExpectedVersion as e:
                self._reload(e)
                continue
            except BaseException as e:
                self._requeue([request])
                if isinstance(e, EventStoreError):
                    raise PlacementError(
                        f"the event log refuses even a short rejection of workload "
                        f"{rid[:64]} ({refusals.describe(e)}); it stays queued"
                    ) from e
                raise
            self._recorded({rid: (version + len(events), state)})
            self._rejected_in_memory(request, reason, answered=False)
            return BatchReport(requests=1, rejected=1, appends=attempt)
        self._requeue([request])
        raise LogUnavailable(f"workload {rid[:64]}'s stream kept changing while it was rejected")

    def _rejected_in_memory(self, request: WorkloadRequest, reason: str, *, answered: bool) -> None:
        """``request`` is answered: rejected with ``reason``, or (``answered``) as its stream
        in the log says."""
        with self._lock:
            known = self._ledger.state(request.id)
            if not answered:
                status = WorkloadStatus(request.id, "rejected", reason=reason)
            elif known.phase == "placed":
                status = WorkloadStatus(request.id, "placed", node=known.node)
            elif known.phase == "rejected":
                status = WorkloadStatus(request.id, "rejected", reason=known.reason)
            else:
                status = WorkloadStatus(request.id, "released")
            self._statuses[request.id] = status
            self._requests.pop(request.id, None)
            self._waiting.unwait(request)
            self._lock.notify_all()

    def _planned(self, run: _Run, result: PlacementPlan, pending: Iterable[PendingWorker]) -> None:
        """Note the workers ``result`` sends workloads to, and the new ones to request."""
        run.pools.update((p.name, p.pool) for p in pending)
        for new in result.provisions:
            run.pools[new.name] = new.pool
            run.provisions.append((new.name, new.pool))

    def _outcome_appends(self, run: _Run) -> list[StreamAppend]:
        """One append per submitted workload of the batch: placed, waiting or rejected. A
        placement the workload's stream refuses (another process placed or released it since)
        is taken out of the batch."""
        outcomes: dict[str, WorkloadCommand] = {}
        for rid, worker in run.result.waiting.items():
            outcomes[rid] = RecordWaiting(rid, worker, run.pools[worker], run.at)
        for new in run.result.provisions:
            for rid in new.request_ids:
                outcomes[rid] = RecordWaiting(rid, new.name, new.pool, run.at)
        for rid, reason in run.result.rejected.items():
            outcomes[rid] = RecordRejection(rid, reason, run.at)
        if self._record_placements:
            for rid, node in run.placed.items():
                outcomes[rid] = RecordPlacement(rid, node, run.at)
        for request in run.requeued:
            outcomes.pop(request.id, None)
        term = self._writer.fencing.term()
        appends = []
        run.recorded.clear()
        with self._lock:
            for rid, command in outcomes.items():
                if self._ledger.state(rid).phase == "new":
                    continue  # never submitted (planned directly): nothing acknowledged to keep
                try:
                    events, state = self._ledger.decide(rid, [command])
                except Rejected as e:
                    log.info("placement left to the log's answer", workload=rid, reason=e.reason)
                    self._drop(run, rid)
                    run.dropped.append(rid)
                    continue
                if not events:
                    continue
                appends.append(
                    self._ledger.append_for(
                        rid, events, writer=self._writer, cause=f"batch:{rid}", term=term
                    )
                )
                run.recorded[rid] = (self._ledger.get(rid)[0] + len(events), state)
        return appends

    def _drop(self, run: _Run, workload_id: str) -> None:
        """Take a planned placement out of the batch (its node keeps the rest)."""
        node = run.placed.pop(workload_id, None)
        batch = run.touched.get(node) if node is not None else None
        if node is not None and batch is not None:
            batch.without(workload_id)
            if not batch.commands:
                del run.touched[node]

    def _outcome_conflict(self, run: _Run, conflict: WrongExpectedVersion) -> None:
        """Another writer moved a workload's stream (released or placed it): read it back and
        decide its outcome again; after too many, it goes back to the queue."""
        run.conflicts += 1
        workload_id = self._reload(conflict)
        if run.conflicts > self._max_retries and workload_id in run.by_id:
            request = run.by_id[workload_id]
            self._drop(run, workload_id)
            run.requeued.append(request)
            with self._lock:
                self._waiting.unwait(request)

    def _replan(self, run: _Run, node: str) -> None:
        """Another writer moved ``node``: plan its requests again, and only those."""
        run.conflicts += 1
        lost = run.touched.pop(node, None)
        if lost is None:
            raise PlacementError(f"the log reported a conflict on {node!r}, outside the batch")
        moved = [run.by_id[c.spec.name] for c in lost.commands]
        for request in moved:
            run.placed.pop(request.id, None)
        self._nodes.stream(node).load()
        if run.conflicts > self._max_retries:
            run.requeued.extend(moved)
            return
        # On the conflicting node's fresh state, and every other node as this batch leaves it.
        self._refresh()
        run.reads += 1
        capacity = self._view.capacity
        left: list[Worker] = []
        for name, batch in run.touched.items():
            before = capacity.get(name)
            if before is None:
                continue
            left.append(before)
            after = worker_of(
                batch.decided()[2], version=before.version, pool=before.pool, status=before.status
            )
            capacity.put(after)
        try:
            again, pending = self._plan(moved)
        finally:
            for before in left:
                capacity.put(before)
        run.placed.update(again.placed)
        self._absorb(again, self._view.base, run.touched, at=run.at)
        with self._lock:
            self._planned(run, again, pending)
            self._waiting.record(again, self._requests)
        run.result = _merged(run.result, again)

    def _abandon(self, run: _Run) -> None:
        """The append failed for good: nothing of the batch is in the log, so nothing of it is
        answered. Every workload goes back to the queue, the book of pending workers is as it
        was before the batch, and no machine is asked for."""
        back = list(run.by_id.values())
        with self._lock:
            self._waiting = run.book
        run.placed.clear()
        self._requeue(back)

    def _absorb(
        self,
        result: PlacementPlan,
        base_of: Callable[[str], NodeBatch],
        touched: dict[str, NodeBatch],
        *,
        at: datetime,
    ) -> None:
        for node, placed in result.reservations.items():
            base = touched.get(node)
            if base is None:
                base = touched[node] = base_of(node)
            base.extend(reservation(request, at=at) for request in placed)

    def _committed(self, touched: Mapping[str, NodeBatch], placed: Mapping[str, str]) -> None:
        with self._lock:
            for node, batch in touched.items():
                events, _, after = batch.decided()
                self._known[node] = (batch.version + len(events), after)
                self._view.changed(node)
            for rid, node in placed.items():
                self._statuses[rid] = WorkloadStatus(rid, "placed", node=node)
                request = self._requests.pop(rid, None)
                if request is not None:
                    self._waiting.unwait(request)  # a repeat of a waiting workload, now placed

    def _fold_reservations(self, run: _Run) -> None:
        """Hand the committed reservations to the hosted node streams, so that they need not
        read them back: a release, an agent's request or a sync pass on the node next decides
        on a stream that holds them. A stream that moved meanwhile reads them when next
        loaded."""
        for append in run.reservations:
            node = node_of_stream(append.stream_id)
            assert node is not None
            batch = run.touched[node]
            events, _, _ = batch.decided()
            self._nodes.stream(node).fold_committed(
                events,
                first_version=batch.version + 1,
                event_ids=[str(record.event_id) for record in append.events],
            )

    def _answered_elsewhere(self, workload_ids: Sequence[str]) -> None:
        """Workloads another process placed or released meanwhile: their status is the log's."""
        with self._lock:
            for rid in workload_ids:
                known = self._ledger.state(rid)
                if known.phase == "placed":
                    self._statuses[rid] = WorkloadStatus(rid, "placed", node=known.node)
                elif known.phase == "released":
                    self._statuses[rid] = WorkloadStatus(rid, "released")
                request = self._requests.pop(rid, None)
                if request is not None:
                    self._waiting.unwait(request)

    def _provision(self, workers: Sequence[tuple[str, str]]) -> None:
        """Ask for ``(name, pool)`` workers; the request id is the name's, so asking again for
        the same worker is a repeat the Grouper answers with the first request."""
        if not workers or self._machines is None:
            return
        pools = {p.name: p for p in self._pools}
        requests = [
            MachineRequest(
                machine_name=name,
                template=pools[pool].template,
                tags={"fleetledger-pool": pool},
                request_id=_request_id(name),
            )
            for name, pool in workers
            if pool in pools
        ]
        try:
            self._machines.request(requests)
        except Exception as e:
            # The workloads keep waiting for these workers; a lost request is logged loudly so
            # the operator can re-drive provisioning (a restart sends it again), never silently
            # treated as a success.
            log.error(
                "machine requests for overflow failed",
                workers=[r.machine_name for r in requests],
                error=str(e),
            )

    def _finish(
        self,
        result: PlacementPlan,
        placed: Mapping[str, str],
        requeued: Sequence[WorkloadRequest],
    ) -> None:
        back = {r.id for r in requeued}
        with self._lock:
            for rid, worker in self._waiting.waiting():
                if rid not in placed and rid not in back:
                    self._statuses[rid] = WorkloadStatus(rid, "pending-provisioning", worker=worker)
            for rid, reason in result.rejected.items():
                if rid in back:
                    continue
                self._statuses[rid] = WorkloadStatus(rid, "rejected", reason=reason)
                self._requests.pop(rid, None)
            self._lock.notify_all()

    def _requeue(self, requests: Sequence[WorkloadRequest]) -> None:
        with self._lock:
            for request in requests:
                self._statuses[request.id] = WorkloadStatus(request.id, "queued")
        if self.requeue is not None:
            self.requeue(requests)


def _request_id(worker: str) -> str:
    """The machine request of an overflow worker: one per name, so asking again is a repeat."""
    return f"placement-{worker}"


def _unique(requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
    """``requests`` without repeats; an id given twice with different requests is refused."""
    seen: dict[str, WorkloadRequest] = {}
    for request in requests:
        first = seen.setdefault(request.id, request)
        if first != request:
            raise WorkloadConflict(
                f"workload {request.id} is given twice with different requests; send one"
            )
    return list(seen.values())


def _summed(reports: Sequence[BatchReport], *, appends: int, reads: int) -> BatchReport:
    """The reports of a split batch's parts as one, with the refused whole's own cost."""
    positions = [r.last_position for r in reports if r.last_position is not None]
    return BatchReport(
        requests=sum(r.requests for r in reports),
        placed=sum(r.placed for r in reports),
        waiting=sum(r.waiting for r in reports),
        rejected=sum(r.rejected for r in reports),
        requeued=sum(r.requeued for r in reports),
        workers_requested=tuple(w for r in reports for w in r.workers_requested),
        snapshot_reads=reads + sum(r.snapshot_reads for r in reports),
        appends=appends + sum(r.appends for r in reports),
        conflicts=sum(r.conflicts for r in reports),
        last_position=max(positions) if positions else None,
        optimality_gap=sum(r.optimality_gap for r in reports),
    )


def _merged(first: PlacementPlan, again: PlacementPlan) -> PlacementPlan:
    return replace(
        first,
        placed={**first.placed, **again.placed},
        waiting={**first.waiting, **again.waiting},
        provisions=(*first.provisions, *again.provisions),
        rejected={**first.rejected, **again.rejected},
        optimality_gap=first.optimality_gap + again.optimality_gap,
    )
