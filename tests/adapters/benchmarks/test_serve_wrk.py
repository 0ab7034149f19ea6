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
        report = run_serve_wrk_bench(postgres_url, connections=4, seconds=1, fake_latency=0)

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
