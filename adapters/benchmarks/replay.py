"""``fleetledger bench replay``: every read model rebuilt from position 0 of a long log.

The log holds every capability's events (:mod:`.replay_log` makes it: the simulator's scenarios,
copied under distinct names) — by default a million of them, on a scratch database on the server
at ``url`` (Postgres; ``sqlite:///FILE`` measures SQLite), or on a log of the caller's own
(``log``), topped up to ``events`` if it holds fewer. Making it is not timed.

The replay runs in a child process of its own, so that neither making the log nor this process's
imports count towards its peak memory: it reads the log from position 0 in pages (each next page
read while the one before is folded) and folds every event into every read model ``fleetledger
replay`` rebuilds (nodes, subnets, each grouper's machine requests) and into placement's workload
ledger, a page at a time, then reports the events folded, the wall seconds and its peak resident
memory (the kernel's high-water mark of the child, interpreter included). Targets: 100,000
events/s and less than 1 GiB for a million events on Postgres.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetledger.domain.placement import workloads
from fleetledger.eventstore import EventStore, migrate, open_store
from fleetledger.projections._reading import bulk_read, log_pages

from .replay_log import GeneratedLog, generate_log
from .scratch import scratch_database

if TYPE_CHECKING:
    from fleetledger.adapters.cli.replay import Replayed
    from fleetledger.adapters.placement.workloads import WorkloadLedger

__all__ = [
    "DEFAULT_EVENTS",
    "PAGE",
    "TARGET_EVENTS_PER_SECOND",
    "TARGET_PEAK_RSS_BYTES",
    "Folded",
    "ReplayBenchReport",
    "ReplayFigures",
    "fold_log",
    "measure_in_child",
    "replay_models",
    "run_replay_bench",
]

DEFAULT_EVENTS = 1_000_000
TARGET_EVENTS_PER_SECOND = 100_000
TARGET_PEAK_RSS_BYTES = 1 << 30
PAGE = 5000
"""Events per read. Measured on a million events on Postgres, the next page read ahead: 130,000
to 132,000 events/s in pages of 2,000 or 5,000, 127,000 to 137,000 in pages of 10,000 or 20,000
(and 50 MiB more at the peak); without the read ahead, on 100,000 events: 2.17 s in pages of
1,000, 2.07 s in pages of 5,000, 2.37 s in pages of 20,000."""

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Folded:
    """What the read models hold after a replay: evidence that each one folded its events."""

    events: int
    position: int
    nodes: int
    subnets: int
    groupers: int
    machine_requests: int
    workloads: int


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """One replay, measured in the process that ran it. ``cpu_seconds``: the processor time it
    took (every thread's), which other work sharing the machine changes less than the wall
    seconds: compare two runs by it on a busy machine."""

    folded: Folded
    seconds: float
    peak_rss_bytes: int
    cpu_seconds: float

    @property
    def events_per_second(self) -> float:
        return self.folded.events / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class ReplayBenchReport:
    """The figures of one run, each beside its target."""

    backend: str
    events: int
    page: int
    generated: GeneratedLog
    figures: ReplayFigures

    @property
    def meets_rate(self) -> bool:
        return self.figures.events_per_second >= TARGET_EVENTS_PER_SECOND

    @property
    def meets_memory(self) -> bool:
        return self.figures.peak_rss_bytes < TARGET_PEAK_RSS_BYTES

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json``; the keys are stable."""
        figures = self.figures
        return {
            "backend": self.backend,
            "events": self.events,
            "page": self.page,
            "generated": asdict(self.generated),
            "replay": {
                "events_per_second": round(figures.events_per_second, 1),
                "seconds": round(figures.seconds, 3),
                "cpu_seconds": round(figures.cpu_seconds, 3),
                "peak_rss_bytes": figures.peak_rss_bytes,
                "folded": asdict(figures.folded),
            },
            "targets": {
                "events_per_second": TARGET_EVENTS_PER_SECOND,
                "events_per_second_met": self.meets_rate,
                "peak_rss_bytes_below": TARGET_PEAK_RSS_BYTES,
                "peak_rss_met": self.meets_memory,
            },
        }

    def render(self) -> str:
        """The figures as text, each beside its target."""
        figures, folded = self.figures, self.figures.folded
        return "\n".join(
            [
                f"bench replay: {folded.events:,} events from position 0 through every read model "
                f"({self.backend}, pages of {self.page:,})",
                f"  rate:      {figures.events_per_second:>12,.0f} events/s in "
                f"{figures.seconds:.2f} s, {figures.cpu_seconds:.2f} s of CPU (target >= "
                f"{TARGET_EVENTS_PER_SECOND:,}: {'met' if self.meets_rate else 'MISSED'})",
                f"  peak RSS:  {figures.peak_rss_bytes / _MIB:>12,.0f} MiB (target < "
                f"{TARGET_PEAK_RSS_BYTES // _MIB:,} MiB: "
                f"{'met' if self.meets_memory else 'MISSED'})",
                f"  folded:    {folded.nodes:,} nodes, {folded.subnets:,} subnets, "
                f"{folded.machine_requests:,} machine requests of {folded.groupers:,} groupers, "
                f"{folded.workloads:,} workloads (to position {folded.position:,})",
                f"  log:       {self.generated.events:,} events made for this run "
                f"({self.generated.copies} copies of {self.generated.template_events:,}) in "
                f"{self.generated.seconds:.1f} s, not timed",
            ]
        )


def fold_log(store: EventStore, *, events: int | None = None, page: int = PAGE) -> Folded:
    """Fold the log from position 0 (its first ``events`` events, or all of them) into every
    read model ``fleetledger replay`` rebuilds and into placement's workload ledger."""
    models, ledger, folded = replay_models(store, events=events, page=page)
    return Folded(
        events=folded,
        position=models.position,
        nodes=len(models.nodes.states()),
        subnets=len(models.subnets.subnets()),
        groupers=len(models.requests),
        # Counted by status, not as views: a view per request built just to count them was a
        # hundredth of a replay.
        machine_requests=sum(sum(m.counts().values()) for m in models.requests.values()),
        workloads=len(ledger.items()),
    )


def replay_models(
    store: EventStore, *, events: int | None = None, page: int = PAGE
) -> tuple[Replayed, WorkloadLedger, int]:
    """The read models of :func:`fold_log`, and how many events they folded."""
    from fleetledger.adapters.cli.replay import Replayed
    from fleetledger.adapters.placement.workloads import WorkloadLedger

    models = Replayed()
    ledger = WorkloadLedger()
    apply, fold = models.apply_page, ledger.fold
    # The ledger folds the records of workload streams and passes over every other one; the
    # call per record only to find that out was a twentieth of a replay.
    workload_stream = workloads.STREAM_PREFIX
    folded = 0
    with bulk_read():
        for records in log_pages(store, page=page, events=events):
            apply(records)
            for record in records:
                if record.stream_id.startswith(workload_stream):
                    fold(record)
            folded += len(records)
    return models, ledger, folded


def _measure(url: str, events: int, page: int) -> ReplayFigures:
    """The replay, timed; run in a fresh child process."""
    _import_read_models()
    with open_store(url) as store:
        began, began_cpu = time.perf_counter(), time.process_time()
        folded = fold_log(store, events=events, page=page)
        seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
    return ReplayFigures(
        folded=folded,
        seconds=seconds,
        peak_rss_bytes=_peak_rss_bytes(),
        cpu_seconds=cpu_seconds,
    )


def _import_read_models() -> None:
    """Import what the replay folds with before the clock starts: the modules the read models
    import lazily cost a fresh process a few tenths of a second, which is no part of a replay."""
    import fleetledger.adapters.cli.replay
    import fleetledger.adapters.machines.streams
    import fleetledger.adapters.placement.workloads
    import fleetledger.projections.machine_requests  # noqa: F401


def _peak_rss_bytes() -> int:
    """This process's peak resident memory. On Linux ``VmHWM``: ``getrusage``'s ``ru_maxrss``
    survives the ``exec`` that starts a spawned child, so it reported the parent's size when
    the parent had grown larger (by making the log) than the replay ever did."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    # ru_maxrss is in kilobytes on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def measure_in_child(url: str, *, events: int, page: int = PAGE) -> ReplayFigures:
    """:func:`fold_log` timed in a new process (spawned, so it inherits no memory of ours)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_measure, url, events, page).result()


