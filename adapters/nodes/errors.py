"""Errors of node accounting at its boundary: one tree, each mapped to one HTTP answer.

Exception tree::

    NodesError                  base of everything ``adapters.nodes`` raises
     ├── InvalidRequest         the request cannot be decided as given (400): a bad amount, an
     │                          unsupported protocol version, fractional CPU on an old protocol
     ├── UnknownPod             no node accounts a VM pod by that name (404)
     ├── MigratingPodMismatch   a migrating pod asked for something other than its reservation
     │                          (409)
     ├── RequestRefused         the node refused for another reason, e.g. unschedulable (409)
     ├── LogUnavailable         the event log is unreachable; send it again (503)
     ├── LogContention          another writer kept moving the node's stream (503)
     └── RuntimeStopped         the runtime is not running (503)

The host's and the domain's errors are translated here with ``raise … from e``.
"""

from __future__ import annotations

__all__ = [
    "InvalidRequest",
    "LogContention",
    "LogUnavailable",
    "MigratingPodMismatch",
    "NodesError",
    "RequestRefused",
    "RuntimeStopped",
    "UnknownPod",
]


class NodesError(Exception):
    """Base class of every error node accounting raises at its boundary."""


class InvalidRequest(NodesError):
    """Raised when a request cannot be decided as given; the message says what to fix."""


class UnknownPod(NodesError):
    """Raised when no node accounts a VM pod of that name."""


class MigratingPodMismatch(NodesError):
    """Raised when a migrating pod asks for anything but its reservation."""


class RequestRefused(NodesError):
    """Raised when a node refuses a command for any other reason (e.g. unschedulable)."""


class LogUnavailable(NodesError):
    """Raised when the event log stayed unreachable; the same request may be sent again."""


class LogContention(NodesError):
    """Raised when a node's stream kept moving under this process (another writer)."""


class RuntimeStopped(NodesError):
    """Raised when the node runtime is not running."""
