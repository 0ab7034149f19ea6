"""``fleetledger bench serve --driver wrk``: ``serve`` under a C load generator, to outcomes.

The Python clients of :mod:`.serve` share the machine's cores with the server and spend more of
them per request than it does; ``wrk`` (Debian's ``wrk`` package) spends a fraction of that, so
the rate it reaches is the server's. A ``fleetledger serve`` on a scratch database, with the fake
cloud answering each batch after ``fake_latency`` seconds, takes ``connections`` keep-alive
connections posting single-machine requests for ``seconds``, each with a name of its own (the
Lua script below numbers them per wrk thread). Then the bench watches the log until every
accepted request has its outcome (``vm.MachineCreated`` or ``vm.MachineFailed``), for at most
``outcome_deadline`` seconds after the last POST.

Figures: POSTs per second accepted (202), the latency tail as wrk measured it (p50, p99,
p99.9, max), answers other than 202 and socket errors, *lost* (accepted, not in the log: must
be 0), the server's CPU time per POST and per machine (from the run's first POST to its last
outcome: the request and the machine's creation, which other work on the cores moves far less
than the rate), and ``seconds_to_all_outcomes``: when the run's last outcome entered the log (its
``recorded_at``), after the last POST (``None`` when some had none by the deadline), beside
when the bench saw it; and the server's appends from the first POST until the outcomes were
seen, with how many took over 50 ms and over 250 ms (its ``/metrics``): a p99 that missed beside
slow appends is the database's commits (its WAL flushes), not the server's work. The targets: at
least 2,000 POSTs/s, and every outcome within 15 s of the last POST.

``runs`` consecutive runs against the same server (the log growing under it) show whether the
tail holds run after run: the tail target, for a fake cloud of 50 ms a batch (the coordinator
creating machines while the POSTs run), is at least 2,500 POSTs/s with a p99 under 50 ms in
every run, and every outcome within 5 s.

The bench reads only what the run appended: from the log's head before its first POST, and
only requests and outcomes. It once read the whole log from position 0 after every run, which
took longer as runs piled up (about 1.7 s more per run of 28,000 POSTs, 85,000 events) and
showed as outcomes coming later and later, although the server had logged each run's last
outcome a fraction of a second after its last POST.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog
from prometheus_client.parser import text_string_to_metric_families

from fleetledger.adapters.metrics.appends import APPEND_SECONDS
from fleetledger.adapters.metrics.http import METRICS_PATH
from fleetledger.eventstore import EventStore, open_store

from .scratch import scratch_database
from .serve import TARGET_POSTS_PER_SECOND, drive, process_cpu_seconds, serve_process

__all__ = [
    "TARGET_OUTCOME_SECONDS",
    "CommitTail",
    "FollowedOutcomes",
    "WrkServeReport",
    "WrkServeSeries",
    "append_buckets",
    "commit_tail",
    "follow_outcomes",
    "run_serve_wrk_bench",
]

log = structlog.get_logger("bench.serve")

TARGET_OUTCOME_SECONDS = 15.0
TAIL_POSTS_PER_SECOND = 2_500
TAIL_P99_MS = 50.0
TAIL_OUTCOME_SECONDS = 5.0
_PREFIX = "wrk-"
_OUTCOMES = ("vm.MachineCreated", "vm.MachineFailed")
_FOLLOWED = ("vm.MachineRequested", *_OUTCOMES)

# Each wrk thread numbers its requests; ``done`` sums the threads' accepted answers and prints
# the latency tail as one JSON line (wrk's own report stops at p99).
_SCRIPT = """
local threads = {}
local sent = 0
accepted = 0  -- a global: ``done`` reads each thread's with thread:get

