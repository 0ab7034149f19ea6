"""How long the log takes to commit this process's decisions: the one measure not in the log.

Every decision the runtimes write goes through
:func:`~fleetledger.adapters.runtime.appends.append_decision`, which times each
``append_many`` here. The histogram is process-wide on purpose: appends come from every runtime
and every listener of the process, while each app builds its own registry; each registry then
reads the same histogram (:class:`AppendLatency` is a collector), so a process serving two
listeners shows the same figures on both.

This module imports nothing of fleetledger: the runtime imports it, and the metrics package's
other modules import the capabilities' read models, which import the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric

__all__ = ["APPEND_LATENCY", "APPEND_SECONDS", "APPEND_SECONDS_BUCKETS", "AppendLatency"]

APPEND_SECONDS = "fleetledger_log_append_duration_seconds"
"""The histogram's name in ``/metrics``."""

APPEND_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""From an in-process SQLite commit (under a millisecond) to a Postgres group commit under
load (tens of milliseconds) and an outage's retries (seconds)."""


class AppendLatency:
    """``fleetledger_log_append_duration_seconds``: one observation per ``append_many`` that
    returned (committed or replayed); refused and failed attempts are not timed, their error is
    logged where they happen."""

    __slots__ = ("_histogram",)

    def __init__(self) -> None:
        # Not registered anywhere: each registry that serves it adds this collector.
        self._histogram = Histogram(
            APPEND_SECONDS,
            "Time one append of decisions (possibly several streams) took to commit.",
            buckets=APPEND_SECONDS_BUCKETS,
            registry=None,
        )

    def observe(self, seconds: float) -> None:
        """Record one append that took ``seconds`` (wall time)."""
        self._histogram.observe(max(0.0, seconds))

    def collect(self) -> Iterable[Metric]:
        return self._histogram.collect()


APPEND_LATENCY = AppendLatency()
"""The process's append timings."""
