"""The node accounting service: commands for one node into that node's stream.

Each node's stream (``node-<name>``) is hosted by its own
:class:`~fleetledger.adapters.runtime.HostedStream`: requests for the same node that arrive while
its append is in flight are decided together and appended as one, and requests for different
nodes append concurrently, where the store's group commit joins them into one transaction. So a
burst of agents costs a few commits, not one each.

Agents name only their pod; the service keeps which node accounts each pod, from every event its
streams fold. Host and domain errors leave as :mod:`fleetledger.adapters.nodes.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import (
    CommandRefused,
    Decision,
    Deposed,
    Folded,
    HostedStream,
    Plan,
    RetryPolicy,
    Writer,
    execute_each,
)
from fleetledger.adapters.runtime import LogContention as HostContention
from fleetledger.adapters.runtime import LogUnavailable as HostUnavailable
from fleetledger.domain import nodes
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.nodes import (
    AgentResourcesRequest,
    ComputeUnit,
    ComputeUnitMismatch,
    ComputeUnitViolated,
    NodeCommand,
    NodeEvent,
    NodeState,
    ResourcesGranted,
    VmLimitsChanged,
    VmMigrationChanged,
    VmScalingChanged,
    VmUseChanged,
)
from fleetledger.eventstore import EventStore
from fleetledger.projections.heads import StreamHead

from .aggregate import node_aggregate, node_of_stream
from .errors import (
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MigratingPodMismatch,
    NodesError,
    RequestRefused,
    RuntimeStopped,
    UnknownPod,
)

__all__ = ["Grant", "NodeService", "NodeStream", "ResourceRequest"]

NodeStream: TypeAlias = HostedStream[NodeState, NodeCommand, NodeEvent]

# Events that never add or remove a pod: folding them leaves the pod index as it was.
_POD_NEUTRAL = (
    ResourcesGranted,
    ComputeUnitMismatch,
    ComputeUnitViolated,
    nodes.MigrationStarted,
    VmLimitsChanged,
    VmScalingChanged,
    VmUseChanged,
    VmMigrationChanged,
)
_PAGE = 1000
_JOINED_TYPE = "nodes.NodeJoined"


@dataclass(frozen=True, slots=True)
class Grant:
    """The answer to an agent: its permit, the compute unit to scale in, and any warnings.

    ``position`` is the log position of the append that recorded it.
    """

    pod: str
    node: str
    cpu_milli: int
    memory_slots: int
    compute_unit: ComputeUnit
    cpu_pressure: int
    memory_pressure: int
    migrating: bool
    warnings: tuple[str, ...]
    position: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceRequest:
    """One agent's request, as :meth:`NodeService.request_resources` takes it."""

    pod: str
    cpu_milli: int
    memory_slots: int
    fractional_cpu: bool = True
    load: float | None = None