function setup(thread)
  thread:set("number", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  sent = sent + 1
  local name = string.format("%s%d-%d", PREFIX, number, sent)
  local body = string.format(
    '{"request_id":"%s","machine_name":"%s","template":'
    .. '{"vm_size":"Standard_D4s_v5","orchestrator_version":"1.31.2"}}', name, name)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  if status == 202 then accepted = accepted + 1 end
end

function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do total = total + thread:get("accepted") end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"accepted":%d,"non_2xx":%d,"socket_errors":%d,"duration_us":%d,'
    .. '"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\\n',
    summary.requests, total, e.status, e.connect + e.read + e.write + e.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitTail:
    """The server's appends from a run's first POST until its outcomes were seen, from its
    ``/metrics`` (``fleetledger_log_append_duration_seconds``): how many, and how many took
    longer than a p99 may. Every request in flight waits for its commit, so a run whose p99
    missed beside slow appends missed in the database (its WAL's flushes), not in the server's
    own work."""

    appends: int
    over_50ms: int
    over_250ms: int

    def to_dict(self) -> dict[str, int]:
        return {"count": self.appends, "over_50ms": self.over_50ms, "over_250ms": self.over_250ms}

    def render(self) -> str:
        return (
            f"{self.appends:,} appends, {self.over_50ms} over 50 ms, {self.over_250ms} over 250 ms"
        )


def append_buckets(base_url: str) -> dict[str, float] | None:
    """The server's append-duration histogram now: cumulative counts by bucket bound (``le``),
    and ``"count"``; ``None`` when ``/metrics`` does not answer with it."""
    try:
        text = httpx.get(f"{base_url}{METRICS_PATH}", timeout=5).text
    except httpx.HTTPError:
        return None
    buckets: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != APPEND_SECONDS:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets[sample.labels["le"]] = sample.value
            elif sample.name.endswith("_count"):
                buckets["count"] = sample.value
    return buckets or None


_TAIL_BOUNDS = ("count", "0.05", "0.25")
"""The readings :func:`commit_tail` subtracts: the count and the buckets of 50 and 250 ms."""


def commit_tail(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> CommitTail | None:
    """What the histogram gained between two readings of :func:`append_buckets`; ``None``
    when either is unknown or lacks a bound counted here (every append would look slow)."""
    if before is None or after is None:
        return None
    if any(bound not in reading for reading in (before, after) for bound in _TAIL_BOUNDS):
        return None

    def gained(key: str) -> int:
        return round(after.get(key, 0.0) - before.get(key, 0.0))

    count = gained("count")
    return CommitTail(
        appends=count, over_50ms=count - gained("0.05"), over_250ms=count - gained("0.25")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WrkServeReport:
    backend: str
    connections: int
    seconds: float
    fake_latency: float
    requests: int
    accepted: int
    non_2xx: int
    socket_errors: int
    lost: int
    logged: int
    """Requests of the run in the log: the accepted ones, and any whose answer wrk did not wait
    for when its time was up."""
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    with_outcome: int
    seconds_to_all_outcomes: float | None
    """When the run's last outcome entered the log (``recorded_at``), after the last POST."""
    seconds_to_see_outcomes: float | None = None
    """When the bench had read them all, after the last POST (the log is polled)."""
    server_cpu_seconds: float | None = None
    """The serve process's CPU time (user and system) while wrk posted, if known."""
    server_cpu_seconds_to_outcomes: float | None = None
    """Its CPU time from the run's first POST until the bench had seen every outcome."""
    commits: CommitTail | None = None
    """The server's appends during the run, if its metrics answered."""

    @property
    def posts_per_second(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms_per_post(self) -> float | None:
        if self.server_cpu_seconds is None or not self.requests:
            return None
        return round(self.server_cpu_seconds * 1000 / self.requests, 3)

    @property
    def server_cpu_ms_per_machine(self) -> float | None:
        """The server's CPU per request logged, from its POST to its machine's outcome."""
        if self.server_cpu_seconds_to_outcomes is None or not self.logged:
            return None
        return round(self.server_cpu_seconds_to_outcomes * 1000 / self.logged, 3)

    @property
    def passed(self) -> bool:
        return (
            self.posts_per_second >= TARGET_POSTS_PER_SECOND
            and self.lost == 0
            and self.seconds_to_all_outcomes is not None
            and self.seconds_to_all_outcomes <= TARGET_OUTCOME_SECONDS
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "driver": "wrk",
            "backend": self.backend,
            "connections": self.connections,
            "seconds": round(self.seconds, 3),
            "fake_latency_seconds": self.fake_latency,
            "requests": self.requests,
            "accepted": self.accepted,
            "posts_per_second": round(self.posts_per_second, 1),
            "latency_ms": {
                "p50": self.p50_ms,
                "p99": self.p99_ms,
                "p99.9": self.p999_ms,
                "max": self.max_ms,
            },
            "non_2xx": self.non_2xx,
            "socket_errors": self.socket_errors,
            "lost": self.lost,
            "logged": self.logged,
            "with_outcome": self.with_outcome,
            "seconds_to_all_outcomes": self.seconds_to_all_outcomes,
            "seconds_to_see_outcomes": self.seconds_to_see_outcomes,
            "server_cpu_ms_per_post": self.server_cpu_ms_per_post,
            "server_cpu_ms_per_machine": self.server_cpu_ms_per_machine,
            "appends": None if self.commits is None else self.commits.to_dict(),
            "targets": {
                "posts_per_second": TARGET_POSTS_PER_SECOND,
                "seconds_to_all_outcomes": TARGET_OUTCOME_SECONDS,
            },
            "passed": self.passed,
        }

    def render(self) -> str:
        rate = self.posts_per_second
        outcomes = (
            f"all {self.logged} logged within {self.seconds_to_all_outcomes:.1f} s of the last POST"
            + (
                ""
                if self.seconds_to_see_outcomes is None
                else f" (read by the bench after {self.seconds_to_see_outcomes:.1f} s)"
            )
            if self.seconds_to_all_outcomes is not None
            else f"only {self.with_outcome} of {self.logged} logged by the deadline"
        )
        per_machine = self.server_cpu_ms_per_machine
        return "\n".join(
            [
                f"bench serve (wrk, {self.backend}, {self.connections} connections, "
                f"{self.seconds:.0f} s, fake cloud {self.fake_latency:g} s per batch)",
                f"  throughput  {rate:,.0f} accepted POSTs/s "
                f"({rate / TARGET_POSTS_PER_SECOND:.2f}x the {TARGET_POSTS_PER_SECOND:,}/s target)",
                f"  latency     p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, "
                f"p99.9 {self.p999_ms:.1f} ms, max {self.max_ms:.1f} ms",
                f"  answers     {self.accepted} accepted, {self.non_2xx} other than 202, "
                f"{self.socket_errors} socket errors; {self.lost} lost (must be 0)",
                f"  outcomes    {outcomes} (target {TARGET_OUTCOME_SECONDS:.0f} s)",
                "  server CPU  "
                + (
                    "unknown (no /proc)"
                    if self.server_cpu_ms_per_post is None
                    else f"{self.server_cpu_ms_per_post:.3f} ms per POST"
                )
                + " (the serve process, user + system, while wrk posted)"
                + ("" if per_machine is None else f"; {per_machine:.3f} ms per machine to outcome"),
                "  commits     "
                + ("unknown (no metrics)" if self.commits is None else self.commits.render())
                + " (the server's appends, first POST to outcomes)",
                "  verdict     " + ("met" if self.passed else "MISSED"),
            ]
        )


@dataclass(frozen=True, slots=True)
class WrkServeSeries:
    """Consecutive wrk runs against one ``serve``: each run's figures, and the two targets —
    every run's rate and outcomes (:attr:`WrkServeReport.passed`), and the tail target, meant
    for a fake cloud of 50 ms a batch: at least 2,500 POSTs/s with a p99 under 50 ms in every
    run, every outcome within 5 s of the run's last POST."""

    runs: tuple[WrkServeReport, ...]

    @property
    def passed(self) -> bool:
        return all(run.passed for run in self.runs)

    @property
    def tail_passed(self) -> bool:
        return not self.tail_misses()

    def tail_misses(self) -> list[str]:
        """What kept each run from the tail target, as ``run N: …`` (empty when every run met
        it): a series is judged by its worst run, so the report names it."""
        misses = []
        for number, run in enumerate(self.runs, 1):
            missed = []
            if run.posts_per_second < TAIL_POSTS_PER_SECOND:
                missed.append(f"{run.posts_per_second:,.0f} POSTs/s")
            if not run.p99_ms < TAIL_P99_MS:
                missed.append(f"p99 {run.p99_ms:.1f} ms")
            if run.seconds_to_all_outcomes is None:
                missed.append("outcomes missing")
            elif run.seconds_to_all_outcomes > TAIL_OUTCOME_SECONDS:
                missed.append(f"outcomes after {run.seconds_to_all_outcomes:.1f} s")
            if missed:
                misses.append(f"run {number}: " + ", ".join(missed))
        return misses

    def to_dict(self) -> dict[str, object]:
        return {
            "driver": "wrk",
            "runs": [run.to_dict() for run in self.runs],
            "passed": self.passed,
            "tail_target": {
                "posts_per_second": TAIL_POSTS_PER_SECOND,
                "p99_ms": TAIL_P99_MS,
                "seconds_to_all_outcomes": TAIL_OUTCOME_SECONDS,
                "fake_latency_seconds": 0.05,
                "passed": self.tail_passed,
            },
        }

    def render(self) -> str:
        lines = []
        for number, run in enumerate(self.runs, 1):
            text = run.render()
            lines.append(text if len(self.runs) == 1 else f"run {number}: {text}")
        lines.append(
            f"tail target (fake cloud 50 ms, every run): >= {TAIL_POSTS_PER_SECOND:,} POSTs/s, "
            f"p99 < {TAIL_P99_MS:.0f} ms, outcomes within {TAIL_OUTCOME_SECONDS:.0f} s: "
            + ("met" if self.tail_passed else "MISSED (" + "; ".join(self.tail_misses()) + ")")
            + (
                ""
                if all(run.fake_latency == 0.05 for run in self.runs)
                else " (these runs' fake cloud is not 50 ms)"
            )
        )
        return "\n".join(lines)


def run_serve_wrk_bench(
    url: str | None,
    *,
    connections: int = 32,
    seconds: float = 10.0,
    fake_latency: float = 2.0,
    runs: int = 1,
    outcome_deadline: float = TARGET_OUTCOME_SECONDS * 2,
) -> WrkServeSeries:
    """Serve a scratch database of ``url``'s server and drive it with wrk ``runs`` times in a
    row (each run on the log the ones before it left); see the module docstring.
    ``ValueError`` when wrk is not installed."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise ValueError("wrk is not installed: apt-get install wrk (Debian), then run it again")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    reports = []
    with (
        tempfile.TemporaryDirectory() as scratch_dir,
        scratch_database(url) as scratch,
        serve_process(scratch, fake_latency=fake_latency) as (base_url, pid),
        contextlib.closing(open_store(scratch)) as store,
    ):
        backend = "sqlite" if scratch.startswith("sqlite") else "postgres"
        asyncio.run(drive(base_url, clients=min(connections, 32), count=200, prefix="warm"))
        for run in range(1, runs + 1):
            prefix = f"{_PREFIX}{run}-"
            script = Path(scratch_dir) / f"post-machines-{run}.lua"
            script.write_text(f'PREFIX = "{prefix}"\n{_SCRIPT}')
            command = [
                wrk, "-t", "2", "-c", str(connections), "-d", f"{seconds:g}s", "--timeout", "10s",
                "-s", str(script), f"{base_url}/v1/machines",
            ]  # fmt: skip
            log.info("wrk posting", run=run, of=runs, connections=connections, seconds=seconds)
            # Everything the run appends comes after this position.
            start = store.head()
            appends_before = append_buckets(base_url)
            cpu_before = process_cpu_seconds(pid)
            finished = subprocess.run(command, capture_output=True, text=True, check=False)
            last_post, last_post_at = time.monotonic(), time.time()
            cpu_after = process_cpu_seconds(pid)
            if finished.returncode != 0:
                raise RuntimeError(f"wrk failed ({finished.returncode}): {finished.stderr.strip()}")
            figures = json.loads(finished.stdout.strip().splitlines()[-1])
            followed = follow_outcomes(
                store,
                prefix=prefix,
                after=start,
                accepted=figures["accepted"],
                since=last_post,
                deadline=outcome_deadline,
            )
            cpu_outcomes = process_cpu_seconds(pid)
            # Read after the CPU figures: a scrape makes the server fold the run's events into
            # its metrics, work that is not the run's.
            commits = commit_tail(appends_before, append_buckets(base_url))
            logged, with_outcome = followed.logged, followed.with_outcome
            seen = followed.seconds_to_see
            to_outcomes: float | None = None
            if seen is not None:
                last = followed.last_outcome_at
                # Taken from the log, not from when the bench read it; none logged: none awaited.
                to_outcomes = 0.0 if last is None else round(max(0.0, last - last_post_at), 2)
            reports.append(
                WrkServeReport(
                    backend=backend,
                    connections=connections,
                    seconds=figures["duration_us"] / 1e6,
                    fake_latency=fake_latency,
                    requests=figures["requests"],
                    accepted=figures["accepted"],
                    non_2xx=figures["non_2xx"],
                    socket_errors=figures["socket_errors"],
                    lost=max(0, figures["accepted"] - logged),
                    logged=logged,
                    p50_ms=figures["p50_us"] / 1000,
                    p99_ms=figures["p99_us"] / 1000,
                    p999_ms=figures["p999_us"] / 1000,
                    max_ms=figures["max_us"] / 1000,
                    with_outcome=with_outcome,
                    seconds_to_all_outcomes=to_outcomes,
                    seconds_to_see_outcomes=None if seen is None else round(seen, 2),
                    server_cpu_seconds=(
                        None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
                    ),
                    server_cpu_seconds_to_outcomes=(
                        cpu_outcomes - cpu_before
                        if seen is not None and cpu_before is not None and cpu_outcomes is not None
                        else None
                    ),
                    commits=commits,
                )
            )
    return WrkServeSeries(tuple(reports))


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowedOutcomes:
    """What :func:`follow_outcomes` found of one run in the log."""

    logged: int
    """The run's requests in the log."""
    with_outcome: int
    """Those with an outcome."""
    seconds_to_see: float | None
    """Seconds after ``since`` when every logged request was seen with its outcome; ``None``
    past the deadline."""
    last_outcome_at: float | None
    """When the latest of those outcomes entered the log (``recorded_at``, epoch seconds)."""
    events_read: int
    """Events the follow read: the run's requests and outcomes, however long the log."""


def follow_outcomes(
    store: EventStore, *, prefix: str, after: int, accepted: int, since: float, deadline: float
) -> FollowedOutcomes:
    """Follow the log from position ``after`` (the head before the run's first POST) until
    every logged request whose id starts with ``prefix`` has an outcome, for at most
    ``deadline`` seconds after ``since`` (a ``time.monotonic()``)."""
    requested: set[str] = set()
    done: set[str] = set()
    last_outcome_at: float | None = None
    read = 0
    while True:
        # Only the run's own events, of the types that tell: what came before the run (every
        # earlier run's) is never read again, so the follow costs the same in every run.
        for record in store.read_all(after=after, limit=50_000, types=_FOLLOWED):
            after = record.global_position
            read += 1
            request_id = record.data.get("request_id")
            if not isinstance(request_id, str) or not request_id.startswith(prefix):
                continue
            if record.type == "vm.MachineRequested":
                requested.add(request_id)
            else:
                done.add(request_id)
                at = record.recorded_at.timestamp()
                last_outcome_at = at if last_outcome_at is None else max(last_outcome_at, at)
        waited = time.monotonic() - since
        finished = len(requested) >= accepted and requested <= done
        if finished or waited > deadline:
            return FollowedOutcomes(
                logged=len(requested),
                with_outcome=len(done & requested),
                seconds_to_see=waited if finished else None,
                last_outcome_at=last_outcome_at,
                events_read=read,
            )
        time.sleep(0.2)  # the log is polled: outcomes come from the server's own batches
