"""``fleetledger bench extender``: scheduler-extender calls per second through a real server.

A ``fleetledger extender`` process (the app ``serve --extender-port`` runs too) serves a scratch
database on loopback. This process plays the rest of the cluster:

* **the leader**: a testbed of ``nodes`` × ``slots`` on a fake cluster, its ghost pods created
  and recorded before the clock starts; then, every ``churn_seconds``, the oldest placed pods end
  (they leave the fake cluster) and a reconcile pass records it, freeing their slots — the log
  keeps moving under the extender the way a leader in another process moves it;
* **the kube-scheduler**: ``clients`` concurrent callers, each on one keep-alive connection,
  sending the scheduler's JSON bodies as fast as answers come. A call is, by the weights of the
  mix: a *re-ask* — ``filter`` for a pod that already holds a reservation (the common case: the
  scheduler asks again, for each scheduling cycle or after its own filters) —, a *first* ``filter``
  of a new pod (it reserves a slot, appended before the answer), or a ``preempt`` of a new pod (it
  reserves too, and names the slot's ghost pod). Half the calls use each ``nodeCacheCapable``
  form (node names and meta victims, or whole node objects and whole victim pods) and half the
  pods ask in the original operator's labels instead of this project's annotations. Every pod
  exists in the fake cluster before its first call, as it would in Kubernetes.

Two timed phases of ``seconds`` each (after a ``warmup``), with the figures of each: calls per
second, latency p50, p99 and p99.9 as the callers saw it, by kind too; the answers; *moved* —
re-asks answered with another node than the pod's first answer, which must be 0; and the server
process's CPU time per call, and where the machine's CPU went (Linux, from ``/proc``): the
extender, the callers (this process), the leader's process, the Postgres backends of the scratch
database, and other work sharing the machine. Everything runs on one machine, so the callers,
the leader and Postgres take cores the extender would otherwise have: the report gives the
cores all four would keep busy at the target rate beside the cores there are, and says when
other work was busy meanwhile (its figures are then a busy machine's):

* **capacity**: every caller sends its next call as soon as it is answered. The calls per second
  are the extender's capacity; their latency is mostly queueing — with 32 callers always
  waiting, the mean is 32 / capacity whatever the server does;
* **at rate**: the callers together offer ``rate`` calls per second (the target, 2,000), each
  call timed from when it fell due, so a server that falls behind is charged for the wait. Its
  p99 is the one held against the 10 ms target. It is not run when the capacity is below the
  rate: the latency would only measure a growing backlog, for as long as it took to answer.

The targets are met when the capacity reaches 2,000 calls/s, the p99 at that rate is under
10 ms, and nothing moved.

By default the database is a scratch one on the Postgres at 127.0.0.1:5432; without one the bench
refuses, unless ``--url`` names another server (or a ``sqlite:///`` file, reported as SQLite).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as ProcessEvent
from typing import IO

import httpx
import orjson
import sqlalchemy as sa
import structlog

from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import DATABASE_URL_ENV

from .loopback import LoopbackClient
from .scratch import scratch_database
from .serve import process_cpu_seconds

__all__ = [
    "TARGET_CALLS_PER_SECOND",
    "TARGET_P99_MS",
    "ExtenderBenchReport",
    "Mix",
    "Phase",
    "default_server_url",
    "run_extender_bench",
]

log = structlog.get_logger("bench.extender")

TARGET_CALLS_PER_SECOND = 2_000
TARGET_P99_MS = 10.0
LOCAL_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

_BED = "bench"
_LABEL = "fleetledger.io/bench-testbed"
_SLOT_CPU, _SLOT_MEMORY = 1000, 2048
_WINDOW = 8
"""Slot ids a pod's application lists (a label value holds at most 63 characters)."""
_KINDS = ("reask", "first", "preempt")
_CONTENDED_CORES = 0.25
"""Cores busy with other work from which a phase's figures are reported as contended."""


