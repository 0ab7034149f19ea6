"""The placement service: a batch planned on one snapshot and committed in one append.

:meth:`PlacementService.place_batch` is seed 02's ``processBatch`` on the log:

1. **one snapshot** of every hosted node — its folded state and stream version, from memory (the
   node service's hosted streams, or this service's own fold of what it committed, whichever is
   newer; the version is read before the state, so a state newer than its version can only cause
   a conflict, never an overbooking);
2. the pure :func:`~fleetledger.domain.placement.plan`;
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

Placements are facts in the node streams (the pod is the workload id), so :meth:`status` finds
a placed workload after a restart. Waiting and rejected workloads are kept in memory only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, Protocol

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.machines import MachineRequest
from fleetledger.adapters.nodes import LogUnavailable as NodesUnavailable
from fleetledger.adapters.nodes import NodesError, NodeService, node_of_stream
from fleetledger.adapters.runtime import LogUnavailable as HostUnavailable
from fleetledger.adapters.runtime import RetryPolicy, Writer, append_decision
from fleetledger.domain.nodes import DeletePod, NodeState
from fleetledger.domain.placement import (
    NewWorker,
    PendingWorker,
    PlacementPlan,
    Pool,
    Snapshot,
    Worker,
    WorkerStatus,
    WorkloadRequest,
    plan,
    worker_of,
)
from fleetledger.eventstore import (
    EventStore,
    Fenced,
    StoreUnavailable,
    WrongExpectedVersion,
)

from .commit import NodeBatch, node_appends
from .errors import LogUnavailable, PlacementError, RuntimeStopped, UnknownWorkload
from .waiting import WaitingBook

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
    (:class:`fleetledger.adapters.machines.MachineService`) or a fake."""

    def request(self, requests: Sequence[MachineRequest]) -> object: ...


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
    """What one batch did, and what it cost: snapshots read and appends sent (retries count)."""

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
    placed: dict[str, str] = field(default_factory=dict)
    touched: dict[str, NodeBatch] = field(default_factory=dict)
    provisions: list[NewWorker] = field(default_factory=list)
    requeued: list[WorkloadRequest] = field(default_factory=list)
    reads: int = 1
    appends: int = 0
    conflicts: int = 0
    last_position: int | None = None


