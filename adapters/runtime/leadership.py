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

A leadership may be of one **shard** (:mod:`~fleetledger.adapters.runtime.shards`; docs/SCALING.md,
"Leadership per shard"): its lease is the shard's (:func:`lease_for` with ``shard``), its terms
go in ``leadership-<shard>``, and its election and duty appends name the shard beside the term,
so the store fences them against that shard's term alone. Shards are won and lost independently,
and a process may lead several, each with its own :class:`Leadership`.

Learning it from the heartbeat can take too long: a leader cut off from the database (or the
Kubernetes API) may not hear back from its renewal until well after the lease has passed to
another process, and meanwhile it could still call the cloud. So a leader given
``lease_seconds`` keeps a **local deadline** on the monotonic clock: the start of its last
successful renewal, plus the lease time, less a safety margin (a renewal still on its way then
is waited for: if it succeeds, the lease held from when it was sent). Past it the lease may be
another process's: the side-effect ports (:mod:`~fleetledger.adapters.runtime.self_fencing`)
refuse to act, the leader steps down (``role`` says ``stepping down`` until the lease is
released) and then campaigns again. Its duty appends go on carrying the term it led in
(:class:`DutyFencing`), so one still in flight is refused by the store once a newer term is
recorded, instead of landing with no term at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
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
from .shards import Shard, shard_lock_key, shard_name

