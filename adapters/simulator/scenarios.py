"""Scenarios: what happens in a simulation, built from a seed.

A :class:`Scenario` turns a ``random.Random(seed)`` into a :class:`Script` — timed arrivals of
machine requests, timed injections into the fake cloud (a quota, a zone out of capacity, a lost
result, throttling) and the runtime settings to run them with. Everything random is drawn here,
up front, so a seed fixes the whole run; the runner only executes the script.

The catalog (:mod:`.catalog`) names the scenarios ``fleetledger simulate --scenario NAME`` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from random import Random

from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import MachineRequest
from fleetledger.domain.machines import GrouperConfig

__all__ = [
    "DEFAULT_CONFIG",
    "Arrival",
    "Injection",
    "Scenario",
    "Script",
]


DEFAULT_CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=500),
    max_timeout=timedelta(seconds=5),
    max_batch_size=50,
)
"""Production-typical timing (seed 01, "Tuning Tradeoffs"): idle 500 ms, max 5 s, 50 a batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """A request arriving ``at_seconds`` after the start of the run."""

    at_seconds: float
    request: MachineRequest
    burst: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    """Something done to the fake cloud ``at_seconds`` into the run."""

    at_seconds: float
    description: str
    apply: Callable[[FakeCloud], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """One run's arrivals, injections and settings."""

    arrivals: tuple[Arrival, ...]
    injections: tuple[Injection, ...] = ()
    config: GrouperConfig = field(default_factory=lambda: DEFAULT_CONFIG)
    cloud_latency_seconds: float = 3.0
    max_concurrent_batches: int = 4
    bursts: int = 1

    def without_batching(self) -> Script:
        """The same arrivals with every request flagged skip-batching: one cloud call each."""
        return replace(
            self,
            arrivals=tuple(
                replace(a, request=replace(a.request, skip_batching=True)) for a in self.arrivals
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A named, seeded generator of scripts."""

    name: str
    summary: str
    build: Callable[[Random], Script]
