"""The subnets' application service: commands in, Subnet decisions into the log.

Each subnet has its own stream (``subnet-<id>``), hosted by a
:class:`~fleetledger.adapters.runtime.HostedStream` created on first use and kept: it holds the
folded state, decides on it, appends with the expected version and decides the commands that
arrive during an append together (many node agents reporting at once cost one append).

A refusal may come from a fold that is behind the log (another process created the subnet or
joined the node since this one last read): the service then catches the stream up and, if it
moved, decides once more before reporting the refusal.

Allocator answers and releases are the leader's duties (``duty=True``): they carry its term, so a
deposed leader cannot record a side effect's result.

The plural calls (:meth:`SubnetService.record_allocations`, :meth:`~SubnetService.record_releases`,
:meth:`~SubnetService.report_demands`) decide many commands in few commits
(:func:`~fleetledger.adapters.runtime.execute_each`): each command is still its own submission —
its own causation id, refused alone, retried alone after a stale fold — and each gets its own
answer, a decision or the error its singular call would raise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime

from fleetledger.adapters import runtime
from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import (
    CommandRefused,
    Decision,
    HostedStream,
    Plan,
    RetryPolicy,
    Writer,
    execute_each,
)
from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.ipam import (
    CreateSubnet,
    IpamConfig,
    JoinNodes,
    LeaveNode,
    RecordAllocation,
    RecordRelease,
    ReportDemand,
    SubnetCommand,
    SubnetEvent,
    SubnetState,
)
from fleetledger.eventstore import EventStore
from fleetledger.projections.heads import StreamHead

from .aggregate import SUBNET_CREATED_TYPES, subnet_aggregate, subnet_id_of
from .errors import (
    CommandRejected,
    InvalidIpamCommand,
    IpamError,
    LogContention,
    LogUnavailable,
    NotLeader,
    UnknownSubnet,
)

__all__ = ["Outcome", "SubnetService", "SubnetStream"]

Outcome = Decision[SubnetEvent] | IpamError
"""One command's fate among many: its decision, or the error its singular call would raise."""

_Command = tuple[str, Callable[[datetime], SubnetCommand], str]
"""A command to decide among many: its subnet, the command at a time, its causation id."""

SubnetStream = HostedStream[SubnetState, SubnetCommand, SubnetEvent]

_PAGE = 1000


