"""Metrics only this process knows: its leadership role, and what its placement batches cost.

The role is not in the log (a process follows or leads now; the log records elections), and
neither is a placement plan's optimality gap — how many more workers than the bin-packing minimum
its overflow may have asked for, the bound on the workers it requested for nothing. So these are
read from the live runtimes at scrape time, through the small protocols below.

==================================================  =========================================
``fleetledger_leader_role{role}``                   1 for this process's role (leader,
                                                    follower, stepping_down), 0 for the others
``fleetledger_leader_held_term``                    the term this process leads in (absent
                                                    while it follows)
``fleetledger_placement_batches_total``             placement batches this process ran
``fleetledger_placement_unnecessary_workers_total`` workers its batches requested beyond the
                                                    minimum, at most (the plans' optimality
                                                    gaps; 0 while every plan is proven minimal)
``fleetledger_placement_batch_conflicts_total``     node reservations refused on a version
                                                    conflict and planned again
==================================================  =========================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .labels import known

__all__ = ["ROLES", "LiveMetrics", "PlacementReports"]

ROLES = ("leader", "follower", "stepping_down")
"""The roles a process may be in (``stepping down`` is written ``stepping_down``)."""


class BatchReport(Protocol):
    """What the metrics read of one placement batch's report."""

    @property
    def optimality_gap(self) -> int: ...

    @property
    def conflicts(self) -> int: ...


class PlacementReports(Protocol):
    """A placement runtime: its latest batches' reports, oldest first (it keeps a bounded
    number of them)."""

    @property
    def reports(self) -> Sequence[BatchReport]: ...


class LiveMetrics:
    """The collector (see the module docstring). ``role`` and ``term`` read the process's
    leadership (a machines runtime's ``role`` and ``term``); ``placement`` is the placement
    runtime, if ``serve`` runs one."""

    def __init__(
        self,
        *,
        role: Callable[[], str | None] | None = None,
        term: Callable[[], int | None] | None = None,
        placement: PlacementReports | None = None,
    ) -> None:
        self._role = role
        self._term = term
        self._placement = placement
        self._lock = threading.Lock()
        self._last_report: object | None = None
        self._batches = Counter(
            "fleetledger_placement_batches", "Placement batches this process ran.", registry=None
        )
        self._unnecessary = Counter(
            "fleetledger_placement_unnecessary_workers",
            "Workers this process's placement batches requested beyond the bin-packing "
            "minimum, at most (each plan's optimality gap; 0 while every plan is proven "
            "minimal).",
            registry=None,
        )
        self._conflicts = Counter(
            "fleetledger_placement_batch_conflicts",
            "Node reservations of placement batches refused on a version conflict and planned "
            "again.",
            registry=None,
        )

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._role is not None:
                yield self._roles(self._role())
            if self._term is not None:
                held = self._term()
                if held is not None:
                    yield GaugeMetricFamily(
                        "fleetledger_leader_held_term",
                        "The leader term this process leads in.",
                        value=held,
                    )
            if self._placement is not None:
                self._count_new_reports(self._placement.reports)
                yield from self._batches.collect()
                yield from self._unnecessary.collect()
                yield from self._conflicts.collect()

    @staticmethod
    def _roles(role: str | None) -> Metric:
        current = known((role or "").replace(" ", "_"), ROLES)
        family = GaugeMetricFamily(
            "fleetledger_leader_role",
            "1 for this process's leadership role, 0 for the others.",
            labels=["role"],
        )
        for name in ROLES:
            family.add_metric([name], 1.0 if name == current else 0.0)
        return family

    def _count_new_reports(self, reports: Sequence[BatchReport]) -> None:
        # The runtime keeps its latest reports only: the new ones follow the last one counted,
        # found by identity (two batches may report equal figures). If it was dropped since,
        # every report kept is new (batches beyond what the runtime keeps go uncounted).
        listed = list(reports)
        start = 0
        for index in range(len(listed) - 1, -1, -1):
            if listed[index] is self._last_report:
                start = index + 1
                break
        for report in listed[start:]:
            self._batches.inc()
            self._unnecessary.inc(max(0, report.optimality_gap))
            self._conflicts.inc(max(0, report.conflicts))
        if listed:
            self._last_report = listed[-1]
