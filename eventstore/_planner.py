"""Deciding a group commit: which callers' appends go in, at which positions, with which hashes.

One algorithm for every backend. It works on a :class:`LogView` — the head of the log, the
versions of the group's streams and whichever of the group's event ids are already stored — and
returns the rows to insert plus one outcome per caller. Each caller is judged on its own (a
conflict or a stale leader term never fails another caller of the same group) and in queue order,
so a later caller sees what an earlier one in the same group wrote. Rows are placed in queue order
and, within a caller's append, in the order it lists its streams and events: a cause appended
before its effects precedes them in the log.

Fencing: the view carries the highest leader term recorded so far. A caller whose events carry a
lower term is refused with ``Fenced``; one carrying a higher term raises it for the callers after
it. The terms in the log therefore never decrease along global positions, so the rows of a plan
are fenced rightly by checking their first term and recording their last, which is what the
Postgres appender's statement has the database do again (migration 0002).

A shard's leader fences its events on the shard's own term instead (``leader_shard`` beside
``leader_term``, migration 0005): the same rule, applied per shard to the rows naming it, with
the log-wide term and every other shard's left alone. The plan reports each shard's first and
last term (``GroupPlan.shards``) for the database to check and record.

The backends differ only in how they obtain a view they can trust: SQLite reads it inside its
write transaction; Postgres plans optimistically on a cached view and lets unique constraints
catch a stale one (see ``_postgres_append.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from fleetledger.eventstore._chain import GENESIS_HASH, chain_hash
from fleetledger.eventstore._encoding import (
    EXPECT_ANY,
    EXPECT_EXISTS,
    PreparedAppend,
    PreparedEvent,
)
from fleetledger.eventstore._types import AppendResult
from fleetledger.eventstore.errors import (
    DuplicateEventId,
    EventStoreError,
    Fenced,
    WrongExpectedVersion,
)

__all__ = [
    "AppendOutcome",
    "EventRow",
    "GroupPlan",
    "LogView",
    "ShardSpan",
    "StoredEvent",
    "plan_group",
]

AppendOutcome = list[AppendResult] | EventStoreError
"""What one caller gets: its results (one per stream, in its order) or its error."""


# The records below are NamedTuples, not frozen dataclasses, because every append builds them and
# a frozen dataclass's __init__ costs several times as much as a tuple; they stay immutable.
class StoredEvent(NamedTuple):
    """Where an already stored event id lives."""

    stream_id: str
    stream_version: int
    global_position: int


@dataclass(slots=True)
class LogView:
    """What the planner needs to know about the stored log."""

    head_position: int = 0
    head_hash: bytes = GENESIS_HASH
    versions: dict[str, int] = field(default_factory=dict)
    """Current versions of (at least) the group's streams; a missing stream is at 0."""
    stored: dict[str, StoredEvent] = field(default_factory=dict)
    """The group's event ids (canonical text) that are already stored (empty when none are, or
    unknown)."""
    term: int = 0
    """The highest leader term recorded log-wide (0 when none)."""
    shard_terms: dict[str, int] = field(default_factory=dict)
    """Recorded terms of (at least) the group's shards; a missing shard is at 0."""

    def advance(self, plan: GroupPlan) -> None:
        """Apply a committed plan, so the view stays valid for the next group."""
        if plan.rows:
            last = plan.rows[-1]
            self.head_position, self.head_hash = last.global_position, last.hash
        self.versions.update(plan.stream_versions)
        self.stored = {}
        self.term = plan.term
        if plan.shards:
            for shard, span in plan.shards.items():
                self.shard_terms[shard] = span.last


class EventRow(NamedTuple):
    """One row to insert: a caller's event placed in the log."""

    global_position: int
    stream_id: str
    stream_version: int
    event: PreparedEvent
    recorded_us: int
    """When the group commits, in microseconds since the Unix epoch."""
    hash: bytes


class ShardSpan(NamedTuple):
    """The terms a plan's rows carry for one shard."""

    first: int
    """The lowest: what the shard's recorded term must not exceed."""
    last: int
    """The highest, which the shard's recorded term is once the plan commits (a caller below
    the recorded term is refused, so the highest term a plan carries is at least that)."""


_NO_SHARDS: Mapping[str, ShardSpan] = MappingProxyType({})


class GroupPlan(NamedTuple):
    rows: tuple[EventRow, ...]
    outcomes: tuple[AppendOutcome, ...]
    stream_versions: Mapping[str, int]
    """Final versions of the streams this plan writes to."""
    has_rejections: bool
    """Whether some caller's outcome is an error."""
    term: int
    """The highest leader term recorded once the plan is committed."""
    first_term: int
    """The lowest log-wide leader term a row carries, 0 when none carries one."""
    shards: Mapping[str, ShardSpan]
    """Per shard its rows name, the terms they carry (empty when none names one)."""