class NodeService:
    """Hosts one stream per node and decides node commands on them; thread-safe."""

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Clock,
        writer: Writer | None = None,
        retry: RetryPolicy | None = None,
        snapshot_every: int = 1000,
        locate: Callable[[str], str | None] | None = None,
    ) -> None:
        self._store = store
        # Where to look for a pod this process has not seen reserved (another process's
        # append, e.g. the leader's cluster sync): the runtime's read model of the log.
        self._locate = locate
        self._clock = clock
        self._writer = writer or Writer(actor="fleetledger", labels=(("capability", "nodes"),))
        self._retry = retry
        self._aggregate = node_aggregate(snapshot_every=snapshot_every)
        self._lock = threading.Lock()
        self._streams: dict[str, NodeStream] = {}
        self._pods: dict[str, str] = {}
        self._watchers: list[Callable[[str], None]] = []
        # The pods each node accounted when last indexed, so an update touches only its own.
        self._node_pods: dict[str, frozenset[str]] = {}
        # Every node the log showed joining, read up to ``_joins_read``.
        self._reading = threading.Lock()
        self._joined: set[str] = set()
        self._joins_read = 0
        self._joined_sorted: list[str] | None = None

    # -- streams -----------------------------------------------------------------------------

    def stream(self, node: str) -> NodeStream:
        """``node``'s hosted stream, loaded from the log the first time it is asked for."""
        # A pass of the cluster sync asks for every node's stream: a hosted one is found
        # without the lock (a dict read is atomic, and entries are never replaced).
        stream = self._streams.get(node)
        if stream is not None:
            return stream
        with self._lock:
            stream = self._streams.get(node)
            if stream is not None:
                return stream
            stream = self._streams[node] = self._new_stream(node)
        stream.load()
        self._index(node, stream.state)
        self._changed(node)
        return stream

    def watch(self, observer: Callable[[str], None]) -> None:
        """Call ``observer(node)`` (outside this service's lock) once a node's stream is hosted
        and whenever it folds events: a reader keeping its own view of the nodes (placement's
        capacity) re-reads only the nodes named, not every hosted one."""
        self._watchers.append(observer)

    def _changed(self, node: str) -> None:
        for observer in self._watchers:
            observer(node)

    def host(self, heads: Mapping[str, StreamHead[NodeState]], *, position: int) -> None:
        """Host each node of ``heads`` — a read model's fold of the log's node events up to
        ``position`` — from its folded state, reading nothing back: a start-up over a fleet
        reads the log once, not each node's stream. A node hosted already keeps its own fold.
        """
        for node, head in heads.items():
            with self._lock:
                if node in self._streams:
                    continue
                stream = self._new_stream(node)
                stream.start_from(
                    head.state, version=head.version, last_event_id=head.last_event_id
                )
                self._streams[node] = stream
            self._index(node, head.state)
            self._changed(node)
        with self._reading:
            # Every node stream begins with its join, so the read model's nodes are the
            # joins up to ``position``.
            if position > self._joins_read:
                self._joined.update(heads)
                self._joins_read = position
                self._joined_sorted = None

    def unlogged(self, node: str) -> NodeStream:
        """The stream of ``node``, which :meth:`logged_nodes` has just shown never joined:
        hosted empty, without reading it. A node stream begins with its join, so it is empty
        as of that read; should another process append to it since, the first append here
        conflicts and catches up, as with any stale fold."""
        stream = self._streams.get(node)
        if stream is not None:
            return stream
        self.host({node: StreamHead(nodes.initial_state(), 0, "")}, position=0)
        return self._streams[node]

    def logged_nodes(self) -> list[str]:
        """Every node that ever joined, from the log (each call reads only what was appended
        since the last: a pass over a fleet reads nothing new)."""
        with self._reading:
            while True:
                page = self._store.read_types(
                    after=self._joins_read, types=[_JOINED_TYPE], limit=_PAGE
                )
                for record in page.events:
                    node = node_of_stream(record.stream_id)
                    if node is not None:
                        self._joined.add(node)
                if page.events:
                    self._joined_sorted = None
                self._joins_read = page.through
                if len(page.events) < _PAGE:
                    if self._joined_sorted is None:
                        self._joined_sorted = sorted(self._joined)
                    return list(self._joined_sorted)

    def _new_stream(self, node: str) -> NodeStream:
        stream: NodeStream = HostedStream(
            self._store,
            self._aggregate,
            nodes.stream_id(node),
            clock=self._clock,
            writer=self._writer,
            retry=self._retry,
        )
        stream.on_events(lambda folded: self._folded(node, folded))
        return stream

    def hosted(self) -> dict[str, NodeState]:
        """The state of every node this service hosts, by name."""
        with self._lock:
            streams = sorted(self._streams.items())
        return {name: stream.state for name, stream in streams}

    def node_of(self, pod: str) -> str | None:
        """The node accounting ``pod``, if any hosted node does."""
        with self._lock:
            return self._pods.get(pod)

    # -- deciding ----------------------------------------------------------------------------

    def execute(
        self,
        node: str,
        build: Callable[[datetime], Sequence[NodeCommand]],
        *,
        cause: str,
        duty: bool = False,
    ) -> tuple[NodeEvent, ...]:
        """Decide ``build(now)``'s commands on ``node`` atomically and append what they decide.

        ``duty`` marks the leader's own commands (restarts, cluster sync): they carry its term.
        """
        stream = self.stream(node)
        try:
            decision = stream.execute(lambda at: [(c, cause) for c in build(at)], duty=duty)
        except Exception as e:
            raise _translated(e) from e
        return decision.events

    def request_resources(
        self,
        pod: str,
        *,
        cpu_milli: int,
        memory_slots: int,
        fractional_cpu: bool = True,
        load: float | None = None,
    ) -> Grant:
        """An agent's request for ``pod``: the permit the pod's node grants."""
        node = self.node_of(pod)
        located = False
        if node is None and self._locate is not None:
            node = self._locate(pod)
            located = node is not None
        if node is None:
            raise UnknownPod(f"no node accounts a VM pod named {pod}; is it scheduled yet?")
        stream = self.stream(node)
        if located:
            stream.load()  # the pod was reserved by another process: fold its append first
        plan = _agent_plan(pod, cpu_milli, memory_slots, fractional_cpu, load)
        try:
            decision = stream.execute(plan)
        except Exception as e:
            raise _translated(e) from e
        return _grant(node, pod, stream, decision)

    def request_resources_each(
        self, requests: Sequence[ResourceRequest]
    ) -> list[Grant | NodesError]:
        """Many agents' requests at once, each answered as :meth:`request_resources` would
        (its grant, or the error it would raise), many nodes per commit: what ``serve``'s
        group commit makes of agents posting together, for a caller holding them all."""
        answers: list[Grant | NodesError | None] = [None] * len(requests)
        items: list[tuple[NodeStream, Plan[NodeCommand]]] = []
        asked: list[tuple[int, str, NodeStream]] = []
        for place, request in enumerate(requests):
            node = self.node_of(request.pod)
            if node is None:
                # Not in the index: locating it reads the log, as one request does.
                try:
                    answers[place] = self.request_resources(
                        request.pod,
                        cpu_milli=request.cpu_milli,
                        memory_slots=request.memory_slots,
                        fractional_cpu=request.fractional_cpu,
                        load=request.load,
                    )
                except NodesError as e:
                    answers[place] = e
                continue
            stream = self.stream(node)
            plan = _agent_plan(
                request.pod,
                request.cpu_milli,
                request.memory_slots,
                request.fractional_cpu,
                request.load,
            )
            items.append((stream, plan))
            asked.append((place, node, stream))
        for (place, node, stream), outcome in zip(asked, execute_each(items), strict=True):
            pod = requests[place].pod
            try:
                if isinstance(outcome, BaseException):
                    raise _translated(outcome) from outcome  # type: ignore[arg-type]
                answers[place] = _grant(node, pod, stream, outcome)
            except NodesError as e:
                answers[place] = e
        return [answer for answer in answers if answer is not None]

    async def arequest_resources(
        self,
        pod: str,
        *,
        cpu_milli: int,
        memory_slots: int,
        fractional_cpu: bool = True,
        load: float | None = None,
    ) -> Grant | None:
        """:meth:`request_resources` for a caller on an event loop, for a pod this process
        already knows: decided on a committer thread, with the same grant or
        :class:`NodesError`. ``None`` for a pod not in the index (locating it reads the log:
        call :meth:`request_resources` then, off the loop)."""
        node = self.node_of(pod)
        if node is None:
            return None
        stream = self.stream(node)
        try:
            decision = await stream.decide(
                _agent_plan(pod, cpu_milli, memory_slots, fractional_cpu, load)
            )
        except Exception as e:
            raise _translated(e) from e
        return _grant(node, pod, stream, decision)

    # -- the pod index -----------------------------------------------------------------------

    def _folded(self, node: str, folded: Sequence[Folded[NodeEvent]]) -> None:
        self._changed(node)
        if all(isinstance(f.event, _POD_NEUTRAL) for f in folded):
            return
        with self._lock:
            stream = self._streams[node]
        self._index(node, stream.state)

    def _index(self, node: str, state: NodeState) -> None:
        here = set(state.vm_pods) | set(state.other_pods) if state.present else set()
        with self._lock:
            # Only what changed on this node: the rest of the index (every other node's pods)
            # stays as it was.
            before = self._node_pods.get(node, frozenset())
            for pod in before - here:
                if self._pods.get(pod) == node:
                    del self._pods[pod]
            for pod in here - before:
                self._pods[pod] = node
            self._node_pods[node] = frozenset(here)


