"""A stream as a read model folded it: what a runtime starting up hosts the stream from, instead
of reading the stream back after the read model has read the whole log once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["StreamHead"]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class StreamHead(Generic[S]):
    """A stream's state as folded from its first ``version`` events, and its last event's id."""

    state: S
    version: int
    last_event_id: str
