"""``bench serve``: a real ``fleetledger serve`` driven over loopback, and what it reports."""

from __future__ import annotations

import json
import os
import time

import pytest

from fleetledger.adapters.benchmarks.serve import process_cpu_seconds, run_serve_bench


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
            # Twenty POSTs may cost the server less than one clock tick of CPU.
            assert figures["server_cpu_ms_per_post"] >= 0

    @pytest.mark.skipif(
        not os.path.exists("/proc/self/stat"), reason="CPU time is read from /proc, absent here"
    )
    def test_cpu_time_counts_what_the_process_spent(self) -> None:
        """A tenth of a second of this process's own work shows, give or take a clock tick."""
        before = process_cpu_seconds(os.getpid())
        start = time.process_time()
        while time.process_time() - start < 0.1:
            pass
        after = process_cpu_seconds(os.getpid())

        assert before is not None and after is not None
        assert 0.08 <= after - before <= 0.5

    def test_impossible_sizes_are_refused(self, postgres_url: str) -> None:
        with pytest.raises(ValueError, match="clients and requests must be at least 1"):
            run_serve_bench(postgres_url, clients=0)
