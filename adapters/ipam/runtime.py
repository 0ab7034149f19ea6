"""The assembled pod-IP capability: subnet service, allocator reactions, read model.

``IpamRuntime`` wires the subnets of one database to one allocator::

    config = IpamConfig(x_nsf=2, x_ssf=0.9, max_ips=250)  # seed 03's factors; validated here
    with IpamRuntime(store, allocator, config=config) as ipam:  # read model, follow, lead
        ipam.service.create("pods-a", 1024)
        ipam.service.join("pods-a", ["node-1", "node-2"], max_ips={"node-2": 30})  # max pods
        ipam.service.report_demand("pods-a", "node-1", 12)
        ipam.projection.view("pods-a")                    # what GET /v1/subnets/pods-a shows

While it leads, a reactor hears of every allocator call the subnets ask for and a single worker
makes them in log order (so the allocator frees a gone node's IPs before handing them out again),
recording each answer as a leader duty; on becoming leader it first settles every subnet, which
finishes the calls an earlier leader left unrecorded (:mod:`~fleetledger.adapters.ipam.reactions`).

With a :class:`~fleetledger.adapters.runtime.leadership.Leadership` several processes share one
database: each accepts commands, only the elected one calls the allocator, and its recorded
answers carry its term. Without one the process simply leads. With a ``shard`` (a partition of
the subnets, by subnet id, led by a :class:`Leadership` of that shard) the leader settles only
that partition's subnets, from a checkpoint of its own, and its answers carry the shard's name
beside its term, fenced against that shard alone; commands and the read model stay whole: any
process takes any node's report (docs/SCALING.md, "Leadership per shard").

``threads=False`` runs nothing by itself: tests and the simulator call :meth:`IpamRuntime.step`
when they choose.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import structlog

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.adapters.runtime import (
    DutyFencing,
    LogFollower,
    NoFencing,
    RetryPolicy,
    Shard,
    ThreadRunner,
    Writer,
)
from fleetledger.adapters.runtime.duties import Duties
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.adapters.runtime.reactors import Reactors
from fleetledger.adapters.runtime.shards import check_runtime_shard
from fleetledger.domain.ipam import IpamConfig
from fleetledger.eventstore import EventStore
from fleetledger.projections._reading import bulk_read
from fleetledger.projections.subnets import SUBNET_EVENT_TYPE_NAMES, SubnetsProjection

from .allocator import IpAllocator
from .reactions import SubnetReactions
from .service import SubnetService

__all__ = ["IpamRuntime", "QueuedRunner"]

log = structlog.get_logger(__name__)


class QueuedRunner:
    """Keeps submitted tasks until :meth:`run_pending` runs them, in order (no thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: deque[Callable[[], None]] = deque()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._tasks.append(task)

    def run_pending(self) -> int:
        """Run every task, those submitted meanwhile included; returns how many ran."""
        ran = 0
        while True:
            with self._lock:
                if not self._tasks:
                    return ran
                task = self._tasks.popleft()
            task()
            ran += 1


class IpamRuntime:
    """Every subnet of one store, its allocator calls and its read model."""

    def __init__(
        self,
        store: EventStore,
        allocator: IpAllocator,
        *,
        clock: Clock | None = None,
        config: IpamConfig | None = None,
        threads: bool = True,
        retry: RetryPolicy | None = None,
        actor: str = "fleetledger",
        writer: Writer | None = None,
        leadership: Leadership | None = None,
        manage_leadership: bool = True,
        reactor_poll_seconds: float = 1.0,
        reactor_name: str = "ipam-allocator",
        shard: Shard | None = None,
    ) -> None:
        """``writer`` overrides ``actor`` and the fencing taken from ``leadership``; with
        ``manage_leadership=False`` the leadership is shared with (and started and stopped by)
        another runtime of the same process. ``shard`` needs ``leadership`` of that shard."""
        check_runtime_shard(
            shard, leadership, capability="ipam", runtime="IpamRuntime", aggregate="subnet"
        )
        self.shard = shard
        self.store = store
        self.allocator = allocator
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.leadership = leadership
        self._threads = threads
        self.projection = SubnetsProjection()
        if writer is None:
            writer = Writer(
                actor=actor,
                labels=(("capability", "ipam"),),
                fencing=DutyFencing(leadership) if leadership is not None else NoFencing(),
                recent=self.projection.recent,
            )
        self.service = SubnetService(
            store, clock=self.clock, config=config, writer=writer, retry=retry
        )
        self._queued: QueuedRunner | None = None
        self._pool: ThreadRunner | None = None
        if threads:
            self._pool = ThreadRunner(max_workers=1, name="ipam-allocator")
            runner: ThreadRunner | QueuedRunner = self._pool
        else:
            self._queued = runner = QueuedRunner()
        self.reactions = SubnetReactions(
            self.service,
            allocator,
            runner=runner,
            # A checkpoint of its own: one shared with another shard's reactor would be moved
            # past that shard's calls by this one, which skips them.
            name=reactor_name if shard is None else f"{reactor_name}-{shard.name}",
            owns=None if shard is None else shard.owns,
        )
        self._reactors = Reactors(
            store,
            [self.reactions.reactor],
            poll_interval=reactor_poll_seconds,
            recent=self.projection.recent,
        )
        self._follower = LogFollower(store, self.projection, types=SUBNET_EVENT_TYPE_NAMES)
        self._running = False
        self.duties = Duties(
            leadership,
            on_lead=self._lead,
            on_follow=self._follow,
            manage_leadership=manage_leadership,
        )

    @property
    def running(self) -> bool:
        return self._running

    @property
    def leading(self) -> bool:
        """Whether this process calls the allocator now."""
        return self.duties.leading

    def reactor_failures(self) -> list[str]:
        """What stopped the allocator reactor, if anything did (for readiness)."""
        return self._reactors.failures()

    def start(self) -> IpamRuntime:
        """Catch the read model up and follow the log; lead now (no leadership configured), at
        once if the shared leadership already leads, or once elected."""
        if self._running:
            return self
        self._running = True
        with bulk_read():  # the whole log folded once: no collections meanwhile
            self.projection.catch_up(self.store)
        self.service.host(self.projection.streams())
        if self._threads:
            self._follower.start()
        self.duties.start(threads=self._threads)
        log.info("ipam runtime started", subnets=len(self.projection.subnets()))
        return self

    def stop(self, *, timeout: float | None = 10.0) -> None:
        """Stop calling the allocator (the call in hand finishes), stop following the log and,
        when this runtime manages it, release the leadership."""
        if not self._running:
            return
        self._running = False
        self.duties.relinquish()
        self._reactors.stop(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._follower.stop(timeout)
        self.duties.release(timeout)
        log.info("ipam runtime stopped")

    def __enter__(self) -> IpamRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def step(self, *, max_rounds: int = 100) -> int:
        """Without threads: react to the log and make the calls it asks for, until nothing new
        is asked (or ``max_rounds`` passes); returns how many tasks ran. Also catches the read
        model up."""
        if self._queued is None:
            raise RuntimeError("step() is for a runtime built with threads=False")
        ran = 0
        for _ in range(max_rounds):
            if self.leading:
                self._reactors.run_until_caught_up()
            done = self._queued.run_pending()
            ran += done
            if done == 0:
                break
        self.projection.catch_up(self.store)
        return ran

    # -- leading and following -------------------------------------------------------------------

    def _lead(self, term: int | None) -> None:
        log.info("settling every subnet's allocator calls", term=term)
        self.reactions.resume()
        if self._threads:
            self._reactors.start()

    def _follow(self, reason: str) -> None:
        # Called from whichever thread noticed; a fenced append cannot land anyway.
        self._reactors.stop(timeout=0)
