"""``fleetledger bench shards``: what splitting node accounting into shards buys, with real
processes.

For each shard count of ``shards`` (default 1 and 2), on a fresh scratch database on the server
at ``url`` (Postgres by default; ``sqlite:///FILE`` measures SQLite), that many child processes
(spawned) each lead one partition of a fake cluster of ``nodes`` nodes: each has its own store,
a :class:`~fleetledger.adapters.nodes.NodesRuntime` of its shard and the shard's
:class:`~fleetledger.adapters.runtime.Leadership` over the shard's real lease
(:func:`~fleetledger.adapters.runtime.lease_for`), threadless (``step()``), as the simulator
wires node accounting. Every child imports, opens its store and builds its cluster first; then
they start together (a barrier) and each is elected, takes its nodes over, and runs ``passes``
sync passes. Before each pass a tenth of all the nodes changed: each is resized (a CPU more),
chosen by ``seed`` in this process, so every shard count sees the very same changes, each child
its own partition's. (Resized rather than given a pod: the fake cluster checks a new pod's room
against every pod it holds, which would time the fake rather than the sync.)

The figures, per shard count: the wall seconds from the barrier until the last child finished,
the events appended and their rate, each child's CPU seconds over the same span (its own: the
database server's are not counted), and the speed-up against one shard (its wall seconds over
this count's). Checked, per count: every node's take-over events (``NodeJoined``,
``ControllerRestarted``) were appended under exactly one shard, by the ``leader_shard`` of their
metadata, the one whose partition holds the node; and across counts, the nodes' states the log
folds to (the node read model's dump, less its position) are equal.

What a shard does not split: each pass lists every node and pod of the cluster and folds every
node event of the log into the process's read model, whichever shard wrote it. On a machine with
fewer cores than shards the children share them; the CPU seconds say what the work cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from random import Random
from typing import Any

import psycopg
from sqlalchemy import make_url

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.logging import LOG_LEVEL_ENV, configure_logging
from fleetledger.adapters.nodes import NodesRuntime, node_of_stream
from fleetledger.adapters.runtime import (
    LEADER_SHARD_KEY,
    Leadership,
    Shard,
    lease_for,
    partition_of,
)
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import libpq_conninfo
from fleetledger.projections._reading import bulk_read, log_pages
from fleetledger.projections.nodes import NodesProjection, dump_json

from .scratch import scratch_database

__all__ = [
    "DEFAULT_NODES",
    "DEFAULT_PASSES",
    "DEFAULT_SHARDS",
    "ChildFigures",
    "CountFigures",
    "ShardsBenchReport",
    "Transactions",
    "audit_log",
    "fleet_changes",
    "run_shards_bench",
]

DEFAULT_NODES = 10_000
DEFAULT_SHARDS = (1, 2)
DEFAULT_PASSES = 5

_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_NODE_CPU_MILLI = 16_000
_NODE_MEMORY_MIB = 64 * 1024
_RESIZE_CPU_MILLI = 1000
_CHANGED_SHARE = 10
"""One node in ten changes before each pass."""
# The stored names of the take-over's events (stable: they name events in every log).
_TAKE_OVER_TYPES = frozenset({"nodes.NodeJoined", "nodes.ControllerRestarted"})
# A child holds its shard's lease for the whole run without a heartbeat thread: the lease's
# idle timeout must outlast the longest stretch between two renewals (the take-over).
_LEASE_SECONDS = 3600.0
_BARRIER_SECONDS = 600.0
_RUN_SECONDS = 3600.0
_PAGE = 5000

Changes = tuple[tuple[tuple[str, int], ...], ...]
"""Per pass, the nodes resized before it: ``(name, cpu_milli)``."""


@dataclass(frozen=True, slots=True)
class ChildFigures:
    """One child's run, measured by the child: seconds after the barrier it was elected and
    had taken its nodes over, and finished its passes; its CPU seconds over the same spans."""

    shard: str
    nodes: int
    """The nodes of its partition."""
    started_at: float
    """Wall-clock time (``time.time()``) as it left the barrier; comparable across children."""
    takeover_seconds: float
    seconds: float
    takeover_cpu_seconds: float
    cpu_seconds: float


@dataclass(frozen=True, slots=True)
class Transactions:
    """The scratch database's committed and rolled-back transactions over one count's run
    (``pg_stat_database``). The store places each append at the head it last saw and a second
    writer at the same position fails on its index, reads the head again and retries: with
    several shards appending at once, the rolled-back ones are those collisions (and any
    election or fence refusal), each an append made twice."""

    committed: int
    rolled_back: int

    def since(self, earlier: Transactions) -> Transactions:
        """The transactions between ``earlier`` counts and these."""
        return Transactions(
            self.committed - earlier.committed, self.rolled_back - earlier.rolled_back
        )


@dataclass(frozen=True, slots=True)
class CountFigures:
    """One shard count's run, with what its log shows."""

    shards: int
    wall_seconds: float
    """From the first child leaving the barrier to the last one finishing."""
    events: int
    """Events in the log after the run (elections, take-overs, passes)."""
    children: tuple[ChildFigures, ...]
    events_by_shard: dict[str, int]
    """Events appended under each shard's term (its election included)."""
    takeover_problems: tuple[str, ...]
    """Nodes whose take-over events were not all appended under their own partition's shard
    (or are missing): empty when each node was taken over by exactly one shard."""
    nodes_dumped: int
    state_sha256: str
    """Of the node read model's dump of the log, less its position."""
    transactions: Transactions | None = None
    """The database's transactions over the run, on Postgres."""

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def cpu_seconds(self) -> float:
        """The children's CPU seconds, summed."""
        return sum(child.cpu_seconds for child in self.children)

    @property
    def takeovers_by_one_shard(self) -> bool:
        return not self.takeover_problems


