"""Reports: nearest-rank percentiles, the side-by-side comparison, the exported surface."""

from __future__ import annotations

from fleetledger.adapters.simulator import ComparisonReport, run_script
from fleetledger.adapters.simulator.report import percentile

from .support import small_script


class TestPercentile:
    def test_nearest_rank(self) -> None:
        """p50 of 1..10 is 5 and p99 is 10 (nearest rank, no interpolation)."""
        values = [float(v) for v in range(10, 0, -1)]

        assert (percentile(values, 50), percentile(values, 99)) == (5.0, 10.0)

    def test_empty_is_zero(self) -> None:
        """No requests, no latency."""
        assert percentile([], 99) == 0.0


class TestComparison:
    def test_renders_both_runs_side_by_side_with_the_call_ratio(self) -> None:
        """The text names each figure once, with both runs' values and the ratio of calls."""
        script = small_script()
        batched = run_script(script, scenario="small", seed=0)
        naive = run_script(script.without_batching(), scenario="small", seed=0, mode="naive")

        comparison = ComparisonReport(batched, naive)
        text = comparison.render()

        assert comparison.cloud_call_ratio == 10.0
        assert "cloud create calls" in text and "batching latency p99" in text
        assert "naive makes 10.0x the cloud create calls of batched" in text
