"""One leader among the controllers sharing a database, and fencing of deposed terms.

Two parts:

- a **lease** (:class:`Lease`): who may lead right now. On Postgres (:class:`PostgresLease`) it is
  a session advisory lock held on a dedicated connection. That connection has TCP keepalives (a
  lost network is a lost lease) and ``idle_session_timeout`` set to the lease time, renewed by a
  heartbeat: a holder that stops running — ``kill -STOP``, a stalled VM — stops the heartbeat, the
  server ends its session after the lease time and the lock passes on. (TCP keepalives alone
  would not notice: a stopped process's kernel still answers them.) On SQLite
  (:class:`FileLease`) it is an exclusive ``flock`` on a file beside the database.
  :class:`MemoryLease` is the in-memory fake for tests.
- **terms in the log** (:class:`Leadership`): the lease winner appends ``LeaderElected`` to the
  ``leadership-<scope>`` stream with the expected version, so terms go 1, 2, 3 … and each is
  recorded. The winner's duty appends carry its term; the store refuses appends of a term below
  the latest recorded one (:class:`~fleetledger.eventstore.Fenced`). A process learns it is
  deposed from its heartbeat (the lease is gone) or from a fenced append, whichever comes first,
  and then stops its reactors and drivers at once and goes back to following.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

import psycopg
import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.domain import leadership
from fleetledger.domain.leadership import ClaimLeadership, LeaderElected, LeadershipState
from fleetledger.eventstore import EventStore, EventStoreError, Fenced, WrongExpectedVersion
from fleetledger.eventstore._engine import libpq_conninfo, normalise_url

from .codec import EventCodec

__all__ = [
    "LEADERSHIP_CODEC",
    "FileLease",
    "Lease",
    "Leadership",
    "MemoryLease",
    "PostgresLease",
    "Role",
    "default_holder",
    "lease_for",
]

log = structlog.get_logger(__name__)

LEADERSHIP_CODEC: EventCodec[LeaderElected] = EventCodec(
    "leadership", (LeaderElected,), correlation_fields=("holder",)
)
LEADER_LOCK_KEY = 4_242_001
"""The advisory lock key of the leader lease (the migration lock is 4_242_000)."""

Role = Literal["leader", "follower"]


def default_holder() -> str:
    """``host:pid``: names this process in ``LeaderElected`` and in logs."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease(Protocol):
    """The right to lead, held by at most one process at a time."""

    def try_acquire(self) -> bool:
        """Take the lease if it is free (never blocks for long); whether it is now held."""
        ...

    def check(self) -> bool:
        """Renew the lease; ``False`` once it is lost (then it is no longer held)."""
        ...

    def release(self) -> None:
        """Give the lease up (idempotent)."""
        ...


class PostgresLease:
    """A session advisory lock on a dedicated connection; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        lease_seconds: float = 10.0,
        key: int = LEADER_LOCK_KEY,
        connect_timeout: int = 5,
    ) -> None:
        if lease_seconds < 1:
            raise ValueError(f"lease_seconds must be at least 1, got {lease_seconds}")
        self._conninfo = libpq_conninfo(url)
        self._lease_ms = int(lease_seconds * 1000)
        self._key = key
        self._connect_timeout = connect_timeout
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self._conn is not None:
                return True
            keepalive = max(1, self._lease_ms // 3000)
            try:
                conn = psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=self._connect_timeout,
                    application_name="fleetledger-leader-lease",
                    keepalives=1,
                    keepalives_idle=keepalive,
                    keepalives_interval=keepalive,
                    keepalives_count=3,
                )
            except psycopg.Error as e:
                log.warning("cannot reach the database for the leader lease", error=str(e))
                return False
            try:
                conn.execute(f"SET idle_session_timeout = {self._lease_ms}")
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
            except psycopg.Error as e:
                conn.close()
                log.warning("could not ask for the leader lease", error=str(e))
                return False
            if row is None or row[0] is not True:
                conn.close()
                return False
            self._conn = conn
            return True

    def check(self) -> bool:
        with self._lock:
            if self._conn is None:
                return False
            try:
                self._conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                self._close()
                return False

    def release(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            # A dead session has released its locks already.
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
            self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class FileLease:
    """An exclusive ``flock`` on ``path`` (SQLite: one machine, one database file)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self._fd is not None:
                return True
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._fd = fd
            return True

    def check(self) -> bool:
        with self._lock:
            return self._fd is not None

    def release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


