"""The ``testbed`` scenario: the issue's known placement, both jobs complete, the sharing
scheduling waits, no slot ever holds two pods."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.simulator.testbed import TestbedReport, run_testbed_scenario


@pytest.fixture(scope="module")
def report() -> TestbedReport:
    return run_testbed_scenario(1)


class TestScenario:
    def test_queue_places_the_jobs_round_robin(self, report: TestbedReport) -> None:
        """[j2, j1, j2, j1] over 2 nodes × 2 slots: j2 on {0, 2}, j1 on {1, 3}."""
        assert report.to_dict()["assignments"] == {"j1": [1, 3], "j2": [0, 2]}

    def test_both_jobs_run_and_complete(self, report: TestbedReport) -> None:
        """Both jobs end completed, after running for at least one pass, and s1 is finished."""
        assert report.job_states == {"j1": "completed", "j2": "completed"}
        assert all(passes >= 1 for passes in report.run_passes.values())
        assert report.first_scheduling_phase == "finished"

    def test_the_sharing_scheduling_waits_for_the_release(self, report: TestbedReport) -> None:
        """s2 names j1: it held nothing in acquire while s1 held j1, and tried again after the
        release (j1 is then completed, which a new claim cannot take back)."""
        assert report.second_scheduling_waited is True
        assert report.second_scheduling_phase == "acquire"
        assert "already completed" in report.second_scheduling_conflict

    def test_no_slot_ever_holds_two_pods(self, report: TestbedReport) -> None:
        """Every job pod took its slot by preempting the ghost: never two pods in a slot."""
        assert report.slots_held_by_two_pods == 0
        assert report.preemptions == 4
        assert report.ghost_pods_created == 8

    def test_extender_latency_is_measured(self, report: TestbedReport) -> None:
        """Every filter and preempt call was timed (the figure itself is wall-clock time)."""
        assert report.extender_calls == 8
        assert report.extender_p99_ms > 0

    def test_the_report_is_json_and_text(self, report: TestbedReport) -> None:
        """--json carries the issue's keys; the text report names the outcome."""
        data = json.loads(json.dumps(report.to_dict()))
        for key in (
            "assignments",
            "job_states",
            "second_scheduling_waited",
            "slots_held_by_two_pods",
            "extender_p99_ms",
        ):
            assert key in data
        assert "j2: slots [0, 2], completed" in report.render()

    def test_the_seed_only_changes_run_times(self) -> None:
        """Another seed gives the same placement and outcome."""
        other = run_testbed_scenario(7)
        assert other.assignments == {"j2": (0, 2), "j1": (1, 3)}
        assert other.slots_held_by_two_pods == 0
