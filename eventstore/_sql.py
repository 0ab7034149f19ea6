"""The SQL backend: one class for Postgres and SQLite, with Postgres fast paths.

Everything that is not on a hot path goes through SQLAlchemy Core and is shared by both dialects.
On Postgres an append (a whole group commit) is one prepared INSERT on a dedicated autocommit
connection (``_postgres_append.py``), wake-ups for other processes follow it (``_wakeups.py``),
and a ``read_all`` page or a ``read_stream`` is one prepared SELECT on the reader's own
connections (``_postgres_read.py``). ``fleetledger bench store`` measures appends and replay
against raw psycopg.
"""

from __future__ import annotations

import json
import operator
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import orjson
import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from fleetledger.eventstore import _sqlite_read as sqlite_read
from fleetledger.eventstore._chain import now_micros
from fleetledger.eventstore._encoding import PreparedAppend
from fleetledger.eventstore._engine import (
    SQLITE_IMMEDIATE,
    is_sqlite,
    libpq_conninfo,
    make_engine,
    timeout_error,
)
from fleetledger.eventstore._planner import AppendOutcome
from fleetledger.eventstore._postgres_append import NOTIFY_CHANNEL, PostgresAppender
from fleetledger.eventstore._postgres_read import PostgresReader
from fleetledger.eventstore._schema import (
    SCHEMA_REVISION,
    checkpoints,
    events,
    fencing,
    shard_fencing,
    snapshots,
)
from fleetledger.eventstore._sqlite_append import append_in_transaction
from fleetledger.eventstore._types import RecordedEvent, Snapshot
from fleetledger.eventstore._wakeups import Notifier
from fleetledger.eventstore.errors import (
    EventStoreError,
    InvalidEvent,
    SchemaOutOfDate,
    StoreUnavailable,
)

__all__ = ["ChainRow", "SqlBackend"]

T = TypeVar("T")

_EVENT_COLUMNS = (
    events.c.global_position,
    events.c.stream_id,
    events.c.stream_version,
    events.c.event_id,
    events.c.type,
    events.c.schema_version,
    events.c.data,
    events.c.metadata,
    events.c.recorded_at,
    events.c.hash,
)


@dataclass(frozen=True, slots=True)
class ChainRow:
    """A stored event exactly as the hash chain covers it."""

    global_position: int
    stream_id: str
    stream_version: int
    event_id: str
    type: str
    schema_version: int
    recorded_at: datetime
    data_text: str
    metadata_text: str
    hash: bytes


