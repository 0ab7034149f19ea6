"""``simulate --scenario all``: every capability's scenario, and what batching bought in all.

It runs, with one seed, ``burst-vms`` (VM requests batched into cloud calls),
``burst-workloads`` (placement, compared with the naive placer), ``subnet`` (pod-IP batch
sizing, compared with the naive policy and the seed's formula), ``restart`` (node buffers after
a controller restart, compared with the seed's assume-max rule) and ``testbed`` (slot
reservations), then reads their logs back for the time series the report charts.

**Each scenario writes its own log.** ``subnet``, ``restart`` and ``burst-workloads`` need an
empty one: they name their streams after their fleets (``node-…``), the node runtime takes over
every node its log holds when it starts, and their checkpoints are replays of the whole log —
on a shared log, the restart would adopt the placement fleet and no checkpoint would match its
replay. So every scenario gets a log of its own (:data:`SCENARIOS` names them), each one left
for ``events tail`` and ``audit verify`` like a single scenario's.

The summary's comparisons are the scenarios' own: naive means one cloud call per VM request, the
naive placer of ``burst-workloads``, the naive IP policy of ``subnet`` and the seed's assume-max
startup rule of ``restart``. Every figure in :meth:`AllReport.summary` and :meth:`render` is a
function of the seed and the scenario file (virtual time, counts); wall-clock figures (a
rebuild's seconds, the extender's latency) stay in the per-scenario JSON only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from fleetledger.eventstore import EventStore, open_store

from .placement import PlacementReport, run_placement_scenario
from .report import SimulationReport
from .report_series import (
    Series,
    batch_series,
    cloud_call_series,
    node_series,
    slot_series,
    subnet_series,
)
from .restart import RestartReport, run_restart_scenario
from .runner import run_scenario
from .scenario_file import ScenarioFile
from .subnet import SubnetReport, run_subnet_scenario
from .testbed import TestbedReport, run_testbed_scenario

__all__ = ["LOG_PER_SCENARIO", "SCENARIOS", "AllReport", "run_all"]

log = structlog.get_logger(__name__)

SCENARIOS = ("burst-vms", "burst-workloads", "subnet", "restart", "testbed")
"""The scenarios ``all`` runs, in order: one per capability."""

LOG_PER_SCENARIO = (
    "each scenario on its own log: subnet, restart and burst-workloads need an empty one, as "
    "their fleets' streams and checkpoints assume no other fleet in the log"
)

_START = datetime(2025, 1, 1, tzinfo=UTC)
"""Virtual time zero of every scenario (each scenario fixes this same epoch)."""

_SERIES: Mapping[str, tuple[Callable[..., Series], ...]] = {
    "burst-vms": (batch_series, cloud_call_series),
    "subnet": (subnet_series,),
    "restart": (node_series,),
    "testbed": (slot_series,),
}
"""The series read from each scenario's log (``burst-workloads``' counts are its report's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReport:
    """Every scenario's report, its log, and the time series read from the logs."""

    seed: int
    source: str
    logs: Mapping[str, str]
    burst_vms: SimulationReport
    placement: PlacementReport
    subnet: SubnetReport
    restart: RestartReport
    testbed: TestbedReport
    series: Mapping[str, Series]

    def summary(self) -> dict[str, Any]:
        """What batching bought, against each scenario's naive twin (stable keys)."""
        vms = self.burst_vms
        ours_workers = sum(p.workers_requested for p in self.placement.phases)
        minimum = sum(p.bin_packing_minimum for p in self.placement.phases)
        naive_workers = sum(p.workers_requested for p in self.placement.naive or ())
        policies = self.subnet.policies
        settled, naive, formula = policies["settled"], policies["naive"], policies["formula"]
        ours, seeds = self.restart.log_bound, self.restart.assume_max
        return {
            "cloud_calls": {
                "requests": vms.requests,
                "batched": vms.cloud_calls,
                "naive": vms.requests,
                "saved": vms.requests - vms.cloud_calls,
            },
            "workers": {
                "batched": ours_workers,
                "naive": naive_workers,
                "bin_packing_minimum": minimum,
                "unnecessary_avoided": (naive_workers - minimum) - (ours_workers - minimum),
            },
            "subnet_batch_changes": {
                "settled": settled.batch_changes,
                "naive": naive.batch_changes,
                "formula": formula.batch_changes,
                "avoided": naive.batch_changes - settled.batch_changes,
                "at_steady_demand": {
                    "settled": settled.steady_batch_changes,
                    "naive": naive.steady_batch_changes,
                    "formula": formula.steady_batch_changes,
                },
                "allocator_calls": {
                    "settled": settled.ip_requests,
                    "naive": naive.ip_requests,
                    "formula": formula.ip_requests,
                },
            },
            "buffer_after_restart": {
                "ours": {
                    "cpu_milli": ours.buffer_cpu_milli,
                    "memory_slots": ours.buffer_memory_slots,
                },
                "seed_rule": {
                    "cpu_milli": seeds.buffer_cpu_milli,
                    "memory_slots": seeds.buffer_memory_slots,
                },
                "freed": {
                    "cpu_milli": seeds.buffer_cpu_milli - ours.buffer_cpu_milli,
                    "memory_slots": seeds.buffer_memory_slots - ours.buffer_memory_slots,
                },
                "seconds_until_zero": ours.seconds_until_buffers_zero,
            },
            "slots_double_held": self.testbed.slots_held_by_two_pods,
        }

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the summary, every scenario's own figures (their ``--json``) and logs."""
        return {
            "scenario": "all",
            "seed": self.seed,
            "scenario_file": self.source,
            "log_per_scenario": True,
            "logs": dict(self.logs),
            "summary": self.summary(),
            "scenarios": {
                "burst-vms": self.burst_vms.to_dict(),
                "burst-workloads": self.placement.to_dict(),
                "subnet": self.subnet.to_dict(),
                "restart": self.restart.to_dict(),
                "testbed": self.testbed.to_dict(),
            },
        }

    def render(self) -> str:
        """One screen: what batching bought, scenario by scenario."""
        rows = self.headlines()
        label = max(len(r[0]) for r in rows)
        figure = max(len(r[1]) for r in rows)
        lines = [f"all capabilities (seed {self.seed}, {self.source}): what batching bought"]
        lines.extend(f"  {n:<{label}}  {f:>{figure}}  {text}" for n, f, text in rows)
        lines.append(f"  {LOG_PER_SCENARIO}")
        return "\n".join(lines)

    def headlines(self) -> list[tuple[str, str, str]]:
        """The summary's rows: what was bought, how much, and against what."""
        s = self.summary()
        calls, workers = s["cloud_calls"], s["workers"]
        changes, buffer = s["subnet_batch_changes"], s["buffer_after_restart"]
        ours, seeds, freed = buffer["ours"], buffer["seed_rule"], buffer["freed"]
        steady = changes["at_steady_demand"]
        ratio = calls["requests"] / calls["batched"] if calls["batched"] else 0.0
        zero = buffer["seconds_until_zero"]
        tb = self.testbed
        rows = [
            (
                "cloud calls saved",
                str(calls["saved"]),
                f"burst-vms: {calls['requests']} VM requests in {calls['batched']} create calls "
                f"({ratio:.1f} a call) vs {calls['naive']}, one per request",
            ),
            (
                "unnecessary workers avoided",
                str(workers["unnecessary_avoided"]),
                f"burst-workloads: {workers['batched']} workers asked for (bin-packing minimum "
                f"{workers['bin_packing_minimum']}) vs {workers['naive']} by the naive placer",
            ),
            (
                "oscillation avoided",
                f"{changes['avoided']} changes",
                f"subnet: batch size changed {changes['settled']}x ({steady['settled']} at "
                f"steady demand) vs naive {changes['naive']}x ({steady['naive']}), the seed's "
                f"formula {changes['formula']}x ({steady['formula']}); allocator calls "
                f"{changes['allocator_calls']['settled']} vs {changes['allocator_calls']['naive']}",
            ),
            (
                "buffer freed after restart",
                f"{_cores(freed['cpu_milli'])} CPU",
                f"restart: {_cores(ours['cpu_milli'])} CPU and {ours['memory_slots']} memory "
                f"slots held vs {_cores(seeds['cpu_milli'])} CPU and {seeds['memory_slots']} by "
                f"the seed's rule ({freed['memory_slots']} slots freed); zero again after "
                + ("never" if zero is None else f"{zero:g} s"),
            ),
            (
                "slots double-held",
                str(s["slots_double_held"]),
                f"testbed: {len(tb.job_runs)} jobs, {sum(len(r) for r in tb.job_runs.values())} "
                f"runs in 2 schedulings; {tb.deadlocked_schedulings} deadlocked, "
                f"{tb.applications_leaked} applications leaked",
            ),
        ]
        return rows


