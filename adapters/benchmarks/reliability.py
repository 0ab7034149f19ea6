"""``fleetledger bench reliability``: hostile inputs and injected faults; nothing may be lost.

On a scratch database (:mod:`.scratch`) the HTTP app runs in-process over a threaded machines
runtime and the fake cloud, and two phases run:

1. **Hostile inputs**: NUL bytes, lone surrogates (escaped and as raw bytes), NaN and infinities,
   a body over the size limit, 10,000 tags, ids holding ``/`` and ``?``, unicode ids, bodies that
   are not JSON objects. Each must be answered with a 4xx and append nothing, or with a 202 whose
   requests are in the log and whose status URL answers.
2. **Faults** during bursts of ordinary requests: every connection to the database cut through a
   loopback TCP proxy (:mod:`.tcp_proxy`) while batches are in the cloud, new ones refused for
   ``outage_seconds`` (Postgres only: an embedded SQLite has no connection to cut), and the
   runtime stopped mid-burst without grace and a new one started on the same log and cloud.

Every acknowledged request (a 202) is waited for, up to ``outcome_timeout`` seconds — after the
outages and before the restart (which would resume anything they left behind), then once more at
the end: *stalled* counts those without an outcome by then; *lost* those acknowledged but absent
from the log or without a terminal event in it once everything has stopped; *duplicated* those
with more than one terminal event, and machines the cloud created twice. All three must be 0,
and the hash chain must verify.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from sqlalchemy.engine import make_url

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
)
from fleetledger.adapters.http import create_app
from fleetledger.adapters.http.in_process import TestClient
from fleetledger.adapters.http.limits import DEFAULT_MAX_BODY_BYTES
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.simulator.dst import DstReport, run_seeds
from fleetledger.domain.machines import GrouperConfig
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import normalise_url

from .edge_fuzz import IDLE_WAIT_SECONDS, fuzz_served, idle_connections_closed_at, serving
from .partition import measure_partition
from .scratch import scratch_database
from .tcp_proxy import TcpProxy, proxied_url

__all__ = [
    "HostileInput",
    "ListenerEdges",
    "ReliabilityReport",
    "hostile_inputs",
    "run_reliability_bench",
]

log = structlog.get_logger("bench.reliability")

_TEMPLATE = {"vm_size": "Standard_D4s_v5", "orchestrator_version": "1.31.2"}
_CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=100), max_timeout=timedelta(seconds=1), max_batch_size=50
)
_PER_POST = 50
_TERMINAL = ["vm.MachineCreated", "vm.MachineFailed"]


@dataclass(frozen=True, slots=True)
class HostileInput:
    """One malformed or unusual call: ``kind`` groups it in the report."""

    kind: str
    method: str
    path: str
    body: bytes = b""


@dataclass(slots=True)
class _Ledger:
    """What the bench saw: statuses by kind, rule breaks, acknowledged ids."""

    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    refused_during_faults: int = 0
    not_ready_during_outage: int = 0

    def saw(self, kind: str, status: int) -> None:
        self.statuses.setdefault(kind, Counter())[status] += 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ReliabilityReport:
    backend: str
    seconds: float
    hostile_inputs: dict[str, dict[str, int]]
    """Per kind of input: how many were tried (``tried``) and the status codes seen."""
    broken_rules: tuple[str, ...]
    """Inputs answered neither with a 4xx appending nothing nor with a 202 that is in the log."""
    faults: dict[str, int]
    acknowledged: int
    refused_during_faults: int
    not_ready_during_outage: int
    lost: int
    stalled: int
    duplicated: int
    chain_ok: bool
    listeners: ListenerEdges | None = None
    """Every route of every listener fuzzed, and idle connections (None: not run)."""
    simulation: DstReport | None = None
    """The deterministic simulation's seeds (None: not run)."""
    partition: Mapping[str, Any] | None = None
    """A leader cut from the database while a burst goes to the follower (Postgres only)."""

    @property
    def server_errors(self) -> int:
        return 0 if self.listeners is None else self.listeners.server_errors

    @property
    def partition_double_attempts(self) -> int | None:
        return None if self.partition is None else int(self.partition["partition_double_attempts"])

    @property
    def passed(self) -> bool:
        return (
            not self.broken_rules
            and self.lost == 0
            and self.stalled == 0
            and self.duplicated == 0
            and self.chain_ok
            and (self.listeners is None or self.listeners.passed)
            and (self.simulation is None or self.simulation.ok)
            and not self.partition_double_attempts
        )

    def to_dict(self) -> dict[str, object]:
        listeners, simulation = self.listeners, self.simulation
        return {
            "backend": self.backend,
            "seconds": round(self.seconds, 2),
            # Per listener: the machines API's own kinds below, plus every route's fuzzing.
            "hostile_inputs": self._inputs_per_listener(),
            "hostile_input_kinds": self.hostile_inputs,
            "broken_rules": list(self.broken_rules),
            "routes_fuzzed": None if listeners is None else listeners.routes_fuzzed,
            "server_errors": self.server_errors,
            "idle_connections_closed": None if listeners is None else listeners.idle_closed,
            "faults": self.faults,
            "seeds_run": 0 if simulation is None else simulation.seeds_run,
            "faults_injected": {} if simulation is None else dict(simulation.faults_injected),
            "simulation_violations": {}
            if simulation is None
            else {k: n for k, n in simulation.violations.items() if n},
            "partition_double_attempts": self.partition_double_attempts,
            "partition": None if self.partition is None else dict(self.partition),
            "acknowledged": self.acknowledged,
            "refused_during_faults": self.refused_during_faults,
            "not_ready_during_outage": self.not_ready_during_outage,
            "lost": self.lost + (0 if simulation is None else simulation.lost),
            "stalled": self.stalled + (0 if simulation is None else simulation.stalled),
            "duplicated": self.duplicated + (0 if simulation is None else simulation.duplicated),
            "chain_ok": self.chain_ok,
            "passed": self.passed,
        }

    def _inputs_per_listener(self) -> dict[str, int]:
        counts = {"api": sum(seen["tried"] for seen in self.hostile_inputs.values())}
        if self.listeners is not None:
            for listener, tried in self.listeners.hostile_inputs.items():
                counts[listener] = counts.get(listener, 0) + tried
        return counts

    def render(self) -> str:
        lines = [f"reliability on {self.backend} ({self.seconds:.1f} s)", "  hostile inputs"]
        for kind, seen in self.hostile_inputs.items():
            codes = ", ".join(f"{code}×{n}" for code, n in seen.items() if code != "tried")
            lines.append(f"    {kind:<24} {seen['tried']:>3} tried  {codes}")
        lines.extend(f"    BROKEN: {problem}" for problem in self.broken_rules)
        faults = ", ".join(f"{kind} {n}" for kind, n in self.faults.items()) or "none"
        lines += [
            f"  faults injected  {faults}",
            f"  acknowledged     {self.acknowledged} requests (refused while faulted: "
            f"{self.refused_during_faults}; /readyz 503 during outages: "
            f"{self.not_ready_during_outage})",
            f"  lost             {self.lost} (target 0)",
            f"  stalled          {self.stalled} (target 0)",
            f"  duplicated       {self.duplicated} (target 0)",
            f"  audit verify     {'ok' if self.chain_ok else 'FAILED'}",
        ]
        if self.listeners is not None:
            lines.append(self.listeners.render())
        if self.simulation is not None:
            lines.append("  " + self.simulation.render().replace("\n", "\n  "))
        if self.partition is None:
            lines.append(
                "  partition        not run (needs Postgres: SQLite has no connection to cut)"
            )
        else:
            lines.append(
                f"  partition        {self.partition_double_attempts} machine names attempted by "
                f"both controllers (target 0); follower took over after "
                f"{self.partition.get('takeover_seconds')} s"
            )
        lines.append(f"  {'PASSED' if self.passed else 'FAILED'}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerEdges:
    """Hostile inputs at every route of every listener of a real ``serve``, and its idle
    connections (see :mod:`.edge_fuzz`)."""

    routes_fuzzed: int
    hostile_inputs: Mapping[str, int]
    server_errors: int
    appended: int
    serves_afterwards: bool
    failures: tuple[str, ...]
    idle_opened: int
    idle_closed: int

    @property
    def passed(self) -> bool:
        return (
            self.server_errors == 0
            and self.appended == 0
            and self.serves_afterwards
            and self.idle_closed == self.idle_opened
        )

    def render(self) -> str:
        per = ", ".join(f"{name} {n}" for name, n in self.hostile_inputs.items())
        lines = [
            f"  routes fuzzed    {self.routes_fuzzed} ({per} hostile inputs): "
            f"{self.server_errors} server errors, {self.appended} events appended (targets 0), "
            f"serves afterwards: {'yes' if self.serves_afterwards else 'NO'}",
            f"  idle sockets     {self.idle_closed} of {self.idle_opened} closed by the server",
        ]
        lines.extend(f"    FAILED: {failure}" for failure in self.failures)
        return "\n".join(lines)


def hostile_inputs(*, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> list[HostileInput]:
    """The malformed and unusual calls the bench makes, by kind."""

    def post(kind: str, request: dict[str, Any] | str) -> HostileInput:
        body = request if isinstance(request, str) else json.dumps(request)
        return HostileInput(kind, "POST", "/v1/machines", body.encode("utf-8", "surrogatepass"))

    def machine(**fields: object) -> dict[str, Any]:
        return {"machine_name": "hostile-1", "template": dict(_TEMPLATE), **fields}

    many_tags = {f"k{n}": "v" for n in range(10_000)}
    return [
        post("nul_byte", machine(machine_name="bad\u0000name")),
        post("nul_byte", machine(tags={"k": "v\u0000"})),
        post("nul_byte", machine(request_id="r\u0000-1")),
        post("nul_byte", machine(template={**_TEMPLATE, "vm_size": "Standard\u0000D4"})),
        post("lone_surrogate", machine(machine_name="bad\ud800")),
        post("lone_surrogate", machine(tags={"k\udfff": "v"})),
        HostileInput(
            "lone_surrogate",
            "POST",
            "/v1/machines",
            b'{"machine_name": "m\xed\xa0\x80", "template": {"vm_size": "Standard_D4s_v5"}}',
        ),
        post("nan", machine(template={**_TEMPLATE, "max_pods": float("nan")})),
        post("nan", machine(template={**_TEMPLATE, "max_pods": float("inf")})),
        post("nan", machine(template={**_TEMPLATE, "os_disk_size_gb": float("-inf")})),
        post("huge_body", machine(tags={"k": "v" * (max_body_bytes + 1)})),
        post("huge_body", {"requests": [machine(machine_name=f"h-{n}") for n in range(20_000)]}),
        post("many_tags", machine(tags=many_tags)),
        post("id_with_slash_or_query", machine(request_id="a/b")),
        post("id_with_slash_or_query", machine(request_id="a?b=c")),
        post("id_with_slash_or_query", machine(request_id="../../etc/passwd")),
        HostileInput("id_with_slash_or_query", "GET", "/v1/machines/a%2Fb%3Fc"),
        HostileInput("id_with_slash_or_query", "GET", "/v1/machines/a/b?wait=0"),
        post("unicode_id", machine(request_id="réq-1")),
        post("unicode_id", machine(request_id="请求-1")),
        post("unicode_id", machine(machine_name="mächine-1")),
        post("unicode_id", machine(request_id="uni-ok-1", tags={"owner": "zoë 😀"})),
        HostileInput("unicode_id", "GET", "/v1/machines/%F0%9F%98%80"),
        post("not_a_json_object", "{"),
        post("not_a_json_object", "[]"),
        post("not_a_json_object", "null"),
        post("not_a_json_object", '"machine"'),
        post("not_a_json_object", '{"requests": []}'),
        # A well-formed request with every allowed id character: must be kept, and findable.
        post("unusual_but_valid", machine(request_id="A.b_c:d~e-1", machine_name="odd-1")),
    ]


def run_reliability_bench(
    url: str | None,
    *,
    requests: int = 200,
    connection_drops: int = 2,
    outage_seconds: float = 2.0,
    outcome_timeout: float = 30.0,
    fuzz_inputs_per_route: int = 0,
    idle_connections: int = 0,
    seeds: int = 0,
    partition: bool = False,
) -> ReliabilityReport:
    """Run both phases on a scratch database beside ``url``; see the module docstring. Beyond
    them: with ``fuzz_inputs_per_route`` every route of a real ``serve``'s listeners is fuzzed
    and ``idle_connections`` sockets are left idle on it; ``seeds`` deterministic simulation
    seeds run (each on a log of its own); with ``partition`` (Postgres) a leader is cut from
    the database while a burst goes to the follower."""
    if requests < 1 or connection_drops < 0 or outage_seconds <= 0 or outcome_timeout <= 0:
        raise ValueError(
            "requests must be >= 1, connection_drops >= 0, outage_seconds and outcome_timeout > 0"
        )
    if fuzz_inputs_per_route < 0 or idle_connections < 0 or seeds < 0:
        raise ValueError("fuzz_inputs_per_route, idle_connections and seeds must be >= 0")
    started = time.perf_counter()
    ledger = _Ledger()
    with scratch_database(url) as scratch:
        backend = normalise_url(scratch).get_backend_name()
        cloud = _SignallingCloud(FakeCloud(clock=SystemClock(), latency=0.3))
        with contextlib.ExitStack() as stack:
            proxy = None
            runtime_url = scratch
            if backend == "postgresql":
                target = make_url(scratch)
                proxy = stack.enter_context(
                    TcpProxy(target.host or "127.0.0.1", target.port or 5432)
                )
                runtime_url = proxied_url(scratch, proxy)
            store = stack.enter_context(contextlib.closing(open_store(runtime_url)))
            _hostile_phase(store, cloud, ledger)
            stalled = _fault_phase(
                store,
                cloud,
                ledger,
                proxy=proxy,
                requests=requests,
                connection_drops=connection_drops,
                outage_seconds=outage_seconds,
                outcome_timeout=outcome_timeout,
            )
        with contextlib.closing(open_store(scratch)) as store:
            lost, duplicated = _check_the_log(store, ledger.acknowledged)
            chain_ok = store.verify().ok
    creations = Counter(cloud.inner.creations)
    duplicated += sum(1 for count in creations.values() if count > 1)
    listeners = (
        _listener_edges(url, inputs_per_route=fuzz_inputs_per_route, idle=idle_connections)
        if fuzz_inputs_per_route or idle_connections
        else None
    )
    simulation = None
    if seeds:
        log.info("simulating seeds", seeds=seeds)
        simulation = run_seeds(seeds)
    partitioned = None
    if partition and backend == "postgresql":
        log.info("partitioning a leader from the database")
        partitioned = measure_partition(url)
    report = ReliabilityReport(
        backend=backend,
        seconds=time.perf_counter() - started,
        hostile_inputs={
            kind: {
                "tried": sum(seen.values()),
                **{str(code): n for code, n in sorted(seen.items())},
            }
            for kind, seen in ledger.statuses.items()
        },
        broken_rules=tuple(ledger.broken),
        faults=dict(ledger.faults),
        acknowledged=len(ledger.acknowledged),
        refused_during_faults=ledger.refused_during_faults,
        not_ready_during_outage=ledger.not_ready_during_outage,
        lost=lost,
        stalled=stalled,
        duplicated=duplicated,
        chain_ok=chain_ok,
        listeners=listeners,
        simulation=simulation,
        partition=partitioned,
    )
    log.info("reliability bench done", **report.to_dict())
    return report


def _listener_edges(url: str | None, *, inputs_per_route: int, idle: int) -> ListenerEdges:
    """Every listener of one real ``serve`` fuzzed, then ``idle`` sockets left on its API."""
    log.info("fuzzing every listener", inputs_per_route=inputs_per_route)
    with serving(url) as served:
        fuzzed = (
            fuzz_served(served, inputs_per_route=inputs_per_route, rng=random.Random(1))
            if inputs_per_route
            else {}
        )
        closed = (
            idle_connections_closed_at(
                "127.0.0.1", served.api_port, connections=idle, wait=IDLE_WAIT_SECONDS
            )
            if idle
            else {"idle_connections_closed": 0}
        )
    return ListenerEdges(
        routes_fuzzed=int(fuzzed.get("routes_fuzzed", 0)),
        hostile_inputs=dict(fuzzed.get("hostile_inputs", {})),
        server_errors=int(fuzzed.get("server_errors", 0)),
        appended=int(fuzzed.get("appended", 0)),
        serves_afterwards=bool(fuzzed.get("serves_afterwards", True)),
        failures=tuple(fuzzed.get("failures", ())),
        idle_opened=idle,
        idle_closed=int(closed["idle_connections_closed"]),
    )


# -- phase 1: hostile inputs -----------------------------------------------------------------------


def _hostile_phase(store: EventStore, cloud: _SignallingCloud, ledger: _Ledger) -> None:
    runtime = MachinesRuntime(store, cloud, clock=SystemClock(), config=_CONFIG)
    with runtime, TestClient(create_app(runtime)) as client:
        for hostile in hostile_inputs():
            _try(client, store, hostile, ledger)
        # Everything the log holds came from an acknowledged call: no refusal appended.
        requested = _requested_ids(store)
        unexpected = requested - set(ledger.acknowledged)
        if unexpected:
            ledger.broken.append(f"requests in the log that no 202 acknowledged: {unexpected}")


def _try(client: TestClient, store: EventStore, hostile: HostileInput, ledger: _Ledger) -> None:
    headers = {"content-type": "application/json"}
    try:
        answer = client.request(hostile.method, hostile.path, content=hostile.body, headers=headers)
    except Exception as e:  # the app itself must never raise through the client
        ledger.saw(hostile.kind, 0)
        ledger.broken.append(f"{hostile.kind} {hostile.method} {hostile.path}: raised {e!r}")
        return
    status = answer.status_code
    ledger.saw(hostile.kind, status)
    described = f"{hostile.kind} {hostile.method} {hostile.path} {hostile.body[:60]!r}"
    if hostile.method == "GET":
        if status not in (200, 404):
            ledger.broken.append(f"{described}: answered {status}")
        return
    if 400 <= status < 500:
        return
    if status != 202:
        ledger.broken.append(f"{described}: answered {status}")
        return
    ids = [str(i) for i in answer.json()["request_ids"]]
    ledger.acknowledged.extend(ids)
    missing = set(ids) - _requested_ids(store)
    if missing:
        ledger.broken.append(f"{described}: acknowledged {missing} but the log lacks them")
    for status_url in answer.json()["status_urls"]:
        if client.get(status_url).status_code != 200:
            ledger.broken.append(f"{described}: its status URL {status_url} does not answer")


# -- phase 2: faults -------------------------------------------------------------------------------


def _fault_phase(
    store: EventStore,
    cloud: _SignallingCloud,
    ledger: _Ledger,
    *,
    proxy: TcpProxy | None,
    requests: int,
    connection_drops: int,
    outage_seconds: float,
    outcome_timeout: float,
) -> int:
    drops = connection_drops if proxy is not None else 0
    bursts = _bursts(requests, parts=2 * drops + 2)
    stalled = 0
    runtime = MachinesRuntime(store, cloud, clock=SystemClock(), config=_CONFIG).start()
    try:
        client = TestClient(create_app(runtime))
        if proxy is not None:
            for _ in range(drops):
                _post_burst(client, next(bursts), ledger, cloud=cloud)
                _outage(client, proxy, ledger, seconds=outage_seconds)
                _post_burst(client, next(bursts), ledger)
            # Counted before the restart, which would resume whatever the outages left behind:
            # the runtime must finish its work by itself once the database is back.
            stalled += _stalled(runtime, ledger.acknowledged, timeout=outcome_timeout)
        # A restart mid-burst: the batches in the cloud are left to the next runtime.
        _post_burst(client, next(bursts), ledger, cloud=cloud)
    finally:
        runtime.stop(timeout=0)
    ledger.faults["runtime_restarts"] += 1
    with MachinesRuntime(store, cloud, clock=SystemClock(), config=_CONFIG) as runtime:
        client = TestClient(create_app(runtime))
        _post_burst(client, next(bursts), ledger)
        return stalled + _stalled(runtime, ledger.acknowledged, timeout=outcome_timeout)


def _bursts(requests: int, *, parts: int) -> Iterator[list[str]]:
    names = [f"rel-{n}" for n in range(requests)]
    size = max(1, -(-requests // parts))
    for start in range(0, requests, size):
        yield names[start : start + size]
    while True:
        yield []


def _post_burst(
    client: TestClient,
    names: list[str],
    ledger: _Ledger,
    *,
    cloud: _SignallingCloud | None = None,
) -> None:
    """POST ``names`` (50 a call); with ``cloud``, return once a batch of them is in the cloud."""
    if cloud is not None:
        cloud.entered.clear()
    for start in range(0, len(names), _PER_POST):
        body = {
            "requests": [
                {"request_id": name, "machine_name": name, "template": _TEMPLATE}
                for name in names[start : start + _PER_POST]
            ]
        }
        answer = client.post("/v1/machines", json=body)
        if answer.status_code == 202:
            ledger.acknowledged.extend(str(i) for i in answer.json()["request_ids"])
        else:
            ledger.refused_during_faults += 1
    if cloud is not None and names and not cloud.entered.wait(10):
        log.warning("no batch reached the cloud within 10 s; faulting anyway")


def _outage(client: TestClient, proxy: TcpProxy, ledger: _Ledger, *, seconds: float) -> None:
    """Cut every connection, refuse new ones for ``seconds``; a POST and a readiness probe are
    tried meanwhile (a 503 each is right: nothing can be acknowledged without the log)."""
    proxy.cut()
    ledger.faults["connection_drops"] += 1
    back = threading.Timer(seconds, proxy.restore)
    back.start()
    try:
        if client.get("/readyz").status_code == 503:
            ledger.not_ready_during_outage += 1
        body = {"machine_name": "during-outage", "template": _TEMPLATE}
        answer = client.post("/v1/machines", json=body)
        if answer.status_code == 202:
            ledger.acknowledged.extend(str(i) for i in answer.json()["request_ids"])
        else:
            ledger.refused_during_faults += 1
        back.join()
    finally:
        back.cancel()
        proxy.restore()


def _stalled(runtime: MachinesRuntime, request_ids: list[str], *, timeout: float) -> int:
    """How many of ``request_ids`` have no outcome within ``timeout`` seconds (in all)."""
    deadline = time.monotonic() + timeout
    stalled = 0
    for request_id in request_ids:
        future = runtime.machines.outcome(request_id)
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            stalled += 1
    return stalled


# -- the verdict -----------------------------------------------------------------------------------


def _check_the_log(store: EventStore, acknowledged: list[str]) -> tuple[int, int]:
    """(lost, duplicated): acknowledged requests missing from the log or without a terminal
    event in it, and requests with more than one terminal event."""
    requested = _requested_ids(store)
    terminal: Counter[str] = Counter(
        str(event.data["request_id"])
        for event in store.read_all(after=0, limit=1_000_000, types=_TERMINAL)
    )
    lost = sum(1 for i in set(acknowledged) if i not in requested or terminal[i] == 0)
    duplicated = sum(1 for count in terminal.values() if count > 1)
    return lost, duplicated


def _requested_ids(store: EventStore) -> set[str]:
    return {
        str(event.data["request_id"])
        for event in store.read_all(after=0, limit=1_000_000, types=["vm.MachineRequested"])
    }


class _SignallingCloud:
    """The fake cloud, setting ``entered`` whenever a create call arrives."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner
        self.entered = threading.Event()

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self.entered.set()
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)