@dataclass(frozen=True, slots=True)
class Mix:
    """The share of each kind of call (normalised); re-asks need a placed pod, so a caller with
    none to ask about sends a first filter instead."""

    reask: float = 0.8
    first: float = 0.1
    preempt: float = 0.1

    @classmethod
    def parse(cls, spec: str) -> Mix:
        """``REASK:FIRST:PREEMPT`` shares, e.g. ``80:10:10``."""
        try:
            shares = [float(part) for part in spec.split(":")]
        except ValueError:
            shares = []
        if len(shares) != 3:
            raise ValueError(f"--mix takes REASK:FIRST:PREEMPT shares, e.g. 80:10:10, not {spec!r}")
        mix = cls(*shares)
        mix.weights()
        return mix

    def weights(self) -> tuple[float, float, float]:
        values = (self.reask, self.first, self.preempt)
        if any(v < 0 for v in values) or sum(values) <= 0:
            raise ValueError(f"the mix needs non-negative shares, not all zero: {self}")
        return values


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed run of the callers: ``rate`` ``None`` is as fast as answers come (capacity),
    otherwise the calls offered per second (latency, timed from when each call was due)."""

    rate: float | None
    seconds: float
    samples: tuple[tuple[str, float], ...]
    """(kind, latency in ms) of every timed call."""
    outcomes: Counter[str]
    """Timed answers: ``placed``, ``no node`` (no free slot then), or ``status <code>``."""
    moved: int
    server_cpu_seconds: float | None = None
    cpu: CpuShares | None = None
    """Where the machine's CPU went meanwhile (``None`` without ``/proc``)."""

    @property
    def calls_per_second(self) -> float:
        return len(self.samples) / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms_per_call(self) -> float | None:
        if self.server_cpu_seconds is None or not self.samples:
            return None
        return self.server_cpu_seconds * 1000 / len(self.samples)

    def percentile(self, q: float, kind: str | None = None) -> float:
        return _percentile(sorted(ms for k, ms in self.samples if kind in (None, k)), q)

    def calls(self) -> Counter[str]:
        return Counter(kind for kind, _ in self.samples)

    def to_dict(self) -> dict[str, object]:
        cpu = self.server_cpu_ms_per_call
        calls = self.calls()
        return {
            "offered_per_second": self.rate,
            "seconds": round(self.seconds, 3),
            "calls": len(self.samples),
            "calls_by_kind": dict(sorted(calls.items())),
            "calls_per_second": round(self.calls_per_second, 1),
            "latency_ms": {
                "p50": round(self.percentile(0.50), 3),
                "p99": round(self.percentile(0.99), 3),
                "p99.9": round(self.percentile(0.999), 3),
                "max": round(max((ms for _, ms in self.samples), default=0.0), 3),
            },
            "latency_ms_by_kind": {
                kind: {
                    "p50": round(self.percentile(0.5, kind), 3),
                    "p99": round(self.percentile(0.99, kind), 3),
                }
                for kind in sorted(calls)
            },
            "outcomes": dict(sorted(self.outcomes.items())),
            "moved": self.moved,
            "server_cpu_ms_per_call": None if cpu is None else round(cpu, 3),
            "cpu": None if self.cpu is None else self.cpu.to_dict(len(self.samples)),
        }

    def render(self, title: str) -> list[str]:
        cpu = self.server_cpu_ms_per_call
        calls = self.calls()
        by_kind = "; ".join(
            f"{kind} p50 {self.percentile(0.5, kind):.2f} / p99 {self.percentile(0.99, kind):.2f}"
            for kind in sorted(calls)
        )
        outcomes = ", ".join(f"{n} {o}" for o, n in sorted(self.outcomes.items()))
        return [
            f"  {title}",
            f"    throughput  {self.calls_per_second:,.0f} calls/s over {self.seconds:.1f} s",
            f"    latency     p50 {self.percentile(0.5):.2f} ms, p99 {self.percentile(0.99):.2f} "
            f"ms, p99.9 {self.percentile(0.999):.2f} ms",
            f"    by kind     {by_kind} (ms)",
            f"    calls       {', '.join(f'{calls[k]} {k}' for k in _KINDS)}; answers: {outcomes}",
            f"    moved       {self.moved} re-asks answered with another node (must be 0)",
            "    server CPU  "
            + ("unknown (no /proc)" if cpu is None else f"{cpu:.3f} ms per call")
            + " (the extender process, user + system)",
            *([] if self.cpu is None else self.cpu.render(len(self.samples))),
        ]


