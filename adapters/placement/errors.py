"""Errors of workload placement at its boundary: one tree, each mapped to one HTTP answer.

Exception tree::

    PlacementError          base of everything ``adapters.placement`` raises
     ├── InvalidWorkload    a workload request cannot be read as given (400)
     ├── UnknownWorkload    no workload by that id is known (404)
     ├── WorkloadConflict   the id was already submitted with a different request (409)
     ├── LogUnavailable     the event log is unreachable; send it again (503)
     └── RuntimeStopped     the runtime is not running, or no longer leads (503)

The host's and the node service's errors are translated here with ``raise … from e``.
"""

from __future__ import annotations

__all__ = [
    "InvalidWorkload",
    "LogUnavailable",
    "PlacementError",
    "RuntimeStopped",
    "UnknownWorkload",
    "WorkloadConflict",
]


class PlacementError(Exception):
    """Base class of every error workload placement raises."""


class InvalidWorkload(PlacementError, ValueError):
    """A workload request is malformed; the message says which field to fix."""


class UnknownWorkload(PlacementError, LookupError):
    """No workload by that id was submitted to this runtime or is reserved on a node."""


class LogUnavailable(PlacementError):
    """The event log could not be reached; nothing was committed, send the request again."""


class RuntimeStopped(PlacementError):
    """The placement runtime is stopped, or this process no longer leads."""


class WorkloadConflict(PlacementError):
    """A workload id was already submitted with a different request; nothing was recorded.
    Send it under a new id, or release the first one."""
