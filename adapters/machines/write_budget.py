"""The controller's side of the cloud's write budget: a token bucket that learns from 429s.

Azure Resource Manager lets a subscription write at most a bucket of 200 requests at once,
refilled at 10 a second (:data:`~fleetledger.adapters.cloud.throttling.ARM_SUBSCRIPTION_WRITES`,
where the figures and their sources are). A controller that sends past it is answered ``429`` with
a ``Retry-After``, and the batch that got it fails with ``throttled``. So the coordinator spends
from a bucket of its own, of the same size and rate, before each create call, and a batch waits
for its writes here rather than being refused there.

The local bucket is an estimate: other writers share the subscription's budget, and resource
providers behind ARM (Compute, AKS) throttle with limits of their own. A 429 says the estimate was
too generous, and the budget adapts:

- **pause**: no write is sent until the ``Retry-After`` has passed (a request sent earlier would
  only be refused again), and the bucket is emptied;
- **shrink**: the refill rate halves (down to ``floor_fraction`` of the configured rate). 429s that
  arrive while a pause runs belong to the same episode (calls already in flight) and shrink it
  once, not once each;
- **grow back**: the rate climbs linearly back to the configured one, from zero to full in
  ``recovery_seconds``, while no 429 comes.

Reservations, not polling: :meth:`WriteBudget.reserve` spends the writes at once, letting the
bucket go into debt, and says how long to wait before sending. Callers wait in reservation order
without holding a lock or watching each other, which keeps the coordinator's rule that a batch
never blocks on anything another batch holds (the simulator runs one task at a time). A write
sent after a wait made before a 429 first waits out the pause (:meth:`WriteBudget.pause_remaining`).

Time comes from the caller (``at``), so tests and the simulator drive it with their clocks.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

__all__ = ["ThrottleReason", "WriteBudget", "WriteReservation"]

ThrottleReason = Literal["write_budget", "retry_after"]
"""Why a write waits: the local bucket had too few tokens (``write_budget``), or the cloud
answered a 429 whose ``Retry-After`` has not passed yet (``retry_after``)."""

_DEFAULT_PAUSE_SECONDS = 1.0
"""The pause after a 429 that came without a ``Retry-After`` (ARM always sends one)."""


@dataclass(frozen=True, slots=True)
class WriteReservation:
    """Writes reserved: send them ``wait_seconds`` from now; why, and the rate then in force
    (writes per second; ``None`` when the budget has no rate limit)."""

    wait_seconds: float
    reason: ThrottleReason
    rate: float | None


class WriteBudget:
    """A subscription's write budget as this controller spends it; see the module docstring.

    ``rate=None`` sets no local limit (a cloud with no ARM in front of it, like the in-memory
    fake): writes only wait out the pauses 429s ask for. Thread-safe; share one per subscription.
    """

    def __init__(
        self,
        *,
        rate: float | None,
        burst: int,
        recovery_seconds: float = 60.0,
        floor_fraction: float = 1 / 16,
    ) -> None:
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a number of writes per second > 0, got {rate!r}")
        if type(burst) is not int or burst < 1:
            raise ValueError(f"burst must be a whole number of writes >= 1, got {burst!r}")
        if not (math.isfinite(recovery_seconds) and recovery_seconds > 0):
            raise ValueError(f"recovery_seconds must be > 0, got {recovery_seconds!r}")
        if not 0 < floor_fraction <= 1:
            raise ValueError(f"floor_fraction must be in (0, 1], got {floor_fraction!r}")
        self._configured = rate
        self._burst = burst
        self._recovery_seconds = recovery_seconds
        self._floor = None if rate is None else rate * floor_fraction
        self._rate = rate
        self._tokens = float(burst)
        self._at: datetime | None = None
        self._not_before: datetime | None = None
        self._lock = threading.Lock()
        self._refusals = 0

    @property
    def configured_rate(self) -> float | None:
        """The rate the budget grows back to (writes per second; ``None``: no limit)."""
        return self._configured

    @property
    def burst(self) -> int:
        return self._burst

    @property
    def refusals(self) -> int:
        """429s reported so far."""
        with self._lock:
            return self._refusals

    def rate(self, at: datetime) -> float | None:
        """The refill rate in force at ``at`` (shrunk after 429s, growing back)."""
        with self._lock:
            self._advance(at)
            return self._rate

    def tokens(self, at: datetime) -> float:
        """The tokens at ``at``; negative while reserved writes are waiting."""
        with self._lock:
            self._advance(at)
            return self._tokens

    def reserve(self, writes: int, at: datetime) -> WriteReservation:
        """Spend ``writes`` now and say how long to wait before sending them."""
        if type(writes) is not int or writes < 1:
            raise ValueError(f"writes must be a whole number >= 1, got {writes!r}")
        with self._lock:
            self._advance(at)
            pause = self._pause_at(at)
            if self._rate is None:
                return WriteReservation(_whole_milliseconds(pause), "retry_after", None)
            short = writes - self._tokens
            self._tokens -= writes
            # Debt is repaid at the current rate: a rate growing back meanwhile only repays it
            # sooner, so the wait errs on the safe side.
            refill = max(0.0, short / self._rate)
            wait = max(pause, refill)
            reason: ThrottleReason = "write_budget"
            if pause > 0 and pause >= refill:
                reason = "retry_after"
            return WriteReservation(_whole_milliseconds(wait), reason, self._rate)

    def pause_remaining(self, at: datetime) -> float:
        """Seconds until writes may go again after a 429 (0.0 when none is pending)."""
        with self._lock:
            return _whole_milliseconds(self._pause_at(at))

    def refused(self, retry_after: float | None, at: datetime) -> None:
        """The cloud answered a write with a 429 at ``at``: pause, and shrink (see the module
        docstring)."""
        if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
            raise ValueError(f"retry_after must be seconds >= 0, got {retry_after!r}")
        with self._lock:
            self._advance(at)
            self._refusals += 1
            if self._pause_at(at) == 0:  # a new episode, not a call that was already in flight
                if self._rate is not None and self._floor is not None:
                    self._rate = max(self._floor, self._rate / 2)
                self._tokens = min(self._tokens, 0.0)
            pause = _DEFAULT_PAUSE_SECONDS if retry_after is None else retry_after
            until = at + timedelta(seconds=pause)
            if self._not_before is None or until > self._not_before:
                self._not_before = until

    # -- internals (under the lock) ---------------------------------------------------------

    def _pause_at(self, at: datetime) -> float:
        if self._not_before is None or self._not_before <= at:
            return 0.0
        return (self._not_before - at).total_seconds()

    def _advance(self, at: datetime) -> None:
        """Refill the bucket and grow the rate back from the last time seen up to ``at``."""
        if self._at is None or at <= self._at:
            if self._at is None:
                self._at = at
            return
        elapsed = (at - self._at).total_seconds()
        self._at = at
        if self._rate is None or self._configured is None:
            return
        full = self._configured
        growth = full / self._recovery_seconds  # writes/s gained per second
        rate = self._rate
        if rate >= full:
            gained = full * elapsed
        else:
            to_full = (full - rate) / growth
            if elapsed <= to_full:
                gained = rate * elapsed + growth * elapsed * elapsed / 2
                self._rate = rate + growth * elapsed
            else:
                gained = rate * to_full + growth * to_full * to_full / 2
                gained += full * (elapsed - to_full)
                self._rate = full
        self._tokens = min(float(self._burst), self._tokens + gained)


def _whole_milliseconds(seconds: float) -> float:
    """A wait rounded up to whole milliseconds: clocks that keep microseconds could otherwise
    end it a hair before the bucket holds the token it waited for."""
    return math.ceil(seconds * 1000) / 1000 if seconds > 0 else 0.0