@dataclass(frozen=True, slots=True)
class CpuShares:
    """CPU seconds (user + system) spent during a phase: by the extender, by this process (the
    callers), by the leader's process, by the Postgres backends serving the scratch database,
    and by the whole machine, which has ``cores``. What the machine spent beyond those four is
    other work sharing it: the bench's figures are then those of a busy machine."""

    cores: int
    elapsed: float
    extender: float
    callers: float
    leader: float
    database: float
    machine: float

    @property
    def ours(self) -> float:
        return self.extender + self.callers + self.leader + self.database

    @property
    def others(self) -> float:
        return max(0.0, self.machine - self.ours)

    def cores_at(self, calls_per_second: float, calls: int) -> float:
        """Cores the four would keep busy at ``calls_per_second``, at this phase's CPU per
        call."""
        return self.ours / calls * calls_per_second if calls else 0.0

    def to_dict(self, calls: int) -> dict[str, object]:
        def per_call(seconds: float) -> float | None:
            return round(seconds * 1000 / calls, 3) if calls else None

        return {
            "ms_per_call": {
                "extender": per_call(self.extender),
                "callers": per_call(self.callers),
                "leader": per_call(self.leader),
                "database": per_call(self.database),
                "all": per_call(self.ours),
            },
            "cores": self.cores,
            "busy_cores": round(self.machine / self.elapsed, 2) if self.elapsed else None,
            "others_busy_cores": round(self.others / self.elapsed, 2) if self.elapsed else None,
            "cores_at_target": round(self.cores_at(TARGET_CALLS_PER_SECOND, calls), 2),
            "extender_core_at_target": round(
                self.extender / calls * TARGET_CALLS_PER_SECOND if calls else 0.0, 2
            ),
        }

    def render(self, calls: int) -> list[str]:
        if not calls or not self.elapsed:
            return []
        ms = {k: v * 1000 / calls for k, v in (("x", self.extender), ("c", self.callers),
              ("l", self.leader), ("d", self.database), ("all", self.ours))}  # fmt: skip
        need = self.cores_at(TARGET_CALLS_PER_SECOND, calls)
        lines = [
            f"    CPU/call    {ms['all']:.3f} ms in all: extender {ms['x']:.3f}, callers "
            f"{ms['c']:.3f}, leader {ms['l']:.3f}, Postgres {ms['d']:.3f} -> "
            f"{need:.2f} cores at {TARGET_CALLS_PER_SECOND:,} calls/s, of the {self.cores} here",
            f"    machine     {self.machine / self.elapsed:.2f} of {self.cores} cores busy, "
            f"{self.others / self.elapsed:.2f} by other work",
        ]
        # One interpreter runs the extender's Python one thread at a time: whatever the cores,
        # its event loop and its threads share one.
        lines.append(
            f"    extender    {ms['x'] * TARGET_CALLS_PER_SECOND / 1000:.2f} of the one core its "
            f"interpreter can use, at {TARGET_CALLS_PER_SECOND:,} calls/s"
        )
        if self.others / self.elapsed >= _CONTENDED_CORES:
            lines.append(
                "    contended   other work shared the machine: these figures are those of a "
                "busy machine, not of this code alone"
            )
        return lines


