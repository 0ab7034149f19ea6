"""What the host needs to run an aggregate: its pure functions, its codec, its stream naming.

A capability hands the host one :class:`Aggregate` and nothing else of the runtime: the host
loads and folds its streams, decides, appends with expected versions, drives its deadlines and
runs its reactors. ``decide`` takes ``(state, command)``; an aggregate whose decisions depend on
configuration binds it first (``functools.partial(grouper.decide, config=…)`` or a lambda).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from .codec import EventCodec

__all__ = ["Aggregate", "SnapshotCodec"]

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotCodec(Generic[S]):
    """How an aggregate's state is saved as a snapshot: every ``every`` events, as the JSON-ready
    ``to_data(state)``; ``schema_version`` changes whenever that shape does (an older snapshot is
    then ignored and the stream folded from the start)."""

    to_data: Callable[[S], Mapping[str, Any]]
    from_data: Callable[[Mapping[str, Any]], S]
    schema_version: int = 1
    every: int = 1000

    def __post_init__(self) -> None:
        if self.every < 1 or self.schema_version < 1:
            raise ValueError("snapshot every and schema_version must be at least 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class Aggregate(Generic[S, C, E]):
    """A pure aggregate as the host runs it.

    ``stream_of(key)`` names the stream of one instance (``key`` is e.g. a node name); ``tick(at)``
    is the command the clock driver sends when ``next_deadline(state)`` has passed.
    """

    name: str
    initial_state: Callable[[], S]
    evolve: Callable[[S, E], S]
    decide: Callable[[S, C], Sequence[E]]
    codec: EventCodec[E]
    stream_of: Callable[[str], str]
    next_deadline: Callable[[S], datetime | None] | None = None
    tick: Callable[[datetime], C] | None = None
    snapshots: SnapshotCodec[S] | None = None

    def __post_init__(self) -> None:
        if (self.next_deadline is None) != (self.tick is None):
            raise ValueError(
                f"aggregate {self.name!r}: give next_deadline and tick together (the driver "
                "sends tick(at) when next_deadline(state) has passed)"
            )

    def fold(self, state: S, events: Sequence[E]) -> S:
        """``state`` after ``events``."""
        for event in events:
            state = self.evolve(state, event)
        return state
