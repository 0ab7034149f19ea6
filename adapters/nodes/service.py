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
from collections.abc import Callable, Sequence
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
    RetryPolicy,
    Writer,
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
    NodeJoined,
    NodeState,
    ResourcesGranted,
    VmLimitsChanged,
    VmMigrationChanged,
    VmScalingChanged,
    VmUseChanged,
)
from fleetledger.eventstore import EventStore

from .aggregate import NODE_CODEC, node_aggregate
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

__all__ = ["Grant", "NodeService", "NodeStream"]

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

    # -- streams -----------------------------------------------------------------------------

    def stream(self, node: str) -> NodeStream:
        """``node``'s hosted stream, loaded from the log the first time it is asked for."""
        with self._lock:
            stream = self._streams.get(node)
            if stream is not None:
                return stream
            stream = HostedStream(
                self._store,
                self._aggregate,
                nodes.stream_id(node),
                clock=self._clock,
                writer=self._writer,
                retry=self._retry,
            )
            stream.on_events(lambda folded: self._folded(node, folded))
            self._streams[node] = stream
        stream.load()
        self._index(node, stream.state)
        return stream

    def logged_nodes(self) -> list[str]:
        """Every node that ever joined, from the log."""
        found: set[str] = set()
        after = 0
        while True:
            records = self._store.read_all(after=after, limit=_PAGE, types=["nodes.NodeJoined"])
            for record in records:
                event = NODE_CODEC.decode(record)
                assert isinstance(event, NodeJoined)
                found.add(event.node)
            if len(records) < _PAGE:
                return sorted(found)
            after = records[-1].global_position

    def hosted(self) -> dict[str, NodeState]:
        """The state of every node this service hosts, by name."""
        with self._lock:
            streams = dict(self._streams)
        return {name: stream.state for name, stream in sorted(streams.items())}

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
        if all(isinstance(f.event, _POD_NEUTRAL) for f in folded):
            return
        with self._lock:
            stream = self._streams[node]
        self._index(node, stream.state)

    def _index(self, node: str, state: NodeState) -> None:
        here = set(state.vm_pods) | set(state.other_pods) if state.present else set()
        with self._lock:
            for pod in [p for p, n in self._pods.items() if n == node and p not in here]:
                del self._pods[pod]
            for pod in here:
                self._pods[pod] = node


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