@dataclass(frozen=True, slots=True)
class ShardsBenchReport:
    """The figures of every shard count, and the checks across them."""

    backend: str
    nodes: int
    passes: int
    changed_per_pass: int
    seed: int
    cpu_count: int | None
    runs: tuple[CountFigures, ...]

    @property
    def states_equal(self) -> bool:
        """Whether every count's log folds to the same node states."""
        return len({run.state_sha256 for run in self.runs}) <= 1

    @property
    def passed(self) -> bool:
        return self.states_equal and all(run.takeovers_by_one_shard for run in self.runs)

    def speedup(self, run: CountFigures) -> float | None:
        """One shard's wall seconds over ``run``'s; ``None`` without a run of one shard."""
        single = next((r for r in self.runs if r.shards == 1), None)
        if single is None or run.wall_seconds <= 0:
            return None
        return single.wall_seconds / run.wall_seconds

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``; the keys are stable."""
        return {
            "backend": self.backend,
            "nodes": self.nodes,
            "passes": self.passes,
            "changed_per_pass": self.changed_per_pass,
            "seed": self.seed,
            "cpu_count": self.cpu_count,
            "runs": [
                {
                    "shards": run.shards,
                    "wall_seconds": round(run.wall_seconds, 3),
                    "events": run.events,
                    "events_per_second": round(run.events_per_second, 1),
                    "cpu_seconds": round(run.cpu_seconds, 3),
                    "speedup": _rounded(self.speedup(run)),
                    "events_by_shard": dict(sorted(run.events_by_shard.items())),
                    "takeovers_by_one_shard": run.takeovers_by_one_shard,
                    "takeover_problems": list(run.takeover_problems),
                    "nodes_dumped": run.nodes_dumped,
                    "state_sha256": run.state_sha256,
                    "transactions_committed": _field(run.transactions, "committed"),
                    "transactions_rolled_back": _field(run.transactions, "rolled_back"),
                    "children": [
                        {
                            "shard": child.shard,
                            "nodes": child.nodes,
                            "takeover_seconds": round(child.takeover_seconds, 3),
                            "seconds": round(child.seconds, 3),
                            "takeover_cpu_seconds": round(child.takeover_cpu_seconds, 3),
                            "cpu_seconds": round(child.cpu_seconds, 3),
                        }
                        for child in run.children
                    ],
                }
                for run in self.runs
            ],
            "states_equal": self.states_equal,
            "passed": self.passed,
        }

    def render(self) -> str:
        """The figures as text, beside the machine's cores."""
        cores = "an unknown number of" if self.cpu_count is None else f"{self.cpu_count}"
        lines = [
            f"bench shards: {self.nodes:,} nodes, take-over then {self.passes} sync passes of "
            f"{self.changed_per_pass:,} changed nodes each (seed {self.seed}), on {self.backend}",
            f"  this machine has {cores} cores (os.cpu_count()): children beyond them share; "
            "CPU seconds are the children's own, not the database server's",
            f"  {'shards':>6}  {'wall s':>8}  {'events':>8}  {'events/s':>9}  {'speed-up':>8}  "
            f"{'CPU s':>7}  {'rolled back':>11}  {'one shard per node':<18}  "
            "each child: CPU s (take-over's), wall s (take-over's)",
        ]
        for run in self.runs:
            speedup = self.speedup(run)
            children = ", ".join(
                f"{c.shard} {c.cpu_seconds:.2f} ({c.takeover_cpu_seconds:.2f}), "
                f"{c.seconds:.2f} ({c.takeover_seconds:.2f})"
                for c in run.children
            )
            one = "yes" if run.takeovers_by_one_shard else f"NO ({len(run.takeover_problems)})"
            rolled_back = "-" if run.transactions is None else f"{run.transactions.rolled_back:,}"
            lines.append(
                f"  {run.shards:>6}  {run.wall_seconds:>8.2f}  {run.events:>8,}  "
                f"{run.events_per_second:>9,.0f}  "
                f"{'-' if speedup is None else f'{speedup:.2f}x':>8}  {run.cpu_seconds:>7.2f}  "
                f"{rolled_back:>11}  {one:<18}  {children}"
            )
        digests = sorted({run.state_sha256[:12] for run in self.runs})
        lines.append(
            f"  node states equal across counts: {'yes' if self.states_equal else 'NO'} "
            f"(sha256 {', '.join(digests)}; {self.runs[0].nodes_dumped:,} nodes)"
            if self.runs
            else "  no run"
        )
        return "\n".join(lines)


