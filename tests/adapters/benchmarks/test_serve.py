"""``bench serve``: a real ``fleetledger serve`` driven over loopback, and what it reports."""

from __future__ import annotations

import json
import os

import pytest

from fleetledger.adapters.benchmarks.serve import run_serve_bench


class TestBenchServe:
    def test_a_tiny_run_counts_every_answer_and_loses_nothing(self, postgres_url: str) -> None:
        """Every POST is answered 202 and found in the log; the report's keys are stable."""
        report = run_serve_bench(postgres_url, clients=2, requests=20, warmup=4)

        figures = json.loads(json.dumps(report.to_dict()))
        assert (figures["acknowledged"], figures["refused"], figures["lost"]) == (20, 0, 0)
        assert figures["posts_per_second"] > 0
        assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"]
        assert figures["machines"]["requested"] == 24
        assert 0 <= figures["machines"]["created"] <= 24
        assert "20 accepted, 0 refused; 0 lost" in report.render()
        if os.path.exists("/proc/self/stat"):
            assert figures["server_cpu_ms_per_post"] > 0

    def test_impossible_sizes_are_refused(self, postgres_url: str) -> None:
        with pytest.raises(ValueError, match="clients and requests must be at least 1"):
            run_serve_bench(postgres_url, clients=0)
