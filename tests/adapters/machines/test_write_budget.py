"""The write budget: reservations spaced at its rate, pauses and shrinking after a 429, growth."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleetledger.adapters.machines import WriteBudget

from .support import EPOCH


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


class TestReservations:
    def test_the_burst_goes_at_once_and_the_rest_at_the_rate(self) -> None:
        """A bucket of 3 at 2 a second: three writes wait nothing, the next ones 0.5 s apart,
        in the order they were reserved."""
        budget = WriteBudget(rate=2.0, burst=3)

        waits = [budget.reserve(1, at(0)).wait_seconds for _ in range(6)]

        assert waits == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]

    def test_a_wait_names_the_local_budget_and_the_rate(self) -> None:
        budget = WriteBudget(rate=10.0, burst=1)
        budget.reserve(1, at(0))

        reservation = budget.reserve(2, at(0))

        assert (reservation.wait_seconds, reservation.reason, reservation.rate) == (
            0.2,
            "write_budget",
            10.0,
        )

    def test_the_bucket_refills_with_time_up_to_its_burst(self) -> None:
        budget = WriteBudget(rate=1.0, burst=5)
        for _ in range(5):
            budget.reserve(1, at(0))

        assert budget.tokens(at(2)) == pytest.approx(2)
        assert budget.tokens(at(100)) == 5

    def test_waits_are_whole_milliseconds_never_early(self) -> None:
        """A clock keeping microseconds must not end a wait before the token is there."""
        budget = WriteBudget(rate=3.0, burst=1)
        budget.reserve(1, at(0))

        assert budget.reserve(1, at(0)).wait_seconds == 0.334

    def test_without_a_rate_nothing_waits(self) -> None:
        budget = WriteBudget(rate=None, burst=1)

        assert {budget.reserve(1, at(0)).wait_seconds for _ in range(1000)} == {0.0}


class TestAfterA429:
    def test_writes_wait_out_the_retry_after(self) -> None:
        """Even with tokens to spare, nothing goes before the Retry-After has passed."""
        budget = WriteBudget(rate=10.0, burst=200)
        budget.refused(7.0, at(0))

        reservation = budget.reserve(1, at(2))

        assert (reservation.wait_seconds, reservation.reason) == (5.0, "retry_after")
        assert budget.pause_remaining(at(2)) == 5.0
        assert budget.pause_remaining(at(7)) == 0.0

    def test_the_rate_halves_and_the_bucket_empties(self) -> None:
        budget = WriteBudget(rate=10.0, burst=200)

        budget.refused(0.0, at(0))

        assert budget.rate(at(0)) == 5.0
        assert budget.tokens(at(0)) == 0.0

    def test_429s_of_calls_already_in_flight_shrink_it_once(self) -> None:
        """Three 429s within one pause are one episode; one after it is another."""
        budget = WriteBudget(rate=8.0, burst=10)
        for _ in range(3):
            budget.refused(4.0, at(0))
        assert budget.rate(at(0)) == 4.0

        budget.refused(4.0, at(4))

        # Grown back for 4 s (by 8/60 a second), then halved.
        assert budget.rate(at(4)) == pytest.approx((4.0 + 8.0 / 60 * 4) / 2)
        assert budget.refusals == 4

    def test_the_rate_never_falls_below_its_floor(self) -> None:
        """Ten episodes in a row halve 16/s down to its floor, a quarter, and no further."""
        budget = WriteBudget(rate=16.0, burst=10, floor_fraction=1 / 4)
        for episode in range(10):
            budget.refused(0.0, at(episode * 1e-3))

        assert budget.rate(at(0.009)) == pytest.approx(4.0, abs=0.01)

    def test_the_rate_grows_back_linearly_to_the_configured_one(self) -> None:
        """Halved to 5 at 10/s with a 60 s recovery: +1/6 a second, full after 30 s."""
        budget = WriteBudget(rate=10.0, burst=200, recovery_seconds=60.0)
        budget.refused(0.0, at(0))

        assert budget.rate(at(15)) == pytest.approx(7.5)
        assert budget.rate(at(30)) == pytest.approx(10.0)
        assert budget.rate(at(300)) == 10.0

    def test_the_refill_follows_the_growing_rate(self) -> None:
        """From 5/s growing by 1/6 per s: 5·6 + ½·(1/6)·36 = 33 tokens in the first 6 s."""
        budget = WriteBudget(rate=10.0, burst=200, recovery_seconds=60.0)
        budget.refused(0.0, at(0))

        assert budget.tokens(at(6)) == pytest.approx(33.0)

    def test_a_429_without_retry_after_still_pauses(self) -> None:
        budget = WriteBudget(rate=10.0, burst=200)

        budget.refused(None, at(0))

        assert budget.pause_remaining(at(0)) == 1.0

    def test_a_budget_without_a_rate_only_pauses(self) -> None:
        budget = WriteBudget(rate=None, burst=1)
        budget.refused(3.0, at(0))

        reservation = budget.reserve(1, at(1))

        assert (reservation.wait_seconds, reservation.reason, reservation.rate) == (
            2.0,
            "retry_after",
            None,
        )


class TestSettings:
    @pytest.mark.parametrize(
        "settings",
        [
            {"rate": 0.0, "burst": 1},
            {"rate": float("inf"), "burst": 1},
            {"rate": 1.0, "burst": 0},
            {"rate": 1.0, "burst": 1, "recovery_seconds": 0.0},
            {"rate": 1.0, "burst": 1, "floor_fraction": 0.0},
        ],
    )
    def test_nonsense_is_refused(self, settings: dict[str, float]) -> None:
        with pytest.raises(ValueError):
            WriteBudget(**settings)  # type: ignore[arg-type]

    @pytest.mark.parametrize("writes", [0, -1])
    def test_a_reservation_is_at_least_one_write(self, writes: int) -> None:
        with pytest.raises(ValueError, match="writes"):
            WriteBudget(rate=1.0, burst=1).reserve(writes, at(0))

    def test_a_negative_retry_after_is_refused(self) -> None:
        with pytest.raises(ValueError, match="retry_after"):
            WriteBudget(rate=1.0, burst=1).refused(-1.0, at(0))