def fleet_changes(nodes: int, passes: int, seed: int) -> Changes:
    """The nodes resized before each pass: a tenth of ``nodes`` (at least one) drawn by
    ``seed`` per pass, each a CPU larger than it was."""
    rng = Random(seed)
    cpu = dict.fromkeys(_node_names(nodes), _NODE_CPU_MILLI)
    names = list(cpu)
    changed = max(1, nodes // _CHANGED_SHARE)
    per_pass = []
    for _ in range(passes):
        resized = []
        for name in sorted(rng.sample(names, changed)):
            cpu[name] += _RESIZE_CPU_MILLI
            resized.append((name, cpu[name]))
        per_pass.append(tuple(resized))
    return tuple(per_pass)


def run_shards_bench(
    url: str | None,
    *,
    nodes: int = DEFAULT_NODES,
    shards: Sequence[int] = DEFAULT_SHARDS,
    passes: int = DEFAULT_PASSES,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ShardsBenchReport:
    """Run every shard count of ``shards``, each on a scratch database of its own beside
    ``url`` (see the module docstring)."""
    if nodes < 1 or passes < 0 or not shards or any(count < 1 for count in shards):
        raise ValueError("bench shards needs nodes >= 1, passes >= 0 and shard counts >= 1")
    say = progress or _stderr
    from .extender import default_server_url

    server = default_server_url(url)
    changes = fleet_changes(nodes, passes, seed)
    runs = []
    backend = server.split(":", 1)[0].split("+", 1)[0]
    for count in shards:
        say(f"{count} shard(s): {nodes:,} nodes, {passes} passes, on a scratch {backend} database")
        with scratch_database(server) as scratch:
            runs.append(_run_count(scratch, count, nodes, changes))
        say(f"{count} shard(s): {runs[-1].wall_seconds:.2f} s, {runs[-1].events:,} events")
    return ShardsBenchReport(
        backend=backend,
        nodes=nodes,
        passes=passes,
        changed_per_pass=len(changes[0]) if changes else 0,
        seed=seed,
        cpu_count=os.cpu_count(),
        runs=tuple(runs),
    )


# -- the parent ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Task:
    """What one child runs: its partition, the fleet's size, its share of the changes."""

    url: str
    partition: int
    count: int
    nodes: int
    changes: Changes


def _run_count(url: str, count: int, nodes: int, changes: Changes) -> CountFigures:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(count)
    results = context.Queue()
    children = [
        context.Process(
            target=_child,
            args=(_task(url, Shard("nodes", i, count), nodes, changes), barrier, results),
            name=f"bench-shards-{i}-of-{count}",
        )
        for i in range(count)
    ]
    before = _transactions(url)
    for child in children:
        child.start()
    try:
        figures = _collect(results, children)
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
                child.join()
    after = _transactions(url)
    started = min(f.started_at for f in figures)
    finished = max(f.started_at + f.seconds for f in figures)
    with contextlib.closing(open_store(url)) as store:
        events, by_shard, problems = audit_log(store, nodes, count)
        dumped, digest = _state(store)
    return CountFigures(
        shards=count,
        wall_seconds=finished - started,
        events=events,
        children=tuple(sorted(figures, key=lambda f: f.shard)),
        events_by_shard=by_shard,
        takeover_problems=problems,
        nodes_dumped=dumped,
        state_sha256=digest,
        transactions=None if before is None or after is None else after.since(before),
    )


def _transactions(url: str) -> Transactions | None:
    """The database's transaction counts so far (``None`` on SQLite), once no other session
    is connected to it: a session's counts reach the statistics as it ends at the latest."""
    if make_url(url).get_backend_name() != "postgresql":
        return None
    deadline = time.monotonic() + _BARRIER_SECONDS
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as connection:
        while True:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is None or row[0] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        connection.execute("SELECT pg_stat_clear_snapshot()")
        counts = connection.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    if counts is None:
        return None
    return Transactions(committed=int(counts[0]), rolled_back=int(counts[1]))


def _task(url: str, shard: Shard, nodes: int, changes: Changes) -> _Task:
    mine = tuple(tuple(c for c in resized if shard.owns(c[0])) for resized in changes)
    return _Task(url, shard.partition, shard.count, nodes, mine)


def _collect(results: Any, children: Sequence[Any]) -> list[ChildFigures]:
    """Every child's figures; ``RuntimeError`` with the first failure a child reported, or
    naming a child that died without reporting."""
    figures: list[ChildFigures] = []
    deadline = time.monotonic() + _RUN_SECONDS
    while len(figures) < len(children):
        try:
            figure, error = results.get(timeout=1.0)
        except queue.Empty:
            dead = [c.name for c in children if c.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"bench shards: {', '.join(dead) or 'a child'} ended without its figures"
                ) from None
            continue
        if error is not None:
            raise RuntimeError(f"bench shards: a child failed: {error}")
        figures.append(figure)
    return figures


def audit_log(
    store: EventStore, nodes: int, count: int
) -> tuple[int, dict[str, int], tuple[str, ...]]:
    """The events in the log, those appended under each shard's terms, and one line per node
    (of the fleet of ``nodes``) whose take-over events were not all appended under the shard of
    its partition of ``count``, or are missing."""
    events = 0
    by_shard: Counter[str] = Counter()
    takers: dict[str, set[object]] = {}
    with bulk_read():
        for records in log_pages(store, page=_PAGE):
            for record in records:
                events += 1
                shard = record.metadata.get(LEADER_SHARD_KEY)
                if isinstance(shard, str):
                    by_shard[shard] += 1
                if record.type in _TAKE_OVER_TYPES:
                    node = node_of_stream(record.stream_id)
                    if node is not None:
                        takers.setdefault(node, set()).add(shard)
    problems = []
    for name in _node_names(nodes):
        found = takers.get(name, set())
        expected = _owner(name, count)
        if found != {expected}:
            shown = ", ".join(sorted(map(str, found))) or "none"
            problems.append(f"{name}: taken over by {shown}, not {expected} alone")
    return events, dict(by_shard), tuple(problems)


def _owner(name: str, count: int) -> str:
    return Shard("nodes", partition_of(name, count), count).name


def _state(store: EventStore) -> tuple[int, str]:
    """How many nodes the log's node read model holds, and the digest of its dump (less the
    position, which the interleaving of the shards' appends moves)."""
    projection = NodesProjection()
    with bulk_read():
        projection.catch_up(store)
    dump = {key: value for key, value in projection.dump().items() if key != "position"}
    nodes = dump.get("nodes")
    text = dump_json(dump)
    return (len(nodes) if isinstance(nodes, dict) else 0), hashlib.sha256(text.encode()).hexdigest()


def _node_names(nodes: int) -> list[str]:
    return [f"node-{n:06d}" for n in range(nodes)]


def _field(transactions: Transactions | None, name: str) -> int | None:
    return None if transactions is None else int(getattr(transactions, name))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- a child ------------------------------------------------------------------------------------


def _child(task: _Task, barrier: Any, results: Any) -> None:
    """Run ``task`` and report ``(figures, None)``, or ``(None, error)``; a child that fails
    before the barrier breaks it, so the others do not wait for it."""
    # A spawned process starts with structlog's defaults, which print every take-over to
    # stdout: errors only (each child's stop is a step-down warning), on stderr, unless
    # $FLEETLEDGER_LOG_LEVEL asks for more.
    configure_logging(level=os.environ.get(LOG_LEVEL_ENV) or "error")
    try:
        results.put((_lead(task, barrier), None))
    except BaseException as e:  # reported to the parent, whatever it was
        barrier.abort()
        results.put((None, f"nodes/{task.partition} of {task.count}: {type(e).__name__}: {e}"))


def _lead(task: _Task, barrier: Any) -> ChildFigures:
    shard = Shard("nodes", task.partition, task.count)
    clock = ManualClock(_EPOCH)
    names = _node_names(task.nodes)
    cluster = FakeCluster(
        [Node(name, cpu_millis=_NODE_CPU_MILLI, memory_mib=_NODE_MEMORY_MIB) for name in names]
    )
    with contextlib.closing(open_store(task.url)) as store:
        leadership = Leadership(
            store,
            lease_for(task.url, lease_seconds=_LEASE_SECONDS, shard=shard),
            clock=clock,
            holder=f"bench-{shard.name}",
            shard=shard,
        )
        elected = threading.Event()
        leadership.on_elected(lambda _term: elected.set())
        runtime = NodesRuntime(
            store, cluster, clock=clock, threads=False, leadership=leadership, shard=shard
        )
        barrier.wait(timeout=_BARRIER_SECONDS)
        started, cpu = time.time(), time.process_time()
        runtime.start()  # elected (the lease is free), then the take-over and a first pass
        if not (elected.is_set() and runtime.leading):
            raise RuntimeError(f"{shard.name} was not elected: its lease is held elsewhere")
        took_over, takeover_cpu = time.time(), time.process_time() - cpu
        for resized in task.changes:
            for name, cpu_milli in resized:
                cluster.add_node(Node(name, cpu_millis=cpu_milli, memory_mib=_NODE_MEMORY_MIB))
            # The renewal the leadership's thread would make between passes.
            if leadership.step() != "leader":
                raise RuntimeError(f"{shard.name} lost its lease during the run")
            runtime.step()
        finished, cpu_seconds = time.time(), time.process_time() - cpu
        runtime.stop()
    return ChildFigures(
        shard=shard.name,
        nodes=sum(1 for name in names if shard.owns(name)),
        started_at=started,
        takeover_seconds=took_over - started,
        seconds=finished - started,
        takeover_cpu_seconds=takeover_cpu,
        cpu_seconds=cpu_seconds,
    )
