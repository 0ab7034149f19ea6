"""One aggregate instance's stream, hosted: fold it, decide on it, append to it.

:class:`HostedStream` keeps the folded state and the stream version in memory and is the only way
the runtime writes an aggregate's decisions. Every call of :meth:`HostedStream.execute` goes the
same way: read the time, ``decide`` on the cached state, append with ``expected_version`` = the
cached version; on ``WrongExpectedVersion`` catch up from the stream's tail and decide again
(bounded by :attr:`RetryPolicy.conflict_attempts`); on an unknown outcome re-send the very same
events (:func:`~fleetledger.adapters.runtime.appends.append_decision`).

**Commands that arrive while an append is in flight are decided together.** One caller at a time
leads: it takes every submission queued so far, decides them in arrival order on one running
state — each submission's commands atomically: a refusal drops that submission alone — and
appends all their events as one append. The others wait and get their own result or refusal.
Under load this turns N fold-decide-append round trips into one, the same batching the store's
group commit does one layer down.

**Streams nobody leads in person are led together.** Groups submitted without a blocked caller
(:meth:`HostedStream.submit` and :meth:`HostedStream.decide`, and whatever queues behind a
leader) are led by the store's batcher: one committer thread at a time takes every stream with
submissions waiting, decides each group on its own stream, commits them all in one transaction
(each keeps its own outcome) and answers each. A caller of ``execute`` finding its stream listed
for the next round takes it back and leads it itself, so an observer running on the batcher's
thread never waits for that thread.

A decision may also open or extend other streams in the same transaction: ``companions(events,
records, at)`` returns extra appends committed atomically with the stream's own (the grouper opens
each batch stream it seals this way, so a batch is never sealed without its stream).

Leader duties (ticks, reactor results) are submitted with ``duty=True`` and carry the current
leader term in their metadata (a shard leader's name the shard too); the store refuses them
once a newer term is elected, and the stream reports that to its :class:`Fencing` and fails them
with :class:`~fleetledger.adapters.runtime.errors.Deposed`, while other submissions of the same
group are decided again and appended without a term.

Observers registered with :meth:`HostedStream.on_events` see every event the stream folds — its
own and those learnt while catching up — after the append, outside any lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.domain.errors import Rejected
from fleetledger.eventstore import (
    NO_STREAM,
    AppendResult,
    DuplicateEventId,
    EventStore,
    EventStoreError,
    Fenced,
    InvalidEvent,
    NewEvent,
    RecordedEvent,
    StoreUnavailable,
    StreamAppend,
    WrongExpectedVersion,
)
from fleetledger.projections.recent import RecentEvents

from .aggregate import Aggregate
from .appends import RetryPolicy, append_decision
from .errors import CommandRefused, Deposed, LogContention

__all__ = [
    "Companions",
    "Decision",
    "Fencing",
    "Folded",
    "HostedStream",
    "NoFencing",
    "Opening",
    "Plan",
    "Writer",
    "execute_each",
    "fencing_shard",
    "opening_append",
]

log = structlog.get_logger(__name__)

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")

_PAGE = 1000

Plan = Callable[[datetime], Sequence[tuple[C, str]]]
"""The commands of one submission, given the decision time: ``[(command, causation_id), …]``."""

Companions = Callable[[Sequence[E], Sequence[NewEvent], datetime], Sequence[StreamAppend]]
"""Extra appends to commit atomically with a decision's ``events`` (encoded as ``records``)."""


class Fencing(Protocol):
    """Where the leader term of duty appends comes from, and who hears that it was refused.

    The fencing of one shard's leadership also has a ``shard`` attribute (its name, fixed):
    duty appends then carry it beside the term, and the store fences them against that shard's
    term alone (see :func:`fencing_shard`). It is optional so that every fencing without one
    stays a fencing, fenced log-wide as before.
    """

    def term(self) -> int | None:
        """The term this process leads in, or ``None`` when it does not lead (or is unfenced)."""
        ...

    def deposed(self, error: Fenced) -> None:
        """The store refused this process's term: a newer leader exists."""
        ...


def fencing_shard(fencing: Fencing) -> str | None:
    """The shard whose term ``fencing``'s terms are (its ``shard``), or ``None``: log-wide."""
    shard = getattr(fencing, "shard", None)
    if shard is not None and not isinstance(shard, str):
        raise TypeError(f"a fencing's shard is its name, a str; got {shard!r}")
    return shard


