"""Prometheus metrics on ``/metrics``: folded from the log, plus what only the process knows.

Most values are folded from the log at scrape time (:mod:`.from_log`): batch sizes and seal
reasons, cloud calls and errors by code, throttling waits, placement latency, node and subnet
accounting, testbed slots, leader terms. They count what every process appended, and a replay
of the log gives them again. The process's own figures — its leadership role, its placement
plans' optimality gaps (:mod:`.live`) and how long its appends take (:mod:`.appends`) — are read
from the live runtimes. :mod:`.labels` keeps every label bounded.

:mod:`.http` serves them (``metrics_registry``, ``metrics_router``, ``MetricsEndpoint``); it is
not imported here, so the runtime, which times its appends through :mod:`.appends`, does not
load the web framework.
"""

from __future__ import annotations

from .appends import APPEND_LATENCY, AppendLatency
from .from_log import COUNTED_EVENT_TYPES, MAX_EVENTS_PER_SCRAPE, LogMetrics, Subscriber
from .labels import MAX_NODE_SERIES, MAX_SUBNET_SERIES, MAX_TESTBED_SERIES, OTHER
from .live import ROLES, LiveMetrics, PlacementReports

__all__ = [
    "APPEND_LATENCY",
    "COUNTED_EVENT_TYPES",
    "MAX_EVENTS_PER_SCRAPE",
    "MAX_NODE_SERIES",
    "MAX_SUBNET_SERIES",
    "MAX_TESTBED_SERIES",
    "OTHER",
    "ROLES",
    "AppendLatency",
    "LiveMetrics",
    "LogMetrics",
    "PlacementReports",
    "Subscriber",
]