@dataclass(frozen=True, slots=True)
class ExtenderBenchReport:
    """Capacity (callers as fast as answers come) and latency at the target rate."""

    backend: str
    nodes: int
    slots: int
    clients: int
    mix: Mix
    capacity: Phase
    rate: float
    at_rate: Phase | None
    """``None`` when the capacity is below ``rate``: not run."""
    reservations: int
    """Reservations in the log at the end (the warm-ups' included)."""
    ended: int
    """Pods the leader ended to free their slots meanwhile."""

    @property
    def p99_at_rate(self) -> float | None:
        return None if self.at_rate is None else self.at_rate.percentile(0.99)

    @property
    def cores_ratio(self) -> float | None:
        """The cores the extender, the callers, the leader and Postgres would keep busy at the
        target rate (at the capacity phase's CPU per call), over the machine's cores: from
        about 0.7 on, queueing alone puts a p99 of a few milliseconds out of reach."""
        cpu = self.capacity.cpu
        calls = len(self.capacity.samples)
        if cpu is None or not calls:
            return None
        return round(cpu.cores_at(TARGET_CALLS_PER_SECOND, calls) / cpu.cores, 3)

    @property
    def met(self) -> bool:
        p99 = self.p99_at_rate
        return (
            self.capacity.calls_per_second >= TARGET_CALLS_PER_SECOND
            and self.rate >= TARGET_CALLS_PER_SECOND
            and p99 is not None
            and p99 < TARGET_P99_MS
            and self.capacity.moved == 0
            and (self.at_rate is None or self.at_rate.moved == 0)
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "nodes": self.nodes,
            "slots_per_node": self.slots,
            "clients": self.clients,
            "mix": {"reask": self.mix.reask, "first": self.mix.first, "preempt": self.mix.preempt},
            "capacity": self.capacity.to_dict(),
            "rate": self.rate,
            "at_rate": None if self.at_rate is None else self.at_rate.to_dict(),
            "reservations": self.reservations,
            "pods_ended": self.ended,
            "targets": {"calls_per_second": TARGET_CALLS_PER_SECOND, "p99_ms": TARGET_P99_MS},
            "ratios": {
                "calls_per_second": round(
                    self.capacity.calls_per_second / TARGET_CALLS_PER_SECOND, 3
                ),
                "cores_at_target": self.cores_ratio,
                "p99": None
                if self.p99_at_rate is None
                else round(self.p99_at_rate / TARGET_P99_MS, 3),
            },
            "met": self.met,
        }

    def render(self) -> str:
        capacity, offered, p99 = self.capacity.calls_per_second, self.rate, self.p99_at_rate
        mix = f"{self.mix.reask:g}:{self.mix.first:g}:{self.mix.preempt:g}"
        at_rate = (
            self.at_rate.render(f"at {offered:,.0f} calls/s offered (latency from when due)")
            if self.at_rate is not None
            else [
                f"  at {offered:,.0f} calls/s offered: not run, the capacity is below that rate "
                "(the latency would only measure the backlog)"
            ]
        )
        p99_ratio = (
            "not measured"
            if p99 is None
            else f"{p99 / TARGET_P99_MS:.2f}x the < {TARGET_P99_MS:.0f} ms target"
        )
        return "\n".join(
            [
                f"bench extender ({self.backend}, testbed {self.nodes} nodes x {self.slots} slots, "
                f"{self.clients} callers, mix re-ask:first:preempt {mix})",
                *self.capacity.render("capacity (each caller sends as soon as answered)"),
                *at_rate,
                f"  log         {self.reservations} reservations; {self.ended} pods ended by the "
                "leader to free their slots",
                f"  ratios      capacity {capacity / TARGET_CALLS_PER_SECOND:.2f}x the "
                f"{TARGET_CALLS_PER_SECOND:,}/s target; p99 at {offered:,.0f}/s {p99_ratio}; "
                + (
                    ""
                    if self.cores_ratio is None
                    else f"CPU at the target {self.cores_ratio:.2f}x the machine's cores; "
                )
                + f"{'met' if self.met else 'MISSED'}",
            ]
        )


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


@dataclass(frozen=True, slots=True)
class _Watched:
    """What a phase's CPU is counted for: the extender's and the leader's processes, and the
    scratch database (its Postgres backends name it in their titles; ``None`` on SQLite)."""

    extender: int
    leader: int
    database: str | None


@dataclass(frozen=True, slots=True)
class _CpuSample:
    at: float
    extender: float
    callers: float
    leader: float
    database: float
    machine: float

    @classmethod
    def take(cls, watched: _Watched) -> _CpuSample | None:
        extender = process_cpu_seconds(watched.extender)
        leader = process_cpu_seconds(watched.leader)
        machine = _machine_cpu_seconds()
        if extender is None or leader is None or machine is None:
            return None
        own = os.times()
        return cls(
            at=time.perf_counter(),
            extender=extender,
            callers=own.user + own.system,
            leader=leader,
            database=_backends_cpu_seconds(watched.database),
            machine=machine,
        )

    def until(self, later: _CpuSample) -> CpuShares:
        return CpuShares(
            cores=os.cpu_count() or 1,
            elapsed=later.at - self.at,
            extender=later.extender - self.extender,
            callers=later.callers - self.callers,
            leader=later.leader - self.leader,
            # A backend that ended meanwhile takes its time away: never below none.
            database=max(0.0, later.database - self.database),
            machine=later.machine - self.machine,
        )


def _machine_cpu_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy so far (``/proc/stat``: all but idle
    and I/O wait)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _backends_cpu_seconds(database: str | None) -> float:
    """CPU seconds so far of the Postgres backends connected to ``database`` (their process
    titles read ``postgres: … USER DATABASE HOST(PORT) STATE``)."""
    if database is None:
        return 0.0
    total = 0.0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                    title = cmdline.read(512).replace(b"\0", b" ").split()
            except OSError:
                continue
            if title[:1] == [b"postgres:"] and database.encode() in title:
                # A backend ending just now leaves an empty or missing stat: it counts as none.
                with contextlib.suppress(IndexError, ValueError):
                    total += process_cpu_seconds(int(entry.name)) or 0.0
    return total


