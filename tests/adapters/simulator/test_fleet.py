"""The fleet scenario: every capability on one log at scale, and its figures beside the targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.cli.common import EXIT_USAGE
from fleetledger.adapters.cli.main import main
from fleetledger.adapters.cli.simulate import SIMULATION_LOG
from fleetledger.adapters.simulator.fleet import FleetReport, FleetSettings, run_fleet_scenario
from fleetledger.eventstore import migrate

TINY = FleetSettings(nodes=50, workloads_per_hour=1200, hours=0.1)
"""50 nodes for six virtual minutes: ~120 workloads, five VM pods, a machine, a restart."""


PROGRESS: list[str] = []
"""The progress lines of the module's run."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[FleetReport, str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}"
    migrate.upgrade(url)
    return run_fleet_scenario(3, url=url, settings=TINY, progress=PROGRESS.append), url


def test_a_run_reports_its_progress_as_it_goes(fleet: tuple[FleetReport, str]) -> None:
    """About twenty lines over the virtual time, each further on, with the events so far."""
    report, _ = fleet
    assert 15 <= len(PROGRESS) <= 21
    reached = [float(line.split()[1].replace(",", "")) for line in PROGRESS]
    assert reached == sorted(reached) and reached[-1] < report.virtual_seconds
    events = [int(line.split(", ")[-2].split()[0].replace(",", "")) for line in PROGRESS]
    assert events == sorted(events) and 0 < events[-1] <= report.events
    assert all("of 360 virtual s" in line and "x real time" in line for line in PROGRESS[1:])


def test_every_capability_appends_to_the_one_log(fleet: tuple[FleetReport, str]) -> None:
    """Nodes, subnets, placement, machines, leadership and the testbed all wrote to the log."""
    report, _ = fleet
    by_capability = report.events_by_capability
    for capability in ("nodes", "ipam", "placement", "vm", "leadership", "testbed"):
        assert by_capability.get(capability, 0) > 0, capability
    assert sum(by_capability.values()) == report.events
    assert report.machines_created >= 1
    assert report.nodes == TINY.nodes + report.machines_created
    assert report.agent_requests > 0
    assert report.workload_outcomes.get("placed", 0) > 0
    assert report.testbed_ok


def test_the_restart_rebuilds_the_state_the_old_process_held(
    fleet: tuple[FleetReport, str],
) -> None:
    """The new process's dumpstate equals the dead one's at the same position, and so does a
    replay of the log to there."""
    report, _ = fleet
    assert 0 < report.restart_position < report.events
    assert report.restart_state_equal
    assert report.replay_equal


def test_the_restart_checks_are_timed_apart_from_the_run(fleet: tuple[FleetReport, str]) -> None:
    """The dumps compared at the restart and the replay are the simulator's checks, timed on
    their own (wall time, and so the speed, leaves them out)."""
    report, _ = fleet
    assert report.phases["state_check"] > 0
    assert report.phases["replay_check"] > 0


def test_the_log_passes_audit_verify(
    fleet: tuple[FleetReport, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = fleet
    assert main(["audit", "verify", "--url", url]) == 0


def test_the_report_has_its_stable_keys(fleet: tuple[FleetReport, str]) -> None:
    """The figures and the targets beside them, under the keys docs and benches read."""
    report, _ = fleet
    figures: dict[str, Any] = report.to_dict()
    for key in (
        "nodes",
        "workloads",
        "virtual_seconds",
        "wall_seconds",
        "speedup",
        "events",
        "peak_rss_bytes",
        "rebuild_seconds",
        "dumpstate_seconds",
        "dumpstate_bytes",
    ):
        assert key in figures, key
    assert figures["virtual_seconds"] == 360.0
    assert figures["peak_rss_bytes"] > 1 << 20  # bytes, not KiB
    assert figures["dumpstate_bytes"] > 0
    assert set(figures["targets"]) == {
        "speedup",
        "peak_rss_bytes",
        "rebuild_seconds",
        "dumpstate_seconds",
    }
    assert "MISSED" in report.render() or "met" in report.render()


def test_simulate_runs_the_fleet_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    options = ["--nodes", "8", "--workloads-per-hour", "600", "--hours", "0.02", "--json"]
    assert main(["simulate", "--scenario", "fleet", *options]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["scenario"] == "fleet"
    assert figures["nodes_asked"] == 8
    assert figures["virtual_seconds"] == 72.0
    assert (tmp_path / SIMULATION_LOG).exists()


@pytest.mark.parametrize("option", [["--nodes", "100"], ["--hours", "1"]])
def test_fleet_options_are_refused_for_other_scenarios(
    option: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--scenario", "subnet", *option]) == EXIT_USAGE
    assert "apply to the fleet scenario" in capsys.readouterr().err
    assert not (tmp_path / SIMULATION_LOG).exists()


def test_a_fleet_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="--nodes must be 4-200000"):
        FleetSettings(nodes=2)
