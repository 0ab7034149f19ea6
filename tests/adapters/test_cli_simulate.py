"""``fleetledger simulate``: every capability's scenario, and the log it leaves behind."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import structlog

from fleetledger.adapters.cli import EXIT_USAGE, SIMULATION_LOG, main
from fleetledger.adapters.cli import simulate as simulate_cli
from fleetledger.eventstore import open_store

# The scenarios of node accounting, subnets and placement: each runs once for this module.
LOGGED = ("restart", "subnet", "burst-workloads")


def simulated(scenario: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["simulate", "--scenario", scenario, "--json", *extra]) == 0
    return dict(json.loads(capsys.readouterr().out))


class ScenarioLogs:
    """Scenarios run with ``--url`` on SQLite files, each once, when first asked for."""

    def __init__(self, folder: pytest.TempPathFactory) -> None:
        self._folder = folder
        self._runs: dict[str, tuple[str, dict[str, Any]]] = {}

    def get(self, scenario: str) -> tuple[str, dict[str, Any]]:
        """The log's URL and the ``--json`` report of ``scenario``'s run."""
        if scenario not in self._runs:
            url = f"sqlite:///{self._folder.mktemp(scenario) / 'x.db'}"
            saved = structlog.get_config()
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    code = main(["simulate", "--scenario", scenario, "--url", url, "--json"])
            finally:
                structlog.configure(**saved)
            assert code == 0
            self._runs[scenario] = url, dict(json.loads(out.getvalue()))
        return self._runs[scenario]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> ScenarioLogs:
    return ScenarioLogs(tmp_path_factory)


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


class TestLogCreation:
    """./fleetledger-sim.db is created whole: a run killed at any moment never leaves a file
    without the schema in its place."""

    def test_a_new_log_holds_the_schema_before_anything_runs(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)

        url = simulate_cli._fresh_simulation_log()

        assert _head(url) == 0  # opens: the schema is at the code's revision
        assert [p.name for p in tmp_path.iterdir()] == [SIMULATION_LOG]

    def test_a_creation_interrupted_before_its_rename_leaves_no_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(os, "replace", _killed)

        with pytest.raises(KeyboardInterrupt):
            simulate_cli._fresh_simulation_log()

        assert list(tmp_path.iterdir()) == []

    def test_a_creation_interrupted_before_its_rename_keeps_the_previous_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The previous run's log stays whole and verifies."""
        monkeypatch.chdir(tmp_path)
        url = str(simulated("dst", capsys, "--seed", "2")["log_url"])
        before = _head(url)
        monkeypatch.setattr(os, "replace", _killed)

        with pytest.raises(KeyboardInterrupt):
            simulate_cli._fresh_simulation_log()

        assert _head(url) == before > 0
        assert main(["audit", "verify", "--url", url]) == 0
        assert [p.name for p in tmp_path.iterdir()] == [SIMULATION_LOG]


def _killed(*args: object) -> None:
    raise KeyboardInterrupt  # the process is interrupted right before the rename


