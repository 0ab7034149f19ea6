"""``fleetledger bench store``: our log against raw psycopg, on the same server, in one run.

Every figure is printed beside a reference measured in the same run on the same server, so the
ratios hold across machines even when absolute numbers do not. Commits and reads are short and
sensitive to whatever else the machine does, so the contenders run in turn, round after round:
a rate is the median of its rounds, and a ratio is the median of the per-round ratios, each
taken against the reference measured beside it — so a passing disturbance (a noisy neighbour, a
checkpoint) decides neither, and a slow spell of the machine slows both sides of a pair.

Replay reads its own log — 20,000 events of a ~300-byte nested body, the shape of a machine
request — in pages of 1,000, against raw psycopg reading the same ten columns and decoding data
and metadata with ``json.loads``.

The benchmark never writes to the log it is pointed at: on Postgres it creates scratch databases
on that server (and drops them); on SQLite it uses scratch files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from fleetledger.eventstore import ANY, EventStore, NewEvent, open_store
from fleetledger.eventstore._engine import libpq_conninfo

from .scratch import scratch_database

__all__ = ["Measurement", "StoreBenchReport", "run_store_bench"]

log = structlog.get_logger("bench.store")

WRITER_THREADS = 8
COMMITS = "commits/s"
BATCH = 100
READ_ROUNDS = 5
WRITE_ROUNDS = 9
BATCH_ROUNDS = 5
BATCH_TARGET = 15_000
READ_PAGE = 1000
READ_EVENTS = 20_000
READ_LOAD_BATCH = 500


@dataclass(frozen=True, slots=True)
class Measurement:
    name: str
    rate: float
    unit: str
    reference: str | None = None
    ratio: float | None = None
    target: str | None = None
    met: bool | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class StoreBenchReport:
    backend: str
    events: int
    measurements: tuple[Measurement, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "events": self.events,
            "measurements": [m.to_dict() for m in self.measurements],
        }

    def render(self) -> str:
        lines = [
            f"bench store — {self.backend}, {self.events} events per write test and round",
            f"  medians of interleaved rounds ({WRITE_ROUNDS} single-append, {BATCH_ROUNDS} batch,"
            f" {READ_ROUNDS} read); each ratio pairs rounds run side by side",
            f"  replay: {READ_EVENTS:,} events of a ~300-byte nested body, pages of {READ_PAGE:,}",
        ]
        for m in self.measurements:
            line = f"  {m.name:<46} {m.rate:>10,.0f} {m.unit:<10}"
            if m.ratio is not None:
                line += f"   {m.ratio:5.2f}× {m.reference}"
            if m.target is not None:
                line += f"   target {m.target}: {'met' if m.met else 'NOT MET'}"
            lines.append(line)
        return "\n".join(lines)


def _event(i: int) -> NewEvent:
    # Realistic bodies: a small payload and the correlation metadata every domain event carries.
    return NewEvent(
        "BenchEvent",
        {"index": i, "node": f"node-{i % 50}", "cpu_milli": 250 * (i % 8), "ok": True},
        metadata={"correlation_id": f"req-{i}", "actor": "bench"},
    )


def _replay_event(i: int) -> NewEvent:
    """An event of the replay log: a nested body of about 300 bytes and the usual metadata."""
    return NewEvent(
        "MachineRequested",
        {
            "request_id": f"req-{i:08d}",
            "template": {
                "name": f"gpu-pool-{i % 7}",
                "vm_size": "Standard_NC24ads_A100_v4",
                "zone": str(1 + i % 3),
                "labels": {"pool": "batch", "team": "ml-infra", "tier": "spot"},
            },
            "count": 1 + i % 4,
            "nodes": [
                {"name": f"node-{i % 50}", "cpu_milli": 250 * (i % 8), "memory_mib": 4096},
                {"name": f"node-{(i + 1) % 50}", "cpu_milli": 500, "memory_mib": 8192},
            ],
            "ok": True,
        },
        metadata={"correlation_id": f"req-{i:08d}", "causation_id": f"cmd-{i}", "actor": "bench"},
    )


def _timed(work: Callable[[], int]) -> float:
    """Run ``work`` (which returns how many units it did) and return units per second."""
    started = time.perf_counter()
    done = work()
    return done / (time.perf_counter() - started)


def run_store_bench(url: str | None = None, *, events: int = 2000) -> StoreBenchReport:
    """Measure appends and replay; see the module docstring."""
    if events < WRITER_THREADS * 10:
        raise ValueError(f"--events must be at least {WRITER_THREADS * 10}")
    with scratch_database(url) as scratch:
        is_postgres = not scratch.startswith("sqlite")
        with (
            _raw_writer(scratch, events) if is_postgres else contextlib.nullcontext() as raw,
            open_store(scratch) as store,
        ):
            writes = _measure_single_appends(store, raw, events)
            batches = _measure_batches(store, scratch if is_postgres else None, events)
    # Replay reads a log of its own, so its figures do not depend on --events.
    with scratch_database(url) as scratch, open_store(scratch) as store:
        reads = _measure_replay(store, scratch if is_postgres else None)
    raw_minimal, raw_insert = writes.get("raw_minimal"), writes.get("raw_insert")
    single, threaded = writes["single"], writes["threaded"]
    measurements = [
        _compare("raw INSERT minimal row, commit each", raw_minimal, None, None, COMMITS),
        _compare("raw INSERT event row, commit each", raw_insert, None, None, COMMITS),
        _compare("append 1 event, 1 writer", single, raw_insert, 0.95, "appends/s"),
        _versus_minimal("append 1 event, 1 writer", single, raw_minimal),
        _fenced(writes["fenced"], single),
        _compare("append 1 event, 8 writers", threaded, raw_insert, 2.0, "appends/s"),
        _versus_minimal("append 1 event, 8 writers", threaded, raw_minimal),
        _compare("raw psycopg executemany 100/txn", batches.get("raw"), None, None, "events/s"),
        _batched(batches["ours"], batches.get("raw")),
        _compare("raw read data::text + json.loads", reads.get("raw"), None, None, "events/s"),
        _compare(
            "read_all replay into RecordedEvent",
            reads["replay"],
            reads.get("raw"),
            1.0,
            "events/s",
        ),
    ]
    return StoreBenchReport(
        backend="postgres" if is_postgres else "sqlite",
        events=events,
        measurements=tuple(m for m in measurements if m.rate > 0),
    )


Rounds = dict[str, list[float]]
"""Each contender's rate in every round, in round order."""


