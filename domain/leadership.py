"""Leader terms: who leads the controllers sharing one database, term after term.

One stream (``leadership-<scope>``) records every election. A process that has won the lease
(the runtime's business) claims the next term; terms increase by one, and the expected version
of the append makes two claims of the same term impossible. The event store fences by these
terms: once term N is recorded, appends from terms below N are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleetledger.domain.errors import InvalidCommand

__all__ = [
    "ClaimLeadership",
    "LeaderElected",
    "LeadershipState",
    "decide",
    "evolve",
    "initial_state",
]


@dataclass(frozen=True, slots=True)
class ClaimLeadership:
    """``holder`` won the lease at ``at`` and takes the next term."""

    holder: str
    at: datetime


@dataclass(frozen=True, slots=True)
class LeaderElected:
    """``holder`` leads from ``at`` in ``term`` (1, 2, … without gaps)."""

    term: int
    holder: str
    at: datetime


@dataclass(frozen=True, slots=True)
class LeadershipState:
    """The latest term and its holder (term 0: nobody was ever elected)."""

    term: int = 0
    holder: str | None = None


def initial_state() -> LeadershipState:
    return LeadershipState()


def evolve(state: LeadershipState, event: LeaderElected) -> LeadershipState:
    return LeadershipState(term=event.term, holder=event.holder)


def decide(state: LeadershipState, command: ClaimLeadership) -> list[LeaderElected]:
    """The next term for the claimant. Raises :class:`InvalidCommand` for an empty holder."""
    if not isinstance(command.holder, str) or not command.holder.strip():
        raise InvalidCommand("holder must name the claiming process, e.g. 'host-1:4242'")
    return [LeaderElected(state.term + 1, command.holder, command.at)]
