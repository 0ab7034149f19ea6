"""Batch jobs on slot testbeds, run on the decider host (docs/ARCHITECTURE.md, "Batch jobs on
slot testbeds").

- :class:`TestbedsService`: the testbed, job and scheduling streams, hosted; users' commands
  (each answering where it left its resource in the log, :class:`Written`) and reads;
- :class:`GhostPodReconciler`: ghost pods as the testbed's slots want them, through the
  :class:`~fleetledger.adapters.cluster.ClusterGateway`;
- :class:`SchedulingProcess`: claims, submissions, confirmations, completion, release, and the
  jobs' applications (:class:`Applications`, :class:`FakeApplications`);
- :class:`TestbedsRuntime`: all of it assembled, with ``start()/stop()``.

The extender that places the jobs' pods is :mod:`fleetledger.adapters.extender.server`.
"""

from __future__ import annotations

from .aggregates import BATCH_JOB, SCHEDULING, TESTBED
from .applications import APPLICATION_LABEL, Applications, FakeApplications
from .errors import (
    CommandRejected,
    Conflict,
    InvalidTestbedCommand,
    LogContention,
    LogUnavailable,
    NotFound,
    NotLeading,
    TestbedsError,
)
from .process import SchedulingProcess
from .reconciler import GHOST_LABEL, GhostPodReconciler
from .runtime import TestbedsRuntime
from .service import TestbedsService, Written

__all__ = [
    "APPLICATION_LABEL",
    "BATCH_JOB",
    "GHOST_LABEL",
    "SCHEDULING",
    "TESTBED",
    "Applications",
    "CommandRejected",
    "Conflict",
    "FakeApplications",
    "GhostPodReconciler",
    "InvalidTestbedCommand",
    "LogContention",
    "LogUnavailable",
    "NotFound",
    "NotLeading",
    "SchedulingProcess",
    "TestbedsError",
    "TestbedsRuntime",
    "TestbedsService",
    "Written",
]
