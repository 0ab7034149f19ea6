"""The process's own metrics: its role, its term, what its placement batches cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from fleetledger.adapters.metrics import ROLES, LiveMetrics
from fleetledger.adapters.placement import BatchReport

from .world import value


@dataclass
class Placement:
    """A placement runtime's reports list, as the runtime keeps it (the latest ones)."""

    reports: list[BatchReport] = field(default_factory=list)


def _scrape(live: LiveMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(live)
    return generate_latest(registry).decode()


class TestRole:
    def test_the_role_is_one_of_its_set(self) -> None:
        """1 for the process's role and 0 for the others; ``stepping down`` is spelt with an
        underscore."""
        text = _scrape(LiveMetrics(role=lambda: "stepping down"))
        assert [value(text, "fleetledger_leader_role", role=r) for r in ROLES] == [0, 0, 1]

    def test_the_held_term_is_shown_while_leading(self) -> None:
        """A leader shows its term; a follower, none."""
        assert value(_scrape(LiveMetrics(term=lambda: 4)), "fleetledger_leader_held_term") == 4
        assert "fleetledger_leader_held_term" not in _scrape(LiveMetrics(term=lambda: None))


class TestPlacement:
    def test_unnecessary_workers_are_the_plans_gaps(self) -> None:
        """Batches, their optimality gaps and conflicts are summed over the reports."""
        placement = Placement([BatchReport(optimality_gap=2, conflicts=1), BatchReport()])
        text = _scrape(LiveMetrics(placement=placement))
        assert value(text, "fleetledger_placement_batches_total") == 2
        assert value(text, "fleetledger_placement_unnecessary_workers_total") == 2
        assert value(text, "fleetledger_placement_batch_conflicts_total") == 1

    def test_each_report_is_counted_once(self) -> None:
        """A report seen by a scrape is not counted again by the next, even when the runtime
        has dropped older ones and a new report has equal figures."""
        placement = Placement([BatchReport(optimality_gap=1)])
        live = LiveMetrics(placement=placement)
        _scrape(live)
        placement.reports = [*placement.reports[1:], BatchReport(optimality_gap=1)]
        text = _scrape(live)
        assert value(text, "fleetledger_placement_batches_total") == 2
        assert value(text, "fleetledger_placement_unnecessary_workers_total") == 2

    def test_without_placement_no_family_is_claimed(self) -> None:
        """A process that runs no placement shows none of its families."""
        assert "fleetledger_placement" not in _scrape(LiveMetrics(role=lambda: "leader"))