class NoFencing:
    """No leader election: duty appends carry no term (single process, tests, simulator)."""

    __slots__ = ()

    def term(self) -> int | None:
        return None

    def deposed(self, error: Fenced) -> None:  # pragma: no cover - no term, never fenced
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Writer:
    """Who writes: ``actor`` and fixed ``labels`` in every event's metadata, the fencing term;
    ``recent``, if given, is handed every event its streams commit, so this process's read
    models fold them without decoding them again."""

    actor: str = "fleetledger"
    labels: tuple[tuple[str, str], ...] = ()
    fencing: Fencing = field(default_factory=NoFencing)
    recent: RecentEvents | None = None


@dataclass(frozen=True, slots=True)
class Decision(Generic[E]):
    """What one submission appended: its events and their records (with ids), and the global
    position of the stream's last event in the append that carried them (``None`` if nothing
    was). Companion appends of the same transaction come after it in the log."""

    events: tuple[E, ...]
    records: tuple[NewEvent, ...]
    last_position: int | None


@dataclass(frozen=True, slots=True)
class Opening(StreamAppend):
    """The append that creates a stream (see :func:`opening_append`), with the domain events
    its records encode: once it commits, a stream of this process that hosts it starts from
    them instead of reading and decoding them back."""

    decided: tuple[object, ...] = ()


@dataclass(frozen=True, slots=True)
class Folded(Generic[E]):
    """An event the stream folded, with its stream version and id."""

    event: E
    version: int
    event_id: str


@dataclass(frozen=True, slots=True)
class _Tail(Generic[E]):
    """A page of a stream's events read from the log, decoded; ``full``: more may follow."""

    events: list[tuple[E, RecordedEvent]]
    full: bool


_Outcome = list[AppendResult] | EventStoreError | None
"""A shared commit's outcome for one group: its results, its error, or ``None`` (not sent)."""


@dataclass(frozen=True, slots=True)
class _Prepared(Generic[S, C, E]):
    """A group decided and encoded, ready to append."""

    group: list[_Submission[C, E]]
    decided: list[tuple[_Submission[C, E], list[E], list[str]]]
    events: list[E]
    records: list[NewEvent]
    appends: list[StreamAppend]
    state: S


# Groups whose submitters do not lead themselves (``submit``) are led on these threads, shared
# by every hosted stream: a thread per stream would mean thousands for a fleet's nodes.
_COMMITTERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="stream-committer")


class _StreamBatcher:
    """Leads the queued groups of every stream of one store, many streams per commit.

    Streams with submissions waiting are marked ready; one committer thread at a time drains
    them: it decides each ready stream's group on that stream, commits all of them in one
    :meth:`~fleetledger.eventstore.EventStore.append_each` (each group keeps its own outcome),
    concludes each, and goes round again while streams are ready. Under a burst spread over
    many streams (agents of a hundred nodes) that is one commit and two thread hops per round
    instead of a committer thread, a commit and a wake-up per stream: on a 2-core machine the
    hops, each waiting for the interpreter lock, cost more than the commits. A round of one
    stream appends it alone, exactly as a caller of ``execute`` would.
    """

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._ready: list[HostedStream[Any, Any, Any]] = []
        self._draining = False

    def ready(self, stream: HostedStream[Any, Any, Any]) -> None:
        """``stream`` has submissions queued and is led by this batcher from now on."""
        with self._lock:
            self._ready.append(stream)
            start = not self._draining
            self._draining = True
        # A caller of ``execute`` that found the stream marked for the batcher before it was
        # listed here may now take it back.
        stream._wake_waiters()
        if start:
            _COMMITTERS.submit(self._drain)

    def withdraw(self, stream: HostedStream[Any, Any, Any]) -> bool:
        """Take ``stream`` back if no round has taken it yet: its caller leads it instead."""
        with self._lock:
            if stream in self._ready:
                self._ready.remove(stream)
                return True
            return False

    def _drain(self) -> None:
        while True:
            with self._lock:
                streams, self._ready = self._ready, []
                if not streams:
                    self._draining = False
                    return
            try:
                _shared_round(self._store, streams)
            finally:
                # Once every stream of the round has passed its leadership on: an observer
                # that executes on one of them, or on any stream waiting for the next round,
                # takes that stream back and leads it itself (see HostedStream.execute).
                for stream in streams:
                    stream._announce()


