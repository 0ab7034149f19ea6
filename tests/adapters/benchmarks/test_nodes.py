"""``bench nodes`` end to end at a tiny size: the figures it returns, never their speed."""

from __future__ import annotations

import pytest

from fleetledger.adapters.benchmarks.nodes import bench_nodes


class TestBenchNodes:
    def test_a_tiny_run_reports_rate_and_latency(self, postgres_url: str) -> None:
        """Every measured request is answered 200 and counted in the rate and percentiles."""
        lines: list[str] = []
        report = bench_nodes(
            postgres_url, nodes=2, pods=4, clients=2, seconds=0.5, warmup=0.2, progress=lines.append
        )
        codes, requests = report["status_codes"], report["requests"]
        rate, p50, p99 = report["requests_per_second"], report["p50_ms"], report["p99_ms"]
        assert isinstance(codes, dict) and isinstance(requests, int)
        assert isinstance(rate, float) and isinstance(p50, float) and isinstance(p99, float)
        assert requests > 0 and codes == {"200": requests}
        assert rate > 0
        assert 0 < p50 <= p99
        assert set(report) >= {"nodes", "pods", "clients", "target", "met"}
        assert report["backend"] == "postgresql"
        assert any("requests/s" in line for line in lines)

    def test_the_server_logs_to_stderr_not_stdout(
        self, postgres_url: str, capfd: pytest.CaptureFixture[str]
    ) -> None:
        """Only the report goes to stdout (``--json`` must parse): the server's logs do not."""
        bench_nodes(
            postgres_url, nodes=1, pods=1, clients=1, seconds=0.2, warmup=0.1, progress=_quiet
        )

        out, err = capfd.readouterr()
        assert out == ""
        assert "nodes runtime started" in err

    def test_impossible_sizes_are_refused(self, postgres_url: str) -> None:
        """Fewer pods than nodes (or no clients) is refused before anything starts."""
        with pytest.raises(ValueError, match="pods >= nodes"):
            bench_nodes(postgres_url, nodes=4, pods=2)


def _quiet(line: str) -> None:
    del line
