"""How ``bench store`` turns interleaved rounds into figures and ratios."""

from __future__ import annotations

import pytest

from fleetledger.adapters.benchmarks.store import _batched, _compare


class TestCompare:
    def test_the_figure_is_the_median_round(self) -> None:
        measurement = _compare("x", [900.0, 100.0, 1000.0], None, None, "appends/s")

        assert measurement.rate == 900.0
        assert measurement.ratio is None

    def test_each_round_is_judged_against_the_reference_run_beside_it(self) -> None:
        """A disturbance that slows one round of both sides does not move the ratio, and a
        reference's lucky round is not set against another round of ours."""
        ours = [95.0, 50.0, 100.0, 96.0]
        raw = [100.0, 50.0, 125.0, 100.0]  # round 2 slow for both; round 3 lucky for raw only

        measurement = _compare("x", ours, raw, 0.95, "appends/s")

        assert measurement.ratio == pytest.approx(0.955)  # median of .95, 1.0, .8, .96
        assert measurement.met is True

    def test_a_ratio_below_the_factor_is_not_met(self) -> None:
        measurement = _compare("x", [90.0, 91.0, 89.0], [100.0, 100.0, 100.0], 0.95, "appends/s")

        assert measurement.ratio == pytest.approx(0.90)
        assert measurement.met is False


class TestBatched:
    def test_the_absolute_target_applies_on_postgres(self) -> None:
        measurement = _batched([14_000.0, 16_000.0, 15_500.0], [20_000.0] * 3)

        assert (measurement.rate, measurement.met) == (15_500.0, True)

    def test_sqlite_gets_figures_without_the_postgres_target(self) -> None:
        measurement = _batched([6_000.0, 6_500.0, 6_200.0], None)

        assert (measurement.rate, measurement.target, measurement.met) == (6_200.0, None, None)
