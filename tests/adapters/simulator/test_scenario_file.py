"""Scenario files: TOML settings for the scenarios, validated with errors that say where."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from random import Random

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.simulator.scenario_file import (
    ScenarioFile,
    load_scenario_file,
    parse_scenario_file,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "ops" / "scenarios"


class TestExamples:
    @pytest.mark.parametrize("name", ["example.toml", "small.toml", "aks.toml"])
    def test_every_example_is_valid(self, name: str) -> None:
        assert load_scenario_file(EXAMPLES / name).source.endswith(name)

    def test_the_full_example_spells_out_the_defaults(self) -> None:
        """example.toml sets every key to its default: a run with it is a run without."""
        example = load_scenario_file(EXAMPLES / "example.toml")
        defaults = ScenarioFile.defaults()

        assert (example.subnet, example.restart) == (defaults.subnet, defaults.restart)
        assert example.burst_vms is not None
        script = example.burst_vms.build(Random(1))
        assert script.config.idle_timeout == timedelta(milliseconds=500)
        assert (script.cloud_latency_seconds, script.max_concurrent_batches) == (3.0, 4)


class TestSettings:
    def test_subnet_demand_curve_and_fleet(self) -> None:
        file = parse_scenario_file(
            "[subnet]\nnodes = 4\npeak_pods_per_node = [1, 3]\n[subnet.demand]\nrise_s = 9\n"
        )

        assert file.subnet.kwargs() == {
            "nodes": 4,
            "capacity": 1024,
            "peak_range": (1, 3),
            "rise_s": 9,
            "hold_s": 180,
            "fall_s": 180,
            "tail_s": 60,
            "allocator_latency_s": 2,
        }

    def test_burst_vms_batching_and_cloud_reach_the_script(self) -> None:
        """The file's batching and cloud settings replace the profile's in the built script."""
        file = parse_scenario_file(
            '[burst-vms]\ncloud_profile = "aks"\nburst_size = 20\ncloud_latency_s = 9\n'
            "[burst-vms.batching]\nmax_batch_size = 3\n"
        )
        assert file.burst_vms is not None

        script = file.burst_vms.build(Random(1))

        assert len(script.arrivals) == 20
        assert script.config.max_batch_size == 3
        assert script.cloud_latency_seconds == 9

    def test_restart_fleet(self) -> None:
        file = parse_scenario_file("seed = 4\n[restart]\nnodes = 3\nwatermark = 0.5\n")

        assert (file.seed, file.restart.nodes, file.restart.watermark) == (4, 3, 0.5)

    def test_placement_fleet_and_pool(self) -> None:
        file = parse_scenario_file(
            "[burst-workloads]\nworkers = 6\nburst = 30\n"
            '[burst-workloads.pool]\nname = "big"\nworker_cpu_milli = 8000\n'
            "worker_memory_gib = 32\n"
        )

        placement = file.placement
        assert (placement.workers, placement.burst, placement.pool.name) == (6, 30, "big")
        assert (placement.pool.worker_cpu_milli, placement.pool.worker_memory_bytes) == (
            8000,
            32 << 30,
        )


class TestRefusals:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[subnet]\nnodez = 3", "[subnet] nodez: unknown key"),
            ("[subnets]\nnodes = 3", "unknown section or key 'subnets'"),
            ("[testbed]\n", "[testbed] takes no settings"),
            ('[subnet]\nnodes = "3"', "[subnet] nodes: Input should be a valid integer"),
            ("[subnet]\nnodes = 0", "[subnet] nodes: Input should be greater than or equal to 1"),
            ("[subnet]\npeak_pods_per_node = [5, 4]", "low <= high, got [5, 4]"),
            ("[restart]\nwatermark = 2", "[restart] watermark: Input should be less than"),
            ("[restart]\nnodes = 1", "[restart] the restart scenario needs at least 2 nodes"),
            ("[burst-vms]\nburst_size = 50", 'burst_size applies to cloud_profile = "aks"'),
            (
                '[burst-vms]\ncloud_profile = "aks"\nburst_size = 5',
                "[burst-vms] burst_size: Input should be greater than or equal to 12",
            ),
            ('[burst-vms]\ncloud_profile = "gcp"', "[burst-vms] cloud_profile: Input should be"),
            ("[burst-vms.batching]\nidle_timeout_ms = 9000", "must not exceed max_timeout"),
            ("[subnet\n", "is not valid TOML"),
            (
                "[burst-workloads.pool]\nworker_cpu_milli = 4001",
                "[burst-workloads.pool] worker_cpu_milli: Input should be a multiple of 4",
            ),
            (
                "[burst-workloads.pool]\nworker_memory_gib = 4",
                "[burst-workloads.pool] worker_memory_gib: Input should be greater than or equal",
            ),
        ],
    )
    def test_a_bad_file_is_refused_naming_section_and_key(self, text: str, message: str) -> None:
        with pytest.raises(ValueError, match=r"^f\.toml") as refused:
            parse_scenario_file(text, source="f.toml")

        assert message in str(refused.value)

    def test_a_missing_file_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="cannot read the scenario file"):
            load_scenario_file(tmp_path / "none.toml")


class TestCommand:
    def test_a_single_scenario_takes_its_section(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--scenario subnet --scenario-file`` runs the file's fleet, with the file's seed."""
        monkeypatch.chdir(tmp_path)
        file = tmp_path / "s.toml"
        file.write_text(
            "seed = 9\n[subnet]\nnodes = 3\ncapacity = 64\n"
            "[subnet.demand]\nrise_s = 5\nhold_s = 5\nfall_s = 5\ntail_s = 1\n"
        )

        assert (
            main(["simulate", "--scenario", "subnet", "--scenario-file", str(file), "--json"]) == 0
        )
        report = json.loads(capsys.readouterr().out)
        assert report["seed"] == 9
        assert (report["config"]["nodes"], report["config"]["capacity"]) == (3, 64)

    def test_the_placement_scenario_takes_its_fleet(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--scenario burst-workloads --scenario-file`` runs the file's workers and pool."""
        monkeypatch.chdir(tmp_path)
        file = tmp_path / "w.toml"
        file.write_text(
            "[burst-workloads]\nworkers = 4\nburst = 12\n"
            "[burst-workloads.pool]\nworker_cpu_milli = 8000\nworker_memory_gib = 32\n"
        )

        args = ["simulate", "--scenario", "burst-workloads", "--scenario-file", str(file)]
        assert main([*args, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["config"]["workers"], report["config"]["burst"]) == (4, 12)
        assert report["config"]["worker_cpu_milli"] == 8000
        overflow = report["phases"][1]
        assert overflow["placed"] == overflow["requests"] == 12
        assert overflow["workers_requested"] == overflow["bin_packing_minimum"]

    def test_a_bad_file_exits_2_before_anything_runs(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.chdir(tmp_path)
        file = tmp_path / "s.toml"
        file.write_text("[subnet]\nnodes = -1\n")

        assert main(["simulate", "--scenario", "all", "--scenario-file", str(file)]) == EXIT_USAGE
        assert "[subnet] nodes" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]

    def test_a_burst_vms_section_and_cloud_profile_flags_conflict(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.chdir(tmp_path)
        options = ["--scenario-file", str(EXAMPLES / "aks.toml"), "--cloud-profile", "aks"]

        assert main(["simulate", "--scenario", "burst-vms", *options]) == EXIT_USAGE
        assert "set the cloud profile and burst size there" in capsys.readouterr().err
