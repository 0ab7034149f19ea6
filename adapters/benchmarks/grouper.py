"""``fleetledger bench grouper``: how fast the pure Grouper folds requests, and how well it batches.

The workload is bursty, like Karpenter under a wave of pending pods (seed 01, "Why Batching?"):
bursts of requests a few milliseconds apart, separated by quiet gaps of up to a few seconds, with
some templates far more popular than others. Commands are built up front from ``seed``; only the
``decide`` + ``evolve`` fold is timed, so the figure is the domain's own cost, without a store.
The fold runs ``repeat`` times from scratch; like ``timeit``, the headline is the best run (noise
from other processes only ever slows a run down) and the median is reported beside it.

Batching quality is reported against the floor: a template with ``n`` requests needs at least
``ceil(n / max_batch_size)`` cloud calls, so ``calls_ratio`` = calls made / that floor (1.0 is
perfect; idle and max timeouts in quiet periods are what push it above 1).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fleetledger.domain.machines import (
    BatchSealed,
    GrouperCommand,
    GrouperConfig,
    GrouperEvent,
    RequestMachine,
    Tick,
    grouper,
)
from fleetledger.domain.template import MachineTemplate, template_hash

__all__ = ["GrouperBenchReport", "TARGET_REQUESTS_PER_SECOND", "run_grouper_bench"]

TARGET_REQUESTS_PER_SECOND = 50_000

_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_BURST_SIZE = (1, 400)  # requests per burst
_IN_BURST_GAP_MS = 2.0  # mean gap between requests of one burst (exponential)
_QUIET_GAP_S = (0.0, 3.0)  # gap between bursts (uniform)


@dataclass(frozen=True, slots=True)
class GrouperBenchReport:
    """The figures of one run."""

    requests: int
    templates: int
    seed: int
    idle_timeout_s: float
    max_timeout_s: float
    max_batch_size: int
    repeat: int
    seconds: float
    requests_per_second: float
    median_requests_per_second: float
    target_requests_per_second: int
    batches_sealed: int
    cloud_calls: int
    min_cloud_calls: int
    calls_ratio: float
    largest_batch: int
    mean_batch_size: float
    seal_reasons: tuple[tuple[str, int], ...]
    simulated_span_s: float

    @property
    def meets_target(self) -> bool:
        """Whether the fold ran at least as fast as the target."""
        return self.requests_per_second >= self.target_requests_per_second

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures, for ``--json`` output and for comparing runs."""
        return {
            "requests": self.requests,
            "templates": self.templates,
            "seed": self.seed,
            "config": {
                "idle_timeout_s": self.idle_timeout_s,
                "max_timeout_s": self.max_timeout_s,
                "max_batch_size": self.max_batch_size,
            },
            "repeat": self.repeat,
            "seconds": round(self.seconds, 6),
            "requests_per_second": round(self.requests_per_second, 1),
            "median_requests_per_second": round(self.median_requests_per_second, 1),
            "target_requests_per_second": self.target_requests_per_second,
            "meets_target": self.meets_target,
            "batches_sealed": self.batches_sealed,
            "cloud_calls": self.cloud_calls,
            "min_cloud_calls": self.min_cloud_calls,
            "calls_ratio": round(self.calls_ratio, 4),
            "largest_batch": self.largest_batch,
            "mean_batch_size": round(self.mean_batch_size, 2),
            "seal_reasons": dict(self.seal_reasons),
            "simulated_span_s": round(self.simulated_span_s, 3),
        }


