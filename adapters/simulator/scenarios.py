"""Scenarios: what happens in a simulation, built from a seed, and the registry that names them.

A :class:`Scenario` turns a ``random.Random(seed)`` into a :class:`Script` — timed arrivals of
machine requests, timed injections into the fake cloud (a quota, a zone out of capacity, a lost
result, throttling) and the runtime settings to run them with. Everything random is drawn here,
up front, so a seed fixes the whole run; the runner only executes the script.

Later issues add scenarios with :func:`register_scenario`; ``fleetledger simulate --scenario NAME``
looks them up with :func:`get_scenario`.
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
    "get_scenario",
    "register_scenario",
    "scenario_names",
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


_SCENARIOS: dict[str, Scenario] = {}


def register_scenario(scenario: Scenario) -> Scenario:
    """Make ``scenario`` available by name; a name can be registered once."""
    existing = _SCENARIOS.get(scenario.name)
    if existing is not None and existing is not scenario:
        raise ValueError(f"a scenario named {scenario.name!r} is already registered")
    _SCENARIOS[scenario.name] = scenario
    return scenario


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``ValueError`` listing the known names otherwise."""
    _load_builtin()
    try:
        return _SCENARIOS[name]
    except KeyError:
        raise ValueError(
            f"unknown scenario {name!r}; choose one of: {', '.join(scenario_names())}"
        ) from None


def scenario_names() -> tuple[str, ...]:
    """Every registered scenario name, sorted."""
    _load_builtin()
    return tuple(sorted(_SCENARIOS))


def _load_builtin() -> None:
    # The built-in scenarios register themselves on import; importing here (not at the top)
    # keeps this registry importable by them without a cycle.
    from . import burst_vms  # noqa: F401
