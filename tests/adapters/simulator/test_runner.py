"""The scenario runner and burst-vms: deterministic, one outcome per request, a readable report."""

from __future__ import annotations

import json
from random import Random

import pytest

from fleetledger.adapters.cli import main
from fleetledger.adapters.simulator import (
    get_scenario,
    run_scenario,
    run_script,
    scenario_names,
)

from .support import small_script


@pytest.fixture(scope="module")
def burst_report() -> dict[str, object]:
    """burst-vms with seed 1, run once for the module (it takes about a second)."""
    return run_scenario("burst-vms", seed=1).to_dict()


class TestBurstVms:
    def test_the_same_seed_gives_the_same_report(self, burst_report: dict[str, object]) -> None:
        """Determinism: a second run of seed 1 reports exactly the same figures."""
        assert run_scenario("burst-vms", seed=1).to_dict() == burst_report

    def test_every_request_ends_with_one_outcome_and_no_machine_twice(
        self, burst_report: dict[str, object]
    ) -> None:
        """Nothing is lost or duplicated, faults included."""
        outcomes = burst_report["outcomes"]
        assert isinstance(outcomes, dict)
        assert outcomes["without_outcome"] == 0
        assert outcomes["created"] + outcomes["failed"] == burst_report["requests"]
        assert burst_report["duplicate_machines"] == 0

    def test_the_injected_faults_show_in_the_outcomes(
        self, burst_report: dict[str, object]
    ) -> None:
        """Quota and capacity failures are per machine; lost results are read back."""
        outcomes = burst_report["outcomes"]
        assert isinstance(outcomes, dict)
        failures = outcomes["failures"]
        assert failures["quota_exceeded"] == 6
        assert failures["capacity_unavailable"] == 3
        assert failures["throttled"] >= 1
        assert burst_report["machine_reads"] == 3

    def test_batching_makes_far_fewer_calls_than_requests(
        self, burst_report: dict[str, object]
    ) -> None:
        """The point of it all: many requests per create call, bounded latency."""
        assert burst_report["batching_ratio"] > 5  # type: ignore[operator]
        latency = burst_report["batching_latency_s"]
        assert isinstance(latency, dict)
        assert 0 < latency["p50"] <= latency["p99"] <= 5.0  # max_timeout bounds the wait

    def test_a_seed_fixes_the_script(self) -> None:
        """Different seeds make different runs; one seed always the same one."""
        build = get_scenario("burst-vms").build
        first, again, other = build(Random(1)), build(Random(1)), build(Random(2))

        assert [a.request for a in first.arrivals] == [a.request for a in again.arrivals]
        assert len(first.arrivals) != len(other.arrivals)


class TestRunner:
    def test_runs_on_postgres_under_a_fresh_grouper_each_time(self, postgres_url: str) -> None:
        """Reruns on one database do not collide, and report the same figures."""
        first = run_script(small_script(), scenario="small", seed=0, url=postgres_url)
        second = run_script(small_script(), scenario="small", seed=0, url=postgres_url)

        assert first == second
        assert (first.requests, first.created, first.cloud_calls) == (20, 20, 2)

    def test_without_batching_every_request_is_its_own_call(self) -> None:
        """The naive baseline: one create call per request, no time spent waiting to batch."""
        report = run_script(
            small_script().without_batching(), scenario="small", seed=0, mode="naive"
        )

        assert report.cloud_calls == report.requests == 20
        assert report.batching_latency.max == 0.0

    def test_unknown_scenarios_list_the_known_ones(self) -> None:
        """A typo is answered with the choices."""
        assert "burst-vms" in scenario_names()
        with pytest.raises(ValueError, match="burst-vms"):
            get_scenario("burst-vm")


class TestCli:
    def test_simulate_prints_the_report(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The README's main command: calls, ratio, latency percentiles and outcomes."""
        code = main(["simulate", "--scenario", "burst-vms", "--seed", "1"])

        out = capsys.readouterr().out
        assert code == 0
        for figure in ("cloud calls", "batching ratio", "batching latency  p50", "p99", "outcomes"):
            assert figure in out

    def test_compare_naive_reports_both_runs_and_the_call_ratio(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--compare naive runs the same arrivals without batching, side by side."""
        code = main(
            ["simulate", "--scenario", "burst-vms", "--seed", "1", "--compare", "naive", "--json"]
        )

        figures = json.loads(capsys.readouterr().out)
        batched, naive = figures["batched"], figures["naive"]
        assert code == 0
        assert naive["cloud_calls"] == naive["requests"] == batched["requests"]
        ratio = naive["cloud_calls"] / batched["cloud_calls"]
        assert figures["cloud_call_ratio"] == round(ratio, 2)
        assert naive["outcomes"]["without_outcome"] == 0
