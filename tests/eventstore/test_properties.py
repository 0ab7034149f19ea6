"""Property test: random appends, multi-stream appends and replays agree with a simple model."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetledger.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    AppendResult,
    DuplicateEventId,
    EventStore,
    ExpectedVersion,
    NewEvent,
    StreamAppend,
    WrongExpectedVersion,
    open_store,
)
from tests.eventstore.support import FreshDatabase

STREAMS = ("vm-a", "vm-b", "vm-c")
# Each example needs a fresh database: a file on SQLite, a template clone on Postgres.
EXAMPLES = {"sqlite": 150, "postgres": 40}


Part = tuple[str, tuple[uuid.UUID, ...], ExpectedVersion]
"""One stream's part of an append: stream, event ids, expected version."""


@dataclass(frozen=True)
class Refused:
    """What the model predicts instead of results."""

    kind: type[Exception]
    stream_id: str | None = None
    actual: int | None = None
    ids: frozenset[uuid.UUID] = frozenset()


@dataclass
class Model:
    """The log as lists: the global order and, per event id, where it is."""

    log: list[tuple[str, int, uuid.UUID]] = field(default_factory=list)
    position_of: dict[uuid.UUID, int] = field(default_factory=dict)

    def version(self, stream: str) -> int:
        return sum(1 for s, _, _ in self.log if s == stream)

    def append(self, parts: list[Part]) -> list[AppendResult] | Refused:
        """Results in the order of ``parts``, or the refusal the store must raise; the parts are
        checked and written in their order."""
        ordered = parts
        stored = frozenset(i for _, ids, _ in parts for i in ids if i in self.position_of)
        if stored:
            # Some ids are stored: a faithful retry of every part, or a duplicate.
            replays = {p[0]: self._replay(*p) for p in ordered}
            if any(r is None for r in replays.values()):
                return Refused(DuplicateEventId, ids=stored)
            return [r for p in parts if (r := replays[p[0]]) is not None]
        for stream, _, expected in ordered:
            actual = self.version(stream)
            exact = 0 if expected is NO_STREAM else expected
            if (isinstance(exact, int) and actual != exact) or (
                expected is STREAM_EXISTS and actual == 0
            ):
                return Refused(WrongExpectedVersion, stream_id=stream, actual=actual)
        results = {}
        for stream, ids, _ in ordered:
            first = len(self.log) + 1
            for event_id in ids:
                self.log.append((stream, self.version(stream) + 1, event_id))
                self.position_of[event_id] = len(self.log)
            results[stream] = AppendResult(first, len(self.log), self.version(stream))
        return [results[p[0]] for p in parts]

    def _replay(
        self, stream: str, ids: tuple[uuid.UUID, ...], expected: ExpectedVersion
    ) -> AppendResult | None:
        if not all(i in self.position_of for i in ids):
            return None
        positions = [self.position_of[i] for i in ids]
        entries = [self.log[p - 1] for p in positions]
        first_version = entries[0][1]
        if any(s != stream or v != first_version + n for n, (s, v, _) in enumerate(entries)):
            return None
        exact = 0 if expected is NO_STREAM else expected
        if isinstance(exact, int) and first_version != exact + 1:
            return None
        return AppendResult(positions[0], positions[-1], entries[-1][1])


expectations = st.one_of(
    # "current" is the model's version of the stream, so that many appends succeed.
    st.sampled_from([ANY, NO_STREAM, STREAM_EXISTS, "current", "current", "current"]),
    st.integers(min_value=0, max_value=4),
)


