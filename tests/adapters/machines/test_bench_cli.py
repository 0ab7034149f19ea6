"""``fleetledger bench grouper``: decide throughput and cloud calls against the minimum."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.cli import main


class TestBenchGrouper:
    def test_json_reports_throughput_and_calls_against_the_minimum(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The figures a reader needs: requests/s vs target, calls vs the floor."""
        code = main(["bench", "grouper", "--json", "--requests", "2000", "--repeat", "1"])

        figures = json.loads(capsys.readouterr().out)
        assert code == 0
        assert figures["requests"] == 2000
        assert figures["target_requests_per_second"] == 50_000
        assert figures["cloud_calls"] >= figures["min_cloud_calls"] > 0

    def test_text_gives_the_ratios(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The human form states the ratio to the target and to the minimum calls."""
        main(["bench", "grouper", "--requests", "1000", "--repeat", "1"])

        out = capsys.readouterr().out
        assert "x the 50,000 /s target" in out
        assert "x the minimum" in out