def run_replay_bench(
    url: str | None,
    *,
    events: int = DEFAULT_EVENTS,
    log: str | None = None,
    page: int = PAGE,
    seed: int = 1,
    scenarios: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReplayBenchReport:
    """Make (or top up) the log, then time its replay; see the module docstring."""
    if events < 1 or page < 1:
        raise ValueError("events and page must both be at least 1")
    say = progress or _stderr
    if log is not None:
        migrate.upgrade(log)
        return _bench(log, events=events, page=page, seed=seed, scenarios=scenarios, say=say)
    from .extender import default_server_url

    with scratch_database(default_server_url(url)) as scratch:
        return _bench(scratch, events=events, page=page, seed=seed, scenarios=scenarios, say=say)


def _bench(
    url: str,
    *,
    events: int,
    page: int,
    seed: int,
    scenarios: Sequence[str] | None,
    say: Callable[[str], None],
) -> ReplayBenchReport:
    generated = generate_log(url, events=events, seed=seed, scenarios=scenarios, progress=say)
    say(f"replaying {events:,} events in a child process")
    figures = measure_in_child(url, events=events, page=page)
    return ReplayBenchReport(
        backend=url.split(":", 1)[0].split("+", 1)[0],
        events=events,
        page=page,
        generated=generated,
        figures=figures,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