def _shared_round(store: EventStore, streams: Sequence[HostedStream[Any, Any, Any]]) -> None:
    """Decide, commit and conclude the queued groups of ``streams`` (observers are told by
    the caller once every stream of the round has passed its leadership on)."""
    begun: list[tuple[HostedStream[Any, Any, Any], _Prepared[Any, Any, Any]]] = []
    for stream in streams:
        try:
            prepared = stream._begin_shared()
        except Exception as e:
            # Its submissions have their error and the stream was released; the rest go on.
            log.debug("a group could not be decided", stream=stream.stream_id, error=str(e))
            continue
        if prepared is not None:
            begun.append((stream, prepared))
    outcomes: list[_Outcome] = [None] * len(begun)
    if len(begun) > 1:
        try:
            outcomes = list(store.append_each([p.appends for _, p in begun]))
        except Exception as e:
            # Not a per-group outcome: each group is appended alone below instead.
            log.warning("a shared commit failed; appending its groups one by one", error=str(e))
    for (stream, prepared), outcome in zip(begun, outcomes, strict=True):
        try:
            stream._end_shared(prepared, outcome)
        except Exception as e:
            log.debug("a group failed", stream=stream.stream_id, error=str(e))


_BATCHERS: weakref.WeakKeyDictionary[EventStore, _StreamBatcher] = weakref.WeakKeyDictionary()
_BATCHERS_LOCK = threading.Lock()


def _batcher_for(store: EventStore) -> _StreamBatcher:
    with _BATCHERS_LOCK:
        batcher = _BATCHERS.get(store)
        if batcher is None:
            batcher = _BATCHERS[store] = _StreamBatcher(store)
        return batcher


_Reply = Callable[["Decision[Any] | None", "BaseException | None"], None]
"""Told a submission's decision or error once it has one (on the thread that decided it)."""


class _Submission(Generic[C, E]):
    __slots__ = ("done", "duty", "error", "plan", "reply", "result")

    def __init__(self, plan: Plan[C], duty: bool, reply: _Reply | None) -> None:
        self.plan = plan
        self.duty = duty
        self.reply = reply
        self.done = False
        self.result: Decision[E] | None = None
        self.error: BaseException | None = None

    def finish(self, result: Decision[E] | None = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True
        if self.reply is not None:
            self.reply(result, error)


def _future_reply(future: Future[Decision[Any]]) -> _Reply:
    def reply(result: Decision[Any] | None, error: BaseException | None) -> None:
        if future.set_running_or_notify_cancel():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

    return reply


def _loop_reply(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[Decision[Any]]) -> _Reply:
    def settle(result: Decision[Any] | None, error: BaseException | None) -> None:
        if waiter.cancelled():
            return
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)  # type: ignore[arg-type]

    def reply(result: Decision[Any] | None, error: BaseException | None) -> None:
        # A closed loop raises RuntimeError: nobody is left waiting for this answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    return reply


