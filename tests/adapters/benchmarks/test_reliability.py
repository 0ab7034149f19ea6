"""bench reliability on a small run: hostile inputs refused or kept, faults lose nothing."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.benchmarks.reliability import hostile_inputs, run_reliability_bench
from fleetledger.adapters.cli import main

KINDS = {
    "nul_byte",
    "lone_surrogate",
    "nan",
    "huge_body",
    "many_tags",
    "id_with_slash_or_query",
    "unicode_id",
    "not_a_json_object",
    "unusual_but_valid",
}


class TestReliabilityBench:
    def test_a_small_run_on_sqlite_loses_and_stalls_nothing(self, sqlite_url: str) -> None:
        """Every hostile input is a 4xx that appends nothing or a 202 in the log; a restart
        mid-burst leaves no request lost or without an outcome."""
        report = run_reliability_bench(sqlite_url, requests=40, outage_seconds=1.0)

        assert (report.lost, report.stalled, report.duplicated) == (0, 0, 0)
        assert report.broken_rules == ()
        assert report.chain_ok
        assert set(report.hostile_inputs) == KINDS
        assert report.faults == {"runtime_restarts": 1}  # nothing to cut on SQLite
        assert report.acknowledged >= 40

    @pytest.mark.postgres
    def test_a_small_run_on_postgres_survives_connection_cuts(
        self, eventstore_postgres_server: str
    ) -> None:
        """On Postgres the connections are cut too: readiness says so meanwhile, the POST made
        during the outage is refused, and once the network is back nothing is lost."""
        report = run_reliability_bench(
            eventstore_postgres_server, requests=60, connection_drops=1, outage_seconds=1.0
        )

        assert (report.lost, report.stalled, report.duplicated) == (0, 0, 0)
        assert report.broken_rules == ()
        assert report.faults == {"connection_drops": 1, "runtime_restarts": 1}
        assert report.not_ready_during_outage == 1
        assert report.refused_during_faults >= 1
        assert report.passed

    def test_the_json_keys_of_the_command(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--json`` names the figures the runbooks read: hostile inputs per listener, every
        route fuzzed, simulation seeds and their faults, idle sockets closed, and lost, stalled,
        duplicated and server errors all 0."""
        small = ["--requests", "10", "--fuzz-inputs", "2", "--seeds", "2"]
        small += ["--idle-connections", "4"]
        code = main(["bench", "reliability", "--url", sqlite_url, *small, "--json"])

        data = json.loads(capsys.readouterr().out)
        assert code == 0
        assert {"hostile_inputs", "faults", "lost", "stalled"} <= set(data)
        assert (data["lost"], data["stalled"], data["duplicated"]) == (0, 0, 0)
        assert data["server_errors"] == 0
        assert data["hostile_input_kinds"]["many_tags"]["tried"] == 1
        assert set(data["hostile_inputs"]) == {"api", "agents", "extender"}
        assert all(n > 0 for n in data["hostile_inputs"].values())
        assert data["routes_fuzzed"] > 10
        assert (data["seeds_run"], data["idle_connections_closed"]) == (2, 4)
        assert sum(data["faults_injected"].values()) > 0
        assert data["partition_double_attempts"] is None  # SQLite: no connection to cut

    def test_the_hostile_inputs_cover_each_kind_asked_for(self) -> None:
        """NUL bytes, lone surrogates, NaN, a huge body, 10,000 tags, ids with / and ?, unicode
        ids: each kind is tried at least once."""
        inputs = hostile_inputs(max_body_bytes=1024)

        assert {i.kind for i in inputs} == KINDS
        many = next(i for i in inputs if i.kind == "many_tags")
        assert len(json.loads(many.body)["tags"]) == 10_000
        assert all(len(i.body) > 1024 for i in inputs if i.kind == "huge_body")

    def test_bad_sizes(self, sqlite_url: str) -> None:
        """Sizes that cannot run are refused before anything runs."""
        with pytest.raises(ValueError, match="requests must be >= 1"):
            run_reliability_bench(sqlite_url, requests=0)
