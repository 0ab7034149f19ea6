"""Many writers with conflicting expectations and a live subscriber: nothing lost, nothing twice."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import (
    ANY,
    AppendResult,
    EventStore,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
    StreamAppend,
    WrongExpectedVersion,
    open_store,
)
from tests.eventstore.support import fresh_database

THREADS = 8
STREAMS = [f"load-{n}" for n in range(16)]
APPENDS = 500
WAIT = 60.0


@dataclass
class WriterLog:
    """What one writer thread was told: acknowledged appends and refused event ids."""

    acknowledged: list[tuple[str, list[uuid.UUID], AppendResult]] = field(default_factory=list)
    refused: list[uuid.UUID] = field(default_factory=list)


def choose_expected(rng: random.Random, seen: dict[str, int], stream: str) -> ExpectedVersion:
    """A mix of ANY, the version this thread last saw (often stale by now) and older ones."""
    roll = rng.random()
    if roll < 0.25:
        return ANY
    last = seen.get(stream, 0)
    if roll < 0.85:
        return last
    return max(0, last - rng.randint(1, 3))


def writer(store: EventStore, seed: int, appends: int, start: threading.Barrier) -> WriterLog:
    rng = random.Random(seed)
    log = WriterLog()
    seen: dict[str, int] = {}
    start.wait(WAIT)
    for n in range(appends):
        streams = rng.sample(STREAMS, 2 if rng.random() < 0.1 else 1)
        parts = [
            StreamAppend(
                stream,
                [
                    NewEvent("Load", {"writer": seed, "n": n}, event_id=uuid.uuid4())
                    for _ in range(rng.randint(1, 3))
                ],
                choose_expected(rng, seen, stream),
            )
            for stream in streams
        ]
        try:
            if len(parts) == 1:
                [part] = parts
                results = [
                    store.append(
                        part.stream_id, part.events, expected_version=part.expected_version
                    )
                ]
            else:
                results = store.append_many(parts)
        except WrongExpectedVersion as e:
            seen[e.stream_id] = e.actual
            log.refused.extend(uuid.UUID(str(ev.event_id)) for p in parts for ev in p.events)
            continue
        for part, result in zip(parts, results, strict=True):
            seen[part.stream_id] = result.stream_version
            ids = [uuid.UUID(str(ev.event_id)) for ev in part.events]
            log.acknowledged.append((part.stream_id, ids, result))
    return log


class Tail:
    """A live subscriber's handler: records every delivered event's position and id."""

    def __init__(self) -> None:
        self.delivered: list[tuple[int, uuid.UUID]] = []

    def __call__(self, event: RecordedEvent, conn: sa.Connection) -> None:
        self.delivered.append((event.global_position, event.event_id))


Scenario = tuple[EventStore, list[WriterLog], Tail]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def hammered(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    """Runs the writers once per backend with a live subscriber; yields what everyone saw.

    Half the writers use a second EventStore on the same database, as a second process would:
    its appends reach the subscriber through the database, not the in-process wake-up, and the
    two stores' group commits race each other for the same positions.

    Module-scoped: the run is the expensive part, and each test below checks one property of it.
    """
    backend = str(request.param)
    tail = Tail()
    with (
        fresh_database(request, backend)() as url,
        open_store(url) as store,
        open_store(url) as other,
    ):
        subscription = store.subscribe("tail", tail, batch_size=500, poll_interval=0.2)
        start = threading.Barrier(THREADS)
        try:
            with ThreadPoolExecutor(max_workers=THREADS) as pool:
                futures = [
                    pool.submit(writer, (store, other)[seed % 2], seed, APPENDS, start)
                    for seed in range(THREADS)
                ]
                logs = [f.result(timeout=WAIT * 2) for f in futures]
            assert subscription.wait_for(store.head(), timeout=WAIT), subscription.failure
        finally:
            subscription.stop()
        yield store, logs, tail


class TestManyWriters:
    def test_every_acknowledged_event_is_delivered_once_in_order(self, hammered: Scenario) -> None:
        """The live subscriber saw each acknowledged event exactly once, positions 1..head in
        strictly increasing order, and nothing else."""
        store, logs, tail = hammered
        acknowledged = [i for log in logs for _, ids, _ in log.acknowledged for i in ids]
        positions = [p for p, _ in tail.delivered]

        assert positions == list(range(1, store.head() + 1))
        assert len(tail.delivered) == len(acknowledged)
        assert {i for _, i in tail.delivered} == set(acknowledged)
        assert len(set(acknowledged)) == len(acknowledged)

    def test_acknowledged_results_match_the_log(self, hammered: Scenario) -> None:
        """Each AppendResult points at its own events: their positions and final version."""
        store, logs, _ = hammered
        stored = {e.event_id: e for e in read_everything(store)}

        for log in logs:
            for stream, ids, result in log.acknowledged:
                events = [stored[i] for i in ids]
                assert {e.stream_id for e in events} == {stream}
                assert [e.global_position for e in events] == list(
                    range(result.first_position, result.last_position + 1)
                )
                assert events[-1].stream_version == result.stream_version

    def test_streams_have_no_holes(self, hammered: Scenario) -> None:
        """Every stream's versions run 1..n and stream_version is n."""
        store, _, _ = hammered

        for stream in STREAMS:
            versions = [e.stream_version for e in store.read_stream(stream)]
            assert versions == list(range(1, len(versions) + 1))
            assert store.stream_version(stream) == len(versions)

    def test_refused_appends_wrote_nothing(self, hammered: Scenario) -> None:
        """No event id of a refused append is in the log; some appends were refused."""
        store, logs, _ = hammered
        refused = {i for log in logs for i in log.refused}
        stored = {e.event_id for e in read_everything(store)}

        assert refused
        assert not refused & stored

    def test_the_chain_verifies(self, hammered: Scenario) -> None:
        """The hash chain over everything the writers committed verifies."""
        store, _, _ = hammered

        report = store.verify()

        assert report.ok
        assert report.checked == store.head()


def read_everything(store: EventStore) -> list[RecordedEvent]:
    events: list[RecordedEvent] = []
    while page := store.read_all(after=len(events), limit=5000):
        events.extend(page)
    return events