class HostedStream(Generic[S, C, E]):
    """The cached fold of one stream and the decide-append loop over it; thread-safe."""

    def __init__(
        self,
        store: EventStore,
        aggregate: Aggregate[S, C, E],
        stream_id: str,
        *,
        clock: Clock,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
        companions: Companions[E] | None = None,
    ) -> None:
        self.store = store
        self.aggregate = aggregate
        self.stream_id = stream_id
        self._clock = clock
        self._writer = writer or Writer()
        # Read once: a writer is frozen, and a fencing's shard is fixed.
        self._shard = fencing_shard(self._writer.fencing)
        self._retry = retry or RetryPolicy()
        self._companions = companions
        # _fold guards the folded state and version. The queue has a lock of its own, so callers
        # can join it while the leader appends (holding _fold): they make the next group.
        self._fold = threading.RLock()
        self._queue_changed = threading.Condition()
        self._state: S = aggregate.initial_state()
        self._version = 0
        self._last_event_id = ""
        self._loaded = False
        self._queue: list[_Submission[C, E]] = []
        self._leading = False
        # Led by the store's batcher, which may not have taken the stream into a round yet.
        self._batched = False
        self._unannounced: list[Folded[E]] = []
        self._observers: list[Callable[[Sequence[Folded[E]]], None]] = []
        self._fenced_by: Fenced | None = None

    # -- reading -----------------------------------------------------------------------------

    # Reads take no lock once the stream is loaded: state, version and id are immutable values
    # replaced whole by the leader, so a reader (the clock driver, a reactor) never waits for an
    # append in flight; it may see the state a moment before the version catches up with it.

    @property
    def state(self) -> S:
        """The folded state (loading the stream first if it never was)."""
        if not self._loaded:
            with self._fold:
                self._ensure_loaded()
        return self._state

    @property
    def version(self) -> int:
        return self._version

    @property
    def last_event_id(self) -> str:
        """Id of the stream's last folded event (``""`` for an empty stream)."""
        return self._last_event_id

    def queued(self) -> int:
        """How many submissions wait for the append in flight (they will be decided together)."""
        with self._queue_changed:
            return len(self._queue)

    def on_events(self, observer: Callable[[Sequence[Folded[E]]], None]) -> None:
        """Call ``observer(folded)`` after each batch of events the stream folds."""
        self._observers.append(observer)

    def load(self, *, announce_history: bool = False, through_version: int | None = None) -> None:
        """Fold the stream's new tail. A first load tells observers about the stream's history
        only with ``announce_history`` (a restart need not replay old news to them).

        ``through_version``: the version the caller needs folded (an event it read from the log).
        If the stream has it once the append in flight has concluded — this process wrote it —
        nothing is read."""
        tail = None
        if self._loaded and (through_version is None or self._version < through_version):
            # Read and decode the tail before taking the fold lock: a group being appended
            # holds that lock through its whole commit, and the read need not wait for it (nor
            # the commit for the read). Under the lock only what the fold still lacks is folded.
            tail = self._read_tail(self._version)
        with self._fold:
            if self._loaded:
                if through_version is None or self._version < through_version:
                    self._catch_up(tail)
            else:
                self._ensure_loaded(announce_history=announce_history)
            # Taken here, not under the lock again: a group may take it in between and hold
            # it through its commit.
            news = self._take_news()
        self._tell(*news)

    def start_from(self, state: S, *, version: int, last_event_id: str) -> bool:
        """Start a stream nobody has loaded yet from a fold of its first ``version`` events
        made elsewhere (a read model rebuilt in one pass over the log): what :meth:`load`
        would leave after reading those events, without reading them. The next load or append
        goes on from ``version``; should the log hold more, the first append conflicts and
        catches up. ``False`` (nothing changed) once the stream is loaded."""
        with self._fold:
            if self._loaded:
                return False
            self._state, self._version, self._last_event_id = state, version, last_event_id
            self._loaded = True
            return True

    def fold_committed(
        self, events: Sequence[E], *, first_version: int, event_ids: Sequence[str]
    ) -> bool:
        """Fold ``events``, which this process committed to the stream within another
        capability's transaction (from ``first_version`` on, with these ids), without reading
        them back — when the stream stands just before them. ``False`` (nothing folded)
        otherwise: not loaded yet, behind them (the next load reads what it lacks) or past
        them. Observers are told as a load tells them."""
        if len(event_ids) != len(events):
            raise ValueError(f"give one event id per event: {len(event_ids)} for {len(events)}")
        with self._fold:
            if not self._loaded or self._version != first_version - 1:
                return False
            for offset, (event, event_id) in enumerate(zip(events, event_ids, strict=True)):
                self._fold_event(event, first_version + offset, event_id)
            news = self._take_news()
        self._tell(*news)
        return True

    def next_deadline(self) -> datetime | None:
        """When the aggregate next needs a tick, or ``None``."""
        if self.aggregate.next_deadline is None:
            return None
        return self.aggregate.next_deadline(self.state)

    def _ensure_loaded(self, *, announce_history: bool = False) -> None:
        if self._loaded:
            return
        if not self._start_from_opening():
            self._restore_snapshot()
            self._catch_up()
        self._loaded = True
        if not announce_history:
            self._unannounced.clear()

    def _start_from_opening(self) -> bool:
        """Fold the events this process opened the stream with, if it did (and they are still
        kept): they are the whole stream as committed then, so nothing is read."""
        recent = self._writer.recent
        opening = None if recent is None else recent.take_opening(self.stream_id)
        if opening is None:
            return False
        for version, (event_id, event) in enumerate(opening, start=1):
            self._fold_event(event, version, event_id)  # type: ignore[arg-type]
        return True

    def _restore_snapshot(self) -> None:
        codec = self.aggregate.snapshots
        if codec is None:
            return
        snapshot = self.store.load_snapshot(self.stream_id)
        if snapshot is None or snapshot.schema_version != codec.schema_version:
            return
        self._state = codec.from_data(snapshot.state)
        self._version = snapshot.version
        # The event after the snapshot names the snapshot's last event as its cause only if we
        # know its id: read that one record back.
        [last] = self.store.read_stream(self.stream_id, from_version=snapshot.version, limit=1)
        self._last_event_id = str(last.event_id)

    def _catch_up(self, tail: _Tail[E] | None = None) -> None:
        """Fold every event the log has beyond the fold's version, starting from ``tail`` (a
        page read without the lock) when given."""
        while True:
            if tail is None:
                tail = self._read_tail(self._version)
            # The fold may have moved on since the page was read (an append of this process
            # concluded meanwhile): a stream's version n is one event for every reader, so the
            # page's events the fold already has are skipped, and the rest continue it.
            for event, record in tail.events:
                if record.stream_version > self._version:
                    self._fold_record(event, record)
            if not tail.full:
                return
            tail = None

    def _read_tail(self, after_version: int) -> _Tail[E]:
        """The decoded page of the stream's events after ``after_version`` (takes no lock)."""
        decode = self.aggregate.codec.decode
        records = self.store.read_stream(
            self.stream_id, from_version=after_version + 1, limit=_PAGE
        )
        return _Tail([(decode(record), record) for record in records], len(records) == _PAGE)

    def _fold_record(self, event: E, record: RecordedEvent) -> None:
        self._fold_event(event, record.stream_version, str(record.event_id))

    def _fold_event(self, event: E, version: int, event_id: str) -> None:
        self._state = self.aggregate.evolve(self._state, event)
        self._version = version
        self._last_event_id = event_id
        self._unannounced.append(Folded(event, version, event_id))

    # -- deciding ----------------------------------------------------------------------------

    def execute(self, plan: Plan[C], *, duty: bool = False) -> Decision[E]:
        """Decide ``plan(now)``'s commands on the current state and append what they decide.

        Raises :class:`CommandRefused` (nothing of this call appended), ``LogUnavailable``,
        :class:`LogContention`, or :class:`Deposed` for a duty whose term was fenced.
        """
        submission: _Submission[C, E] = _Submission(plan, duty, None)
        with self._queue_changed:
            self._queue.append(submission)
            while self._leading and not submission.done:
                if self._batched and _batcher_for(self.store).withdraw(self):
                    # Waiting for the batcher could mean waiting for this very thread (an
                    # observer it is running): lead the queue here instead.
                    self._batched = False
                    self._leading = False
                    break
                self._queue_changed.wait()
            leads = not submission.done
            if leads:
                self._leading = True
                group, self._queue = self._queue, []
        if leads:
            try:
                self._lead(group)
            finally:
                self._pass_on()
                # Observers hear of the group only once this caller no longer leads: one that
                # executes on this stream in turn (an inline reactor) would otherwise wait for
                # its own caller.
                self._announce()
        if submission.error is not None:
            raise submission.error
        assert submission.result is not None
        return submission.result

    def submit(self, plan: Plan[C], *, duty: bool = False) -> Future[Decision[E]]:
        """:meth:`execute` without blocking the caller: the future resolves with the decision or
        the error ``execute`` would raise; the group is decided on a committer thread."""
        future: Future[Decision[E]] = Future()
        self._enqueue(_Submission(plan, duty, _future_reply(future)))
        return future

    async def decide(self, plan: Plan[C], *, duty: bool = False) -> Decision[E]:
        """:meth:`execute` for a caller on an event loop, which must not wait for the log on
        its own thread: the group is decided on a committer thread, and the answer comes back
        with one call into the caller's loop (no future of another thread to chain)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Decision[E]] = loop.create_future()
        self._enqueue(_Submission(plan, duty, _loop_reply(loop, waiter)))
        return await waiter

    def _enqueue(self, submission: _Submission[C, E]) -> None:
        with self._queue_changed:
            self._queue.append(submission)
            if self._leading:
                return
            self._leading = True
            self._batched = True
        _batcher_for(self.store).ready(self)

    def _lead(self, group: list[_Submission[C, E]]) -> None:
        """Decide and append ``group`` as the leader (observers are told by the caller, once
        it has passed the leadership on)."""
        try:
            # The leader decides and appends holding the fold lock, so a concurrent load()
            # cannot fold the group's events a second time.
            with self._fold:
                self._load_for(group)
                self._run_group(group)
        finally:
            with self._queue_changed:
                self._queue_changed.notify_all()

    def _load_for(self, group: list[_Submission[C, E]]) -> None:
        """Load the stream before deciding ``group``; a failure is every submission's answer."""
        try:
            self._ensure_loaded()
        except BaseException as e:
            for submission in group:
                submission.finish(error=e)
            raise

    def _pass_on(self) -> None:
        """The leader is done with its group: submissions queued meanwhile are led by the
        store's batcher (blocked callers of ``execute`` among them are woken when theirs are
        done), or nobody leads."""
        with self._queue_changed:
            if not self._queue:
                self._leading = False
                self._queue_changed.notify_all()
                return
            self._batched = True
        _batcher_for(self.store).ready(self)

    def _wake_waiters(self) -> None:
        with self._queue_changed:
            self._queue_changed.notify_all()

    # -- leading in a shared commit ----------------------------------------------------------
    # The batcher leads the queued groups of many streams at once: each is decided on its own
    # stream (holding its fold lock), all are committed together, each concludes on its own.

    def _begin_shared(self) -> _Prepared[S, C, E] | None:
        """Take the queued group, hold the fold lock and decide it. ``None`` when there is
        nothing to append (every submission is answered and the stream passed on)."""
        with self._queue_changed:
            group, self._queue = self._queue, []
            self._batched = False
        self._fold.acquire()
        try:
            self._load_for(group)
            try:
                prepared = self._prepare(group)
            except Exception:
                # Whatever deciding or encoding raised (an event the store would refuse, a
                # companion failing), the group goes the way a lone leader's does: decided
                # again, offenders split out and refused, every submission answered.
                self._run_group([s for s in group if not s.done])
                prepared = None
        except BaseException:
            self._end_lead()
            raise
        if prepared is None:
            self._end_lead()
        return prepared

    def _end_shared(self, prepared: _Prepared[S, C, E], outcome: _Outcome) -> None:
        """Conclude a group begun with :meth:`_begin_shared` from its shared commit's
        ``outcome`` (``None``: append it alone now); release the stream."""
        try:
            self._run_group(prepared.group, first=lambda: self._conclude(prepared, outcome))
        finally:
            self._end_lead()

    def _end_lead(self) -> None:
        """Release the stream after a shared round (the batcher announces what it folded)."""
        self._fold.release()
        with self._queue_changed:
            self._queue_changed.notify_all()
        self._pass_on()

    def _run_group(
        self,
        group: list[_Submission[C, E]],
        first: Callable[[], list[_Submission[C, E]]] | None = None,
    ) -> None:
        try:
            self._settle(group, first)
        except InvalidEvent as e:
            undecided = [submission for submission in group if not submission.done]
            if len(undecided) > 1:
                # One caller's events cannot be stored (too large, a value the database
                # refuses): decide each alone, so only the offender is refused and the stream
                # keeps going.
                log.warning(
                    "a group's events could not be stored; deciding its callers one by one",
                    stream=self.stream_id,
                    callers=len(undecided),
                    error=str(e),
                )
                for submission in undecided:
                    self._run_group([submission])
                return
            for submission in undecided:
                submission.finish(error=e)
        except BaseException as e:
            for submission in group:
                if not submission.done:
                    submission.finish(error=e)
            raise

    def _settle(
        self,
        group: list[_Submission[C, E]],
        first: Callable[[], list[_Submission[C, E]]] | None = None,
    ) -> None:
        pending = group
        for attempt in range(self._retry.conflict_attempts):
            pending = first() if first is not None and attempt == 0 else self._attempt(pending)
            if not pending:
                return
        error = LogContention(
            f"{self.stream_id} kept changing under this process through "
            f"{self._retry.conflict_attempts} attempts; is another controller writing to it? "
            "Run one leader per database"
        )
        for submission in pending:
            submission.finish(error=error)

    def _attempt(self, group: list[_Submission[C, E]]) -> list[_Submission[C, E]]:
        """Decide and append ``group`` once; the submissions still to retry (after a conflict
        or a fenced duty), with the others finished."""
        prepared = self._prepare(group)
        return [] if prepared is None else self._conclude(prepared, None)

    def _prepare(self, group: list[_Submission[C, E]]) -> _Prepared[S, C, E] | None:
        """Decide ``group`` on the current state: what to append, or ``None`` when nothing is
        (every submission refused or deciding nothing, and answered)."""
        at = self._clock.now()
        term = self._writer.fencing.term()
        state = self._state
        decided: list[tuple[_Submission[C, E], list[E], list[str]]] = []
        for submission in group:
            try:
                events, causes, state = self._decide(state, submission.plan(at))
            except Exception as e:
                submission.finish(error=e)
                continue
            decided.append((submission, events, causes))
        events = [event for _, group_events, _ in decided for event in group_events]
        if not events:
            for submission, _, _ in decided:
                submission.finish(Decision((), (), None))
            return None
        causes = [cause for _, _, group_causes in decided for cause in group_causes]
        terms = [
            term if submission.duty else None
            for submission, group_events, _ in decided
            for _ in group_events
        ]
        records = self.aggregate.codec.encode(
            self.stream_id,
            self._version + 1,
            events,
            causation_ids=causes,
            actor=self._writer.actor,
            labels=dict(self._writer.labels),
            leader_terms=terms,
            leader_shard=self._shard,
        )
        appends = [StreamAppend(self.stream_id, records, expected_version=self._version)]
        if self._companions is not None:
            appends.extend(self._companions(events, records, at))
        return _Prepared(group, decided, events, records, appends, state)

    def _conclude(self, prepared: _Prepared[S, C, E], outcome: _Outcome) -> list[_Submission[C, E]]:
        """Append what :meth:`_prepare` decided — or take the ``outcome`` of a shared commit
        that carried it — and answer its submissions; the ones to retry."""
        decided, events, records, state = (
            prepared.decided,
            prepared.events,
            prepared.records,
            prepared.state,
        )
        try:
            if outcome is None or isinstance(outcome, StoreUnavailable):
                # Alone, or the shared commit's outcome is unknown: (re-)send the same records.
                results = append_decision(
                    self.store, prepared.appends, clock=self._clock, policy=self._retry
                )
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results = outcome
        except WrongExpectedVersion as e:
            log.info(
                "stream moved; catching up and deciding again",
                stream=e.stream_id,
                expected=str(e.expected),
                actual=e.actual,
            )
            self._catch_up()
            return [submission for submission, _, _ in decided]
        except DuplicateEventId:
            # Event ids derive from what was decided, so a writer that decided on a stale stream
            # (a leader elected before its follower caught up) repeats the ids another writer
            # already stored there: the stream moved, like a version conflict. Caught up, it
            # decides again; had the stream not moved, the id truly is another's and that stands.
            before = self._version
            self._catch_up()
            if self._version == before:
                raise
            log.info("stream moved under a decision already stored; deciding again",
                     stream=self.stream_id, version=self._version)  # fmt: skip
            return [submission for submission, _, _ in decided]
        except Fenced as e:
            return self._fenced(e, [submission for submission, _, _ in decided])
        # The stream's own events, not its companions': a read model filtered to this
        # aggregate's event types may not reach a companion's position until something else
        # moves it, so a caller waiting to read its own writes would wait on the wrong event.
        last_position = results[0].last_position
        # ``state`` already folds every event decided and appended.
        self._state = state
        folded = [
            Folded(event, self._version + 1 + offset, str(record.event_id))
            for offset, (event, record) in enumerate(zip(events, records, strict=True))
        ]
        self._unannounced.extend(folded)
        self._last_event_id = folded[-1].event_id
        self._version += len(events)
        recent = self._writer.recent
        if recent is not None:
            # Before any caller hears back: one that then reads a model finds them there.
            recent.remember((f.event_id, f.event) for f in folded)
            for append in prepared.appends[1:]:
                if isinstance(append, Opening):
                    ids = [str(record.event_id) for record in append.events]
                    recent.opened(append.stream_id, list(zip(ids, append.decided, strict=True)))
        start = 0
        for submission, group_events, _ in decided:
            own = slice(start, start + len(group_events))
            start += len(group_events)
            submission.finish(Decision(tuple(events[own]), tuple(records[own]), last_position))
        self._maybe_snapshot(len(events))
        return []

    def _decide(self, state: S, commands: Sequence[tuple[C, str]]) -> tuple[list[E], list[str], S]:
        events: list[E] = []
        causes: list[str] = []
        for index, (command, cause) in enumerate(commands):
            try:
                new = self.aggregate.decide(state, command)
            except Rejected as e:
                raise CommandRefused(index, e) from e
            state = self.aggregate.fold(state, new)
            events.extend(new)
            causes.extend([cause] * len(new))
        return events, causes, state

    def _fenced(self, error: Fenced, group: list[_Submission[C, E]]) -> list[_Submission[C, E]]:
        # The fencing hears of it once the lock is released (_announce): stepping down stops
        # threads that may be waiting for this very lock.
        self._fenced_by = error
        deposed = Deposed(
            f"{self.stream_id}: {error}", term=error.term, current_term=error.current_term
        )
        retry = []
        for submission in group:
            if submission.duty:
                submission.finish(error=deposed)
            else:
                retry.append(submission)
        return retry

    def _maybe_snapshot(self, appended: int) -> None:
        codec = self.aggregate.snapshots
        if codec is None:
            return
        version, state = self._version, self._state
        if version // codec.every == (version - appended) // codec.every:
            return
        try:
            self.store.save_snapshot(
                self.stream_id,
                version=version,
                state=codec.to_data(state),
                schema_version=codec.schema_version,
            )
        except Exception as e:
            # A snapshot only shortens the next load; failing to save one loses nothing.
            log.warning("could not save a snapshot", stream=self.stream_id, error=str(e))

    def _announce(self) -> None:
        with self._fold:
            news = self._take_news()
        self._tell(*news)

    def _take_news(self) -> tuple[Fenced | None, list[Folded[E]]]:
        """What to tell the fencing and the observers (hold the fold lock)."""
        fenced, self._fenced_by = self._fenced_by, None
        folded, self._unannounced = self._unannounced, []
        return fenced, folded

    def _tell(self, fenced: Fenced | None, folded: list[Folded[E]]) -> None:
        if fenced is not None:
            self._writer.fencing.deposed(fenced)
        if folded:
            for observer in self._observers:
                observer(folded)


