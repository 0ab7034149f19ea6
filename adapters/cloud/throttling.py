"""Azure's documented request budgets, and a token bucket to model one.

Azure Resource Manager, "Throttling Resource Manager requests"
(https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling,
"Regional throttling and token bucket algorithm", the limits since the 2024 migration): every
request spends a token of a bucket per *region, subscription, security principal and operation
type*; a bucket holds at most its *bucket size* and refills at its *refill rate per second*:

==============  ==========  ===========  =====================
scope           operations  bucket size  refill rate per second
==============  ==========  ===========  =====================
subscription    reads       250          25
subscription    deletes     200          10
subscription    writes      200          10
tenant          reads       250          25
tenant          deletes     200          10
tenant          writes      200          10
==============  ==========  ===========  =====================

A global per-subscription limit of 15 times these applies across all principals. A request over
the budget is answered ``429 Too Many Requests`` with a ``Retry-After`` header, the seconds to
wait before sending again (a request sent earlier is refused and given a new ``Retry-After``);
write answers carry ``x-ms-ratelimit-remaining-subscription-writes``. Free and trial
subscriptions may get less. (The same page's older table, 1,200 writes per hour per ARM
instance, is what the token buckets replaced.)

Resource providers throttle again behind ARM, with limits of their own:

- Compute ("Compute throttling limits",
  https://learn.microsoft.com/azure/virtual-machines/compute-throttling-limits): *Put VM* (create)
  per subscription and region: bucket 1,500, refill 500 per minute; per VM: bucket 12, refill 4
  per minute. Sustained, 500 creates a minute (8.3/s) is below ARM's 10 writes/s, so per-VM PUTs
  are held to it: :data:`COMPUTE_PUT_VM_WRITES`.
- AKS applies its own per-operation limits to its resource provider's APIs
  (https://aka.ms/aks/throttling); they are not modelled here: a 429 from them is answered like
  ARM's (the controller's budget shrinks, see ``fleetledger.adapters.machines.write_budget``).

One AKS batch PUT is one ARM write for up to 50 machines (the machines API's batch limit), so a
burst of 1,000 machines is some 20 writes, a tenth of the write bucket.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "ARM_SUBSCRIPTION_READS",
    "ARM_SUBSCRIPTION_WRITES",
    "COMPUTE_PUT_VM_WRITES",
    "BucketLimits",
    "TokenBucket",
]


@dataclass(frozen=True, slots=True)
class BucketLimits:
    """A token bucket's size (requests it can take at once) and refill rate (per second)."""

    bucket_size: int
    refill_per_second: float

    def __post_init__(self) -> None:
        if type(self.bucket_size) is not int or self.bucket_size < 1:
            raise ValueError(f"bucket_size must be a whole number >= 1, got {self.bucket_size!r}")
        if not (math.isfinite(self.refill_per_second) and self.refill_per_second > 0):
            raise ValueError(
                f"refill_per_second must be a number > 0, got {self.refill_per_second!r}"
            )


ARM_SUBSCRIPTION_WRITES = BucketLimits(200, 10.0)
"""ARM's write budget per subscription, principal and region (see the module docstring)."""

ARM_SUBSCRIPTION_READS = BucketLimits(250, 25.0)
"""ARM's read budget per subscription, principal and region."""

COMPUTE_PUT_VM_WRITES = BucketLimits(200, 500 / 60)
"""Per-VM create PUTs: ARM's write bucket (200, the smaller) refilled at Compute's sustained
*Put VM* rate, 500 a minute (the slower)."""


class TokenBucket:
    """A token bucket on the caller's time line (``at``): full at the start unless told
    otherwise, refilled continuously, never above its size. Thread-safe."""

    def __init__(self, limits: BucketLimits, *, available: float | None = None) -> None:
        tokens = float(limits.bucket_size) if available is None else float(available)
        if not 0 <= tokens <= limits.bucket_size:
            raise ValueError(
                f"available must be between 0 and the bucket size {limits.bucket_size}, "
                f"got {available!r}"
            )
        self._limits = limits
        self._tokens = tokens
        self._at: datetime | None = None
        self._lock = threading.Lock()

    @property
    def limits(self) -> BucketLimits:
        return self._limits

    def level(self, at: datetime) -> float:
        """The tokens in the bucket at ``at``."""
        with self._lock:
            self._refill(at)
            return self._tokens

    def take(self, cost: int, at: datetime) -> float:
        """Spend ``cost`` tokens at ``at`` and return 0.0, or, if the bucket holds fewer, spend
        nothing and return the seconds until it will hold them (a ``Retry-After``)."""
        if not 1 <= cost <= self._limits.bucket_size:
            raise ValueError(
                f"a request costs 1 to {self._limits.bucket_size} tokens (the bucket size), "
                f"got {cost!r}"
            )
        with self._lock:
            self._refill(at)
            if self._tokens >= cost:
                self._tokens -= cost
                return 0.0
            return (cost - self._tokens) / self._limits.refill_per_second

    def _refill(self, at: datetime) -> None:
        if self._at is not None and at > self._at:
            elapsed = (at - self._at).total_seconds()
            self._tokens = min(
                float(self._limits.bucket_size),
                self._tokens + elapsed * self._limits.refill_per_second,
            )
        if self._at is None or at > self._at:
            self._at = at
