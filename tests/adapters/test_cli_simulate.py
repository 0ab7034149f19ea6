"""``fleetledger simulate``: every capability's scenario, and the log it leaves behind."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, SIMULATION_LOG, main
from fleetledger.eventstore import open_store


def simulated(scenario: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["simulate", "--scenario", scenario, "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


class TestSimulationLog:
    def test_the_log_is_kept_in_the_working_folder(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without --url the run's log is ./fleetledger-sim.db, named in the report, and the
        log commands work on it afterwards."""
        monkeypatch.chdir(tmp_path)

        report = simulated("burst-vms", capsys)

        url = f"sqlite:///{tmp_path / SIMULATION_LOG}"
        assert report["log_url"] == url
        assert main(["audit", "verify", "--url", url]) == 0
        assert main(["events", "tail", "--url", url, "--limit", "1"]) == 0

    def test_each_run_replaces_the_previous_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A second run starts from an empty log: it holds that run's events only."""
        monkeypatch.chdir(tmp_path)
        url = str(simulated("burst-vms", capsys)["log_url"])
        first = _head(url)

        simulated("burst-vms", capsys)

        assert _head(url) == first > 0


class TestCapabilityScenarios:
    def test_subnet_compares_the_three_policies(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The subnet scenario's JSON carries each policy's oscillation figures."""
        policies = simulated("subnet", capsys)["policies"]
        assert isinstance(policies, dict)
        assert set(policies) == {"naive", "formula", "settled"}
        for figures in policies.values():
            assert {
                "exhaustion_flips",
                "batch_changes",
                "ip_requests",
                "pod_ip_wait_p99_s",
                "peak_utilization",
            } <= set(figures)
        assert policies["settled"]["exhaustion_flips"] == 0

    def test_restart_reports_both_buffer_rules(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The restart scenario's JSON carries the buffers of both rules and the safety counts."""
        report = simulated("restart", capsys)
        assert set(report["buffer_after_restart"]) == {"log_bound", "assume_max"}
        assert report["negative_values"] == report["grants_beyond_capacity"] == 0
        assert {"seconds_until_buffers_zero", "requests", "migrations_started"} <= set(report)

    def test_testbed_assigns_the_known_slots(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The testbed scenario's JSON carries the issue's known assignment."""
        monkeypatch.chdir(tmp_path)
        report = simulated("testbed", capsys)
        assert report["assignments"] == {"j1": [1, 3], "j2": [0, 2]}
        assert report["slots_held_by_two_pods"] == 0
        assert report["second_scheduling_waited"] is True
        assert {"job_states", "extender_p99_ms"} <= set(report)

    def test_an_unknown_scenario_lists_every_name(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A typo is answered with every scenario there is."""
        assert main(["simulate", "--scenario", "nosuch"]) == EXIT_USAGE
        assert "burst-vms, burst-workloads, restart, subnet, testbed" in capsys.readouterr().err


def _head(url: str) -> int:
    with contextlib.closing(open_store(url)) as store:
        return store.head()