_EACH_ROUND = 500
"""Streams per shared commit in :func:`execute_each`: a transaction of a few thousand events,
short enough that readers waiting on a stream's fold lock are not held up for long."""


def execute_each(
    items: Sequence[tuple[HostedStream[Any, Any, Any], Plan[Any]]], *, duty: bool = False
) -> list[Decision[Any] | BaseException]:
    """Execute each ``(stream, plan)`` as its own :meth:`HostedStream.execute` would, many
    streams per commit, led on the caller's thread.

    For a duty that visits many streams in one pass (a cluster sync over a fleet's nodes, a
    take-over, a subnet's allocator answers): one commit per round of streams instead of one
    per stream. Each item keeps its own fate — its decision or the error ``execute`` would
    raise, in the order given; a refused or conflicting item does not touch the others.
    Observers are told before this returns, as ``execute`` tells them. A stream another caller
    leads at the moment is executed alone after the round (it waits for that caller).
    """
    answers: list[Decision[Any] | BaseException | None] = [None] * len(items)
    for start in range(0, len(items), _EACH_ROUND):
        chunk = list(enumerate(items[start : start + _EACH_ROUND], start=start))
        for place, answer in _execute_round(chunk, duty=duty):
            answers[place] = answer
    assert all(answer is not None for answer in answers)
    return answers  # type: ignore[return-value]