class MemoryLease:
    """The in-memory fake: leases on one shared ``board`` (a dict), for tests and the simulator.
    :meth:`expire` plays a lost lease."""

    def __init__(self, board: dict[str, str], *, holder: str, name: str = "leader") -> None:
        self._board = board
        self._holder = holder
        self._name = name
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            current = self._board.setdefault(self._name, self._holder)
            return current == self._holder

    def check(self) -> bool:
        with self._lock:
            return self._board.get(self._name) == self._holder

    def release(self) -> None:
        with self._lock:
            if self._board.get(self._name) == self._holder:
                del self._board[self._name]

    def expire(self) -> None:
        """The lease lapses (as if the holder had stalled past the lease time)."""
        self.release()


def lease_for(url: str, *, lease_seconds: float = 10.0) -> Lease:
    """The lease that fits the database at ``url``: an advisory lock on Postgres, a lock file
    beside the database file on SQLite."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "postgresql":
        return PostgresLease(url, lease_seconds=lease_seconds)
    database = parsed.database
    if not database or database == ":memory:":
        raise ValueError(
            f"cannot elect a leader on {url!r}: an in-memory SQLite database has no file to lock; "
            "use a SQLite file or Postgres"
        )
    return FileLease(f"{database}.leader")


class Leadership:
    """Elects this process when its lease is won; the host's :class:`Fencing`.

    ``on_elected(term)`` runs when this process starts leading, ``on_deposed(reason)`` the moment
    it stops; both run in the thread that noticed and must return quickly.
    """

    def __init__(
        self,
        store: EventStore,
        lease: Lease,
        *,
        clock: Clock,
        holder: str | None = None,
        scope: str = "default",
        check_interval: float = 1.0,
    ) -> None:
        if check_interval <= 0:
            raise ValueError(f"check_interval must be > 0, got {check_interval}")
        self._store = store
        self._lease = lease
        self._clock = clock
        self.holder = holder or default_holder()
        self.stream_id = f"leadership-{scope}"
        self._check_interval = check_interval
        self._lock = threading.RLock()
        self._term: int | None = None
        self._elected: list[Callable[[int], None]] = []
        self._deposed: list[Callable[[str], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- fencing (the host's view) -------------------------------------------------------------

    def term(self) -> int | None:
        """The term this process leads in, or ``None`` while it follows."""
        with self._lock:
            return self._term

    def deposed(self, error: Fenced) -> None:
        """A duty append was fenced: a newer term leads; step down now."""
        self._step_down(f"append refused: {error}", term=error.term)

    # -- roles ---------------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return "leader" if self.term() is not None else "follower"

    def on_elected(self, callback: Callable[[int], None]) -> None:
        self._elected.append(callback)

    def on_deposed(self, callback: Callable[[str], None]) -> None:
        self._deposed.append(callback)

    def latest_term(self) -> int:
        """The latest term recorded in the log (by any process)."""
        return self._recorded()[0].term

    def step(self) -> Role:
        """One round: a leader renews its lease (stepping down if it is lost); a follower tries
        to take the lease and, having it, records the next term. Returns the role after it."""
        if self.term() is not None:
            if not self._lease.check():
                self._step_down("the lease was lost")
            return self.role
        if not self._lease.try_acquire():
            return "follower"
        try:
            term = self._record_election()
        except (EventStoreError, OSError) as e:
            log.warning("won the lease but could not record the election", error=str(e))
            self._lease.release()
            return "follower"
        with self._lock:
            self._term = term
        log.info("elected leader", holder=self.holder, term=term)
        for callback in self._elected:
            callback(term)
        return "leader"

    def _record_election(self) -> int:
        for _ in range(5):
            state, version = self._recorded()
            events = leadership.decide(state, ClaimLeadership(self.holder, self._clock.now()))
            term = events[0].term
            records = LEADERSHIP_CODEC.encode(
                self.stream_id,
                version + 1,
                events,
                causation_ids=[self.holder],
                actor=self.holder,
                leader_terms=[term],
            )
            try:
                self._store.append(self.stream_id, records, expected_version=version)
            except WrongExpectedVersion:
                continue  # a previous holder's election landed meanwhile: claim the next term
            return term
        raise WrongExpectedVersion(self.stream_id, str(version), version + 1)

    def _recorded(self) -> tuple[LeadershipState, int]:
        state = leadership.initial_state()
        version = 0
        for record in self._store.read_stream(self.stream_id):
            state = leadership.evolve(state, LEADERSHIP_CODEC.decode(record))
            version = record.stream_version
        return state, version

    def _step_down(self, reason: str, *, term: int | None = None) -> None:
        with self._lock:
            if self._term is None or (term is not None and term != self._term):
                return  # already following, or a stale report about an earlier term
            was, self._term = self._term, None
        log.warning("stepped down; following", holder=self.holder, term=was, reason=reason)
        for callback in self._deposed:
            callback(reason)
        self._lease.release()

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> Leadership:
        """Campaign and renew in a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop campaigning; a leader steps down and releases its lease."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._step_down("stopping")
        self._lease.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("leadership round failed; trying again")
            self._stop.wait(self._check_interval)