def run_grouper_bench(
    *,
    requests: int = 10_000,
    templates: int = 5,
    seed: int = 0,
    config: GrouperConfig | None = None,
    repeat: int = 5,
) -> GrouperBenchReport:
    """Fold ``requests`` bursty machine requests over ``templates`` templates and measure it."""
    if requests < 1 or templates < 1 or repeat < 1:
        raise ValueError("requests, templates and repeat must all be at least 1")
    config = config or GrouperConfig.default()
    commands, per_template = _workload(requests, templates, random.Random(seed), config)

    timings: list[float] = []
    sealed: list[BatchSealed] = []
    for _ in range(repeat):
        seconds, sealed = _timed_fold(commands, config)
        timings.append(seconds)
    seconds = min(timings)
    median = statistics.median(timings)

    floor = sum(math.ceil(n / config.max_batch_size) for n in per_template.values())
    sizes = [len(batch.machines) for batch in sealed]
    reasons = Counter(batch.reason for batch in sealed)
    span = (commands[-1].at - commands[0].at).total_seconds()
    return GrouperBenchReport(
        requests=requests,
        templates=templates,
        seed=seed,
        idle_timeout_s=config.idle_timeout.total_seconds(),
        max_timeout_s=config.max_timeout.total_seconds(),
        max_batch_size=config.max_batch_size,
        repeat=repeat,
        seconds=seconds,
        requests_per_second=requests / seconds if seconds > 0 else math.inf,
        median_requests_per_second=requests / median if median > 0 else math.inf,
        target_requests_per_second=TARGET_REQUESTS_PER_SECOND,
        batches_sealed=len(sealed),
        cloud_calls=len(sealed),  # one BatchPutMachine call per sealed batch
        min_cloud_calls=floor,
        calls_ratio=len(sealed) / floor,
        largest_batch=max(sizes, default=0),
        mean_batch_size=sum(sizes) / len(sizes) if sizes else 0.0,
        seal_reasons=tuple(sorted(reasons.items())),
        simulated_span_s=span,
    )


def _timed_fold(
    commands: list[GrouperCommand], config: GrouperConfig
) -> tuple[float, list[BatchSealed]]:
    decide, evolve = grouper.decide, grouper.evolve  # bound once: the loop is what is timed
    state = grouper.initial_state()
    sealed: list[BatchSealed] = []
    started = time.perf_counter()
    for command in commands:
        events: list[GrouperEvent] = decide(state, command, config)
        for event in events:
            state = evolve(state, event)
            if type(event) is BatchSealed:
                sealed.append(event)
    return time.perf_counter() - started, sealed


def _workload(
    requests: int, templates: int, rng: random.Random, config: GrouperConfig
) -> tuple[list[GrouperCommand], Counter[str]]:
    pool = [
        MachineTemplate(
            vm_size=("Standard_D4s_v5", "Standard_D8s_v5", "Standard_E16s_v5")[i % 3],
            priority="spot" if i % 4 == 3 else "regular",
            orchestrator_version="1.30.4",
            max_pods=110,
            os_disk_size_gb=128 + i,  # keeps every template distinct however many are asked for
            vnet_subnet_id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/"
            "virtualNetworks/vnet/subnets/nodes",
        )
        for i in range(templates)
    ]
    # A few popular templates and a long tail, as in a real fleet (Zipf-like weights).
    weights = [1.0 / (rank + 1) for rank in range(templates)]
    commands: list[GrouperCommand] = []
    per_template: Counter[str] = Counter()
    at = _EPOCH
    left_in_burst = 0
    for i in range(requests):
        if left_in_burst == 0:
            left_in_burst = rng.randint(*_BURST_SIZE)
            at += timedelta(seconds=rng.uniform(*_QUIET_GAP_S))
        else:
            at += timedelta(milliseconds=rng.expovariate(1.0 / _IN_BURST_GAP_MS))
        left_in_burst -= 1
        template = rng.choices(pool, weights)[0]
        per_template[template_hash(template)] += 1
        commands.append(
            RequestMachine(
                f"req-{i:07d}",
                f"aks-bench-{i:07d}",
                template,
                zones=(str(rng.randint(1, 3)),),
                tags=(("fleetledger-shard", str(i % 17)),),
                at=at,
            )
        )
    # The runtime would tick at each deadline; one tick past the last possible one seals the rest
    # with their natural reasons (stamps are deadlines, so the events are the same either way).
    commands.append(Tick(at + config.max_timeout))
    return commands, per_template