def _utc(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything the store writes is UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


# Decoding the bodies is most of the cost of a replay, so it uses orjson (several times faster
# than the standard library). orjson reads integers outside [-2**63, 2**64) as floats, though, and
# the store accepts any JSON integer: a body that may hold one — a run of 20 digits, or a minus
# sign and 19 digits (or merely a long digit string) — takes the exact standard decoder instead.
#
# Postgres looks for the run as it reads each row (a regular expression its engine runs in a
# fraction of the time it takes here, on the server's own core: see _postgres_read.py), and says
# so in the row's last column. On SQLite the run is looked for here, once per page, over all its
# bodies joined: a search per body would cost half as much as decoding it. And it is looked for as
# a substring of the text with every digit turned into "0" (a table lookup per character, then a
# substring search that skips ahead): a regular expression for a digit run costs several times as
# much in Python, as much as decoding the page with orjson (``fleetledger bench store`` measures
# replay). str.translate is fast for ASCII only; other text is translated as its UTF-8 bytes.
_DIGITS_AS_ZEROS = str.maketrans("123456789", "000000000")
_BYTE_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_BIG_POSITIVE = "0" * 20
_BIG_NEGATIVE = "-" + "0" * 19
_BYTES_BIG_POSITIVE = _BIG_POSITIVE.encode()
_BYTES_BIG_NEGATIVE = _BIG_NEGATIVE.encode()


def _may_hold_big_integer(text: str) -> bool:
    if text.isascii():
        zeroed = text.translate(_DIGITS_AS_ZEROS)
        return _BIG_POSITIVE in zeroed or _BIG_NEGATIVE in zeroed
    zeroed_bytes = text.encode().translate(_BYTE_DIGITS_AS_ZEROS)
    return _BYTES_BIG_POSITIVE in zeroed_bytes or _BYTES_BIG_NEGATIVE in zeroed_bytes


def _decode_body(text: str) -> Any:
    if _may_hold_big_integer(text):
        return json.loads(text)
    return orjson.loads(text)


def _page_may_hold_big_integer(rows: Sequence[Sequence[Any]]) -> bool:
    """Whether any body of a page of rows (data at 6, metadata at 7) may hold a big integer."""
    # The newline keeps a digit run from spanning two bodies; the columns are gathered by
    # itemgetter, in C, not by a comprehension making a tuple per row.
    return _may_hold_big_integer("\n".join(map(_DATA_COLUMN, rows))) or _may_hold_big_integer(
        "\n".join(map(_METADATA_COLUMN, rows))
    )


_DATA_COLUMN = operator.itemgetter(6)
_METADATA_COLUMN = operator.itemgetter(7)
_CHECKED_COLUMN = operator.itemgetter(10)
_FIELD_NAMES = tuple(RecordedEvent.__dataclass_fields__)
_FIELDS_OF = operator.attrgetter(*_FIELD_NAMES)
_DATA_SLOT = RecordedEvent.__dict__["data"]
_METADATA_SLOT = RecordedEvent.__dict__["metadata"]
_HASH_SLOT = RecordedEvent.__dict__["hash"]


class _StoredEvent(RecordedEvent):
    """A :class:`RecordedEvent` read from the database, its bodies decoded when first read.

    A replay reads every event of the log, and its read models never look at most of the
    bodies: the metadata of nine events in ten, the data of the warnings and of the events no
    model folds (a quarter of a fleet's log). Decoding them, and collecting the dictionaries
    made, was a fifth of a replay (``fleetledger bench replay``). So a record holds the text of
    each body in its field until ``data`` or ``metadata`` is first read, which decodes it (with
    orjson: a page whose text may hold an integer orjson cannot is decoded whole as it is read,
    into plain RecordedEvents). A body is always a JSON object, so text is never a decoded value.
    The hash, which only a verification reads, is kept as the bytes read until asked for.

    Nothing else differs from a RecordedEvent: the same fields and values, frozen, equal to any
    RecordedEvent of equal fields, shown and pickled as one. Two threads reading a body at once
    may both decode it; both see equal values.
    """

    # No slots of its own: laid out as a RecordedEvent, so that a page's records are built as
    # instances of _Building (see _recorded_page).
    __slots__ = ()

    @property
    def data(self) -> Mapping[str, Any]:
        value = _DATA_SLOT.__get__(self)
        if type(value) is str:
            value = orjson.loads(value)
            _DATA_SLOT.__set__(self, value)
        return cast(Mapping[str, Any], value)

    @data.setter
    def data(self, value: Mapping[str, Any]) -> None:
        # Only object.__setattr__ comes here (the dataclass's __init__, which replace() calls):
        # RecordedEvent's own __setattr__ refuses every field.
        _DATA_SLOT.__set__(self, value)

    @property
    def metadata(self) -> Mapping[str, Any]:
        value = _METADATA_SLOT.__get__(self)
        if type(value) is str:
            value = orjson.loads(value)
            _METADATA_SLOT.__set__(self, value)
        return cast(Mapping[str, Any], value)

    @metadata.setter
    def metadata(self, value: Mapping[str, Any]) -> None:
        _METADATA_SLOT.__set__(self, value)

    @property
    def hash(self) -> str:
        value = _HASH_SLOT.__get__(self)
        if type(value) is not str:
            value = value.hex()
            _HASH_SLOT.__set__(self, value)
        return cast(str, value)

    @hash.setter
    def hash(self, value: str) -> None:
        _HASH_SLOT.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordedEvent):
            return bool(_FIELDS_OF(self) == _FIELDS_OF(other))
        return NotImplemented

    __hash__ = RecordedEvent.__hash__

    def __repr__(self) -> str:
        return repr(self._plain())

    def __reduce__(self) -> tuple[type[RecordedEvent], tuple[Any, ...]]:
        return RecordedEvent, _FIELDS_OF(self)

    def _plain(self) -> RecordedEvent:
        return RecordedEvent(*_FIELDS_OF(self))


