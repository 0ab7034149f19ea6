"""The burst-vms scenario's ``aks`` cloud profile: a 1,000-VM burst against AKS timings and
ARM's write budget ends within 1.5 times one batch plus the longest seal delay, unthrottled."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from pathlib import Path
from random import Random

import pytest

from fleetledger.adapters.simulator import SimulationReport, run_script
from fleetledger.adapters.simulator.burst_vms import (
    AKS_BATCH_SECONDS,
    AKS_BURST_SIZE,
    BURST_VMS,
    burst_vms,
)
from fleetledger.adapters.simulator.runner import EPOCH
from fleetledger.adapters.simulator.scenarios import DEFAULT_CONFIG, Script
from fleetledger.eventstore import open_store


def seconds_to_all_outcomes(script: Script, report: SimulationReport) -> float:
    """From the burst's first request to the last outcome (virtual seconds)."""
    return report.virtual_seconds - script.arrivals[0].at_seconds


@pytest.fixture(scope="module")
def aks_run() -> tuple[Script, SimulationReport]:
    """The 1,000-VM burst, run once for the module (a few seconds)."""
    script = burst_vms("aks").build(Random(1))
    return script, run_script(script, scenario="burst-vms", seed=1)


class TestAksProfile:
    def test_a_thousand_vm_burst_ends_within_one_and_a_half_batch_times(
        self, aks_run: tuple[Script, SimulationReport]
    ) -> None:
        """All outcomes within 1.5 x (one batch, at most 120 s, + the 5 s max seal delay),
        and no sooner than one batch can take."""
        script, report = aks_run
        bound = 1.5 * (AKS_BATCH_SECONDS[1] + DEFAULT_CONFIG.max_timeout.total_seconds())

        took = seconds_to_all_outcomes(script, report)

        assert report.requests == AKS_BURST_SIZE == 1000
        assert AKS_BATCH_SECONDS[0] <= took <= bound

    def test_no_caller_sees_throttling_and_every_request_has_one_outcome(
        self, aks_run: tuple[Script, SimulationReport]
    ) -> None:
        _, report = aks_run
        failures = dict(report.failures)

        assert "throttled" not in failures
        assert report.without_outcome == 0
        assert report.created + report.failed == report.requests
        assert report.duplicate_machines == 0
        # The scripted faults still show: they are the cloud's, not the budget's.
        assert (failures["quota_exceeded"], failures["capacity_unavailable"]) == (6, 3)

    def test_the_burst_arrives_within_seconds_and_batches_into_few_writes(
        self, aks_run: tuple[Script, SimulationReport]
    ) -> None:
        """Karpenter-like: a thousand requests in a few seconds, some fifty create calls,
        well inside ARM's bucket of 200 writes."""
        script, report = aks_run

        assert script.arrivals[-1].at_seconds < 5
        assert report.cloud_calls < 200

    def test_the_same_seed_gives_the_same_run(self) -> None:
        scenario = burst_vms("aks", burst_size=200)

        first = run_script(scenario.build(Random(3)), scenario="burst-vms", seed=3)
        again = run_script(scenario.build(Random(3)), scenario="burst-vms", seed=3)

        assert first == again

    def test_without_batching_the_budget_spaces_the_calls_and_says_so(self, tmp_path: Path) -> None:
        """260 single-machine calls against a bucket of 200 refilled at 10 a second: the
        calls past the bucket wait for the budget (recorded as such), the last until 6 s after
        the burst began, and none is refused by the cloud."""
        url = f"sqlite:///{tmp_path / 'naive.db'}"
        script = burst_vms("aks", burst_size=260).build(Random(1)).without_batching()

        report = run_script(script, scenario="burst-vms", seed=1, url=url, mode="naive")

        assert "throttled" not in dict(report.failures)
        assert report.without_outcome == 0
        with contextlib.closing(open_store(url)) as store:
            waits = store.read_all(after=0, limit=100_000, types=["vm.BatchThrottled"])
        assert len(waits) >= 50  # 60 past the bucket, less what refilled while they arrived
        assert {w.data["reason"] for w in waits} == {"write_budget"}
        ends = [
            datetime.fromisoformat(str(w.data["at"])) + timedelta(seconds=w.data["wait_seconds"])
            for w in waits
        ]
        assert (max(ends) - EPOCH).total_seconds() == pytest.approx(6.0, abs=0.01)


class TestProfiles:
    def test_the_fake_profile_is_the_classic_scenario(self) -> None:
        assert burst_vms("fake") is BURST_VMS

    def test_an_unknown_profile_lists_the_known_ones(self) -> None:
        with pytest.raises(ValueError, match="fake, aks"):
            burst_vms("gce")

    def test_the_burst_size_is_the_aks_profiles(self) -> None:
        with pytest.raises(ValueError, match="aks cloud profile"):
            burst_vms("fake", burst_size=10)
        with pytest.raises(ValueError, match="burst_size"):
            burst_vms("aks", burst_size=0)
