"""Errors of the decider host: one tree, raised at the runtime's boundary.

Exception tree::

    HostError                       base of everything ``adapters.runtime`` raises
     ├── CommandRefused             command ``index`` of a submission was refused by the
     │                              aggregate (``error`` is the domain's ``Rejected``); nothing
     │                              of that submission was appended
     ├── LogUnavailable             the event log stayed unreachable through every re-send; the
     │                              decision may or may not have landed — send it again: the
     │                              deterministic event ids make the retry idempotent
     ├── LogContention              the stream kept moving under this process (another writer);
     │                              catching up and deciding again did not settle within the bound
     └── Deposed                    the store refused a leader duty's append: a newer leader term
                                    was elected, this process no longer leads (``term`` is ours,
                                    ``current_term`` the newest)

Capabilities translate these into their own trees at their boundary (``raise … from e``).
"""

from __future__ import annotations

from fleetledger.domain.errors import Rejected

__all__ = ["CommandRefused", "Deposed", "HostError", "LogContention", "LogUnavailable"]


class HostError(Exception):
    """Base class of every error the decider host raises."""


class CommandRefused(HostError):
    """Raised when the aggregate refuses command ``index`` of a submission."""

    def __init__(self, index: int, error: Rejected) -> None:
        super().__init__(error.reason)
        self.index = index
        self.error = error


class LogUnavailable(HostError):
    """Raised when the event log stayed unreachable through every re-send."""


class LogContention(HostError):
    """Raised when expected-version conflicts on one stream did not settle."""


class Deposed(HostError):
    """Raised when the store fenced a leader duty's append: a newer term leads now."""

    def __init__(self, message: str, *, term: int, current_term: int) -> None:
        super().__init__(message)
        self.term = term
        self.current_term = current_term
