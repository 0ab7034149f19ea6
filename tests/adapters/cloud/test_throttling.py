"""The token bucket that models ARM's request budgets, and the documented figures."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleetledger.adapters.cloud.throttling import (
    ARM_SUBSCRIPTION_WRITES,
    COMPUTE_PUT_VM_WRITES,
    BucketLimits,
    TokenBucket,
)

from .support import EPOCH


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


class TestFigures:
    def test_arm_writes_are_a_bucket_of_200_refilled_at_10_a_second(self) -> None:
        """The documented per-subscription write budget (request-limits-and-throttling)."""
        assert (ARM_SUBSCRIPTION_WRITES.bucket_size, ARM_SUBSCRIPTION_WRITES.refill_per_second) == (
            200,
            10.0,
        )

    def test_vm_creates_refill_at_computes_500_a_minute(self) -> None:
        """Per-VM PUTs: ARM's bucket, Compute's slower sustained Put VM rate."""
        assert COMPUTE_PUT_VM_WRITES.bucket_size == 200
        assert COMPUTE_PUT_VM_WRITES.refill_per_second == pytest.approx(500 / 60)


class TestTokenBucket:
    def test_a_full_bucket_pays_for_its_size_at_once_then_refuses(self) -> None:
        bucket = TokenBucket(BucketLimits(3, 1.0))

        assert [bucket.take(1, at(0)) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert bucket.take(1, at(0)) == pytest.approx(1.0)

    def test_a_refusal_spends_nothing_and_names_the_wait(self) -> None:
        """Asked for 2 with 0.5 left at 1 a second: wait 1.5 s; after it, it pays."""
        bucket = TokenBucket(BucketLimits(2, 1.0), available=0.5)

        assert bucket.take(2, at(0)) == pytest.approx(1.5)
        assert bucket.level(at(0)) == pytest.approx(0.5)
        assert bucket.take(2, at(1.5)) == 0.0

    def test_it_refills_with_time_but_never_above_its_size(self) -> None:
        bucket = TokenBucket(BucketLimits(10, 2.0), available=0)

        assert bucket.level(at(0)) == 0
        assert bucket.level(at(3)) == pytest.approx(6)
        assert bucket.level(at(60)) == 10

    def test_time_going_backwards_refills_nothing(self) -> None:
        bucket = TokenBucket(BucketLimits(10, 1.0), available=0)
        bucket.level(at(0))
        bucket.level(at(5))

        assert bucket.level(at(1)) == pytest.approx(5)

    @pytest.mark.parametrize("cost", [0, 11])
    def test_a_cost_outside_one_to_the_bucket_size_is_refused(self, cost: int) -> None:
        """A request the bucket could never pay for is a mistake, not a wait."""
        with pytest.raises(ValueError, match="costs 1 to 10"):
            TokenBucket(BucketLimits(10, 1.0)).take(cost, at(0))

    @pytest.mark.parametrize(
        ("size", "rate"), [(0, 1.0), (1, 0.0), (1, float("inf")), (1, float("nan"))]
    )
    def test_limits_must_be_positive(self, size: int, rate: float) -> None:
        with pytest.raises(ValueError):
            BucketLimits(size, rate)

    def test_the_starting_level_must_fit_the_bucket(self) -> None:
        with pytest.raises(ValueError, match="between 0 and the bucket size"):
            TokenBucket(BucketLimits(10, 1.0), available=11)