def run_all(seed: int, *, logs: Mapping[str, str], scenario_file: ScenarioFile) -> AllReport:
    """Run every scenario of :data:`SCENARIOS` with ``seed`` on its log in ``logs`` (a URL per
    scenario name; each must hold no events yet), then read the logs' time series."""
    missing = [name for name in SCENARIOS if name not in logs]
    if missing:
        raise ValueError(f"no log given for the scenario(s): {', '.join(missing)}")
    if len(set(logs.values())) != len(logs):
        raise ValueError(f"every scenario needs a log of its own ({LOG_PER_SCENARIO})")
    file = scenario_file
    reports: dict[str, Any] = {}
    series: dict[str, Series] = {}
    for name in SCENARIOS:
        log.info("scenario starting", scenario=name, seed=seed)
        url = logs[name]
        if name == "burst-vms":
            reports[name] = run_scenario(name, seed=seed, url=url, definition=file.burst_vms)
        elif name == "burst-workloads":
            reports[name] = run_placement_scenario(
                seed, compare_naive=True, url=url, settings=file.placement
            )
        elif name == "subnet":
            reports[name] = run_subnet_scenario(seed, url=url, **file.subnet.kwargs())
        elif name == "restart":
            reports[name] = run_restart_scenario(seed, file.restart, url=url)
        else:
            reports[name] = run_testbed_scenario(seed, url=url)
        with open_store(url) as store:
            series.update(_read_series(name, store))
    return AllReport(
        seed=seed,
        source=file.source,
        logs=dict(logs),
        burst_vms=reports["burst-vms"],
        placement=reports["burst-workloads"],
        subnet=reports["subnet"],
        restart=reports["restart"],
        testbed=reports["testbed"],
        series=series,
    )


def _read_series(name: str, store: EventStore) -> dict[str, Series]:
    read = (reader(store, start=_START) for reader in _SERIES.get(name, ()))
    return {s.name: s for s in read}


def _cores(milli: int) -> str:
    return f"{milli / 1000:g}"
