"""bench placement on a tiny run: the report's shape, never its speed."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.benchmarks.placement import (
    TARGET_END_TO_END_PER_SECOND,
    TARGET_PLANNING_PER_SECOND,
    run_placement_bench,
)


class TestPlacementBench:
    def test_a_tiny_run_reports_both_figures(self, sqlite_url: str) -> None:
        """Planning and end-to-end figures come back with their targets, every request accepted
        in the log, then placed in one append and one snapshot per batch, and progress is
        reported."""
        lines: list[str] = []
        report = run_placement_bench(
            sqlite_url, nodes=5, batch=4, batches=3, repeat=1, progress=lines.append
        )
        data = json.loads(json.dumps(report.to_dict()))
        assert data["planning"]["target_per_second"] == TARGET_PLANNING_PER_SECOND
        assert data["end_to_end"]["target_per_second"] == TARGET_END_TO_END_PER_SECOND
        assert data["planning"]["placements_per_second"] > 0
        assert data["end_to_end"]["recorded_placements_per_second"] > 0
        assert data["end_to_end"]["placed"] == data["accepted"]["workloads"] == 12
        assert (data["end_to_end"]["appends_per_batch"], data["nodes"]) == (1.0, 5)
        assert data["end_to_end"]["snapshot_reads_per_batch"] == 1.0
        assert "planning (pure)" in report.render()
        assert any("end to end" in line for line in lines)

    def test_overflow_is_planned_with_the_exact_search(self, sqlite_url: str) -> None:
        """The overflow figure plans the same batches on a fleet with no room: every request
        is packed into new workers by the exact search, the figure beside its target, with the
        workers asked for and the optimality gap the plans report."""
        report = run_placement_bench(sqlite_url, nodes=5, batch=20, batches=3, repeat=1)
        data = json.loads(json.dumps(report.to_dict()))
        overflow = data["overflow"]
        assert overflow["placements_per_second"] > 0
        assert overflow["target_per_second"] == TARGET_PLANNING_PER_SECOND
        assert overflow["workers_requested"] >= 3
        assert overflow["optimality_gap"] == 0
        assert overflow["search_steps"] > 0
        assert "overflow (pure)" in report.render()

    def test_bad_sizes(self, sqlite_url: str) -> None:
        """A size below one is refused before anything runs."""
        with pytest.raises(ValueError, match="at least 1"):
            run_placement_bench(sqlite_url, nodes=0)
