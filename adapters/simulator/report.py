"""What a simulation measured: figures as a frozen dataclass, JSON-ready or as readable text.

Every figure is a function of the seed (virtual time, counts): no wall-clock time, run id or
database name appears, so the same seed gives the same report on SQLite and Postgres, twice.

Latencies are on virtual time, per request: *batching* latency is the time a request waited in
the grouper (sealed − requested; zero for a request that skipped batching), *end-to-end* latency
the time to its outcome (outcome − requested), which adds queueing for a free cloud slot and the
cloud's own latency. Percentiles are nearest-rank.

A :class:`Checkpoint` is what a scenario's live runtime held at a log position, kept so that
``fleetledger dumpstate --as-of POSITION`` (a replay of the log) can be checked against it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetledger.projections.nodes import dump_json

__all__ = ["Checkpoint", "ComparisonReport", "Latency", "SimulationReport", "percentile"]


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Latency:
    """p50, p99 and max of a set of durations, in seconds."""

    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        return cls(percentile(seconds, 50), percentile(seconds, 99), max(seconds, default=0.0))

    def to_dict(self) -> dict[str, float]:
        return {"p50": round(self.p50, 3), "p99": round(self.p99, 3), "max": round(self.max, 3)}


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The dumpstate a scenario's runtime held in memory (its hosted streams' folds, not a read
    of the log) when the log's head was ``position``.

    Replaying the log to the same position must give the same dump: ``fleetledger dumpstate
    --as-of POSITION`` prints it as the JSON text whose SHA-256 is :attr:`sha256`.
    """

    label: str
    position: int
    state: Mapping[str, object]

    @property
    def sha256(self) -> str:
        """SHA-256 of the dump's canonical JSON text (``dumpstate``'s output line, UTF-8)."""
        return hashlib.sha256(dump_json(self.state).encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "position": self.position, "sha256": self.sha256}


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationReport:
    """The figures of one run of a scenario."""

    scenario: str
    seed: int
    mode: str
    idle_timeout_s: float
    max_timeout_s: float
    max_batch_size: int
    cloud_latency_s: float
    max_concurrent_batches: int
    bursts: int
    requests: int
    skip_batching_requests: int
    cloud_calls: int
    machine_reads: int
    batches: int
    seal_reasons: tuple[tuple[str, int], ...]
    mean_batch_size: float
    largest_batch: int
    batching_latency: Latency
    end_to_end_latency: Latency
    created: int
    failed: int
    failures: tuple[tuple[str, int], ...]
    without_outcome: int
    machines_created: int
    duplicate_machines: int
    machines_in_cloud: int
    failed_leftovers_deleted: int
    virtual_seconds: float
    seconds_to_all_outcomes: float
    """From the first request to the last outcome, in virtual seconds (what a burst's callers
    wait in all)."""
    injections: tuple[str, ...]

    @property
    def batching_ratio(self) -> float:
        """Requests per cloud create call (1.0 without batching)."""
        return self.requests / self.cloud_calls if self.cloud_calls else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json`` and for comparing runs."""
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "mode": self.mode,
            "config": {
                "idle_timeout_s": self.idle_timeout_s,
                "max_timeout_s": self.max_timeout_s,
                "max_batch_size": self.max_batch_size,
                "cloud_latency_s": self.cloud_latency_s,
                "max_concurrent_batches": self.max_concurrent_batches,
            },
            "bursts": self.bursts,
            "requests": self.requests,
            "skip_batching_requests": self.skip_batching_requests,
            "cloud_calls": self.cloud_calls,
            "machine_reads": self.machine_reads,
            "batching_ratio": round(self.batching_ratio, 2),
            "batches": self.batches,
            "seal_reasons": dict(self.seal_reasons),
            "mean_batch_size": round(self.mean_batch_size, 2),
            "largest_batch": self.largest_batch,
            "batching_latency_s": self.batching_latency.to_dict(),
            "end_to_end_latency_s": self.end_to_end_latency.to_dict(),
            "outcomes": {
                "created": self.created,
                "failed": self.failed,
                "failures": dict(self.failures),
                "without_outcome": self.without_outcome,
            },
            "machines_created": self.machines_created,
            "duplicate_machines": self.duplicate_machines,
            "machines_in_cloud": self.machines_in_cloud,
            "failed_leftovers_deleted": self.failed_leftovers_deleted,
            "virtual_seconds": round(self.virtual_seconds, 3),
            "seconds_to_all_outcomes": round(self.seconds_to_all_outcomes, 3),
            "injections": list(self.injections),
        }

    def render(self) -> str:
        """A readable summary."""
        failures = ", ".join(f"{code} {n}" for code, n in self.failures) or "none"
        reasons = ", ".join(f"{reason} {n}" for reason, n in self.seal_reasons) or "none"
        lines = [
            f"scenario {self.scenario} (seed {self.seed}, {self.mode}): {self.requests} requests "
            f"in {self.bursts} burst(s) over {self.virtual_seconds:.1f} s of virtual time",
            f"  config            idle {self.idle_timeout_s:g} s, max {self.max_timeout_s:g} s, "
            f"batch <= {self.max_batch_size}; cloud latency {self.cloud_latency_s:g} s, "
            f"<= {self.max_concurrent_batches} calls in flight",
            f"  cloud calls       {self.cloud_calls} creates (+{self.machine_reads} reads); "
            f"batching ratio {self.batching_ratio:.2f} requests/call",
            f"  batches           {self.batches} (mean {self.mean_batch_size:.1f}, largest "
            f"{self.largest_batch}); sealed by {reasons}",
            f"  batching latency  p50 {_ms(self.batching_latency.p50)}, p99 "
            f"{_ms(self.batching_latency.p99)}, max {_ms(self.batching_latency.max)}",
            f"  end-to-end        p50 {_ms(self.end_to_end_latency.p50)}, p99 "
            f"{_ms(self.end_to_end_latency.p99)}, max {_ms(self.end_to_end_latency.max)}",
            f"  outcomes          {self.created} created, {self.failed} failed ({failures}); "
            f"{self.without_outcome} without outcome; all in "
            f"{self.seconds_to_all_outcomes:.1f} s from the first request",
            f"  machines          {self.machines_created} created in the cloud, "
            f"{self.failed_leftovers_deleted} failed leftovers deleted, "
            f"{self.machines_in_cloud} left; {self.duplicate_machines} duplicates",
        ]
        lines.extend(f"  injected          {text}" for text in self.injections)
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ComparisonReport:
    """The same arrivals with batching and without (``--compare naive``)."""

    batched: SimulationReport
    naive: SimulationReport

    @property
    def cloud_call_ratio(self) -> float:
        """How many times more create calls the naive run made."""
        return (
            self.naive.cloud_calls / self.batched.cloud_calls if self.batched.cloud_calls else 0.0
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "batched": self.batched.to_dict(),
            "naive": self.naive.to_dict(),
            "cloud_call_ratio": round(self.cloud_call_ratio, 2),
        }

    def render(self) -> str:
        b, n = self.batched, self.naive
        rows = [
            ("requests", str(b.requests), str(n.requests)),
            ("cloud create calls", str(b.cloud_calls), str(n.cloud_calls)),
            ("machine reads", str(b.machine_reads), str(n.machine_reads)),
            ("batching ratio", f"{b.batching_ratio:.2f}", f"{n.batching_ratio:.2f}"),
            ("batches", str(b.batches), str(n.batches)),
            ("batching latency p50", _ms(b.batching_latency.p50), _ms(n.batching_latency.p50)),
            ("batching latency p99", _ms(b.batching_latency.p99), _ms(n.batching_latency.p99)),
            ("end-to-end p50", _ms(b.end_to_end_latency.p50), _ms(n.end_to_end_latency.p50)),
            ("end-to-end p99", _ms(b.end_to_end_latency.p99), _ms(n.end_to_end_latency.p99)),
            ("created", str(b.created), str(n.created)),
            ("failed", str(b.failed), str(n.failed)),
            ("without outcome", str(b.without_outcome), str(n.without_outcome)),
            ("duplicate machines", str(b.duplicate_machines), str(n.duplicate_machines)),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [
            f"scenario {b.scenario} (seed {b.seed}): batched vs naive (every request its own call)",
            f"  {'':<{width}}  {'batched':>12}  {'naive':>12}",
        ]
        lines.extend(f"  {name:<{width}}  {left:>12}  {right:>12}" for name, left, right in rows)
        lines.append(
            f"  naive makes {self.cloud_call_ratio:.1f}x the cloud create calls of batched"
        )
        return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"