# A frozen dataclass refuses attribute stores, and calling each slot's __set__ costs a call and
# an argument tuple per field: most of building a record. So a page's records are made as
# instances of this plain class, laid out exactly as RecordedEvent (its slots, in order), filled
# by ordinary attribute stores, then given their class (__class__ assignment, which Python allows
# between classes of the same layout: checked here, once). Only _recorded_page sees one.
_Building = type("_Building", (), {"__slots__": RecordedEvent.__slots__})
_probe: Any = object.__new__(_Building)
_probe.__class__ = _StoredEvent
del _probe


def _recorded_page(rows: Sequence[Sequence[Any]]) -> list[RecordedEvent]:
    """The records of a page of rows: the ten event columns, then whether the row's bodies may
    hold an integer orjson cannot read — Postgres's answer, or None on SQLite, where this page's
    text is searched instead."""
    if rows and rows[0][10] is not None:
        exact = any(map(_CHECKED_COLUMN, rows))
    else:
        exact = _page_may_hold_big_integer(rows)
    if exact:
        return _decoded_page(rows)
    new, building, stored, utc = object.__new__, _Building, _StoredEvent, UTC
    page: list[RecordedEvent] = []
    append = page.append
    for position, stream, version, event_id, type_, schema, data, metadata, at, digest, _ in rows:
        event: Any = new(building)
        event.global_position = position
        event.stream_id = stream
        event.stream_version = version
        event.event_id = event_id
        event.type = type_
        event.schema_version = schema
        event.data = data
        event.metadata = metadata
        # SQLite hands back naive datetimes; everything the store writes is UTC.
        event.recorded_at = at if at.tzinfo is not None else at.replace(tzinfo=utc)
        event.hash = digest
        event.__class__ = stored
        append(event)
    return page


def _decoded_page(rows: Sequence[Sequence[Any]]) -> list[RecordedEvent]:
    """The records of a page that may hold a big integer, each body decoded as it is read (by
    the exact decoder where needed)."""
    return [
        RecordedEvent(
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            _decode_body(row[6]),
            _decode_body(row[7]),
            _utc(row[8]),
            row[9].hex(),
        )
        for row in rows
    ]


