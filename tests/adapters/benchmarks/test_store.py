"""How ``bench store`` turns interleaved rounds into figures and ratios."""

from __future__ import annotations

import pytest

from fleetledger.adapters.benchmarks.store import (
    _batched,
    _compare,
    _fenced,
    _replay_event,
    _singles,
)
from fleetledger.eventstore._encoding import canonical_json


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


class TestFenced:
    def test_the_cost_of_fencing_is_paired_with_the_unfenced_rounds(self) -> None:
        """Fenced appends are set against the unfenced ones of the same round."""
        measurement = _fenced([900.0, 400.0, 1000.0], [1000.0, 500.0, 1000.0])

        assert (measurement.rate, measurement.reference) == (900.0, "unfenced")
        assert measurement.ratio == pytest.approx(0.9)

    def test_fenced_appends_carry_the_term_beside_the_usual_metadata(self) -> None:
        """The fenced contender differs from the unfenced one only by its leader_term."""
        [[plain]], [[fenced]] = _singles(1), _singles(1, leader_term=3)

        assert fenced.metadata == {**plain.metadata, "leader_term": 3}
        assert fenced.data == plain.data


class TestReplayLog:
    def test_bodies_are_nested_and_about_300_bytes(self) -> None:
        """Replay reads the body shape its reference was measured on: ~300 bytes, nested objects."""
        sizes = [len(canonical_json(_replay_event(i).data, what="body")) for i in range(100)]

        assert min(sizes) >= 270 and max(sizes) <= 330
        assert isinstance(_replay_event(0).data["template"]["labels"], dict)