def _execute_round(
    chunk: Sequence[tuple[int, tuple[HostedStream[Any, Any, Any], Plan[Any]]]], *, duty: bool
) -> list[tuple[int, Decision[Any] | BaseException]]:
    led: dict[int, HostedStream[Any, Any, Any]] = {}
    mine: list[tuple[int, _Submission[Any, Any]]] = []
    alone: list[tuple[int, HostedStream[Any, Any, Any], Plan[Any]]] = []
    for place, (stream, plan) in chunk:
        with stream._queue_changed:
            if id(stream) not in led:
                if stream._leading:
                    alone.append((place, stream, plan))
                    continue
                stream._leading = True
                led[id(stream)] = stream
            submission: _Submission[Any, Any] = _Submission(plan, duty, None)
            stream._queue.append(submission)
        mine.append((place, submission))
    streams = list(led.values())
    try:
        if streams:
            _shared_round(streams[0].store, streams)
    finally:
        for stream in streams:
            stream._announce()
    answers: list[tuple[int, Decision[Any] | BaseException]] = []
    for place, submission in mine:
        if submission.error is not None:
            answers.append((place, submission.error))
        else:
            assert submission.result is not None
            answers.append((place, submission.result))
    for place, stream, plan in alone:
        try:
            answers.append((place, stream.execute(plan, duty=duty)))
        except Exception as e:
            answers.append((place, e))
    return answers


def opening_append(
    aggregate: Aggregate[S, C, E],
    key: str,
    command: C,
    *,
    causation_id: str,
    writer: Writer,
) -> Opening:
    """The append that opens ``aggregate``'s stream for ``key`` with what ``command`` decides on
    the initial state (expected version: the stream must not exist yet). A decision that starts
    another aggregate returns this from its companions, so both land in one transaction."""
    events = aggregate.decide(aggregate.initial_state(), command)
    stream_id = aggregate.stream_of(key)
    records = aggregate.codec.encode(
        stream_id,
        1,
        events,
        causation_ids=[causation_id] * len(events),
        actor=writer.actor,
        labels=dict(writer.labels),
    )
    return Opening(stream_id, records, expected_version=NO_STREAM, decided=tuple(events))