def _agent_plan(
    pod: str, cpu_milli: int, memory_slots: int, fractional_cpu: bool, load: float | None
) -> Callable[[datetime], list[tuple[NodeCommand, str]]]:
    def plan(at: datetime) -> list[tuple[NodeCommand, str]]:
        command = AgentResourcesRequest(
            pod, cpu_milli, memory_slots, at=at, fractional_cpu=fractional_cpu, load=load
        )
        return [(command, f"agent:{pod}")]

    return plan


def _grant(node: str, pod: str, stream: NodeStream, decision: Decision[NodeEvent]) -> Grant:
    granted = [e for e in decision.events if isinstance(e, ResourcesGranted)]
    if not granted:
        raise NodesError(f"node {node} answered {pod}'s request with no grant")
    grant = granted[-1]
    warnings = tuple(
        f"{e.cpu_milli} milli-CPU and {e.memory_slots} memory slots are not the same whole "
        f"number of the compute unit ({e.compute_unit.cpu_milli} milli-CPU, "
        f"{e.compute_unit.memory_slots} slots) last sent to this pod"
        for e in decision.events
        if isinstance(e, ComputeUnitMismatch) and e.pod == pod
    )
    migrating = any(isinstance(e, nodes.MigrationStarted) and e.pod == pod for e in decision.events)
    if not migrating:
        current = stream.state.vm_pods.get(pod)
        migrating = current is not None and current.migrating
    return Grant(
        pod=pod,
        node=node,
        cpu_milli=grant.cpu_milli,
        memory_slots=grant.memory_slots,
        compute_unit=grant.compute_unit,
        cpu_pressure=grant.cpu_pressure,
        memory_pressure=grant.memory_pressure,
        migrating=migrating,
        warnings=warnings,
        position=decision.last_position,
    )


def _translated(error: Exception) -> NodesError:
    if isinstance(error, NodesError):
        return error
    if isinstance(error, CommandRefused):
        return _refusal(error.error)
    if isinstance(error, Rejected):
        return _refusal(error)
    if isinstance(error, HostUnavailable):
        return LogUnavailable(str(error))
    if isinstance(error, HostContention):
        return LogContention(str(error))
    if isinstance(error, Deposed):
        return RuntimeStopped(f"this controller no longer leads: {error}")
    raise error


def _refusal(error: Rejected) -> NodesError:
    if isinstance(error, nodes.UnknownPod):
        return UnknownPod(error.reason)
    if isinstance(error, nodes.MigratingPodMismatch):
        return MigratingPodMismatch(error.reason)
    if isinstance(error, InvalidCommand):
        return InvalidRequest(error.reason)
    return RequestRefused(error.reason)
