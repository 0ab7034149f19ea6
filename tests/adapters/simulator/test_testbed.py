"""The ``testbed`` scenario: the known placement, the jobs complete, the sharing scheduling waits
and then runs the shared job again, the interleaved queue finishes, no slot ever holds two pods,
nothing deadlocks and nothing leaks."""

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

    def test_every_run_completes_and_both_schedulings_finish(self, report: TestbedReport) -> None:
        """j1 runs twice (s1, then s2), j2 and j3 once, each completed after running at least
        one pass; both schedulings are finished and released their jobs, which are ready."""
        assert {job: [(s, o) for s, o, _ in runs] for job, runs in report.job_runs.items()} == {
            "j1": [("s1", "completed"), ("s2", "completed")],
            "j2": [("s1", "completed")],
            "j3": [("s2", "completed")],
        }
        assert report.job_states == {"j1": "ready", "j2": "ready", "j3": "ready"}
        assert all(passes >= 1 for passes in report.run_passes.values())
        assert (report.first_scheduling_phase, report.second_scheduling_phase) == (
            "finished",
            "finished",
        )

    def test_the_sharing_scheduling_waits_for_the_release(self, report: TestbedReport) -> None:
        """s2 names j1: it held nothing in acquire while s1 held j1, and tried again after the
        release (first waiting for j1's old application to be deleted)."""
        assert report.second_scheduling_waited is True
        assert "deleting its previous application" in report.second_scheduling_conflict

    def test_the_interleaved_queue_longer_than_the_testbed_runs(
        self, report: TestbedReport
    ) -> None:
        """s2's [j1, j3] × 3 on four slots: j1 takes the slots at its indexes 0 and 2 and the
        lowest slot left (index 4 never exists), j3 the same slots once j1 is done."""
        assert report.second_assignments == {"j1": (0, 1, 2), "j3": (0, 1, 2)}
        assert report.deadlocked_schedulings == 0

    def test_no_application_is_left_behind(self, report: TestbedReport) -> None:
        """Every released job's application, completed ones included, was deleted."""
        assert report.applications_leaked == 0

    def test_no_slot_ever_holds_two_pods(self, report: TestbedReport) -> None:
        """Every job pod took its slot by preempting the ghost: never two pods in a slot; each
        preempted ghost was created again (4 at first, then one per preemption)."""
        assert report.slots_held_by_two_pods == 0
        assert report.preemptions == 4 + 3 + 3
        assert report.ghost_pods_created == 4 + report.preemptions

    def test_extender_latency_is_measured(self, report: TestbedReport) -> None:
        """Every filter and preempt call was timed (the figure itself is wall-clock time)."""
        assert report.extender_calls == 2 * report.preemptions
        assert report.extender_p99_ms > 0

    def test_the_report_is_json_and_text(self, report: TestbedReport) -> None:
        """--json carries the scenario's keys; the text report names the outcome."""
        data = json.loads(json.dumps(report.to_dict()))
        for key in (
            "assignments",
            "job_states",
            "second_scheduling_waited",
            "slots_held_by_two_pods",
            "extender_p99_ms",
            "deadlocked_schedulings",
            "applications_leaked",
        ):
            assert key in data
        text = report.render()
        assert "j2 runs: s1 on slots [0, 2]: completed" in text
        assert "deadlocked schedulings: 0, applications leaked: 0" in text

    def test_the_seed_only_changes_run_times(self) -> None:
        """Another seed gives the same placement and outcome."""
        other = run_testbed_scenario(7)
        assert other.assignments == {"j2": (0, 2), "j1": (1, 3)}
        assert other.second_assignments == {"j1": (0, 1, 2), "j3": (0, 1, 2)}
        assert other.slots_held_by_two_pods == other.deadlocked_schedulings == 0
        assert other.applications_leaked == 0
