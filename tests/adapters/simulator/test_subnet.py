"""The ``subnet`` scenario: naive and formula policies oscillate, the settled one does not."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.simulator.subnet import (
    POLICIES,
    SubnetReport,
    run_subnet_scenario,
)


@pytest.fixture(scope="module")
def report() -> SubnetReport:
    return run_subnet_scenario(1)


class TestOscillation:
    @pytest.mark.parametrize("policy", ["naive", "formula"])
    def test_feedback_policies_oscillate(self, report: SubnetReport, policy: str) -> None:
        """Sized from the IPs they allocated, naive and formula flip the flag and change the
        batch again and again while no node's demand changes (32 nodes on a /22)."""
        figures = report.policies[policy]  # type: ignore[index]
        assert figures.exhaustion_flips >= 10
        assert figures.steady_batch_changes >= 10

    def test_settled_does_not_oscillate(self, report: SubnetReport) -> None:
        """The settled aggregate never flips and never changes the batch at steady demand; as
        demand rises then falls the batch only steps down then up (at most twice per power of
        two below 16)."""
        settled = report.policies["settled"]
        assert settled.exhaustion_flips == 0
        assert settled.steady_batch_changes == 0
        assert 0 < settled.batch_changes <= 2 * 4

    def test_settled_calls_the_allocator_least(self, report: SubnetReport) -> None:
        """Without oscillation the settled policy makes far fewer allocator calls."""
        settled = report.policies["settled"].ip_requests
        assert settled * 10 < report.policies["naive"].ip_requests
        assert settled * 10 < report.policies["formula"].ip_requests

    @pytest.mark.parametrize("policy", POLICIES)
    def test_no_policy_over_allocates(self, report: SubnetReport, policy: str) -> None:
        """At no moment do the nodes hold more IPs than the subnet has."""
        figures = report.policies[policy]  # type: ignore[index]
        assert 0 < figures.peak_allocated <= report.capacity
        assert figures.peak_utilization <= 1.0

    @pytest.mark.parametrize("policy", POLICIES)
    def test_every_pod_is_counted(self, report: SubnetReport, policy: str) -> None:
        """Every pod of the script has one wait, whatever the policy."""
        assert report.policies[policy].pods == report.policies["settled"].pods  # type: ignore[index]


class TestOtherSeeds:
    @pytest.mark.parametrize("seed", [2, 3])
    def test_only_the_feedback_policies_oscillate(self, seed: int) -> None:
        """Other pods, same verdict: naive and formula flip at steady demand, settled never."""
        policies = run_subnet_scenario(seed).policies
        assert policies["naive"].steady_batch_changes > 0
        assert policies["formula"].steady_batch_changes > 0
        assert policies["settled"].exhaustion_flips == 0
        assert policies["settled"].steady_batch_changes == 0


class TestReport:
    def test_json_shape(self, report: SubnetReport) -> None:
        """``to_dict`` carries the scenario, the seed and the five figures for each policy."""
        data = json.loads(json.dumps(report.to_dict()))
        assert (data["scenario"], data["seed"]) == ("subnet", 1)
        assert set(data["policies"]) == {"naive", "formula", "settled"}
        for figures in data["policies"].values():
            assert {
                "exhaustion_flips",
                "batch_changes",
                "ip_requests",
                "pod_ip_wait_p99_s",
                "peak_utilization",
            } <= set(figures)

    def test_render_names_each_policy(self, report: SubnetReport) -> None:
        """The text report has a column per policy and a row per figure."""
        text = report.render()
        header = text.splitlines()[1].split()
        assert header == ["naive", "formula", "settled"]
        assert "exhaustion flips" in text and "pod IP wait p99" in text

    def test_same_seed_same_report(self) -> None:
        """The run is a function of its seed (on a smaller cluster, to keep the test short)."""
        options = {"nodes": 6, "capacity": 128, "rise_s": 30, "hold_s": 30, "fall_s": 30}
        first = run_subnet_scenario(7, **options)  # type: ignore[arg-type]
        again = run_subnet_scenario(7, **options)  # type: ignore[arg-type]
        assert first.to_dict() == again.to_dict()
        assert first.to_dict() != run_subnet_scenario(8, **options).to_dict()  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "options",
        [{"nodes": 0}, {"capacity": 0}, {"allocator_latency_s": 0}, {"peak_range": (5, 2)}],
    )
    def test_bad_options_refused(self, options: dict[str, object]) -> None:
        """Options out of range are refused with the reason."""
        with pytest.raises(ValueError, match="must be"):
            run_subnet_scenario(1, **options)  # type: ignore[arg-type]
