"""The testbeds' application service: testbed, job and scheduling streams, hosted.

One :class:`~fleetledger.adapters.runtime.HostedStream` per stream, created on first use and kept;
the catalog (which testbeds, jobs and schedulings exist) is folded from the log, so a restarted
process finds every stream it must look after. Single-stream commands go through the host
(:meth:`TestbedsService.execute`); decisions spanning several streams (claims, submissions,
releases) through :meth:`TestbedsService.decide_together`, which appends to every stream at the
version its state was read at and decides again when any of them moved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

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
from fleetledger.eventstore import EventStore, Fenced, StreamAppend, WrongExpectedVersion

from .aggregates import BATCH_JOB, SCHEDULING, TESTBED
from .errors import (
    CommandRejected,
    InvalidTestbedCommand,
    LogContention,
    LogUnavailable,
    NotLeading,
)

__all__ = ["Part", "Reads", "TestbedsService"]

log = structlog.get_logger(__name__)

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")

TestbedStream = HostedStream[TestbedState, TestbedCommand, TestbedEvent]
JobStream = HostedStream[JobState, JobCommand, JobEvent]
SchedulingStream = HostedStream[SchedulingState, SchedulingCommand, SchedulingEvent]


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
        self._position = 0
        self._catalog_types = [
            *TESTBED.codec.type_names(),
            *BATCH_JOB.codec.type_names(),
            *SCHEDULING.codec.type_names(),
        ]

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
        while True:
            records = self.store.read_all(after=self._position, types=self._catalog_types)
            for record in records:
                self._position = record.global_position
                stream_id = record.stream_id
                for prefix, kind in (
                    ("testbed-", "testbed"),
                    ("batch-job-", "job"),
                    ("scheduling-", "scheduling"),
                ):
                    if stream_id.startswith(prefix):
                        with self._lock:
                            self._names[kind].add(stream_id.removeprefix(prefix))
            read += len(records)
            if len(records) < 1000:
                return read

    def testbeds(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["testbed"]))

    def jobs(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["job"]))

    def schedulings(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._names["scheduling"]))

    # -- commands users send ---------------------------------------------------------------------

    def define_testbed(
        self, name: str, *, node_label: str, slots_per_node: int, cpu_millis: int, memory_mib: int
    ) -> None:
        """Create or resize a testbed."""
        self.execute(
            self.testbed(name),
            lambda at: testbed.DefineTestbed(
                name, node_label, slots_per_node, cpu_millis, memory_mib, at=at
            ),
            cause=f"define-testbed:{name}",
        )
        self._known("testbed", name)

    def define_job(
        self,
        name: str,
        *,
        kind: batch_job.AppKind,
        image: str,
        main_file: str,
        arguments: tuple[str, ...] = (),
    ) -> None:
        """Submit a batch job (ready until a scheduling claims it)."""
        self.execute(
            self.job(name),
            lambda at: batch_job.DefineJob(name, kind, image, main_file, arguments, at=at),
            cause=f"define-job:{name}",
        )
        self._known("job", name)

    def create_scheduling(
        self,
        name: str,
        *,
        testbed: str,
        mode: Mode = "queue",
        queue: tuple[str, ...] = (),
        items: tuple[SlotItem, ...] = (),
    ) -> None:
        """Create a scheduling; the runtime then claims its jobs and testbed."""
        self.execute(
            self.scheduling(name),
            lambda at: scheduling.CreateScheduling(name, testbed, mode, queue, items, at=at),
            cause=f"create-scheduling:{name}",
        )
        self._known("scheduling", name)

    def extend_scheduling(
        self,
        name: str,
        *,
        queue: tuple[str, ...] = (),
        items: tuple[SlotItem, ...] = (),
    ) -> None:
        """Online extension: add jobs to a scheduling that has not finished."""
        self.execute(
            self.scheduling(name),
            lambda at: scheduling.ExtendQueue(queue, items, at=at),
            cause=f"extend-scheduling:{name}",
        )

    def _known(self, kind: str, name: str) -> None:
        with self._lock:
            self._names[kind].add(name)

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
