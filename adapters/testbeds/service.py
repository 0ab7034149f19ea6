"""The testbeds' application service: testbed, job and scheduling streams, hosted.

One :class:`~fleetledger.adapters.runtime.HostedStream` per stream, created on first use and kept;
the catalog (which testbeds, jobs and schedulings exist) is folded from the log, so a restarted
process finds every stream it must look after. Single-stream commands go through the host
(:meth:`TestbedsService.execute`); decisions spanning several streams (claims, submissions,
releases) through :meth:`TestbedsService.decide_together`, which appends to every stream at the
version its state was read at and decides again when any of them moved.

Users' commands (:meth:`TestbedsService.define_testbed` and the rest) answer with a
:class:`Written`: the log position of the resource's latest event and whether the call appended
it. The reads an API needs come with positions too: :meth:`TestbedsService.listed` pages the
catalog in the order the resources were created in the log, :meth:`TestbedsService.position_of`
gives where a resource was created and last changed, and :meth:`TestbedsService.check_claimable`
tells a caller at once that another scheduling holds a job (the scheduling itself would wait for
it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias, TypeVar

import structlog

from fleetledger.adapters import runtime
from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import (
    Aggregate,
    CommandRefused,
    Decision,
    HostedStream,
    RetryPolicy,
    Writer,
    append_decision,
)
from fleetledger.domain.codec import registered_event_types
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds import (
    JobCommand,
    JobEvent,
    JobState,
    Mode,
    SchedulingCommand,
    SchedulingEvent,
    SchedulingState,
    SlotItem,
    TestbedCommand,
    TestbedEvent,
    TestbedState,
    batch_job,
    scheduling,
    testbed,
)
from fleetledger.eventstore import (
    EventStore,
    EventStoreError,
    Fenced,
    RecordedEvent,
    StreamAppend,
    WrongExpectedVersion,
)

from .aggregates import BATCH_JOB, SCHEDULING, TESTBED
from .errors import (
    CommandRejected,
    Conflict,
    InvalidTestbedCommand,
    LogContention,
    LogUnavailable,
    NotFound,
    NotLeading,
)

__all__ = ["Kind", "Part", "Reads", "TestbedsService", "Written"]

log = structlog.get_logger(__name__)

_CATALOG_PAGE = 1000

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")

TestbedStream = HostedStream[TestbedState, TestbedCommand, TestbedEvent]
JobStream = HostedStream[JobState, JobCommand, JobEvent]
SchedulingStream = HostedStream[SchedulingState, SchedulingCommand, SchedulingEvent]

Kind: TypeAlias = Literal["testbed", "job", "scheduling"]

_PREFIXES: tuple[tuple[str, Kind], ...] = (
    (TESTBED.stream_of(""), "testbed"),
    (BATCH_JOB.stream_of(""), "job"),
    (SCHEDULING.stream_of(""), "scheduling"),
)


@dataclass(frozen=True, slots=True)
class Written:
    """Where a user's command left its resource: the global log position of the resource's
    latest event, and whether this call appended it (``False``: a repeat that changed nothing)."""

    position: int
    appended: bool


class _Entry:
    """What the catalog knows of one stream."""

    __slots__ = ("created", "deleted", "kind", "latest", "name", "version")

    def __init__(self, kind: Kind, name: str, created: int) -> None:
        self.kind = kind
        self.name = name
        self.created = created
        self.latest = created
        self.version = 0
        self.deleted = False


@dataclass(frozen=True, slots=True)
class Part:
    """One stream's share of a multi-stream decision."""

    stream: HostedStream[Any, Any, Any]
    events: tuple[object, ...]


