"""``bench extender`` on a tiny workload: it runs and reports its figures, never their speed."""

from __future__ import annotations

import json
import socket

import pytest

from fleetledger.adapters.benchmarks.extender import (
    LOCAL_POSTGRES,
    TARGET_CALLS_PER_SECOND,
    TARGET_P99_MS,
    Mix,
    default_server_url,
    run_extender_bench,
)
from fleetledger.adapters.cli import main

KEYS = {
    "backend",
    "mix",
    "capacity",
    "at_rate",
    "reservations",
    "targets",
    "ratios",
    "met",
}
PHASE_KEYS = {
    "offered_per_second",
    "calls",
    "calls_by_kind",
    "calls_per_second",
    "latency_ms",
    "latency_ms_by_kind",
    "outcomes",
    "moved",
    "server_cpu_ms_per_call",
    "cpu",
}
CPU_SHARES = {"extender", "callers", "leader", "database", "all"}


class TestBenchExtender:
    def test_a_tiny_run_reports_every_figure(self, postgres_url: str) -> None:
        """Every kind of call is made, all answered 200, and both phases' figures and the ratios
        are there."""
        report = run_extender_bench(
            postgres_url,
            nodes=2,
            slots=2,
            clients=3,
            seconds=0.6,
            warmup=0.2,
            rate=20,
            mix=Mix(1, 1, 1),
            seed=1,
        )

        figures = json.loads(json.dumps(report.to_dict()))
        assert set(figures) >= KEYS
        assert figures["backend"] == "postgres"
        assert set(figures["capacity"]["calls_by_kind"]) == {"reask", "first", "preempt"}
        for phase in (figures["capacity"], figures["at_rate"]):
            assert set(phase) >= PHASE_KEYS
            assert set(phase["calls_by_kind"]) <= {"reask", "first", "preempt"}
            assert phase["calls"] == sum(phase["calls_by_kind"].values()) > 0
            assert not [o for o in phase["outcomes"] if o.startswith("status")]
            latency = phase["latency_ms"]
            assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
            cpu = phase["cpu"]
            assert set(cpu["ms_per_call"]) == CPU_SHARES
            assert cpu["cores"] >= 1
            assert 0 <= cpu["others_busy_cores"] <= cpu["busy_cores"] <= cpu["cores"] + 0.5
            assert cpu["extender_core_at_target"] > 0
        assert figures["capacity"]["offered_per_second"] is None
        assert figures["at_rate"]["offered_per_second"] == 20
        # Offered 20 calls/s for 0.6 s: about 12 calls, whatever the machine.
        assert 9 <= figures["at_rate"]["calls"] <= 15
        assert figures["reservations"] > 0
        assert figures["targets"] == {
            "calls_per_second": TARGET_CALLS_PER_SECOND,
            "p99_ms": TARGET_P99_MS,
        }
        p99 = figures["at_rate"]["latency_ms"]["p99"]
        assert figures["ratios"]["p99"] == pytest.approx(p99 / TARGET_P99_MS, abs=1e-3)
        assert figures["ratios"]["cores_at_target"] > 0
        text = report.render()
        assert "calls/s" in text and "p99.9" in text and "capacity" in text
        assert "CPU/call" in text and "cores busy" in text and "its interpreter" in text

    def test_the_command_prints_json(
        self, postgres_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``fleetledger bench extender --json`` prints the report alone on stdout."""
        sizes = ["--nodes", "2", "--slots", "1", "--clients", "2", "--seconds", "0.3"]
        options = [*sizes, "--warmup", "0.1", "--rate", "20", "--json"]

        code = main(
            ["--log-level", "warning", "bench", "extender", "--url", postgres_url, *options]
        )

        assert code == 0
        assert set(json.loads(capsys.readouterr().out)) >= KEYS

    def test_a_rate_beyond_the_capacity_is_not_run(self, postgres_url: str) -> None:
        """Its latency would only measure a growing backlog: it is reported as not measured."""
        report = run_extender_bench(
            postgres_url, nodes=1, slots=1, clients=1, seconds=0.3, warmup=0.1, rate=1e9
        )

        figures = report.to_dict()
        assert figures["at_rate"] is None
        assert figures["ratios"]["p99"] is None  # type: ignore[index]
        assert not report.met
        assert "not run, the capacity is below that rate" in report.render()

    def test_impossible_sizes_are_refused(self, postgres_url: str) -> None:
        with pytest.raises(ValueError, match="nodes, slots and clients >= 1"):
            run_extender_bench(postgres_url, clients=0)


class TestDatabase:
    def test_a_given_url_is_used(self) -> None:
        assert default_server_url("sqlite:///x.db", {}) == "sqlite:///x.db"

    def test_the_configured_url_comes_next(self) -> None:
        url = "postgresql+psycopg://u@db/x"
        assert default_server_url(None, {"FLEETLEDGER_DATABASE_URL": url}) == url

    def test_the_local_postgres_is_the_default_when_it_answers(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(socket, "create_connection", lambda *a, **k: socket.socket())
        assert default_server_url(None, {}) == LOCAL_POSTGRES

    def test_without_any_database_the_bench_refuses(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def refused(*args: object, **kwargs: object) -> socket.socket:
            raise ConnectionRefusedError("refused")

        monkeypatch.setattr(socket, "create_connection", refused)
        with pytest.raises(ValueError, match=r"no Postgres answers at 127\.0\.0\.1:5432"):
            default_server_url(None, {})


class TestMix:
    def test_shares_are_parsed(self) -> None:
        assert Mix.parse("90:5:5") == Mix(90, 5, 5)

    @pytest.mark.parametrize("spec", ["80:20", "a:b:c", "0:0:0", "-1:1:1"])
    def test_a_bad_mix_is_refused(self, spec: str) -> None:
        with pytest.raises(ValueError, match="mix"):
            Mix.parse(spec)
