"""Appending decisions: re-send on an unknown outcome, surface version conflicts to the decider.

``append_decision`` is the one way the host writes. A ``StoreUnavailable`` means the outcome is
unknown, so the very same records are sent again (their deterministic ids, see
:mod:`fleetledger.adapters.runtime.codec`, turn a landed first attempt into a replay), with
exponential back-off on the injected clock. ``WrongExpectedVersion`` is not retried here: only the
caller can reload its stream and decide again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.metrics.appends import APPEND_LATENCY
from fleetledger.eventstore import AppendResult, EventStore, StoreUnavailable, StreamAppend

from .errors import LogUnavailable

__all__ = ["RetryPolicy", "append_decision"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How hard to try before giving up: log outages and expected-version conflicts."""

    unavailable_attempts: int = 5
    backoff_seconds: float = 0.05
    conflict_attempts: int = 20

    def __post_init__(self) -> None:
        if self.unavailable_attempts < 1 or self.conflict_attempts < 1:
            raise ValueError("unavailable_attempts and conflict_attempts must be at least 1")
        if self.backoff_seconds < 0:
            raise ValueError(f"backoff_seconds must be >= 0, got {self.backoff_seconds}")


def append_decision(
    store: EventStore,
    appends: Sequence[StreamAppend],
    *,
    clock: Clock,
    policy: RetryPolicy,
) -> list[AppendResult]:
    """``store.append_many(appends)``, re-sent while the log is unavailable.

    Raises ``WrongExpectedVersion`` (reload and decide again) or :class:`LogUnavailable`.
    """
    for attempt in range(1, policy.unavailable_attempts + 1):
        try:
            # Wall time, whatever the injected clock: how long the database took (/metrics).
            started = time.perf_counter()
            results = store.append_many(appends)
            APPEND_LATENCY.observe(time.perf_counter() - started)
            return results
        except StoreUnavailable as e:
            if attempt == policy.unavailable_attempts:
                raise LogUnavailable(
                    f"the event log stayed unreachable through {attempt} attempts ({e}); "
                    "check the database, then send the request again (the same request id "
                    "makes it idempotent)"
                ) from e
            wait = policy.backoff_seconds * 2 ** (attempt - 1)
            log.warning(
                "event log unavailable; re-sending the same events",
                attempt=attempt,
                wait_seconds=wait,
                streams=[a.stream_id for a in appends],
                error=str(e),
            )
            clock.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
