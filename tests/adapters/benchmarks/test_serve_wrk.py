"""``bench serve --driver wrk``: serve under the C load generator, followed to outcomes."""

from __future__ import annotations

import json
import shutil

import pytest

from fleetledger.adapters.benchmarks.serve_wrk import run_serve_wrk_bench

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None,
    reason="wrk is not installed (apt-get install wrk; .ci/run installs it)",
)


class TestBenchServeWrk:
    def test_a_short_run_follows_every_accepted_post_to_its_outcome(
        self, postgres_url: str
    ) -> None:
        """Every POST wrk sends is accepted, in the log and created; the keys are stable."""
        series = run_serve_wrk_bench(postgres_url, connections=4, seconds=1, fake_latency=0)
        [report] = series.runs

        figures = json.loads(json.dumps(report.to_dict()))
        assert figures["accepted"] > 0
        assert figures["accepted"] + figures["non_2xx"] <= figures["requests"]
        assert (figures["non_2xx"], figures["socket_errors"], figures["lost"]) == (0, 0, 0)
        # wrk may stop before reading the last answers: those requests are logged too.
        assert figures["with_outcome"] == figures["logged"] >= figures["accepted"]
        assert figures["seconds_to_all_outcomes"] is not None
        latency = figures["latency_ms"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
        assert "0 lost (must be 0)" in report.render()

    def test_consecutive_runs_each_follow_their_own_requests(self, postgres_url: str) -> None:
        """Two runs on one server: each counts its own requests and outcomes; the series says
        whether every run met the targets."""
        series = run_serve_wrk_bench(
            postgres_url, connections=2, seconds=1, fake_latency=0.05, runs=2
        )

        first, second = series.runs
        for run in (first, second):
            assert run.lost == 0 and run.with_outcome == run.logged >= run.accepted > 0
        figures = json.loads(json.dumps(series.to_dict()))
        assert [r["accepted"] for r in figures["runs"]] == [first.accepted, second.accepted]
        assert figures["tail_target"]["passed"] is series.tail_passed
        assert "tail target (fake cloud 50 ms, every run)" in series.render()