class SubnetService:
    """Decides subnet commands on their streams; thread-safe."""

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Clock,
        config: IpamConfig | None = None,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._aggregate = subnet_aggregate(config)
        self._writer = writer or Writer()
        self._retry = retry
        self._lock = threading.Lock()
        self._streams: dict[str, SubnetStream] = {}

    @property
    def store(self) -> EventStore:
        return self._store

    # -- streams -----------------------------------------------------------------------------

    def stream(self, subnet_id: str) -> SubnetStream:
        """The hosted stream of ``subnet_id`` (created, not yet loaded, on first use)."""
        with self._lock:
            stream = self._streams.get(subnet_id)
            if stream is None:
                stream = HostedStream(
                    self._store,
                    self._aggregate,
                    self._aggregate.stream_of(subnet_id),
                    clock=self._clock,
                    writer=self._writer,
                    retry=self._retry,
                )
                self._streams[subnet_id] = stream
            return stream

    def host(self, heads: Mapping[str, StreamHead[SubnetState]]) -> None:
        """Host each subnet of ``heads`` — a read model's fold of the log's subnet events —
        from its folded state, reading nothing back: the first pass after a start-up would
        otherwise read every subnet's whole history again. A subnet hosted already keeps its
        own fold."""
        for subnet_id, head in heads.items():
            self.stream(subnet_id).start_from(
                head.state, version=head.version, last_event_id=head.last_event_id
            )

    def subnet_ids(self) -> tuple[str, ...]:
        """Every subnet created in the log, by id."""
        found: set[str] = set()
        after = 0
        with _translated():
            while True:
                records = self._store.read_all(after=after, limit=_PAGE, types=SUBNET_CREATED_TYPES)
                found.update(
                    subnet for r in records if (subnet := subnet_id_of(r.stream_id)) is not None
                )
                if len(records) < _PAGE:
                    return tuple(sorted(found))
                after = records[-1].global_position

    def load(self, subnet_id: str) -> SubnetState:
        """Catch ``subnet_id``'s stream up with the log and return its state.

        Raises :class:`UnknownSubnet` when it was never created.
        """
        stream = self.stream(subnet_id)
        with _translated():
            stream.load()
        state = stream.state
        if state.subnet_id is None:
            raise UnknownSubnet(subnet_id)
        return state

    # -- commands ----------------------------------------------------------------------------

    def create(self, subnet_id: str, capacity: int) -> Decision[SubnetEvent]:
        """Manage ``subnet_id`` with ``capacity`` assignable IPs (again with the same capacity
        changes nothing)."""
        return self._execute(
            subnet_id, lambda at: CreateSubnet(subnet_id, capacity, at=at), f"create:{subnet_id}"
        )

    def join(
        self,
        subnet_id: str,
        nodes: Sequence[str],
        *,
        max_ips: Mapping[str, int] | None = None,
    ) -> Decision[SubnetEvent]:
        """``nodes`` take their pod IPs from ``subnet_id`` (planned together); ``max_ips`` gives
        a node its own maximum IP count (its max pods, 1 to 250), the others have the
        configured one."""
        names = tuple(nodes)
        maxima = dict(max_ips or {})
        return self._execute(
            subnet_id,
            lambda at: JoinNodes(subnet_id, names, at=at, max_ips=maxima),
            f"join:{','.join(names)}",
        )

    def leave(self, subnet_id: str, node: str) -> Decision[SubnetEvent]:
        """``node`` is gone; its IPs return to the subnet."""
        return self._execute(
            subnet_id, lambda at: LeaveNode(subnet_id, node, at=at), f"leave:{node}"
        )

    def report_demand(
        self, subnet_id: str, node: str, demand: int, in_use: Sequence[str] = ()
    ) -> Decision[SubnetEvent]:
        """``node``'s pods need ``demand`` IPs, and hold ``in_use``."""
        held = tuple(in_use)
        return self._execute(
            subnet_id,
            lambda at: ReportDemand(subnet_id, node, demand, held, at=at),
            f"demand:{node}",
        )

    def record_allocation(
        self, subnet_id: str, node: str, request: int, ips: Sequence[str], *, causation_id: str
    ) -> Decision[SubnetEvent]:
        """The allocator answered ``node``'s request ``request`` with ``ips`` (a leader duty)."""
        answer = tuple(ips)
        return self._execute(
            subnet_id,
            lambda at: RecordAllocation(subnet_id, node, request, answer, at=at),
            causation_id,
            duty=True,
        )

    def record_release(
        self, subnet_id: str, node: str, ips: Sequence[str], *, causation_id: str
    ) -> Decision[SubnetEvent]:
        """``ips`` of ``node`` went back to the subnet (a leader duty)."""
        freed = tuple(ips)
        return self._execute(
            subnet_id,
            lambda at: RecordRelease(subnet_id, node, freed, at=at),
            causation_id,
            duty=True,
        )

    def record_allocations(
        self, subnet_id: str, answers: Sequence[tuple[str, int, Sequence[str]]]
    ) -> list[Outcome]:
        """:meth:`record_allocation` of each ``(node, request, ips)``, in few commits: the
        answers of one pass over the subnet's requests. Each keeps its causation id
        (``allocate:<node>:<request>``) and its own outcome, in the order given."""
        return self._execute_each(
            [
                (
                    subnet_id,
                    _allocation(subnet_id, node, request, tuple(ips)),
                    f"allocate:{node}:{request}",
                )
                for node, request, ips in answers
            ],
            duty=True,
        )

    def record_releases(
        self, subnet_id: str, releases: Sequence[tuple[str, Sequence[str]]]
    ) -> list[Outcome]:
        """:meth:`record_release` of each ``(node, ips)``, in few commits. Each keeps its
        causation id (``release:<node>:<count>``) and its own outcome, in the order given."""
        return self._execute_each(
            [
                (subnet_id, _release(subnet_id, node, tuple(ips)), f"release:{node}:{len(ips)}")
                for node, ips in releases
            ],
            duty=True,
        )

    def report_demands(
        self, reports: Sequence[tuple[str, str, int, Sequence[str]]]
    ) -> list[Outcome]:
        """:meth:`report_demand` of each ``(subnet_id, node, demand, in_use)``, many subnets
        per commit: a pass over the nodes whose pods changed. Each keeps its causation id
        (``demand:<node>``) and its own outcome, in the order given."""
        return self._execute_each(
            [
                (subnet_id, _demand(subnet_id, node, demand, tuple(in_use)), f"demand:{node}")
                for subnet_id, node, demand, in_use in reports
            ]
        )

    def _execute_each(self, commands: Sequence[_Command], *, duty: bool = False) -> list[Outcome]:
        """Decide each command as :meth:`_execute` would, many per commit."""
        for subnet_id, _, _ in commands:
            if not isinstance(subnet_id, str) or not subnet_id:
                raise InvalidIpamCommand("subnet_id must be a non-empty string")
        answers = self._each([(self.stream(s), c, k) for s, c, k in commands], duty=duty)
        # A refusal may come from a fold behind the log: as _execute does, catch the stream up
        # and, if it moved, decide the refused commands once more.
        again: list[int] = []
        moved: dict[str, bool] = {}
        for place, answer in enumerate(answers):
            if not isinstance(answer, CommandRefused) or isinstance(answer.error, InvalidCommand):
                continue
            subnet_id = commands[place][0]
            if subnet_id not in moved:
                stream = self.stream(subnet_id)
                version = stream.version
                try:
                    with _translated():
                        stream.load()
                except IpamError as e:
                    answers[place] = e
                    continue
                moved[subnet_id] = stream.version != version
            if moved[subnet_id]:
                again.append(place)
        if again:
            retried = self._each(
                [(self.stream(commands[p][0]), commands[p][1], commands[p][2]) for p in again],
                duty=duty,
            )
            for place, answer in zip(again, retried, strict=True):
                answers[place] = answer
        return [
            _outcome(answer, subnet_id, self.stream(subnet_id))
            for (subnet_id, _, _), answer in zip(commands, answers, strict=True)
        ]

    @staticmethod
    def _each(
        items: Sequence[tuple[SubnetStream, Callable[[datetime], SubnetCommand], str]],
        *,
        duty: bool,
    ) -> list[Decision[SubnetEvent] | BaseException]:
        return execute_each(
            [(stream, _plan(command, causation_id)) for stream, command, causation_id in items],
            duty=duty,
        )

    def _execute(
        self,
        subnet_id: str,
        command: Callable[[datetime], SubnetCommand],
        causation_id: str,
        *,
        duty: bool = False,
    ) -> Decision[SubnetEvent]:
        if not isinstance(subnet_id, str) or not subnet_id:
            raise InvalidIpamCommand("subnet_id must be a non-empty string")
        stream = self.stream(subnet_id)
        with _translated():
            try:
                return stream.execute(lambda at: [(command(at), causation_id)], duty=duty)
            except CommandRefused as first:
                refused = first
            if not isinstance(refused.error, InvalidCommand):
                version = stream.version
                stream.load()
                if stream.version != version:
                    try:
                        return stream.execute(lambda at: [(command(at), causation_id)], duty=duty)
                    except CommandRefused as second:
                        refused = second
        error = refused.error
        if isinstance(error, InvalidCommand):
            raise InvalidIpamCommand(error.reason) from error
        if stream.state.subnet_id is None:
            raise UnknownSubnet(subnet_id) from error
        raise CommandRejected(error.reason) from error