def plan_group(
    items: Sequence[tuple[PreparedAppend, ...]], view: LogView, *, recorded_us: int
) -> GroupPlan:
    """Plan ``items`` in order on ``view``; every row is recorded at ``recorded_us`` (microseconds
    since the Unix epoch)."""
    # The view is read, never changed: a plan that fails to commit leaves it as it was. What this
    # group writes is tracked on the side (``written``, ``stored``) and consulted first.
    head_position, head_hash, term = view.head_position, view.head_hash, view.term
    shard_terms = view.shard_terms
    shards: dict[str, ShardSpan] = {}
    written: dict[str, int] = {}
    stored: dict[str, StoredEvent] = dict(view.stored)
    last_item = len(items) - 1
    rows: list[EventRow] = []
    outcomes: list[AppendOutcome] = []
    rejections = False
    first_term = 0
    for index, item in enumerate(items):
        outcome = _judge(
            item, written, view.versions, stored, term=term, shards=shards, shard_terms=shard_terms
        )
        if outcome is not None:
            outcomes.append(outcome)
            rejections = rejections or isinstance(outcome, EventStoreError)
            continue
        results: list[AppendResult] = []
        for append in item:
            stream_id = append.stream_id
            version = _current_version(stream_id, written, view.versions)
            first = head_position + 1
            for event in append.events:
                head_position += 1
                version += 1
                head_hash = chain_hash(
                    head_hash,
                    position=head_position,
                    stream_id=stream_id,
                    stream_version=version,
                    event_id=event.event_id,
                    type=event.type,
                    schema_version=event.schema_version,
                    recorded_at_us=recorded_us,
                    data_text=event.data_text,
                    metadata_text=event.metadata_text,
                )
                rows.append(
                    EventRow(head_position, stream_id, version, event, recorded_us, head_hash)
                )
                if index < last_item:
                    # Later callers of the same group see this id as stored (a retry racing its
                    # original in one group is then judged like any other retry).
                    stored[event.event_id] = StoredEvent(stream_id, version, head_position)
            written[stream_id] = version
            results.append(AppendResult(first, head_position, version))
            if not append.last_term:
                continue
            shard = append.shard
            if shard is None:
                if not first_term:
                    first_term = append.first_term
                term = max(term, append.last_term)
            else:
                span = shards.get(shard)
                shards[shard] = (
                    ShardSpan(append.first_term, append.last_term)
                    if span is None
                    else ShardSpan(span.first, max(span.last, append.last_term))
                )
        outcomes.append(results)
    return GroupPlan(
        tuple(rows),
        tuple(outcomes),
        written,
        rejections,
        term,
        first_term,
        shards or _NO_SHARDS,
    )


def _current_version(
    stream_id: str, written: Mapping[str, int], stored_versions: Mapping[str, int]
) -> int:
    """What this group wrote to the stream, else what the view says is stored."""
    found = written.get(stream_id)
    return stored_versions.get(stream_id, 0) if found is None else found


def _recorded_shard_term(
    shard: str, planned: Mapping[str, ShardSpan], recorded: Mapping[str, int]
) -> int:
    """What this group raised the shard's term to, else what the view says is recorded."""
    span = planned.get(shard)
    return recorded.get(shard, 0) if span is None else span.last


def _judge(
    item: tuple[PreparedAppend, ...],
    written: Mapping[str, int],
    stored_versions: Mapping[str, int],
    stored: Mapping[str, StoredEvent],
    *,
    term: int,
    shards: Mapping[str, ShardSpan],
    shard_terms: Mapping[str, int],
) -> AppendOutcome | None:
    """None when the item may be written; its original result if it is a faithful replay;
    otherwise its error."""
    if stored:
        # Before the fence: re-sending an append that landed while its writer still led must
        # return the original result, not tell it now that it was deposed.
        replay = _replay(item, stored)
        if replay is not None:
            return replay
    for append in item:
        first_term = append.first_term
        if not first_term:
            continue
        shard = append.shard
        recorded = term if shard is None else _recorded_shard_term(shard, shards, shard_terms)
        if first_term < recorded:
            return Fenced(first_term, recorded)
    for append in item:
        actual = _current_version(append.stream_id, written, stored_versions)
        expected = append.expected
        if (expected >= 0 and actual != expected) or (expected == EXPECT_EXISTS and actual == 0):
            return WrongExpectedVersion(append.stream_id, append.expected_label, actual)
    return None


def _replay(
    item: tuple[PreparedAppend, ...], stored: Mapping[str, StoredEvent]
) -> AppendOutcome | None:
    ids = [e.event_id for a in item for e in a.events]
    found = [i for i in ids if i in stored]
    if not found:
        return None
    # A faithful retry: every id stored, in order, in the same stream at consecutive versions
    # its expectation allowed. Anything else reusing an id is a conflict.
    results = [_original_result(append, stored) for append in item]
    if all(r is not None for r in results):
        return [r for r in results if r is not None]
    return DuplicateEventId(found[0])


def _original_result(
    append: PreparedAppend, stored: Mapping[str, StoredEvent]
) -> AppendResult | None:
    places = [stored.get(e.event_id) for e in append.events]
    present = [p for p in places if p is not None]
    if len(present) != len(places):
        return None
    first = present[0]
    for offset, place in enumerate(present):
        if place.stream_id != append.stream_id or place.stream_version != (
            first.stream_version + offset
        ):
            return None
    if append.expected not in (EXPECT_ANY, EXPECT_EXISTS) and first.stream_version != (
        append.expected + 1
    ):
        return None
    # Positions are reported as stored: the original may have been several appends.
    last = present[-1]
    return AppendResult(first.global_position, last.global_position, last.stream_version)