class Reads:
    """Reads states for a multi-stream decision, remembering each stream's version *before* its
    state: a state newer than its remembered version only makes the append conflict (and the
    decision is taken again), never lands a decision on a stale state."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def __call__(self, stream: HostedStream[S, Any, Any]) -> S:
        if stream.stream_id not in self.versions:
            stream.state  # noqa: B018 - loads the stream, so the version below is meaningful
            self.versions[stream.stream_id] = stream.version
        return stream.state


class TestbedsService:
    """Hosts every testbed, job and scheduling stream of one store; thread-safe."""

    __test__ = False  # its name starts with Test; pytest must not collect it

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Clock,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.writer = writer or Writer(labels=(("capability", "testbeds"),))
        self.retry = retry or RetryPolicy()
        self._lock = threading.Lock()
        self._streams: dict[str, HostedStream[Any, Any, Any]] = {}
        self._names: dict[str, set[str]] = {"testbed": set(), "job": set(), "scheduling": set()}
        # Per stream: where it was created and last changed in the log, its version, whether
        # it was deleted — what reads need without reading every stream.
        self._entries: dict[str, _Entry] = {}
        # Catch-ups run one at a time (the runtime's passes and the API's reads both call it):
        # interleaved, one could move the position back and read a page twice.
        self._catalog_lock = threading.Lock()
        self._position = 0
        self._catalog_types = (
            *TESTBED.codec.type_names(),
            *BATCH_JOB.codec.type_names(),
            *SCHEDULING.codec.type_names(),
        )
        self._defined_types = _stored_names(testbed.TestbedDefined, batch_job.JobDefined)
        self._deleted_types = _stored_names(testbed.TestbedDeleted, batch_job.JobDeleted)
        self._extended_types = _stored_names(scheduling.QueueExtended)

    @property
    def event_types(self) -> tuple[str, ...]:
        """The stored names of every testbed, job and scheduling event."""
        return self._catalog_types

    # -- streams ---------------------------------------------------------------------------------

    def testbed(self, name: str) -> TestbedStream:
        return self._hosted(TESTBED, name)

    def job(self, name: str) -> JobStream:
        return self._hosted(BATCH_JOB, name)

    def scheduling(self, name: str) -> SchedulingStream:
        return self._hosted(SCHEDULING, name)

    def _hosted(self, aggregate: Aggregate[S, C, E], key: str) -> HostedStream[S, C, E]:
        stream_id = aggregate.stream_of(key)
        with self._lock:
            hosted = self._streams.get(stream_id)
            if hosted is None:
                hosted = HostedStream(
                    self.store,
                    aggregate,
                    stream_id,
                    clock=self.clock,
                    writer=self.writer,
                    retry=self.retry,
                )
                self._streams[stream_id] = hosted
        return hosted

    # -- the catalog -----------------------------------------------------------------------------

    def catch_up(self) -> int:
        """Learn of testbeds, jobs and schedulings defined since the last call (by anyone)."""
        read = 0
        with self._catalog_lock:
            while True:
                try:
                    page = self.store.read_types(
                        after=self._position, types=self._catalog_types, limit=_CATALOG_PAGE
                    )
                except EventStoreError as e:
                    raise LogUnavailable(f"could not read the log's new events: {e}") from e
                for record in page.events:
                    self._position = record.global_position
                    self._catalogue(record)
                # Past the other capabilities' events too: a catalog that rarely changes would
                # otherwise have the next call read everything appended since its last change.
                self._position = page.through
                read += len(page.events)
                if len(page.events) < _CATALOG_PAGE:
                    return read

    def _catalogue(self, record: RecordedEvent) -> None:
        known = _kind_of(record.stream_id)
        if known is None:
            return
        kind, name = known
        position = record.global_position
        with self._lock:
            self._names[kind].add(name)
            entry = self._entries.get(record.stream_id)
            if entry is None:
                entry = self._entries[record.stream_id] = _Entry(kind, name, position)
            elif entry.deleted and record.type in self._defined_types:
                # Defined again after its deletion: a new resource under the old name, listed
                # where it was created this time.
                entry.created, entry.deleted = position, False
            entry.latest, entry.version = position, record.stream_version
            if record.type in self._deleted_types:
                entry.deleted = True

    def testbeds(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["testbed"]))

    def jobs(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["job"]))

    def schedulings(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["scheduling"]))

    # -- reads with positions --------------------------------------------------------------------

    def listed(
        self, kind: Kind, *, after: int = 0, limit: int = 100
    ) -> tuple[list[str], int | None]:
        """One page of the resources of ``kind`` that exist now, in the order of the log
        position where each was created: at most ``limit`` names created after position
        ``after``, and the position to ask for the next page from (``None``: no more now).

        A resource keeps its place while it changes, so a client that pages on from the
        returned position neither misses a resource nor sees one twice; one created meanwhile
        comes on a later page. Deleted testbeds and jobs are left out; one defined again after
        its deletion is listed where it was defined again.
        """
        if type(after) is not int or after < 0:
            raise InvalidTestbedCommand(f"after must be a log position (>= 0), got {after!r}")
        if type(limit) is not int or limit < 1:
            raise InvalidTestbedCommand(f"limit must be a positive integer, got {limit!r}")
        self.catch_up()
        with self._lock:
            entries = sorted(
                (e.created, e.name)
                for e in self._entries.values()
                if e.kind == kind and e.created > after and not e.deleted
            )
        if len(entries) > limit:
            return [name for _, name in entries[:limit]], entries[limit - 1][0]
        return [name for _, name in entries], None

    def last_position(self, stream: HostedStream[Any, Any, Any]) -> int:
        """The global log position of the stream's latest event, read from the log now (0 for
        an empty stream)."""
        try:
            last = self.store.read_stream(stream.stream_id, backwards=True, limit=1)
        except EventStoreError as e:
            raise LogUnavailable(f"could not read {stream.stream_id}: {e}") from e
        return last[0].global_position if last else 0

    def position_of(self, kind: Kind, name: str) -> tuple[int, int]:
        """The global log positions of the resource's first and latest events, as the catalog
        last read them (``(0, 0)`` for a resource it has not seen)."""
        with self._lock:
            entry = self._entries.get(_stream_of(kind, name))
            return (0, 0) if entry is None else (entry.created, entry.latest)

    def existing_testbed(self, name: str, *, catch_up: bool = True) -> TestbedStream:
        """The testbed's stream, up to date with the log; :class:`NotFound` if it is not
        defined or was deleted."""
        return self._existing("testbed", name, self.testbed, catch_up=catch_up)

    def existing_job(self, name: str, *, catch_up: bool = True) -> JobStream:
        """The job's stream, up to date with the log; :class:`NotFound` if it is not defined or
        was deleted."""
        return self._existing("job", name, self.job, catch_up=catch_up)

    def existing_scheduling(self, name: str, *, catch_up: bool = True) -> SchedulingStream:
        """The scheduling's stream, up to date with the log; :class:`NotFound` if it was never
        created."""
        return self._existing("scheduling", name, self.scheduling, catch_up=catch_up)

    def _existing(
        self,
        kind: Kind,
        name: str,
        host: Callable[[str], HostedStream[S, C, E]],
        *,
        deleted: bool = False,
        catch_up: bool = True,
    ) -> HostedStream[S, C, E]:
        # The catalog first: a name nobody defined is refused without hosting a stream for it,
        # so looking up arbitrary names does not grow the process.
        if catch_up:
            self.catch_up()
        with self._lock:
            entry = self._entries.get(_stream_of(kind, name))
            version = None if entry is None else entry.version
            gone = entry is not None and entry.deleted
        if version is None or (gone and not deleted):
            raise NotFound(kind, name, _missing(kind, name, gone))
        stream = host(name)
        # Other processes append too (the leader's passes, the extender's reservations): fold
        # what the catalog has seen; nothing is read if the stream has it already.
        try:
            stream.load(through_version=version)
        except EventStoreError as e:
            raise LogUnavailable(f"could not read {stream.stream_id}: {e}") from e
        return stream

    def check_claimable(self, scheduling_name: str, job: str) -> None:
        """Refuse at once what a scheduling would only wait for: :class:`NotFound` if the job
        does not exist, :class:`Conflict` if a scheduling other than ``scheduling_name`` holds
        it."""
        holder = self.existing_job(job).state.holder
        if holder is not None and holder != scheduling_name:
            raise Conflict(
                f"job {job} is held by scheduling {holder}; release that scheduling (delete it) "
                "or wait until it finishes",
                holder=holder,
            )

    # -- commands users send ---------------------------------------------------------------------

    def define_testbed(
        self, name: str, *, node_label: str, slots_per_node: int, cpu_millis: int, memory_mib: int
    ) -> Written:
        """Create or resize a testbed."""
        stream = self.testbed(name)
        decision = self.execute(
            stream,
            lambda at: testbed.DefineTestbed(
                name, node_label, slots_per_node, cpu_millis, memory_mib, at=at
            ),
            cause=f"define-testbed:{name}",
        )
        self._known("testbed", name)
        return self._written(stream, decision)

    def delete_testbed(self, name: str) -> Written:
        """Delete a testbed no scheduling holds (:class:`Conflict` naming the holder otherwise);
        the reconciler then removes its ghost pods. A repeat appends nothing."""
        stream = self._existing("testbed", name, self.testbed, deleted=True)
        return self._delete(
            stream, lambda at: testbed.DeleteTestbed(name, at=at), f"testbed:{name}"
        )

    def define_job(
        self,
        name: str,
        *,
        kind: batch_job.AppKind,
        image: str,
        main_file: str,
        arguments: tuple[str, ...] = (),
    ) -> Written:
        """Submit a batch job (ready until a scheduling claims it)."""
        stream = self.job(name)
        decision = self.execute(
            stream,
            lambda at: batch_job.DefineJob(name, kind, image, main_file, arguments, at=at),
            cause=f"define-job:{name}",
        )
        self._known("job", name)
        return self._written(stream, decision)

    def delete_job(self, name: str) -> Written:
        """Delete a job no scheduling holds (:class:`Conflict` naming the holder otherwise).
        A repeat appends nothing."""
        stream = self._existing("job", name, self.job, deleted=True)
        return self._delete(stream, lambda at: batch_job.DeleteJob(name, at=at), f"job:{name}")

    def _delete(
        self, stream: HostedStream[Any, C, Any], command: Callable[[datetime], C], what: str
    ) -> Written:
        try:
            decision = self.execute(stream, command, cause=f"delete-{what}")
        except CommandRejected as e:
            holder = stream.state.holder
            if holder is None:
                raise
            raise Conflict(e.reason, holder=holder) from e
        return self._written(stream, decision)

    def create_scheduling(
        self,
        name: str,
        *,
        testbed: str,
        mode: Mode = "queue",
        queue: tuple[str, ...] = (),
        items: tuple[SlotItem, ...] = (),
    ) -> Written:
        """Create a scheduling; the runtime then claims its jobs and testbed."""
        stream = self.scheduling(name)
        decision = self.execute(
            stream,
            lambda at: scheduling.CreateScheduling(name, testbed, mode, queue, items, at=at),
            cause=f"create-scheduling:{name}",
        )
        self._known("scheduling", name)
        return self._written(stream, decision)

    def extend_scheduling(
        self,
        name: str,
        *,
        queue: tuple[str, ...] = (),
        items: tuple[SlotItem, ...] = (),
    ) -> Written:
        """Online extension: add jobs to a scheduling that has not finished. The very same
        extension again (a client's retry) appends nothing; the scheduling takes a job once."""
        stream = self.scheduling(name)
        if (queue or items) and self._extended_with(stream, queue, items):
            return Written(self.last_position(stream), appended=False)
        decision = self.execute(
            stream,
            lambda at: scheduling.ExtendQueue(queue, items, at=at),
            cause=f"extend-scheduling:{name}",
        )
        return self._written(stream, decision)

    def _extended_with(
        self, stream: SchedulingStream, queue: tuple[str, ...], items: tuple[SlotItem, ...]
    ) -> bool:
        try:
            records = self.store.read_stream(stream.stream_id)
        except EventStoreError as e:
            raise LogUnavailable(f"could not read {stream.stream_id}: {e}") from e
        for record in records:
            if record.type not in self._extended_types:
                continue
            event = SCHEDULING.codec.decode(record)
            if isinstance(event, scheduling.QueueExtended) and (event.queue, event.items) == (
                queue,
                items,
            ):
                return True
        return False

    def _known(self, kind: str, name: str) -> None:
        with self._lock:
            self._names[kind].add(name)

    def _written(self, stream: HostedStream[Any, Any, Any], decision: Decision[Any]) -> Written:
        if decision.last_position is not None:
            return Written(decision.last_position, appended=True)
        return Written(self.last_position(stream), appended=False)

    # -- deciding --------------------------------------------------------------------------------

    def execute(
        self,
        stream: HostedStream[S, C, E],
        command: Callable[[datetime], C],
        *,
        cause: str,
        duty: bool = False,
    ) -> Decision[E]:
        """Decide ``command(at)`` on ``stream`` through the host, errors translated."""
        try:
            return stream.execute(lambda at: [(command(at), cause)], duty=duty)
        except CommandRefused as e:
            if isinstance(e.error, InvalidCommand):
                raise InvalidTestbedCommand(e.error.reason) from e
            raise CommandRejected(e.error.reason) from e
        except InvalidCommand as e:
            raise InvalidTestbedCommand(e.reason) from e
        except runtime.LogUnavailable as e:
            raise LogUnavailable(str(e)) from e
        except runtime.LogContention as e:
            raise LogContention(str(e)) from e
        except runtime.Deposed as e:
            raise NotLeading(str(e)) from e

    def decide_together(
        self,
        plan: Callable[[datetime, Reads], Sequence[Part]],
        *,
        cause: str,
        duty: bool = True,
    ) -> tuple[Part, ...]:
        """Append ``plan``'s events to all their streams in one transaction, each at the version
        its state was read at; on a conflict reload the streams read and plan again.

        ``plan`` may raise ``Rejected`` (translated to :class:`CommandRejected`).
        """
        for _ in range(self.retry.conflict_attempts):
            reads = Reads()
            at = self.clock.now()
            try:
                parts = tuple(p for p in plan(at, reads) if p.events)
            except InvalidCommand as e:
                raise InvalidTestbedCommand(e.reason) from e
            except Rejected as e:
                raise CommandRejected(e.reason) from e
            if not parts:
                return ()
            term = self.writer.fencing.term() if duty else None
            appends = []
            for part in parts:
                stream = part.stream
                version = reads.versions[stream.stream_id]
                records = stream.aggregate.codec.encode(
                    stream.stream_id,
                    version + 1,
                    part.events,
                    causation_ids=[cause] * len(part.events),
                    actor=self.writer.actor,
                    labels=dict(self.writer.labels),
                    leader_terms=[term] * len(part.events),
                )
                appends.append(StreamAppend(stream.stream_id, records, expected_version=version))
            try:
                append_decision(self.store, appends, clock=self.clock, policy=self.retry)
            except WrongExpectedVersion as e:
                log.info("streams moved; deciding again", stream=e.stream_id, cause=cause)
                continue
            except Fenced as e:
                self.writer.fencing.deposed(e)
                raise NotLeading(f"{cause}: {e}") from e
            except runtime.LogUnavailable as e:
                raise LogUnavailable(str(e)) from e
            finally:
                for part in parts:
                    part.stream.load()
            return parts
        raise LogContention(
            f"{cause}: the streams kept changing through {self.retry.conflict_attempts} attempts; "
            "is another controller writing to them? Run one leader per database"
        )


def _stored_names(*classes: type) -> frozenset[str]:
    return frozenset(name for name, t in registered_event_types().items() if t.cls in classes)


def _stream_of(kind: Kind, name: str) -> str:
    if kind == "testbed":
        return TESTBED.stream_of(name)
    if kind == "job":
        return BATCH_JOB.stream_of(name)
    return SCHEDULING.stream_of(name)


def _kind_of(stream_id: str) -> tuple[Kind, str] | None:
    for prefix, kind in _PREFIXES:
        if stream_id.startswith(prefix):
            return kind, stream_id.removeprefix(prefix)
    return None


def _missing(kind: Kind, name: str, deleted: bool) -> str:
    if deleted:
        return f"{kind} {name} was deleted"
    verb = "create it" if kind == "scheduling" else "define it"
    return f"no {kind} named {name}; {verb} first"
