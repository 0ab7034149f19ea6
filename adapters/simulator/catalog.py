"""The catalog of scripted scenarios, by name: the built-in ones and any a user registers.

The catalog imports the scenarios it ships, never the other way round, so a scenario module
depends only on :mod:`.scenarios`' types.
"""

from __future__ import annotations

from .burst_vms import BURST_VMS
from .scenarios import Scenario

__all__ = ["get_scenario", "register_scenario", "scenario_names"]

_SCENARIOS: dict[str, Scenario] = {BURST_VMS.name: BURST_VMS}


def register_scenario(scenario: Scenario) -> Scenario:
    """Make ``scenario`` available by name; a name can be registered once."""
    existing = _SCENARIOS.get(scenario.name)
    if existing is not None and existing is not scenario:
        raise ValueError(f"a scenario named {scenario.name!r} is already registered")
    _SCENARIOS[scenario.name] = scenario
    return scenario


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return _SCENARIOS[name]
    except KeyError:
        raise ValueError(
            f"unknown scenario {name!r}; choose one of: {', '.join(scenario_names())}"
        ) from None


def scenario_names() -> tuple[str, ...]:
    """Every registered scenario name, sorted."""
    return tuple(sorted(_SCENARIOS))
