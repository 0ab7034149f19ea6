"""The assembled node accounting: service, cluster sync, restart rule, migrations, read model.

``NodesRuntime`` runs node accounting on the decider host::

    with NodesRuntime(store, cluster) as runtime:   # start(): load, take nodes over, follow
        grant = runtime.service.request_resources("vm-1", cpu_milli=2000, memory_slots=4)
        print(runtime.dump())                       # stop(): sync, reactors, follower stop

On leading (at once without a ``leadership``, else once elected) the runtime takes every node
over as a new controller incarnation — the leader term when there is a leadership, since terms
only grow; otherwise one past the highest incarnation in the log — so VM pods not yet heard from
are held at the log-bound startup reservation (seed 04, "Startup uncertainty"). It then syncs
with the cluster, every ``sync_seconds`` from a thread, and runs the migration reactor. Agents'
requests are accepted by any process, leader or not.

With a ``shard`` (a partition of the nodes, led by a :class:`Leadership` of that shard), the
leader's duties — the take-over, cluster sync and the migration reactor — touch only the nodes
the shard owns, and the take-over's incarnation is past every incarnation those nodes have had
as well as the term (a shard's terms start at 1, below the incarnations an earlier leadership
of these nodes, unsharded or of another partition count, gave them). The read model and agents'
requests stay whole: any process answers any agent (docs/SCALING.md, "Leadership per shard").

``threads=False`` wires the same without a thread: tests and the simulator call :meth:`step`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import structlog

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.adapters.cluster import ClusterGateway
from fleetledger.adapters.runtime import (
    DutyFencing,
    LogFollower,
    NoFencing,
    RetryPolicy,
    Shard,
    Writer,
)
from fleetledger.adapters.runtime.duties import Duties
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.adapters.runtime.reactors import Reactor, Reactors
from fleetledger.adapters.runtime.shards import check_runtime_shard
from fleetledger.domain.nodes import NodeConfig, NodeEvent, StartupRule
from fleetledger.eventstore import EventStore
from fleetledger.projections._reading import bulk_read
from fleetledger.projections.nodes import NODE_EVENT_TYPE_NAMES, NodesProjection, dump_json

from .aggregate import node_of_stream
from .errors import RuntimeStopped
from .migrations import FakeMigrations, Migrations, migration_reactor
from .service import NodeService
from .specs import DEFAULT_NODE_CONFIG
from .sync import ClusterSync, SyncReport

__all__ = ["NodesRuntime"]

log = structlog.get_logger(__name__)

_FOLLOW_INTERVAL_SECONDS = 0.05


class NodesRuntime:
    """Node accounting over one store and one cluster."""

    def __init__(
        self,
        store: EventStore,
        cluster: ClusterGateway,
        *,
        migrations: Migrations | None = None,
        clock: Clock | None = None,
        config: NodeConfig | Callable[[str], NodeConfig] = DEFAULT_NODE_CONFIG,
        node_label: str | None = None,
        rule: StartupRule = "log_bound",
        threads: bool = True,
        leadership: Leadership | None = None,
        manage_leadership: bool = True,
        shard: Shard | None = None,
        actor: str = "fleetledger",
        retry: RetryPolicy | None = None,
        snapshot_every: int = 1000,
        sync_seconds: float = 5.0,
        reactor_poll_seconds: float = 1.0,
    ) -> None:
        if sync_seconds <= 0:
            raise ValueError(f"sync_seconds must be positive, got {sync_seconds}")
        check_runtime_shard(
            shard, leadership, capability="nodes", runtime="NodesRuntime", aggregate="node"
        )
        self.shard = shard
        self.store = store
        self.cluster = cluster
        self.migrations: Migrations = migrations if migrations is not None else FakeMigrations()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.leadership = leadership
        self.rule: StartupRule = rule
        self._threads = threads
        self._sync_seconds = sync_seconds
        self.projection = NodesProjection()
        writer = Writer(
            actor=actor,
            labels=(("capability", "nodes"),),
            fencing=DutyFencing(leadership) if leadership is not None else NoFencing(),
            recent=self.projection.recent,
        )
        self.service = NodeService(
            store,
            clock=self.clock,
            writer=writer,
            retry=retry,
            snapshot_every=snapshot_every,
            locate=self._locate,
        )
        self.sync = ClusterSync(
            self.service, cluster, config=config, node_label=node_label, shard=shard
        )
        # Every read of the model catches it up first: the follower only keeps that short.
        self._follower = LogFollower(
            store,
            self.projection,
            types=NODE_EVENT_TYPE_NAMES,
            min_interval_seconds=_FOLLOW_INTERVAL_SECONDS,
        )
        self._reactors = Reactors(
            store,
            [self._migration_reactor()],
            poll_interval=reactor_poll_seconds,
            recent=self.projection.recent,
        )
        self._running = False
        self._stop_sync = threading.Event()
        self._sync_thread: threading.Thread | None = None
        self.last_restart: SyncReport | None = None
        # A take-over is due (the term it was elected in), and the incarnation it takes the
        # nodes over as once worked out: kept for the retries, so a retry after a partly landed
        # take-over goes on with the same incarnation instead of starting another.
        self._due: tuple[int | None] | None = None
        self._pending_incarnation: int | None = None
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
        """Whether this process takes nodes over, syncs and starts migrations now."""
        return self.duties.leading

    def start(self) -> NodesRuntime:
        """Load every logged node, catch the read model up, then lead (or stand by to)."""
        if self._running:
            return self
        # One pass of the log folds the read model, and the node streams start from its
        # states: no stream is read back one by one. A one-shot fold of the whole log, so the
        # collector waits until it is done (bulk_read).
        with bulk_read():
            self.projection.catch_up(self.store)
        position, heads = self.projection.streams()
        self.service.host(heads, position=position)
        self._running = True
        self.duties.start(threads=self._threads)
        if self._threads:
            self._follower.start()
        log.info("nodes runtime started", nodes=len(self.service.hosted()), leading=self.leading)
        return self

    def stop(self) -> None:
        """Stop syncing, the reactors and the follower; release the lease."""
        if not self._running:
            return
        self._running = False
        self.duties.relinquish()
        self._follow("stopping")
        self._follower.stop()
        self.duties.release()
        log.info("nodes runtime stopped")

    def __enter__(self) -> NodesRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def step(self) -> SyncReport:
        """Without threads: one cluster sync (as leader), the reactors and the read model."""
        if not self._running:
            raise RuntimeStopped("the nodes runtime is not running; start() it first")
        if self.leading and self._due is not None:
            self._take_over()
        report = self.sync.sync() if self.leading else SyncReport()
        if self.leading:
            self._reactors.run_until_caught_up()
        self.projection.catch_up(self.store)
        return report

    def dump(self) -> dict[str, object]:
        """Dumpstate of the read model (catching it up first, so it includes this process's
        latest appends, and reflecting the head of the log)."""
        self.projection.catch_up(self.store)
        return self.projection.dump()

    def dump_json(self) -> str:
        return dump_json(self.dump())

    # -- leading and following -------------------------------------------------------------------

    def _lead(self, term: int | None) -> None:
        self._due, self._pending_incarnation = (term,), None
        try:
            self._take_over()
        except Exception as e:
            if self.leadership is None:
                raise
            # Called from the leadership's thread: the sync thread tries the takeover again.
            log.error("could not take the nodes over; retrying on the next pass", error=str(e))
        if self._threads:
            self._reactors.start()
            self._stop_sync.clear()
            self._sync_thread = threading.Thread(
                target=self._sync_loop, name="nodes-cluster-sync", daemon=True
            )
            self._sync_thread.start()

    def _take_over(self) -> None:
        """The restart rule for the pending incarnation (once), then a sync pass."""
        due = self._due
        if due is not None:
            if self._pending_incarnation is None:
                self._pending_incarnation = self._incarnation(due[0])
            incarnation = self._pending_incarnation
            self.last_restart = self.sync.restart(incarnation, rule=self.rule)
            self._due, self._pending_incarnation = None, None
            log.info(
                "took nodes over",
                incarnation=incarnation,
                rule=self.rule,
                nodes=self.last_restart.nodes_restarted,
            )
        self.sync.sync()

    def _follow(self, reason: str) -> None:
        self._stop_sync.set()
        self._reactors.stop(timeout=0 if reason != "stopping" else 10.0)
        thread, self._sync_thread = self._sync_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)

    def _locate(self, pod: str) -> str | None:
        self.projection.catch_up(self.store)
        return self.projection.node_of(pod)

    def _incarnation(self, term: int | None) -> int:
        """The incarnation to take the nodes over as: the term (terms only grow), else one past
        the highest incarnation the nodes have had. A shard's leader takes whichever is higher,
        from the log as of now (this process's streams of nodes it did not lead may be stale)."""
        if self.shard is None:
            return term if term is not None else self._next_incarnation()
        self.projection.catch_up(self.store)
        owned = [
            state.incarnation
            for name, state in self.projection.states().items()
            if self.shard.owns(name)
        ]
        return max(term or 0, max(owned, default=0) + 1)

    def _next_incarnation(self) -> int:
        known = [state.incarnation for state in self.service.hosted().values()]
        return max(known, default=0) + 1

    def _migration_reactor(self) -> Reactor[NodeEvent]:
        shard = self.shard
        if shard is None:
            return migration_reactor(self.service, self.migrations)
        # A checkpoint of its own: one shared with another shard's reactor would be moved past
        # that shard's migrations by this one, which skips them.
        reactor = migration_reactor(
            self.service, self.migrations, name=f"nodes-migrations-{shard.name}"
        )
        return replace(reactor, streams=lambda stream_id: _owns_stream(shard, stream_id))

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(self._sync_seconds):
            try:
                self._take_over()
            except Exception as e:
                # The next pass lists the cluster afresh; one failed pass loses nothing.
                log.warning("cluster sync failed; retrying next pass", error=str(e))


def _owns_stream(shard: Shard, stream_id: str) -> bool:
    node = node_of_stream(stream_id)
    return node is not None and shard.owns(node)