def _measure_single_appends(store: EventStore, raw: _RawWriter | None, events: int) -> Rounds:
    """Interleaved rounds of ours with 1 and 8 writers, 1 writer fenced to a leader term, and
    both raw references."""
    rounds: Rounds = {}
    for round_number in range(1, WRITE_ROUNDS + 1):
        rates: dict[str, float] = {}
        if raw is not None:
            rates["raw_minimal"] = _timed(raw.insert_minimal)
            rates["raw_insert"] = _timed(raw.insert_shaped)
        # The callers' events are built before the clock starts, as the raw references' rows
        # are: the figures compare storing events, not constructing them.
        singles = _singles(events)
        rates["single"] = _timed(functools.partial(_append_each, store, "bench-single", singles))
        fenced = _singles(events, leader_term=1)
        rates["fenced"] = _timed(functools.partial(_append_each, store, "bench-fenced", fenced))
        per_thread = [_singles(events // WRITER_THREADS) for _ in range(WRITER_THREADS)]
        rates["threaded"] = _timed(functools.partial(_append_threaded, store, per_thread))
        log.info(
            "single appends measured",
            round=round_number,
            of=WRITE_ROUNDS,
            **{name: round(rate) for name, rate in rates.items()},
        )
        for name, rate in rates.items():
            rounds.setdefault(name, []).append(rate)
    return rounds


def _load_replay_log(store: EventStore) -> None:
    for start in range(0, READ_EVENTS, READ_LOAD_BATCH):
        events = [_replay_event(i) for i in range(start, start + READ_LOAD_BATCH)]
        store.append(f"bench-replay-{start // READ_LOAD_BATCH % 20}", events)


def _measure_replay(store: EventStore, postgres_url: str | None) -> Rounds:
    _load_replay_log(store)
    log.info("measuring replay, raw read + decode alternating", events=store.head())
    if postgres_url is not None:
        # Both readers get the plan a settled log has (autovacuum would analyse it soon).
        with store.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE events")
            conn.commit()
    rounds: Rounds = {}
    with _raw_reader(postgres_url) if postgres_url else contextlib.nullcontext() as raw_work:
        for _ in range(READ_ROUNDS):
            if raw_work is not None:
                rounds.setdefault("raw", []).append(_timed(raw_work))
            rounds.setdefault("replay", []).append(_timed(lambda: _replay(store)))
    return rounds


def _measure_batches(store: EventStore, postgres_url: str | None, events: int) -> Rounds:
    log.info("measuring 100-event appends, raw executemany alternating", events=events)
    rounds: Rounds = {}
    with (
        _raw_batch_writer(postgres_url, events)
        if postgres_url
        else contextlib.nullcontext() as raw_work
    ):
        for _ in range(BATCH_ROUNDS):
            if raw_work is not None:
                rounds.setdefault("raw", []).append(_timed(raw_work))
            work = functools.partial(_append_batches, store, _batches(events))
            rounds.setdefault("ours", []).append(_timed(work))
    return rounds


def _batched(rates: list[float], raw: list[float] | None) -> Measurement:
    rate = statistics.median(rates)
    if raw is None:  # SQLite: the targets are set for Postgres
        return Measurement("append 100 events per call", rate, "events/s")
    return Measurement(
        "append 100 events per call",
        rate,
        "events/s",
        "raw executemany",
        _paired_ratio(rates, raw),
        f">= {BATCH_TARGET:,} events/s",
        rate >= BATCH_TARGET,
    )


def _compare(
    name: str,
    rates: list[float] | None,
    reference: list[float] | None,
    factor: float | None,
    unit: str,
) -> Measurement:
    if rates is None:
        return Measurement(name, 0.0, unit)
    rate = statistics.median(rates)
    if reference is None or factor is None:
        return Measurement(name, rate, unit)
    ratio = _paired_ratio(rates, reference)
    return Measurement(name, rate, unit, "raw", ratio, f">= {factor}× raw", ratio >= factor)


def _fenced(rates: list[float], unfenced: list[float]) -> Measurement:
    """What fencing costs a lone writer: the leader's appends beside the same without a term."""
    return Measurement(
        "append 1 event with leader_term, 1 writer",
        statistics.median(rates),
        "appends/s",
        "unfenced",
        _paired_ratio(rates, unfenced),
    )


def _versus_minimal(name: str, rates: list[float], minimal: list[float] | None) -> Measurement:
    if minimal is None:
        return Measurement(name, 0.0, "appends/s")
    return Measurement(
        f"  (vs minimal row) {name}",
        statistics.median(rates),
        "appends/s",
        "raw minimal",
        _paired_ratio(rates, minimal),
    )


def _paired_ratio(rates: list[float], reference: list[float]) -> float:
    """The median over rounds of each round's rate against the reference measured beside it."""
    return statistics.median(r / ref for r, ref in zip(rates, reference, strict=True))


def _singles(count: int, *, leader_term: int | None = None) -> list[list[NewEvent]]:
    if leader_term is None:
        return [[_event(i)] for i in range(count)]
    return [[_fenced_event(i, leader_term)] for i in range(count)]


def _fenced_event(i: int, leader_term: int) -> NewEvent:
    """What the leader's runtime appends: the usual event, fenced to its term."""
    event = _event(i)
    return NewEvent(event.type, event.data, metadata={**event.metadata, "leader_term": leader_term})


def _append_each(store: EventStore, stream: str, appends: list[list[NewEvent]]) -> int:
    for events in appends:
        store.append(stream, events, expected_version=ANY)
    return len(appends)


def _append_threaded(store: EventStore, per_thread: list[list[list[NewEvent]]]) -> int:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            _append_each(store, f"bench-thread-{n}", per_thread[n])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(len(per_thread))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(len(appends) for appends in per_thread)


def _batches(count: int) -> list[list[NewEvent]]:
    return [[_event(c * BATCH + i) for i in range(BATCH)] for c in range(count // BATCH)]


def _append_batches(store: EventStore, batches: list[list[NewEvent]]) -> int:
    for c, events in enumerate(batches):
        store.append(f"bench-batch-{c % 20}", events, expected_version=ANY)
    return len(batches) * BATCH


def _replay(store: EventStore) -> int:
    position = 0
    seen = 0
    while page := store.read_all(after=position, limit=READ_PAGE):
        seen += len(page)
        position = page[-1].global_position
    return seen


class _RawWriter:
    """The two single-insert references, both one INSERT and one commit per row, psycopg defaults:

    - a minimal table (bigserial key, text, json) — the cheapest thing Postgres can commit;
    - a table shaped like ``events`` (same columns, same indexes) receiving a complete event row
      computed up front — what storing an event costs before any event-store logic.

    Every row is built before any clock starts; each call inserts the next ``per_round`` rows.
    """

    def __init__(self, conn: Any, *, per_round: int, rounds: int) -> None:
        self._conn = conn
        self._per_round = per_round
        count = per_round * rounds
        now = datetime.now(UTC)
        self._minimal = [("bench-raw", json.dumps(_event(i).data)) for i in range(count)]
        self._shaped = [
            (
                i + 1,
                "bench-raw-1",
                i + 1,
                uuid.uuid4(),
                "BenchEvent",
                1,
                json.dumps(_event(i).data),
                json.dumps(_event(i).metadata),
                now,
                hashlib.sha256(str(i).encode()).digest(),
            )
            for i in range(count)
        ]

    def insert_minimal(self) -> int:
        rows, self._minimal = self._minimal[: self._per_round], self._minimal[self._per_round :]
        for row in rows:
            self._conn.execute("INSERT INTO bench_raw (stream_id, data) VALUES (%s, %s)", row)
        return len(rows)

    def insert_shaped(self) -> int:
        rows, self._shaped = self._shaped[: self._per_round], self._shaped[self._per_round :]
        for row in rows:
            self._conn.execute(
                "INSERT INTO bench_raw_events VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", row
            )
        return len(rows)


@contextlib.contextmanager
def _raw_writer(url: str, per_round: int) -> Iterator[_RawWriter]:
    import psycopg

    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_raw (id bigserial PRIMARY KEY, stream_id text, data json)")
        conn.execute("CREATE TABLE bench_raw_events (LIKE events INCLUDING ALL)")
        yield _RawWriter(conn, per_round=per_round, rounds=WRITE_ROUNDS)


@contextlib.contextmanager
def _raw_batch_writer(url: str, per_round: int) -> Iterator[Callable[[], int]]:
    """The batch reference: psycopg ``executemany`` of 100 rows per transaction."""
    import psycopg

    rows = [("bench-raw", json.dumps(_event(i).data)) for i in range(per_round * BATCH_ROUNDS)]
    with psycopg.connect(libpq_conninfo(url)) as conn:

        def work() -> int:
            nonlocal rows
            now, rows = rows[:per_round], rows[per_round:]
            for start in range(0, len(now), BATCH):
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO bench_raw (stream_id, data) VALUES (%s, %s)",
                        now[start : start + BATCH],
                    )
                conn.commit()
            return len(now)

        yield work


@contextlib.contextmanager
def _raw_reader(url: str) -> Iterator[Callable[[], int]]:
    """The reference replay: pages of ``data::text`` read with psycopg, decoded by json.loads."""
    import psycopg

    sql = (
        "SELECT global_position, stream_id, stream_version, event_id, type, schema_version, "
        "data::text, metadata::text, recorded_at, hash FROM events WHERE global_position > %s "
        "ORDER BY global_position LIMIT %s"
    )
    with psycopg.connect(libpq_conninfo(url)) as conn:

        def work() -> int:
            position = 0
            seen = 0
            loads = json.loads
            while rows := conn.execute(sql, (position, READ_PAGE)).fetchall():
                decoded = [(*r[:6], loads(r[6]), loads(r[7]), *r[8:]) for r in rows]
                seen += len(decoded)
                position = rows[-1][0]
            conn.rollback()
            return seen

        yield work