class SqlBackend:
    """Storage for the event store on one database (Postgres or SQLite)."""

    def __init__(self, url: str, *, pool_size: int = 5, durable: bool = True) -> None:
        try:
            self._engine = make_engine(
                url,
                durable=durable,
                **({} if url.startswith("sqlite") else {"pool_size": pool_size}),
            )
        except sa.exc.ArgumentError as e:
            raise EventStoreError(f"cannot use database URL: {e}") from e
        self.is_sqlite = is_sqlite(self._engine)
        self.url_for_humans = self._engine.url.render_as_string(hide_password=True)
        # Names this backend's NOTIFYs: its listener skips them (its store woke its own
        # waiters at commit already, sparing them a second wake-up and read per burst).
        self._sender = uuid.uuid4().hex
        self._wake_ups = (
            None
            if self.is_sqlite
            else Notifier(self._conninfo(), NOTIFY_CHANNEL, sender=self._sender)
        )
        self._appender = (
            None
            if self._wake_ups is None
            else PostgresAppender(self._conninfo(), on_commit=self._wake_ups.poke)
        )
        self._reader = (
            None if self.is_sqlite else PostgresReader(self._conninfo(), max_idle=pool_size)
        )

    @property
    def engine(self) -> sa.Engine:
        return self._engine

    # -- lifecycle ---------------------------------------------------------------------------

    def check_schema(self) -> None:
        with self._translated("check the schema of"), self._engine.connect() as conn:
            inspector = sa.inspect(conn)
            revision = None
            if inspector.has_table("alembic_version"):
                revision = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        if revision != SCHEMA_REVISION:
            found = f"at revision {revision}" if revision else "without the fleetledger schema"
            raise SchemaOutOfDate(
                f"database {self.url_for_humans} is {found}; this fleetledger needs revision "
                f"{SCHEMA_REVISION}. Run: fleetledger db upgrade --url '{self.url_for_humans}'"
            )

    def close(self) -> None:
        if self._appender is not None:
            self._appender.close()
        if self._reader is not None:
            self._reader.close()
        if self._wake_ups is not None:
            self._wake_ups.close()
        self._engine.dispose()

    def _conninfo(self) -> str:
        return libpq_conninfo(self._engine.url)

    # -- appends -----------------------------------------------------------------------------

    def commit(self, items: Sequence[tuple[PreparedAppend, ...]]) -> list[AppendOutcome]:
        """Commit every item of a group in one transaction; one outcome per item."""
        if self._appender is not None:
            # The hot path: a plain try costs less than entering _translated's context manager.
            try:
                return self._appender.commit(items)
            except Exception as e:
                translated = self._translation(e, "append to")
                if translated is None:
                    raise
                raise translated from e
        with (
            self._translated("append to"),
            self._engine.connect().execution_options(**SQLITE_IMMEDIATE) as conn,
            conn.begin(),
        ):
            return append_in_transaction(conn, items, recorded_us=now_micros())

    # -- reads -------------------------------------------------------------------------------

    def read_stream(
        self, stream_id: str, *, from_version: int, backwards: bool, limit: int | None
    ) -> list[RecordedEvent]:
        if self._reader is not None:
            with self._translated("read from"):
                rows = self._reader.read_stream(
                    stream_id, from_version=from_version, backwards=backwards, limit=limit
                )
            return _recorded_page(rows)
        with self._translated("read from"), self._engine.connect() as conn:
            rows = sqlite_read.read_stream(
                conn, stream_id, from_version=from_version, backwards=backwards, limit=limit
            )
        return _recorded_page(rows)

    def read_all(
        self, *, after: int, limit: int, types: Sequence[str] | None
    ) -> list[RecordedEvent]:
        if self._reader is not None:
            with self._translated("read from"):
                rows = self._reader.read_all(after=after, limit=limit, types=types)
            return _recorded_page(rows)
        with self._translated("read from"), self._engine.connect() as conn:
            rows = sqlite_read.read_all(conn, after=after, limit=limit, types=types)
        return _recorded_page(rows)

    def head(self) -> int:
        if self._reader is not None:
            with self._translated("read from"):
                return self._reader.head()
        with self._translated("read from"), self._engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(events.c.global_position))).scalar() or 0)

    def leader_term(self, shard: str | None = None) -> int:
        """The recorded term of ``shard``, or the log-wide one (None); 0 when none is recorded."""
        query = (
            sa.select(fencing.c.term)
            if shard is None
            else sa.select(shard_fencing.c.term).where(shard_fencing.c.shard == shard)
        )
        with self._translated("read from"), self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def stream_version(self, stream_id: str) -> int:
        query = sa.select(sa.func.max(events.c.stream_version)).where(
            events.c.stream_id == stream_id
        )
        with self._translated("read from"), self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def chain_rows(self, *, after: int, limit: int) -> list[ChainRow]:
        query = (
            sa.select(*_EVENT_COLUMNS)
            .where(events.c.global_position > after)
            .order_by(events.c.global_position)
            .limit(limit)
        )
        with self._translated("read from"), self._engine.connect() as conn:
            return [
                ChainRow(
                    global_position=row[0],
                    stream_id=row[1],
                    stream_version=row[2],
                    event_id=str(row[3]),
                    type=row[4],
                    schema_version=row[5],
                    data_text=row[6],
                    metadata_text=row[7],
                    recorded_at=_utc(row[8]),
                    hash=bytes(row[9]),
                )
                for row in conn.execute(query)
            ]

    def hash_at(self, position: int) -> bytes | None:
        query = sa.select(events.c.hash).where(events.c.global_position == position)
        with self._translated("read from"), self._engine.connect() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else bytes(found)

    # -- checkpoints and snapshots -----------------------------------------------------------

    def load_checkpoint(self, name: str) -> int:
        query = sa.select(checkpoints.c.position).where(checkpoints.c.name == name)
        with self._translated("read from"), self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    @contextmanager
    def checkpoint_transaction(self, name: str) -> Iterator[tuple[sa.Connection, int]]:
        """A write transaction holding the checkpoint row locked; yields (conn, stored position)."""
        with self._translated("write to"), self.write_connection() as conn, conn.begin():
            self._upsert(
                conn, checkpoints, {"name": name, "position": 0, "updated_at": _now()}, None
            )
            query = sa.select(checkpoints.c.position).where(checkpoints.c.name == name)
            if not self.is_sqlite:
                query = query.with_for_update()
            yield conn, int(conn.execute(query).scalar_one())

    def store_checkpoint(self, conn: sa.Connection, name: str, position: int) -> None:
        conn.execute(
            checkpoints.update()
            .where(checkpoints.c.name == name)
            .values(position=position, updated_at=_now())
        )

    def save_snapshot(self, snapshot: Snapshot, state_text: str) -> None:
        row = {
            "stream_id": snapshot.stream_id,
            "version": snapshot.version,
            "schema_version": snapshot.schema_version,
            "state": state_text,
            "created_at": snapshot.created_at,
        }
        with self._translated("write to"), self.write_connection() as conn, conn.begin():
            # An older snapshot never replaces a newer one (two writers racing after a restart).
            self._upsert(conn, snapshots, row, snapshots.c.version <= snapshot.version)

    def load_snapshot(self, stream_id: str) -> tuple[int, int, str, datetime] | None:
        query = sa.select(
            snapshots.c.version,
            snapshots.c.schema_version,
            snapshots.c.state,
            snapshots.c.created_at,
        ).where(snapshots.c.stream_id == stream_id)
        with self._translated("read from"), self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else (int(row[0]), int(row[1]), str(row[2]), _utc(row[3]))

    @contextmanager
    def write_connection(self) -> Iterator[sa.Connection]:
        with self._engine.connect() as conn:
            yield conn.execution_options(**SQLITE_IMMEDIATE) if self.is_sqlite else conn

    def _upsert(
        self,
        conn: sa.Connection,
        table: sa.Table,
        row: dict[str, Any],
        update_when: sa.ColumnElement[bool] | None,
    ) -> None:
        insert = (sqlite.insert if self.is_sqlite else postgresql.insert)(table).values(**row)
        keys = [c.name for c in table.primary_key.columns]
        if update_when is None:
            conn.execute(insert.on_conflict_do_nothing(index_elements=keys))
            return
        updates = {k: v for k, v in row.items() if k not in keys}
        conn.execute(
            insert.on_conflict_do_update(index_elements=keys, set_=updates, where=update_when)
        )

    # -- notifications -----------------------------------------------------------------------

    def listen(
        self, on_notify: Callable[[], None], stop: threading.Event, *, timeout: float
    ) -> None:
        """Block, calling ``on_notify`` for each NOTIFY from another process, until ``stop``.

        Postgres only; LISTEN needs its own connection because notifications are delivered
        between transactions of the listening session.
        """
        conninfo = self._conninfo()
        while not stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    on_notify()  # anything committed while we were not listening
                    while not stop.is_set():
                        for notify in conn.notifies(timeout=timeout, stop_after=1):
                            if notify.payload != self._sender:
                                on_notify()
            except psycopg.OperationalError:
                # Polling keeps subscribers correct while LISTEN is down; wait, then reconnect.
                stop.wait(timeout)

    # -- errors ------------------------------------------------------------------------------

    @contextmanager
    def _translated(self, doing: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            translated = self._translation(e, doing)
            if translated is None:
                raise
            raise translated from e

    def _translation(self, error: Exception, doing: str) -> EventStoreError | None:
        """The store's error for a driver error while ``doing``; None to let ``error`` through."""
        if isinstance(error, EventStoreError):
            return None
        timed_out = timeout_error(error, doing=doing, where=self.url_for_humans)
        if timed_out is not None:
            return timed_out
        if isinstance(error, (sa.exc.DataError, psycopg.DataError)):
            # The database refused a value (a NUL in text, a number out of range): the append's
            # fault, not an outage, and nothing of it was written.
            return InvalidEvent(
                f"{self.url_for_humans} refused a value to {doing} it: {_first_line(error)}"
            )
        if isinstance(
            error,
            (
                sa.exc.OperationalError,
                sa.exc.InterfaceError,
                psycopg.OperationalError,
                psycopg.InterfaceError,
            ),
        ):
            retry = (
                "then retry with the same event ids (a retry of an append that did commit "
                "returns its original result)"
                if doing == "append to"
                else "then retry"
            )
            return StoreUnavailable(
                f"cannot {doing} {self.url_for_humans}: {_first_line(error)}; check that the "
                f"database is running and reachable, {retry}"
            )
        if isinstance(error, (sa.exc.DBAPIError, psycopg.Error)):
            return EventStoreError(f"database error on {self.url_for_humans}: {_first_line(error)}")
        return None


def _now() -> datetime:
    return datetime.now(UTC)


def _first_line(error: BaseException) -> str:
    cause = getattr(error, "orig", None) or error
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