def default_server_url(url: str | None, environ: dict[str, str] | None = None) -> str:
    """The database server to take a scratch database from: ``url``, else
    ``FLEETLEDGER_DATABASE_URL``, else the Postgres at 127.0.0.1:5432 if it answers. A
    ``ValueError`` says what to give when none does."""
    if url:
        return url
    configured = (os.environ if environ is None else environ).get(DATABASE_URL_ENV, "")
    if configured.strip():
        return configured
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 5432), timeout=2):
        return LOCAL_POSTGRES
    raise ValueError(
        "no Postgres answers at 127.0.0.1:5432 and no --url was given: point --url at a "
        "Postgres server (a scratch database is made on it and dropped), or at sqlite:///FILE "
        "to measure SQLite (reported as such)"
    )


def run_extender_bench(
    url: str | None,
    *,
    nodes: int = 16,
    slots: int = 4,
    clients: int = 32,
    seconds: float = 10.0,
    warmup: float = 2.0,
    rate: float = TARGET_CALLS_PER_SECOND,
    mix: Mix = Mix(),
    churn_seconds: float = 0.1,
    seed: int = 0,
) -> ExtenderBenchReport:
    """Serve a scratch database of ``url``'s server and drive it: ``seconds`` (after a
    ``warmup``) at capacity, then as long at ``rate`` calls per second; see the module
    docstring."""
    if (
        min(nodes, slots, clients) < 1
        or seconds <= 0
        or warmup < 0
        or churn_seconds <= 0
        or rate <= 0
    ):
        raise ValueError(
            "bench extender needs nodes, slots and clients >= 1, seconds, rate and churn > 0, "
            "warmup >= 0"
        )
    weights = mix.weights()
    server = default_server_url(url)
    with scratch_database(server) as scratch:
        backend = "sqlite" if scratch.startswith("sqlite") else "postgres"
        database = None if backend == "sqlite" else sa.make_url(scratch).database
        with (
            _cluster(scratch, nodes, slots, churn_seconds) as (link, leader),
            _extender(scratch) as (port, pid),
        ):
            world = _World(link, nodes=nodes, slots=slots, seed=seed)
            try:
                drive = functools.partial(
                    _drive,
                    port,
                    world,
                    clients=clients,
                    seconds=seconds,
                    warmup=warmup,
                    weights=weights,
                    watched=_Watched(extender=pid, leader=leader, database=database),
                )
                capacity = asyncio.run(drive(rate=None, seed=seed))
                # Offered more than it can answer, the server would only show its backlog
                # growing (and the run would last until the backlog was answered).
                at_rate = (
                    asyncio.run(drive(rate=rate, seed=seed + 1))
                    if capacity.calls_per_second >= rate
                    else None
                )
            finally:
                world.close()
        with open_store(scratch) as store:
            reservations = len(
                store.read_all(after=0, limit=10_000_000, types=["testbed.SlotReserved"])
            )
    return ExtenderBenchReport(
        backend=backend,
        nodes=nodes,
        slots=slots,
        clients=clients,
        mix=mix,
        capacity=capacity,
        rate=rate,
        at_rate=at_rate,
        reservations=reservations,
        ended=world.ended,
    )


# -- the cluster and its leader, in a process of their own -------------------------------------
# A leader pass is several milliseconds of Python; in the callers' process it would hold their
# interpreter lock and its pauses would be counted as the extender's latency.


@dataclass(frozen=True, slots=True)
class _ClusterSettings:
    url: str
    nodes: int
    slots: int
    every: float
    """Seconds between leader passes."""


