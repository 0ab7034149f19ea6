"""Errors of the testbeds runtime: one tree, raised at this package's boundary.

Exception tree::

    TestbedsError                   base of everything ``adapters.testbeds`` raises
     ├── InvalidTestbedCommand      a command is malformed (ValueError); nothing was appended
     ├── CommandRejected            the aggregate refused a well-formed command; ``reason`` says
     │   │ (``reason``)             what to do instead; nothing was appended
     │   └── Conflict               refused because a scheduling holds the job or testbed;
     │       (``holder``)           ``holder`` names it
     ├── NotFound                   no such testbed, job or scheduling (or it was deleted)
     │   (``kind``, ``name``)
     ├── LogUnavailable             the event log stayed unreachable; send the command again
     ├── LogContention              the streams kept moving under this process (another writer)
     └── NotLeading                 a leader duty was refused: a newer leader term was elected

Errors of the layers below (host, domain, event store) are translated here with ``raise … from e``.
"""

from __future__ import annotations

__all__ = [
    "CommandRejected",
    "Conflict",
    "InvalidTestbedCommand",
    "LogContention",
    "LogUnavailable",
    "NotFound",
    "NotLeading",
    "TestbedsError",
]


class TestbedsError(Exception):
    """Base class of every error the testbeds runtime raises."""


class InvalidTestbedCommand(TestbedsError, ValueError):
    """Raised when a command is malformed; nothing was appended."""


class CommandRejected(TestbedsError):
    """Raised when an aggregate refuses a command; nothing was appended."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Conflict(CommandRejected):
    """Raised when a command is refused because scheduling ``holder`` holds what it names."""

    def __init__(self, reason: str, *, holder: str) -> None:
        super().__init__(reason)
        self.holder = holder


class NotFound(TestbedsError, LookupError):
    """Raised when no testbed, job or scheduling of that name exists (or it was deleted)."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.name = name
        self.reason = reason


class LogUnavailable(TestbedsError):
    """Raised when the event log stayed unreachable through every re-send."""


class LogContention(TestbedsError):
    """Raised when expected-version conflicts did not settle within the bound."""


class NotLeading(TestbedsError):
    """Raised when the store fenced a leader duty: this process no longer leads."""