def _plan(command: Callable[[datetime], SubnetCommand], causation_id: str) -> Plan[SubnetCommand]:
    return lambda at: [(command(at), causation_id)]


def _allocation(
    subnet_id: str, node: str, request: int, ips: tuple[str, ...]
) -> Callable[[datetime], SubnetCommand]:
    return lambda at: RecordAllocation(subnet_id, node, request, ips, at=at)


def _release(
    subnet_id: str, node: str, ips: tuple[str, ...]
) -> Callable[[datetime], SubnetCommand]:
    return lambda at: RecordRelease(subnet_id, node, ips, at=at)


def _demand(
    subnet_id: str, node: str, demand: int, in_use: tuple[str, ...]
) -> Callable[[datetime], SubnetCommand]:
    return lambda at: ReportDemand(subnet_id, node, demand, in_use, at=at)


def _outcome(
    answer: Decision[SubnetEvent] | BaseException, subnet_id: str, stream: SubnetStream
) -> Outcome:
    """An answer of ``execute_each`` as this package's: the decision, or the error the
    singular call raises (anything else is a bug, raised here)."""
    if isinstance(answer, Decision):
        return answer
    if isinstance(answer, CommandRefused):
        error = answer.error
        if isinstance(error, InvalidCommand):
            return _caused(InvalidIpamCommand(error.reason), error)
        if stream.state.subnet_id is None:
            return _caused(UnknownSubnet(subnet_id), error)
        return _caused(CommandRejected(error.reason), error)
    try:
        with _translated():
            raise answer
    except IpamError as e:
        return e


def _caused(error: IpamError, cause: BaseException) -> IpamError:
    error.__cause__ = cause
    return error


@contextmanager
def _translated() -> Iterator[None]:
    """The host's errors as this package's."""
    try:
        yield
    except runtime.LogUnavailable as e:
        raise LogUnavailable(str(e)) from e
    except runtime.LogContention as e:
        raise LogContention(
            f"{e}; is another controller writing to the same subnet? Run one leader per database"
        ) from e
    except runtime.Deposed as e:
        raise NotLeader(f"{e}; a newer leader records the allocator's answers now") from e