@dataclass
class Run:
    """One example: a store, the model, and every append attempted so far (for replays)."""

    store: EventStore
    model: Model = field(default_factory=Model)
    history: list[list[Part]] = field(default_factory=list)
    next_id: int = 1

    def ids(self, count: int) -> tuple[uuid.UUID, ...]:
        start, self.next_id = self.next_id, self.next_id + count
        return tuple(uuid.UUID(int=n) for n in range(start, start + count))

    def resolve(self, stream: str, expected: Any) -> ExpectedVersion:
        return self.model.version(stream) if expected == "current" else expected

    def new_parts(self, data: st.DataObject, *, many: bool) -> list[Part]:
        streams = data.draw(
            st.lists(st.sampled_from(STREAMS), min_size=2, max_size=3, unique=True)
            if many
            else st.sampled_from(STREAMS).map(lambda s: [s])
        )
        return [
            (s, self.ids(data.draw(st.integers(1, 3))), self.resolve(s, data.draw(expectations)))
            for s in streams
        ]

    def replayed_parts(self, data: st.DataObject) -> list[Part]:
        """An earlier append as sent, or changed: another stream or expectation, fewer ids,
        an extra new id, one part replaced by new ids, or joined with another append's ids."""
        parts = list(data.draw(st.sampled_from(self.history)))
        change = data.draw(
            st.sampled_from(["same", "same", "stream", "expected", "tail", "mix", "fresh", "join"])
        )
        index = data.draw(st.integers(0, len(parts) - 1))
        stream, ids, expected = parts[index]
        if change == "stream":
            others = [s for s in STREAMS if s not in {p[0] for p in parts}]
            if others:
                parts[index] = (data.draw(st.sampled_from(others)), ids, expected)
        elif change == "expected":
            parts[index] = (stream, ids, self.resolve(stream, data.draw(expectations)))
        elif change == "tail" and len(ids) > 1:
            parts[index] = (stream, ids[1:], expected)
        elif change == "mix":
            parts[index] = (stream, ids + self.ids(1), expected)
        elif change == "fresh":
            parts[index] = (stream, self.ids(1), self.resolve(stream, data.draw(expectations)))
        elif change == "join":
            # Ids of two earlier appends to one stream, sent again as one append. An id already
            # in this append (in any of its parts) would make it invalid, so such are skipped.
            taken = {i for _, part_ids, _ in parts for i in part_ids}
            later = [p for h in self.history for p in h if p[0] == stream and not set(p[1]) & taken]
            if later:
                parts[index] = (stream, ids + data.draw(st.sampled_from(later))[1], expected)
        return parts

    def step(self, parts: list[Part]) -> None:
        sent = [i for _, ids, _ in parts for i in ids]
        assert len(sent) == len(set(sent)), "the generator must not repeat an id in one append"
        self.history.append(parts)
        stored_before = set(self.model.position_of)
        predicted = self.model.append(parts)
        outcome = predicted.kind.__name__ if isinstance(predicted, Refused) else "accepted"
        retried = any(i in stored_before for _, ids, _ in parts for i in ids)
        event(f"{'retry' if retried else 'new'} {len(parts)}-stream append: {outcome}")
        appends = [
            StreamAppend(s, [NewEvent("Step", {"id": str(i)}, event_id=i) for i in ids], e)
            for s, ids, e in parts
        ]
        if isinstance(predicted, Refused):
            with pytest.raises(predicted.kind) as raised:
                self.send(appends)
            self.check_refusal(predicted, raised.value)
        else:
            assert self.send(appends) == predicted, parts

    def send(self, appends: list[StreamAppend]) -> list[AppendResult]:
        if len(appends) == 1:
            [a] = appends
            return [self.store.append(a.stream_id, a.events, expected_version=a.expected_version)]
        return self.store.append_many(appends)

    @staticmethod
    def check_refusal(predicted: Refused, error: BaseException) -> None:
        if isinstance(error, WrongExpectedVersion):
            assert (error.stream_id, error.actual) == (predicted.stream_id, predicted.actual)
        if isinstance(error, DuplicateEventId):
            assert uuid.UUID(error.event_id) in predicted.ids

    def check_log(self) -> None:
        events = self.store.read_all()
        assert [(e.stream_id, e.stream_version, e.event_id) for e in events] == self.model.log
        assert [e.global_position for e in events] == list(range(1, len(events) + 1))
        for stream in STREAMS:
            expected = [(s, v, i) for s, v, i in self.model.log if s == stream]
            stored = self.store.read_stream(stream)
            assert [(e.stream_id, e.stream_version, e.event_id) for e in stored] == expected
            assert self.store.stream_version(stream) == len(expected)
        assert self.store.verify().ok


def run_steps(fresh: FreshDatabase, data: st.DataObject) -> None:
    with fresh() as url, open_store(url) as store:
        run = Run(store)
        for _ in range(data.draw(st.integers(1, 20), label="steps")):
            kind = data.draw(st.sampled_from(["append", "append", "many", "replay", "replay"]))
            if kind == "replay" and run.history:
                parts = run.replayed_parts(data)
            else:
                parts = run.new_parts(data, many=kind == "many")
            run.step(parts)
        run.check_log()


SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "database": None,
}


class TestAgainstTheModel:
    @settings(max_examples=EXAMPLES["sqlite"], **SETTINGS)
    @given(data=st.data())
    def test_sqlite_matches_the_model(
        self, fresh_sqlite: FreshDatabase, data: st.DataObject
    ) -> None:
        """On SQLite every step's results or refusal and the final log match the model."""
        run_steps(fresh_sqlite, data)

    @settings(max_examples=EXAMPLES["postgres"], **SETTINGS)
    @given(data=st.data())
    def test_postgres_matches_the_model(
        self, fresh_postgres: FreshDatabase, data: st.DataObject
    ) -> None:
        """On Postgres every step's results or refusal and the final log match the model."""
        run_steps(fresh_postgres, data)
