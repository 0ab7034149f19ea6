"""The deterministic simulator: virtual time, the fake cloud, scenarios, a runner and reports.

``fleetledger simulate --scenario burst-vms --seed 1`` runs the real machine-request runtime
(service, coordinator, driver, read model) on virtual time against the fake cloud and reports
API calls, batching ratio, latency added by batching and outcomes; ``--compare naive`` runs the
same arrivals with batching off. More scripted scenarios register with
(:func:`~fleetledger.adapters.simulator.catalog.register_scenario`).

``simulate --scenario all`` (:mod:`~fleetledger.adapters.simulator.all`) runs every capability's
scenario and sums up what batching bought; :mod:`~fleetledger.adapters.simulator.report_html`
draws it as one HTML page, and scenario files (:mod:`~fleetledger.adapters.simulator.scenario_file`)
set the scenarios' fleets, subnets, demand curves and cloud in TOML.

``simulate --scenario fleet`` (:mod:`~fleetledger.adapters.simulator.fleet`) runs one controller
holding a whole fleet — thousands of nodes, subnets, workloads arriving and leaving, agents, new
machines, a restart and a testbed on one log — and reports how fast, how big and how quick to
rebuild it is, beside the scale targets.

Deterministic simulation testing lives in :mod:`~fleetledger.adapters.simulator.dst` (every
capability on one log under seeded faults, :func:`~fleetledger.adapters.simulator.dst.run_seeds`)
and :mod:`~fleetledger.adapters.simulator.faults` (the fault schedule and its injectors).
"""

from __future__ import annotations

from .catalog import get_scenario, register_scenario, scenario_names
from .report import ComparisonReport, Latency, SimulationReport
from .runner import COMPARE_MODES, compare_scenario, run_scenario, run_script
from .scenarios import Arrival, Injection, Scenario, Script
from .virtual_time import VirtualTime

__all__ = [
    "COMPARE_MODES",
    "Arrival",
    "ComparisonReport",
    "Injection",
    "Latency",
    "Scenario",
    "Script",
    "SimulationReport",
    "VirtualTime",
    "compare_scenario",
    "get_scenario",
    "register_scenario",
    "run_scenario",
    "run_script",
    "scenario_names",
]