def _cluster_process(settings: _ClusterSettings, link: Connection, ready: ProcessEvent) -> None:
    """The fake cluster and the testbed's leader: ghost pods made and recorded before
    ``ready``; then pods created and ended as the callers ask over ``link``, and a leader pass
    every ``settings.every`` seconds, until the link says stop."""
    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
    from fleetledger.adapters.logging import configure_logging
    from fleetledger.adapters.testbeds import FakeApplications, TestbedsRuntime
    from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION

    # A spawned process starts with structlog's defaults, which print to stdout: its logs
    # belong on stderr, so that ``--json`` output stays JSON.
    configure_logging(level="warning")
    url, nodes, slots, every = settings.url, settings.nodes, settings.slots, settings.every
    cluster = FakeCluster(
        [
            # Room for twice the slots: a pod placed by filter fits beside its ghost pod.
            Node(
                name,
                labels={_LABEL: name[-3:]},
                cpu_millis=2 * slots * _SLOT_CPU,
                memory_mib=2 * slots * _SLOT_MEMORY,
            )
            for name in _node_names(nodes)
        ]
    )
    with open_store(url) as store:
        runtime = TestbedsRuntime(
            store, cluster, FakeApplications(cluster), clock=SystemClock(), threads=False
        )
        runtime.start()
        runtime.service.define_testbed(
            _BED, node_label=_LABEL, slots_per_node=slots, cpu_millis=_SLOT_CPU,
            memory_mib=_SLOT_MEMORY,
        )  # fmt: skip
        runtime.run_until_settled()
        stop = threading.Event()

        def lead() -> None:
            while not stop.wait(every):
                try:
                    runtime.step()
                except Exception as e:  # the log refusing a pass: the next one tries again
                    log.warning("bench leader pass failed", error=str(e))

        leader = threading.Thread(target=lead, name="bench-leader", daemon=True)
        leader.start()
        ready.set()
        created = 0
        try:
            while True:
                command, argument = link.recv()
                if command == "stop":
                    break
                if command == "end":
                    for name in argument:
                        with contextlib.suppress(Exception):
                            cluster.delete_pod(name)
                    link.send(None)
                    continue
                pods = []
                for ids in argument:
                    created += 1
                    name = f"job-{created}-exec"
                    pod = cluster.create_pod(
                        PodSpec(
                            name,
                            annotations={
                                TESTBED_ANNOTATION: _BED,
                                SLOT_IDS_ANNOTATION: ",".join(map(str, ids)),
                            },
                            cpu_millis=_SLOT_CPU,
                            memory_mib=_SLOT_MEMORY,
                            scheduler_name="fleetledger",
                        )
                    )
                    pods.append((name, pod.uid, ids))
                link.send(pods)
        finally:
            stop.set()
            leader.join(30)
            runtime.stop()


def _node_names(nodes: int) -> tuple[str, ...]:
    return tuple(f"node-{n:03d}" for n in range(nodes))


@dataclass(slots=True)
class _Pod:
    name: str
    uid: str
    slot_ids: tuple[int, ...]
    seed_labels: bool
    node: str = ""
    ended: bool = False
    """Set (under the world's lock) once the pod is ended: a question about it then in flight
    may be answered otherwise."""