__all__ = [
    "LEADERSHIP_CODEC",
    "DutyFencing",
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

Role = Literal["leader", "follower", "stepping down"]
"""``stepping down``: the lease may have passed (its local deadline did), side effects have
stopped, and the lease is being given up; then ``follower``."""


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


def lease_for(url: str, *, lease_seconds: float = 10.0, shard: Shard | str | None = None) -> Lease:
    """The lease that fits the database at ``url``: an advisory lock on Postgres, a lock file
    beside the database file on SQLite.

    With ``shard``, that shard's own lease: on Postgres the advisory lock keyed by its name
    (:func:`~fleetledger.adapters.runtime.shards.shard_lock_key`), on SQLite the file
    ``<database>.leader.<shard>`` with its ``/`` written ``+`` (a character no shard name has,
    so two shards never share a file)."""
    name = None if shard is None else shard_name(shard)
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "postgresql":
        if name is None:
            return PostgresLease(url, lease_seconds=lease_seconds)
        return PostgresLease(url, lease_seconds=lease_seconds, key=shard_lock_key(name))
    database = parsed.database
    if not database or database == ":memory:":
        raise ValueError(
            f"cannot elect a leader on {url!r}: an in-memory SQLite database has no file to lock; "
            "use a SQLite file or Postgres"
        )
    if name is None:
        return FileLease(f"{database}.leader")
    return FileLease(f"{database}.leader.{name.replace('/', '+')}")


class Leadership:
    """Elects this process when its lease is won; the host's :class:`Fencing`.

    ``on_elected(term)`` runs when this process starts leading, ``on_deposed(reason)`` the moment
    it stops; both run in the thread that noticed and must return quickly.

    ``shard``: lead that shard only (give it the shard's lease); its stream is
    ``leadership-<shard>`` instead of ``leadership-<scope>``.
    """

    def __init__(
        self,
        store: EventStore,
        lease: Lease,
        *,
        clock: Clock,
        holder: str | None = None,
        scope: str | None = None,
        shard: Shard | str | None = None,
        check_interval: float = 1.0,
        lease_seconds: float | None = None,
        safety_margin: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if check_interval <= 0:
            raise ValueError(f"check_interval must be > 0, got {check_interval}")
        self._acting_seconds = _acting_seconds(lease_seconds, safety_margin, check_interval)
        self._monotonic = monotonic
        self._renewed_at: float | None = None
        self._renewing_since: float | None = None
        self._stepping_down = False
        self._last_term: int | None = None
        self._store = store
        self._lease = lease
        self._clock = clock
        self.holder = holder or default_holder()
        if shard is not None and scope is not None:
            raise ValueError(
                f"give a scope or a shard, not both: shard {shard_name(shard)!r} names the "
                f"leadership (its stream is leadership-<shard>), scope {scope!r} would too"
            )
        self.shard: str | None = None if shard is None else shard_name(shard)
        """The shard this leadership leads, or ``None`` (it leads the whole scope)."""
        self.stream_id = f"leadership-{self.shard or scope or 'default'}"
        # A process leading several shards says which one each line is about.
        self._named: dict[str, object] = {} if self.shard is None else {"shard": self.shard}
        self._check_interval = check_interval
        self._lock = threading.RLock()
        self._renewal_answered = threading.Condition(self._lock)
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
        with self._lock:
            if self._stepping_down or (self._term is not None and self._out_of_time()):
                return "stepping down"
            return "leader" if self._term is not None else "follower"

    @property
    def last_term(self) -> int | None:
        """The term this process led in last (still, or before it stepped down)."""
        with self._lock:
            return self._last_term

    # -- self-fencing --------------------------------------------------------------------------

    def acting_deadline(self) -> float | None:
        """The monotonic time past which this leader must not act (its lease may be another
        process's by then); ``None`` without ``lease_seconds`` or while not leading."""
        with self._lock:
            if self._term is None or self._renewed_at is None or self._acting_seconds is None:
                return None
            return self._renewed_at + self._acting_seconds

    def may_act(self) -> int | None:
        """The term to act in, or ``None`` when this process must not act: it does not lead,
        or it leads past its acting deadline — then it steps down here and now."""
        with self._lock:
            while True:
                term = self._term
                if term is None:
                    return None
                if not self._deadline_passed():
                    return term
                if self._out_of_time():
                    break
                # A renewal is on its way: if it succeeds, the lease held from when it was
                # sent, so its answer decides — waited for no longer than that would allow.
                assert self._renewing_since is not None and self._acting_seconds is not None
                left = self._renewing_since + self._acting_seconds - self._monotonic()
                self._renewal_answered.wait(max(0.0, left))
            self._stepping_down = True
        self._step_down(
            "the lease was not renewed in time: it may have passed to another process",
            term=term,
            release=False,
        )
        return None

    def _deadline_passed(self) -> bool:
        if self._renewed_at is None or self._acting_seconds is None:
            return False
        return self._monotonic() >= self._renewed_at + self._acting_seconds

    def _out_of_time(self) -> bool:
        """Past the deadline, and no renewal on its way that could still extend it."""
        if not self._deadline_passed():
            return False
        since, acting = self._renewing_since, self._acting_seconds
        return since is None or acting is None or self._monotonic() >= since + acting

    def _renew(self) -> bool:
        """Renew the lease; on success the acting deadline counts from when it was asked."""
        with self._lock:
            asked = self._renewing_since = self._monotonic()
        renewed = False
        try:
            renewed = self._lease.check()
        finally:
            with self._lock:
                self._renewing_since = None
                if renewed and self._term is not None:
                    self._renewed_at = asked
                self._renewal_answered.notify_all()
        return renewed

    def on_elected(self, callback: Callable[[int], None]) -> None:
        self._elected.append(callback)

    def on_deposed(self, callback: Callable[[str], None]) -> None:
        self._deposed.append(callback)

    def latest_term(self) -> int:
        """The latest term recorded in the log (by any process)."""
        return self._recorded()[0].term

    def step(self) -> Role:
        """One round: a leader renews its lease (stepping down if it is lost); a follower tries
        to take the lease and, having it, records the next term. Returns the role after it.

        A renewal counts from when it was asked for, not answered: the lease holds from at
        least then, so the acting deadline is never later than the lease's true end."""
        with self._lock:
            stepping_down = self._stepping_down
        if stepping_down:
            # Past its acting deadline: give the lease up here, in this thread, where a release
            # that blocks on a dead connection blocks nobody else.
            self._lease.release()
            with self._lock:
                self._stepping_down = False
            return "follower"
        if self.term() is not None:
            if not self._renew():
                self._step_down("the lease was lost")
            return self.role
        if not self._lease.try_acquire():
            return "follower"
        try:
            term = self._record_election()
        except (EventStoreError, OSError) as e:
            log.warning(
                "won the lease but could not record the election", error=str(e), **self._named
            )
            self._lease.release()
            return "follower"
        # Renewed once more before leading: taking the lease (a new connection) and recording
        # the term may have taken a while, and the acting time counts from a renewal's start.
        asked = self._monotonic()
        if not self._lease.check():
            log.warning(
                "won the lease but lost it while recording the election", term=term, **self._named
            )
            self._lease.release()
            return "follower"
        with self._lock:
            self._term = term
            self._last_term = term
            self._renewed_at = asked
        log.info("elected leader", holder=self.holder, term=term, **self._named)
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
                leader_shard=self.shard,
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

    def _step_down(self, reason: str, *, term: int | None = None, release: bool = True) -> None:
        with self._lock:
            if self._term is None or (term is not None and term != self._term):
                return  # already following, or a stale report about an earlier term
            was, self._term = self._term, None
            self._renewed_at = None
        log.warning(
            "stepped down; following", holder=self.holder, term=was, reason=reason, **self._named
        )
        for callback in self._deposed:
            callback(reason)
        if release:
            self._lease.release()

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> Leadership:
        """Campaign and renew in a background thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        name = "leadership" if self.shard is None else f"leadership-{self.shard}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop campaigning; a leader steps down and releases its lease."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._step_down("stopping")
        self._lease.release()
        with self._lock:
            self._stepping_down = False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("leadership round failed; trying again", **self._named)
            self._stop.wait(self._check_interval)


def _acting_seconds(
    lease_seconds: float | None, safety_margin: float | None, check_interval: float
) -> float | None:
    """How long after a renewal was asked for a leader may act: the lease less the margin.

    The margin (a quarter of the lease by default) covers a call's way from the check to the
    provider and a follower whose clock runs faster than ours; renewals must come more often
    than the rest, or a healthy leader would fence itself between two of them."""
    if lease_seconds is None:
        if safety_margin is not None:
            raise ValueError("safety_margin needs lease_seconds: it is taken off the lease")
        return None
    if not lease_seconds > 0:
        raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}")
    margin = lease_seconds / 4 if safety_margin is None else safety_margin
    if not 0 < margin < lease_seconds:
        raise ValueError(
            f"safety_margin must be > 0 and below the lease ({lease_seconds} s), got {margin}"
        )
    acting = lease_seconds - margin
    if check_interval >= acting:
        raise ValueError(
            f"check_interval ({check_interval} s) must be shorter than the lease less its "
            f"safety margin ({acting} s), or a healthy leader would stop acting between renewals"
        )
    return acting


class DutyFencing:
    """The fencing of a runtime's duty appends: the term this process leads in, or after it
    stepped down the term it led in last.

    A duty that was already running when its process stepped down (a batch between its cloud
    call and recording the result) would otherwise append with no term at all, and the store
    fences only appends that carry one; with the old term it is refused once a newer term is
    recorded. A process that never led appends with none, as before."""

    __slots__ = ("_leadership",)

    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership

    @property
    def shard(self) -> str | None:
        """The shard the terms are of (duty appends name it), or ``None``: fenced log-wide."""
        return self._leadership.shard

    def term(self) -> int | None:
        term = self._leadership.term()
        return term if term is not None else self._leadership.last_term

    def deposed(self, error: Fenced) -> None:
        self._leadership.deposed(error)