class TestDst:
    def test_one_seed_keeps_its_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--seed runs one seed on ./fleetledger-sim.db, reports its faults and no violation,
        and the log verifies."""
        monkeypatch.chdir(tmp_path)

        report = simulated("dst", capsys, "--seed", "3")

        assert (report["seed"], report["ok"], report["violations"]) == (3, True, [])
        assert report["faults_injected"]
        assert report["repro"] == "fleetledger simulate --scenario dst --seed 3"
        assert main(["audit", "verify", "--url", report["log_url"]]) == 0

    def test_many_seeds_report_faults_and_every_invariant(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--seeds N --seed-start S runs seeds S..S+N-1 on scratch logs (none left behind)."""
        monkeypatch.chdir(tmp_path)

        report = simulated("dst", capsys, "--seeds", "2", "--seed-start", "10")

        assert (report["seeds_run"], report["first_seed"]) == (2, 10)
        assert sum(report["faults_injected"].values()) > 0
        assert set(report["violations"].values()) == {0}
        assert {"lost", "duplicated", "stalled"} <= set(report["violations"])
        assert list(tmp_path.iterdir()) == []

    def test_a_failing_seed_prints_the_command_that_reproduces_it(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A seed cut short while its creates take far longer than the run leaves requests
        stalled: exit 1, and the failing seed's line ends with its command."""
        from fleetledger.adapters.simulator import dst

        cut_short = dst.DstSettings(cloud_latency_seconds=600.0, drain_seconds=0.0)
        monkeypatch.setattr(dst, "run_seeds", partial(dst.run_seeds, settings=cut_short))

        assert main(["simulate", "--scenario", "dst", "--seeds", "1", "--seed-start", "7"]) == 1

        out = capsys.readouterr().out
        assert "violations: stalled" in out
        assert out.rstrip().endswith("reproduce: fleetledger simulate --scenario dst --seed 7")

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--scenario", "burst-vms", "--seeds", "2"], "dst scenario only"),
            (["--scenario", "dst", "--seeds", "2", "--seed", "1"], "either --seed"),
            (["--scenario", "dst", "--seed-start", "4"], "goes with --seeds"),
            (["--scenario", "dst", "--seeds", "2", "--url", "sqlite:///x.db"], "scratch log"),
            (["--scenario", "dst", "--compare", "naive"], "do not apply to dst"),
        ],
    )
    def test_options_that_cannot_apply_are_refused(
        self,
        options: list[str],
        message: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.chdir(tmp_path)
        assert main(["simulate", *options]) == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert list(tmp_path.iterdir()) == []


class TestScenarioLogs:
    """restart, subnet and burst-workloads run the runtime on virtual time and keep its log."""

    @pytest.mark.parametrize("scenario", LOGGED)
    def test_the_log_verifies(
        self, scenario: str, logs: ScenarioLogs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``audit verify`` passes on the log the run left, which is the one it names."""
        url, report = logs.get(scenario)
        assert report["log_url"] == url
        assert main(["audit", "verify", "--url", url]) == 0
        assert "ok:" in capsys.readouterr().out

    @pytest.mark.parametrize("scenario", LOGGED)
    def test_dumpstate_as_of_each_checkpoint_is_what_the_runtime_held(
        self, scenario: str, logs: ScenarioLogs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """At three positions of the run, ``dumpstate --as-of`` (a replay of the log) prints
        the very JSON the live runtime held there (its SHA-256 is in the report)."""
        url, report = logs.get(scenario)
        checkpoints = report["checkpoints"]
        assert len(checkpoints) == 3
        for checkpoint in checkpoints:
            capsys.readouterr()
            as_of = ["dumpstate", "--url", url, "--as-of", str(checkpoint["position"])]
            assert main(as_of) == 0
            printed = capsys.readouterr().out.rstrip("\n")
            assert hashlib.sha256(printed.encode()).hexdigest() == checkpoint["sha256"], checkpoint[
                "label"
            ]
            assert json.loads(printed)["position"] == checkpoint["position"]

    @pytest.mark.parametrize("scenario", LOGGED)
    def test_events_tail_reads_the_log(
        self, scenario: str, logs: ScenarioLogs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``events tail`` shows the run's events."""
        url, _ = logs.get(scenario)
        assert main(["events", "tail", "--url", url, "--limit", "3"]) == 0
        assert capsys.readouterr().out.strip()

    @pytest.mark.parametrize("scenario", LOGGED)
    def test_the_log_is_refused_a_second_run(
        self, scenario: str, logs: ScenarioLogs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A log that already holds a run cannot take another (the fleet's names would meet):
        refused with exit 2 and a message, nothing written."""
        url, _ = logs.get(scenario)
        head = _head(url)
        assert main(["simulate", "--scenario", scenario, "--url", url]) == EXIT_USAGE
        assert "needs an empty log" in capsys.readouterr().err
        assert _head(url) == head


class TestCapabilityScenarios:
    def test_subnet_compares_the_three_policies(self, logs: ScenarioLogs) -> None:
        """The subnet scenario's JSON carries each policy's oscillation figures."""
        _, report = logs.get("subnet")
        policies = report["policies"]
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

    def test_restart_reports_both_buffer_rules_and_the_rebuild(self, logs: ScenarioLogs) -> None:
        """The restart scenario's JSON carries the buffers of both rules, the safety counts,
        where the rebuild read up to and how long it took; one checkpoint is mid-restart."""
        _, report = logs.get("restart")
        assert set(report["buffer_after_restart"]) == {"log_bound", "assume_max"}
        assert report["negative_values"] == report["grants_beyond_capacity"] == 0
        assert {"seconds_until_buffers_zero", "requests", "migrations_started"} <= set(report)
        assert report["rebuild_seconds"] > 0
        positions = {c["label"]: c["position"] for c in report["checkpoints"]}
        assert positions["before the restart"] == report["rebuilt_from_position"]
        assert report["rebuilt_from_position"] < positions["after the restart"] < positions["end"]

    def test_burst_workloads_reports_its_optimality_gap(self, logs: ScenarioLogs) -> None:
        """The burst-workloads JSON keeps its keys and adds the optimality gap, 0 on seed 1."""
        _, report = logs.get("burst-workloads")
        assert report["optimality_gap"] == 0
        assert {"phases", "overcommitted_nodes", "node_events_per_batch"} <= set(report)

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

    def test_burst_vms_on_the_aks_profile_reports_time_to_all_outcomes(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A 1,000-VM burst at AKS batch times (60-120 s) and ARM's write budget: every outcome
        within 1.5 x (the longest batch + the 5 s longest seal delay), none throttled."""
        url = f"sqlite:///{tmp_path / 'aks.db'}"
        report = simulated("burst-vms", capsys, "--cloud-profile", "aks", "--url", url)
        assert report["requests"] == 1000
        assert 60 <= report["seconds_to_all_outcomes"] <= 1.5 * (120 + 5)
        assert "throttled" not in report["outcomes"]["failures"]
        assert report["outcomes"]["without_outcome"] == 0

    def test_an_unknown_scenario_lists_every_name(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A typo is answered with every scenario there is."""
        assert main(["simulate", "--scenario", "nosuch"]) == EXIT_USAGE
        assert (
            "burst-vms, burst-workloads, dst, restart, subnet, testbed" in capsys.readouterr().err
        )


class TestRefusedOptions:
    @pytest.mark.parametrize("scenario", ["restart", "subnet", "testbed"])
    def test_compare_is_refused_where_there_is_nothing_to_compare(
        self,
        scenario: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--compare naive on a scenario without a naive twin is refused with exit 2, saying
        which scenarios take it, before any log is written."""
        monkeypatch.chdir(tmp_path)
        assert main(["simulate", "--scenario", scenario, "--compare", "naive"]) == EXIT_USAGE
        error = capsys.readouterr().err
        assert f"--compare does not apply to the {scenario!r} scenario" in error
        assert "burst-vms, burst-workloads" in error
        assert not (tmp_path / SIMULATION_LOG).exists()

    def test_burst_workloads_takes_compare(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """burst-workloads honours --compare naive: the naive placer's figures are reported."""
        monkeypatch.chdir(tmp_path)
        report = simulated("burst-workloads", capsys, "--compare", "naive")
        assert [p["name"] for p in report["naive"]["phases"]] == ["fits", "overflow"]

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--scenario", "subnet", "--cloud-profile", "aks"], "apply to the burst-vms"),
            (["--scenario", "burst-vms", "--burst-size", "10"], "applies to the aks cloud"),
        ],
    )
    def test_cloud_profile_options_are_refused_where_they_cannot_apply(
        self,
        options: list[str],
        message: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--cloud-profile and --burst-size change only burst-vms, and --burst-size only its
        aks profile: anywhere else they are refused with exit 2 before a log is written."""
        monkeypatch.chdir(tmp_path)
        assert main(["simulate", *options]) == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert not (tmp_path / SIMULATION_LOG).exists()

    def test_dumpstate_refuses_a_position_beyond_the_log(
        self, logs: ScenarioLogs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--as-of`` past the head is refused with exit 2 and the positions there are."""
        url, _ = logs.get("burst-workloads")
        beyond = str(_head(url) + 1)
        assert main(["dumpstate", "--url", url, "--as-of", beyond]) == EXIT_USAGE
        assert "outside the log" in capsys.readouterr().err


def _head(url: str) -> int:
    with contextlib.closing(open_store(url)) as store:
        return store.head()
