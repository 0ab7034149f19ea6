"""``simulate --scenario all``: every capability's scenario, its own log each, one summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.simulator.all import SCENARIOS, AllReport, run_all
from fleetledger.adapters.simulator.scenario_file import ScenarioFile, load_scenario_file
from fleetledger.eventstore import open_store

SMALL = Path(__file__).resolve().parents[3] / "ops" / "scenarios" / "small.toml"
"""The example file of a small run: every capability in a few seconds."""


@pytest.fixture(scope="module")
def small() -> ScenarioFile:
    return load_scenario_file(SMALL)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, small: ScenarioFile) -> AllReport:
    folder = tmp_path_factory.mktemp("all")
    logs = {name: f"sqlite:///{folder / f'{name}.db'}" for name in SCENARIOS}
    return run_all(3, logs=logs, scenario_file=small)


class TestSummary:
    def test_cloud_calls_saved_are_the_requests_less_the_batched_calls(
        self, report: AllReport
    ) -> None:
        """Naive is one call per request: the saving is requests − create calls, and the log's
        cumulative series ends at the very figures the scenario reported."""
        calls = report.summary()["cloud_calls"]
        series = report.series["cloud_calls"]

        assert calls["saved"] == report.burst_vms.requests - report.burst_vms.cloud_calls > 0
        assert series.rows[-1][1:] == (report.burst_vms.requests, report.burst_vms.cloud_calls)

    def test_unnecessary_workers_are_the_naive_placers_extra_workers(
        self, report: AllReport
    ) -> None:
        """The batch placer asks for the bin-packing minimum; the naive placer's excess over it
        is what batching avoided (the scenario's own ``unnecessary_workers``)."""
        workers = report.summary()["workers"]
        naive = report.placement.to_dict()["naive"]

        assert workers["batched"] == workers["bin_packing_minimum"]
        assert isinstance(naive, dict)
        assert workers["unnecessary_avoided"] == naive["unnecessary_workers"] > 0

    def test_subnet_oscillation_avoided_against_the_naive_policy(self, report: AllReport) -> None:
        """The small subnet is tight enough for the naive policy to flip; ours settles."""
        changes = report.summary()["subnet_batch_changes"]

        assert changes["naive"] > changes["settled"]
        assert changes["avoided"] == changes["naive"] - changes["settled"]
        assert changes["at_steady_demand"]["settled"] == 0

    def test_buffer_freed_is_the_seed_rules_buffer_less_ours(self, report: AllReport) -> None:
        """Both rules' buffers come from the restart scenario; ours is the peak the log shows."""
        buffer = report.summary()["buffer_after_restart"]
        ours, seeds = report.restart.log_bound, report.restart.assume_max
        logged = report.series["node_reservations"].numbers("cpu_buffer_milli")

        assert buffer["freed"]["cpu_milli"] == seeds.buffer_cpu_milli - ours.buffer_cpu_milli > 0
        assert max(logged) == ours.buffer_cpu_milli

    def test_no_slot_is_double_held_in_the_report_or_the_log(self, report: AllReport) -> None:
        """The testbed's figure and the log's own count of slots held by two pods agree: 0."""
        slots = report.series["slot_occupancy"]

        assert report.summary()["slots_double_held"] == 0
        assert max(slots.numbers("slots_double_held")) == 0
        assert max(slots.numbers("slots_held")) > 0

    def test_the_subnet_series_peaks_where_the_settled_policy_did(self, report: AllReport) -> None:
        """IPs held, counted from the log's allocations and releases, peak at the scenario's
        ``peak_allocated``."""
        allocated = report.series["subnet"].numbers("allocated_ips")

        assert max(allocated) == report.subnet.policies["settled"].peak_allocated


class TestLogs:
    def test_each_scenario_left_a_log_of_its_own(self, report: AllReport) -> None:
        """Five logs, none empty, so each can be tailed and verified on its own."""
        assert sorted(report.logs) == sorted(SCENARIOS)
        for url in report.logs.values():
            with open_store(url) as store:
                assert store.head() > 0

    def test_a_log_shared_by_two_scenarios_is_refused(self, tmp_path: Path) -> None:
        """The node, subnet and placement scenarios need an empty log: refused before running."""
        logs = dict.fromkeys(SCENARIOS, f"sqlite:///{tmp_path / 'one.db'}")

        with pytest.raises(ValueError, match="a log of its own"):
            run_all(1, logs=logs, scenario_file=ScenarioFile.defaults())
        assert list(tmp_path.iterdir()) == []


class TestRender:
    def test_the_summary_fits_one_screen(self, report: AllReport) -> None:
        """A title, one line per thing batching bought, and where the logs are."""
        text = report.render()
        lines = text.splitlines()

        assert len(lines) <= 10
        for label in (
            "cloud calls saved",
            "unnecessary workers avoided",
            "oscillation avoided",
            "buffer freed after restart",
            "slots double-held",
        ):
            assert label in text
        assert "own log" in lines[-1]

    def test_json_keys_are_stable(self, report: AllReport) -> None:
        """The ``--json`` shape scripts read: the summary's keys and every scenario's report."""
        data = report.to_dict()

        assert set(data) == {
            "scenario",
            "seed",
            "scenario_file",
            "log_per_scenario",
            "logs",
            "summary",
            "scenarios",
        }
        assert set(report.summary()) == {
            "cloud_calls",
            "workers",
            "subnet_batch_changes",
            "buffer_after_restart",
            "slots_double_held",
        }
        scenarios = data["scenarios"]
        assert isinstance(scenarios, dict) and set(scenarios) == set(SCENARIOS)


class TestCommand:
    def test_all_prints_the_summary_and_writes_report_and_csv(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`make run`'s command: the summary, then the report's path; logs in ./fleetledger-sim."""
        monkeypatch.chdir(tmp_path)
        options = ["--scenario-file", str(SMALL), "--report", "out/r.html", "--csv", "series"]

        assert main(["simulate", "--scenario", "all", *options]) == 0
        out = capsys.readouterr().out
        assert "cloud calls saved" in out
        assert out.rstrip().endswith(f"report: {tmp_path / 'out' / 'r.html'}")
        assert (tmp_path / "out" / "r.html").stat().st_size > 0
        assert len(list((tmp_path / "series").glob("*.csv"))) == 5
        assert sorted(p.name for p in (tmp_path / "fleetledger-sim").glob("*.db")) == sorted(
            f"{name}.db" for name in SCENARIOS
        )

    def test_json_names_the_files_written(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--json`` prints the summary and the report's path, nothing else on stdout."""
        monkeypatch.chdir(tmp_path)
        options = ["--scenario-file", str(SMALL), "--report", "r.html", "--json", "--seed", "2"]

        assert main(["simulate", "--scenario", "all", *options]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["seed"] == 2
        assert data["report"] == str(tmp_path / "r.html")
        assert data["summary"]["slots_double_held"] == 0

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--scenario", "all", "--url", "sqlite:///x.db"], "one log per scenario"),
            (["--scenario", "all", "--compare", "naive"], "naive twin already"),
            (["--scenario", "all", "--cloud-profile", "aks"], "scenario file"),
            (["--scenario", "subnet", "--report", "r.html"], "use them with --scenario all"),
            (["--scenario", "dst", "--csv", "series"], "use them with --scenario all"),
        ],
    )
    def test_options_that_cannot_apply_to_all_are_refused(
        self,
        options: list[str],
        message: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Refused with exit 2 and a message saying what to do, before anything is written."""
        monkeypatch.chdir(tmp_path)

        assert main(["simulate", *options]) == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert list(tmp_path.iterdir()) == []

    def test_help_lists_the_scenarios_and_says_each_has_its_own_log(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit):
            main(["simulate", "--help"])
        text = " ".join(capsys.readouterr().out.split())

        for name in (*SCENARIOS, "dst", "all"):
            assert name in text
        assert "each on its own log" in text