class _World:
    """The callers' view of the cluster: pods created ahead (so that a pod exists before the
    scheduler asks about it, as in Kubernetes, without the callers waiting for the cluster),
    the pods placed, and the ending of the oldest beyond three quarters of the slots."""

    def __init__(self, link: Connection, *, nodes: int, slots: int, seed: int) -> None:
        self.node_names = _node_names(nodes)
        self.node_objects = [_node_json(name, slots) for name in self.node_names]
        """The nodes as the scheduler sends them when it is not node-cache-capable."""
        self.slot_count = nodes * slots
        self.occupancy = max(1, self.slot_count * 3 // 4)
        self.placed: list[_Pod] = []
        self.lock = threading.Lock()
        self.ended = 0
        self._link = link
        self._rng = random.Random(seed)
        self._ahead: deque[_Pod] = deque()
        self._ending: list[str] = []
        self._created = 0
        self._want = threading.Event()
        self._closed = threading.Event()
        self._supplier = threading.Thread(target=self._supply, name="bench-pods", daemon=True)
        self._refill(64)
        self._supplier.start()

    def _refill(self, count: int) -> None:
        windows = []
        for _ in range(count):
            start = self._rng.randrange(self.slot_count)
            size = min(_WINDOW, self.slot_count)
            windows.append(tuple((start + i) % self.slot_count for i in range(size)))
        self._link.send(("create", windows))
        made = self._link.recv()
        with self.lock:
            for name, uid, ids in made:
                self._created += 1
                self._ahead.append(_Pod(name, uid, ids, seed_labels=self._created % 2 == 0))

    def _supply(self) -> None:
        while not self._closed.is_set():
            self._want.wait(0.05)
            self._want.clear()
            with self.lock:
                ending, self._ending = self._ending, []
                short = len(self._ahead) < 64
            if ending:
                self._link.send(("end", ending))
                self._link.recv()
            if short:
                self._refill(64)

    def close(self) -> None:
        self._closed.set()
        self._want.set()
        self._supplier.join(30)

    async def new_pod(self) -> _Pod:
        while True:
            with self.lock:
                if self._ahead:
                    pod = self._ahead.popleft()
                    if len(self._ahead) < 32:
                        self._want.set()
                    return pod
            self._want.set()
            await asyncio.sleep(0.001)  # the supplier is creating more

    def placed_at(self, pod: _Pod, node: str) -> None:
        pod.node = node
        with self.lock:
            self.placed.append(pod)
            beyond = max(0, len(self.placed) - self.occupancy)
            ending, self.placed = self.placed[:beyond], self.placed[beyond:]
            for old in ending:
                old.ended = True
            self._ending.extend(old.name for old in ending)
            self.ended += len(ending)

    def give_up(self, pod: _Pod) -> None:
        with self.lock:
            self._ending.append(pod.name)

    def some_placed(self, rng: random.Random) -> _Pod | None:
        with self.lock:
            return rng.choice(self.placed) if self.placed else None


# -- the scheduler's calls -----------------------------------------------------------------------


def _pod_json(pod: _Pod) -> dict[str, object]:
    from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION

    metadata: dict[str, object] = {
        "name": pod.name,
        "namespace": "jobs",
        "uid": pod.uid,
        "labels": {"spark-role": "executor"},
    }
    if pod.seed_labels:
        metadata["labels"] = {
            "spark-role": "executor",
            "batchjob.tuberlin.de/slots-resource-name": _BED,
            "batchjob.tuberlin.de/slots-ids": "_".join(map(str, pod.slot_ids)),
        }
    else:
        metadata["annotations"] = {
            TESTBED_ANNOTATION: _BED,
            SLOT_IDS_ANNOTATION: ",".join(map(str, pod.slot_ids)),
        }
    return {
        "metadata": metadata,
        "spec": {
            "schedulerName": "fleetledger",
            "priorityClassName": "fleetledger-batch",
            "containers": [
                {
                    "name": "executor",
                    "image": "spark:3.5",
                    "resources": {"requests": {"cpu": "1000m", "memory": "2048Mi"}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def _node_json(name: str, slots: int) -> dict[str, object]:
    capacity = {"cpu": str(2 * slots), "memory": f"{2 * slots * _SLOT_MEMORY}Mi", "pods": "110"}
    return {
        "metadata": {
            "name": name,
            "labels": {_LABEL: name[-3:], "kubernetes.io/hostname": name},
        },
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _filter_body(pod: _Pod, world: _World, *, whole_nodes: bool) -> object:
    if whole_nodes:
        items = world.node_objects
        return {"Pod": _pod_json(pod), "Nodes": {"items": items}, "NodeNames": None}
    return {"Pod": _pod_json(pod), "Nodes": None, "NodeNames": list(world.node_names)}


def _preempt_body(pod: _Pod, world: _World, *, whole_victims: bool) -> object:
    # The scheduler's own candidates: each node with the lower-priority pods it would evict.
    if whole_victims:
        victims = {
            n: {"Pods": [{"metadata": {"name": f"ghost-on-{n}", "uid": f"ghost-on-{n}"}}],
                "NumPDBViolations": 0}
            for n in world.node_names
        }  # fmt: skip
        return {"Pod": _pod_json(pod), "NodeNameToVictims": victims, "NodeNameToMetaVictims": None}
    meta = {
        n: {"Pods": [{"UID": f"ghost-on-{n}"}], "NumPDBViolations": 0} for n in world.node_names
    }
    return {"Pod": _pod_json(pod), "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}


async def _drive(
    port: int,
    world: _World,
    *,
    clients: int,
    seconds: float,
    warmup: float,
    rate: float | None,
    weights: tuple[float, float, float],
    seed: int,
    watched: _Watched,
) -> Phase:
    # The callers' own collector pauses would be counted as the server's latency.
    gc.collect()
    gc.freeze()
    samples: list[tuple[str, float]] = []
    outcomes: Counter[str] = Counter()
    moved = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds
    cpu: dict[str, _CpuSample | None] = {}

    async def mark_cpu() -> None:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        cpu["before"] = _CpuSample.take(watched)

    async def caller(number: int) -> None:
        nonlocal moved
        rng = random.Random(seed * 1000 + number)
        # At a rate, the callers' calls fall due in turn, evenly spaced; a call is timed from
        # when it was due, so a server that falls behind is charged for the wait it causes.
        interval = 0.0 if rate is None else clients / rate
        due = start + (0.0 if rate is None else number / rate)
        async with LoopbackClient("127.0.0.1", port) as client:
            while due < stop_at:
                if rate is None:
                    due = time.perf_counter()
                elif (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                kind, pod, path, body = await _next_call(world, rng, weights)
                status, answer = await client.post_json(path, body)
                elapsed = (time.perf_counter() - due) * 1000
                node = _answered_node(status, answer)
                timed = due >= measure_from
                if kind == "reask":
                    with world.lock:
                        wrong = node != pod.node and not pod.ended
                    moved += int(timed and wrong)
                elif node:
                    world.placed_at(pod, node)
                else:
                    world.give_up(pod)
                if timed:
                    samples.append((kind, elapsed))
                    outcomes[
                        f"status {status}" if status != 200 else "placed" if node else "no node"
                    ] += 1
                due += interval

    await asyncio.gather(mark_cpu(), *(caller(n) for n in range(clients)))
    elapsed = time.perf_counter() - measure_from
    after = _CpuSample.take(watched)
    before = cpu.get("before")
    shares = None if before is None or after is None else before.until(after)
    return Phase(
        rate=rate,
        # Until the last timed answer: a server falling behind the rate shows a lower one.
        seconds=elapsed,
        samples=tuple(samples),
        outcomes=outcomes,
        moved=moved,
        server_cpu_seconds=None if shares is None else shares.extender,
        cpu=shares,
    )


async def _next_call(
    world: _World, rng: random.Random, weights: tuple[float, float, float]
) -> tuple[str, _Pod, str, object]:
    kind = rng.choices(_KINDS, weights)[0]
    pod = world.some_placed(rng) if kind == "reask" else None
    if pod is None:
        kind = "first" if kind == "reask" else kind
        pod = await world.new_pod()
    if kind == "preempt":
        return kind, pod, "/preempt", _preempt_body(pod, world, whole_victims=rng.random() < 0.5)
    return kind, pod, "/filter", _filter_body(pod, world, whole_nodes=rng.random() < 0.5)


def _answered_node(status: int, answer: bytes) -> str:
    if status != 200:
        return ""
    body = orjson.loads(answer)
    names = body.get("NodeNames")
    if names:
        return str(names[0])
    nodes = body.get("Nodes")
    if nodes and nodes.get("items"):
        return str(nodes["items"][0]["metadata"]["name"])
    victims = body.get("NodeNameToMetaVictims")
    if victims:
        return str(next(iter(victims)))
    return ""


# -- the server process --------------------------------------------------------------------------


@contextlib.contextmanager
def _cluster(url: str, nodes: int, slots: int, every: float) -> Iterator[tuple[Connection, int]]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    ready = context.Event()
    process = context.Process(
        target=_cluster_process,
        args=(_ClusterSettings(url, nodes, slots, every), theirs, ready),
        name="bench-extender-cluster",
    )
    process.start()
    try:
        deadline = time.monotonic() + 120
        while not ready.wait(0.2):
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the bench's cluster process did not start (exit code {process.exitcode}); "
                    "its error is printed above"
                )
        assert process.pid is not None  # started
        yield ours, process.pid
    finally:
        with contextlib.suppress(OSError):
            ours.send(("stop", None))
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()


@contextlib.contextmanager
def _extender(url: str) -> Iterator[tuple[int, int]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [
        sys.executable, "-m", "fleetledger", "--log-level", "warning", "extender",
        "--url", url, "--port", str(port),
    ]  # fmt: skip
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            _wait_until_ready(f"http://127.0.0.1:{port}", process, errors)
            yield port, process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_ready(base_url: str, process: subprocess.Popen[bytes], errors: IO[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            errors.seek(0)
            raise RuntimeError(
                f"fleetledger extender exited with {process.returncode}:\n"
                + errors.read().decode(errors="replace")[-4000:]
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/readyz", timeout=2).is_success:
                return
        time.sleep(0.1)
    raise RuntimeError("fleetledger extender did not answer within 60 s")