class PlacementService:
    """Plans and commits batches of workload requests; ``place_batch`` is serialised, the rest
    is thread-safe."""

    def __init__(
        self,
        store: EventStore,
        nodes_service: NodeService,
        pools: Sequence[Pool],
        *,
        clock: Clock,
        machines: MachineRequester | None = None,
        pool_of: Callable[[str], str | None] | None = None,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
        max_conflict_retries: int = 5,
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
        self._batch_lock = threading.Lock()
        self._lock = threading.Condition()
        self._known: dict[str, tuple[int, NodeState]] = {}
        # Only the batch thread reads and writes this: the last snapshot's view of each node.
        self._cache: dict[str, tuple[int, NodeState, Worker]] = {}
        self._worker_status: dict[str, WorkerStatus] = {}
        self._statuses: dict[str, WorkloadStatus] = {}
        self._requests: dict[str, WorkloadRequest] = {}
        self._waiting = WaitingBook(pools)
        self.requeue: Callable[[Sequence[WorkloadRequest]], None] | None = None

    @property
    def pools(self) -> tuple[Pool, ...]:
        return self._pools

    @property
    def nodes_service(self) -> NodeService:
        return self._nodes

    # -- workers -----------------------------------------------------------------------------

    def set_worker_status(self, node: str, status: WorkerStatus) -> None:
        """Mark a worker draining or disabled (no new workloads), or available again."""
        with self._lock:
            self._worker_status[node] = status

    def pending_workers(self) -> tuple[PendingWorker, ...]:
        """Workers requested and not yet joined, with the workloads waiting for them."""
        with self._lock:
            return self._waiting.workers()

    def snapshot(self) -> tuple[Snapshot, dict[str, NodeBatch]]:
        """Every hosted node's free capacity, read once (see the module docstring).

        A node whose version has not moved since the last snapshot is not read again: its
        worker is reused, which keeps a snapshot of 1,000 quiet nodes to a version check each.
        """
        bases: dict[str, NodeBatch] = {}
        workers = []
        with self._lock:
            known = dict(self._known)
            statuses = dict(self._worker_status)
            pending = self._waiting.workers()
        for name in self._nodes.hosted():
            stream = self._nodes.stream(name)
            version = stream.version
            mine = known.get(name)
            if mine is not None and mine[0] >= version:
                version = mine[0]
            cached = self._cache.get(name)
            if cached is not None and cached[0] == version:
                _, state, worker = cached
            else:
                state = mine[1] if mine is not None and mine[0] == version else stream.state
                pool = self._pool_of(name)
                if pool is None or not state.present:
                    continue
                worker = worker_of(state, version=version, pool=pool)
                self._cache[name] = (version, state, worker)
            status = statuses.get(name, "available")
            bases[name] = NodeBatch(state, version)
            workers.append(worker if status == "available" else replace(worker, status=status))
        return Snapshot(workers=tuple(workers), pending=pending), bases

    # -- requests ----------------------------------------------------------------------------

    def accept(self, requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
        """Record ``requests`` as queued; the ones to queue. A workload already queued, waiting
        or placed is not taken twice (a re-sent request is answered by the first); a rejected
        or released one may be sent again."""
        fresh: list[WorkloadRequest] = []
        with self._lock:
            for request in requests:
                known = self._statuses.get(request.id)
                if known is not None and known.state not in ("rejected", "released"):
                    continue
                if known is None and self._nodes.node_of(request.id) is not None:
                    continue
                self._requests[request.id] = request
                self._statuses[request.id] = WorkloadStatus(request.id, "queued")
                fresh.append(request)
            self._lock.notify_all()
        return fresh

    def status(self, workload_id: str) -> WorkloadStatus:
        """Where ``workload_id`` stands; :class:`UnknownWorkload` if nowhere."""
        with self._lock:
            known = self._statuses.get(workload_id)
        if known is not None:
            return known
        node = self._nodes.node_of(workload_id)
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

    def release(self, workload_id: str, *, discard: Callable[[str], bool] | None = None) -> None:
        """Return the workload's capacity: from its node (through the node's stream), from the
        worker it waits for, or from the backlog."""
        current = self.status(workload_id)
        if current.state == "placed" and current.node is not None:
            node = current.node
            try:
                # The node's hosted stream may not have folded this service's own append yet;
                # a DeletePod decided on that state would find no pod and release nothing.
                self._nodes.stream(node).load()
                self._nodes.execute(
                    node,
                    lambda at: [DeletePod(workload_id, at=at)],
                    cause=f"release:{workload_id}",
                )
            except (NodesUnavailable, StoreUnavailable) as e:
                raise LogUnavailable(f"could not release {workload_id}: {e}") from e
            except NodesError as e:
                raise PlacementError(f"node {node} could not release {workload_id}: {e}") from e
        elif current.state == "pending-provisioning":
            with self._lock:
                request = self._requests.get(workload_id)
                if request is not None:
                    self._waiting.unwait(request)
        elif current.state == "queued" and discard is not None:
            discard(workload_id)
        with self._lock:
            self._statuses[workload_id] = WorkloadStatus(workload_id, "released")
            self._lock.notify_all()

    def joined_waiting(self) -> list[WorkloadRequest]:
        """The workloads waiting for workers that have joined since: the next batch takes them
        first."""
        present = {name for name, state in self._nodes.hosted().items() if state.present}
        with self._lock:
            ids = self._waiting.joined(present)
            return [self._requests[rid] for rid in ids if rid in self._requests]

    # -- the batch ---------------------------------------------------------------------------

    def place_batch(self, requests: Sequence[WorkloadRequest]) -> BatchReport:
        """Plan ``requests`` on one snapshot and commit them in one append (see the module
        docstring). Raises :class:`LogUnavailable` (the batch is requeued) when the log is
        unreachable."""
        with self._batch_lock:
            return self._place(list(requests))

    def _place(self, requests: list[WorkloadRequest]) -> BatchReport:
        at = self._clock.now()
        if not requests:
            return BatchReport()
        with self._lock:
            for request in requests:
                self._requests.setdefault(request.id, request)
            any_pending = bool(self._waiting)
        joined = self.joined_waiting() if any_pending else []
        ids = {r.id for r in requests}
        batch = [r for r in joined if r.id not in ids] + requests
        snapshot, bases = self.snapshot()
        first = plan(batch, snapshot, self._pools, at=at)
        run = _Run(at=at, by_id={r.id: r for r in batch}, result=first)
        run.placed.update(first.placed)
        self._absorb(first, bases, run.touched)
        run.provisions.extend(first.provisions)
        with self._lock:
            # A joined worker's waiting workloads were just planned (on it first): they have
            # this batch's outcomes now, and its capacity is in the snapshot like any node's.
            self._waiting.drop(w.name for w in snapshot.workers)
            self._waiting.record(first, self._requests)
        while run.touched:
            try:
                run.appends += 1
                results = append_decision(
                    self._store,
                    node_appends(run.touched, self._writer),
                    clock=self._clock,
                    policy=self._retry,
                )
                run.last_position = results[-1].last_position
                break
            except WrongExpectedVersion as e:
                self._replan(run, node_of_stream(e.stream_id) or "")
            except Fenced as e:
                self._writer.fencing.deposed(e)
                self._abandon(run)
                raise RuntimeStopped(
                    f"a newer leader holds the log ({e}); the batch's placements were put back "
                    "in the queue"
                ) from e
            except (StoreUnavailable, HostUnavailable) as e:
                self._abandon(run)
                raise LogUnavailable(
                    f"the event log is unreachable ({e}); the batch's placements were put back "
                    "in the queue"
                ) from e
        self._committed(run.touched, run.placed)
        if run.requeued:
            self._requeue(run.requeued)
        self._provision(run.provisions)
        self._finish(run.result, run.placed, run.requeued)
        return BatchReport(
            requests=len(batch),
            placed=len(run.placed),
            waiting=len(run.result.waiting) + sum(len(n.request_ids) for n in run.provisions),
            rejected=len(run.result.rejected),
            requeued=len(run.requeued),
            workers_requested=tuple(n.name for n in run.provisions),
            snapshot_reads=run.reads,
            appends=run.appends,
            conflicts=run.conflicts,
            last_position=run.last_position,
        )

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
        snapshot, fresh = self.snapshot()
        run.reads += 1
        fresh.update(run.touched)
        snapshot = replace(
            snapshot,
            workers=tuple(
                worker_of(
                    fresh[w.name].decided()[2], version=w.version, pool=w.pool, status=w.status
                )
                if w.name in run.touched
                else w
                for w in snapshot.workers
            ),
        )
        again = plan(moved, snapshot, self._pools, at=run.at)
        run.placed.update(again.placed)
        self._absorb(again, fresh, run.touched)
        run.provisions.extend(again.provisions)
        with self._lock:
            self._waiting.record(again, self._requests)
        run.result = _merged(run.result, again)

    def _abandon(self, run: _Run) -> None:
        """The append failed for good: the planned placements go back to the queue; overflow
        stands (its workers are requested), rejections are answered."""
        back = [run.by_id[rid] for rid in run.placed]
        run.placed.clear()
        self._provision(run.provisions)
        self._finish(run.result, run.placed, back)
        self._requeue(back)

    def _absorb(
        self,
        result: PlacementPlan,
        bases: Mapping[str, NodeBatch],
        touched: dict[str, NodeBatch],
    ) -> None:
        for node, commands in result.reservations.items():
            base = touched.get(node)
            if base is None:
                source = bases[node]
                base = touched[node] = NodeBatch(source.state, source.version)
            base.extend(commands)

    def _committed(self, touched: Mapping[str, NodeBatch], placed: Mapping[str, str]) -> None:
        with self._lock:
            for node, batch in touched.items():
                events, _, after = batch.decided()
                self._known[node] = (batch.version + len(events), after)
            for rid, node in placed.items():
                self._statuses[rid] = WorkloadStatus(rid, "placed", node=node)
                request = self._requests.pop(rid, None)
                if request is not None:
                    self._waiting.unwait(request)  # a repeat of a waiting workload, now placed

    def _provision(self, provisions: Sequence[NewWorker]) -> None:
        if not provisions or self._machines is None:
            return
        pools = {p.name: p for p in self._pools}
        requests = [
            MachineRequest(
                machine_name=new.name,
                template=pools[new.pool].template,
                tags={"fleetledger-pool": new.pool},
                request_id=f"placement-{new.name}",
            )
            for new in provisions
        ]
        try:
            self._machines.request(requests)
        except Exception as e:
            # The workloads keep waiting for these workers; a lost request is logged loudly so
            # the operator can re-drive provisioning, never silently treated as a success.
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
                self._statuses[rid] = WorkloadStatus(rid, "rejected", reason=reason)
                self._requests.pop(rid, None)
            self._lock.notify_all()

    def _requeue(self, requests: Sequence[WorkloadRequest]) -> None:
        with self._lock:
            for request in requests:
                self._statuses[request.id] = WorkloadStatus(request.id, "queued")
        if self.requeue is not None:
            self.requeue(requests)


def _merged(first: PlacementPlan, again: PlacementPlan) -> PlacementPlan:
    return replace(
        first,
        placed={**first.placed, **again.placed},
        waiting={**first.waiting, **again.waiting},
        provisions=(*first.provisions, *again.provisions),
        rejected={**first.rejected, **again.rejected},
    )
