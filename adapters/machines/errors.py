"""Errors of the machine-request runtime: one tree, raised at this package's boundary.

Exception tree::

    MachinesError                   base of everything ``adapters.machines`` raises
     ├── InvalidRequest (ValueError) a request is malformed (a field out of range, a bad value);
     │                               ``index`` is its position in the call, ``field`` the field
     │                               at fault when known. Nothing was appended.
     ├── RequestRejected             the grouper refused a well-formed request (a machine name
     │                               already held, a request id reused with other content);
     │                               ``index`` and ``reason`` say which and why. Nothing appended.
     ├── LogUnavailable              the event log could not be reached after retries; the
     │                               decision may or may not have landed — send it again: the
     │                               same request id makes the retry idempotent
     ├── LogContention               the grouper stream kept moving under us (another writer);
     │                               reloading and deciding again did not settle within the bound
     ├── BatchStalled                a batch could not make progress (cloud unreachable, machine
     │                               stuck creating); it stays incomplete and is resumed later
     ├── UnknownRequest (KeyError)   no request with that id was ever accepted by this grouper
     ├── RuntimeStopped              the runtime is not running; start it before enqueueing
     └── CloudNotConfigured          a real cloud was chosen without its settings; the message
                                     lists the environment variables to set

Errors from the layers below (``eventstore``, ``domain``, ``adapters.cloud``) are translated here
with ``raise … from e``; callers of this package handle this tree only.
"""

from __future__ import annotations

__all__ = [
    "BatchStalled",
    "CloudNotConfigured",
    "InvalidRequest",
    "LogContention",
    "LogUnavailable",
    "MachinesError",
    "RequestRejected",
    "RuntimeStopped",
    "UnknownRequest",
]


class MachinesError(Exception):
    """Base class of every error the machine-request runtime raises."""


class InvalidRequest(MachinesError, ValueError):
    """Raised when request ``index`` of a call is malformed; nothing was appended."""

    def __init__(self, message: str, *, index: int = 0, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


class RequestRejected(MachinesError):
    """Raised when the grouper refuses request ``index`` for ``reason``; nothing was appended."""

    def __init__(self, reason: str, *, index: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.index = index


class LogUnavailable(MachinesError):
    """Raised when the event log stayed unreachable through every retry."""


class LogContention(MachinesError):
    """Raised when expected-version conflicts on one stream did not settle."""


class BatchStalled(MachinesError):
    """Raised (and logged) when a batch cannot progress now; it is resumed on the next start."""


class UnknownRequest(MachinesError, KeyError):
    """Raised when asking about a request id the grouper has never accepted."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id

    def __str__(self) -> str:
        return (
            f"no request {self.request_id!r} was accepted by this grouper; "
            "check the id returned when it was enqueued"
        )


class RuntimeStopped(MachinesError):
    """Raised when enqueueing on a runtime that is not running."""


class CloudNotConfigured(MachinesError):
    """Raised when a real cloud adapter is chosen without the settings it needs."""
