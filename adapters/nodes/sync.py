"""Cluster sync: what the cluster shows of nodes and pods, turned into node commands.

Each pass lists the cluster (through the :class:`~fleetledger.adapters.cluster.ClusterGateway`
port; the Kubernetes adapter answers from its informer cache) and sends each node what differs:
``JoinNode`` for a new node, ``UpdateNodeCapacity``/``ChangeNodeConfig`` for a changed one,
``ReservePod(already_running=True)`` for a pod bound to it that it does not account yet,
``SetVmScaling``/``ChangeVmLimits``/``UpdateVmUse``/``SetVmMigration`` for an accounted VM pod
whose VM's settings, bounds or (scaling disabled) use the cluster shows changed,
``DeletePod`` for one it accounts that is gone (deleted, finished, moved away by a migration) —
except the reservations placement holds for its workloads, which only their release frees — and
``RemoveNode`` once a node leaves. A pass that finds nothing new appends nothing, so passes can
repeat freely; they are the leader's duty.

One node's commands go in one submission, and the submissions of a pass share commits (rounds
of many nodes, :func:`~fleetledger.adapters.runtime.execute_each`); a node whose cluster view
equals its state gets none. A command the node refuses (a pod that does not fit a node it is not
bound to, unreadable VM annotations) is logged and left out, and the node's others go again.

Given a :class:`~fleetledger.adapters.runtime.Shard`, passes and take-overs visit only the nodes
of its partition: another process leads the others (docs/SCALING.md, "Leadership per shard").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from fleetledger.adapters.cluster import ClusterGateway, Node, Pod
from fleetledger.adapters.runtime import CommandRefused, Plan, Shard, execute_each
from fleetledger.domain.nodes import (
    ChangeNodeConfig,
    ChangeVmLimits,
    DeletePod,
    JoinNode,
    Limits,
    NodeCommand,
    NodeConfig,
    NodeState,
    RemoveNode,
    ReservePod,
    RestartController,
    SetVmMigration,
    SetVmScaling,
    StartupRule,
    UpdateNodeCapacity,
    UpdateVmUse,
    VmPod,
    VmPodSpec,
    same_capacity,
)

from .service import NodeService, NodeStream, _translated
from .specs import DEFAULT_NODE_CONFIG, BadAnnotation, accounting_name, node_capacity, pod_spec

__all__ = ["ClusterSync", "SyncReport"]

log = structlog.get_logger(__name__)

_LIVE_PHASES = ("Pending", "Running")
_CAUSE = "cluster-sync"

Build = Callable[[datetime], NodeCommand]


@dataclass(slots=True)
class SyncReport:
    """What one pass (or a restart) sent: counts of decided events by kind, and what it skipped."""

    nodes_joined: int = 0
    nodes_removed: int = 0
    nodes_restarted: int = 0
    pods_reserved: int = 0
    pods_deleted: int = 0
    skipped: list[str] = field(default_factory=list)


class ClusterSync:
    """Reconciles the hosted nodes with the cluster; not thread-safe (one caller: the leader).

    ``shard``: reconcile and take over only the nodes it owns.
    """

    def __init__(
        self,
        service: NodeService,
        cluster: ClusterGateway,
        *,
        config: NodeConfig | Callable[[str], NodeConfig] = DEFAULT_NODE_CONFIG,
        node_label: str | None = None,
        shard: Shard | None = None,
    ) -> None:
        self._service = service
        self._cluster = cluster
        self.shard = shard
        self._config = config if callable(config) else (lambda _node, c=config: c)
        self._node_label = node_label
        # Each node the last pass found in step with the cluster, with what it compared: the
        # node, its pods, its state and its config. Its commands are a function of those four,
        # so while they stay the very same values it is in step still and is not compared
        # again: a pass costs what changed, not what exists.
        self._in_step: dict[str, tuple[Node, tuple[Pod, ...], NodeState, NodeConfig]] = {}

    def sync(self) -> SyncReport:
        """One reconciliation pass over every node the cluster or the log shows.

        Only nodes whose cluster view differs from their state get commands, and those go in
        shared commits: a pass over an unchanged fleet decides and appends nothing.
        """
        report = SyncReport()
        listed = {n.name: n for n in self._cluster.list_nodes(label=self._node_label)}
        pods = self._pods_by_node()
        work: dict[str, list[Build]] = {}
        logged = set(self._service.logged_nodes())
        for name in self._visited(listed, logged):
            node = listed.get(name)
            state = self._stream(name, logged).state
            if node is None:
                self._in_step.pop(name, None)
                if state.present:
                    work[name] = [lambda at: RemoveNode(at=at)]
                    report.nodes_removed += 1
                continue
            seen = (node, tuple(pods.get(name, ())), state, self._config(name))
            kept = self._in_step.get(name)
            if kept is not None and kept[2] is state and kept == seen:
                continue
            commands = self._node_commands(*seen)
            if commands:
                work[name] = commands
                self._in_step.pop(name, None)
            else:
                self._in_step[name] = seen
        self._send_each(work, report)
        return report

    def restart(self, incarnation: int, *, rule: StartupRule = "log_bound") -> SyncReport:
        """Take every listed node over as ``incarnation``, before any other pass.

        A listed node the log never saw joins first, so its pods count as never seen (held at
        their max). Every present node then gets one ``RestartController`` with the cluster's VM
        pods on it; re-running it for the same incarnation appends nothing. The joins, then the
        restarts, go many nodes per commit.
        """
        report = SyncReport()
        listed = {n.name: n for n in self._cluster.list_nodes(label=self._node_label)}
        pods = self._pods_by_node()
        logged = set(self._service.logged_nodes())
        names = self._visited(listed, logged)
        joins: dict[str, list[Build]] = {}
        for name in names:
            node = listed.get(name)
            if node is not None and not self._stream(name, logged).state.present:
                joins[name] = [self._join(node)]
        self._send_each(joins, report)
        restarts: dict[str, list[Build]] = {}
        for name in names:
            state = self._service.stream(name).state
            if not state.present or state.incarnation >= incarnation:
                continue
            observed = tuple(self._vm_specs(pods.get(name, []), report))
            restarts[name] = [_restart(incarnation, observed, rule)]
        sent = self._send_each(restarts, report)
        report.nodes_restarted += sum(1 for events in sent.values() if events)
        return report

    def _visited(self, listed: Mapping[str, Node], logged: set[str]) -> list[str]:
        """The nodes a pass visits, in order: every node the cluster or the log shows — of the
        shard's partition only, with a shard."""
        names = set(listed) | logged
        shard = self.shard
        if shard is not None:
            names = {name for name in names if shard.owns(name)}
        return sorted(names)

    def _stream(self, name: str, logged: set[str]) -> NodeStream:
        # A node the log never showed joining has nothing to read back: a fleet's first pass
        # reads none of its thousands of streams.
        return self._service.stream(name) if name in logged else self._service.unlogged(name)

    # -- building commands -------------------------------------------------------------------

    def _pods_by_node(self) -> dict[str, list[Pod]]:
        found: dict[str, list[Pod]] = {}
        for pod in self._cluster.list_pods():
            if pod.node is not None and pod.phase in _LIVE_PHASES and not pod.terminating:
                found.setdefault(pod.node, []).append(pod)
        return found

    def _join(self, node: Node) -> Build:
        capacity = node_capacity(node)
        config = self._config(node.name)
        return lambda at: JoinNode(
            node.name, capacity.cpu_milli, capacity.memory_bytes, capacity.gpu, config, at=at
        )

    def _node_commands(
        self, node: Node, pods: Sequence[Pod], state: NodeState, config: NodeConfig
    ) -> list[Build]:
        commands: list[Build] = []
        capacity = node_capacity(node)
        if not state.present:
            commands.append(self._join(node))
        else:
            # What the domain decides for the capacity the node already has is nothing: a
            # node the cluster shows unchanged gets no command at all.
            if not same_capacity(state, capacity.cpu_milli, capacity.memory_bytes, capacity.gpu):
                commands.append(
                    lambda at: UpdateNodeCapacity(
                        capacity.cpu_milli, capacity.memory_bytes, capacity.gpu, at=at
                    )
                )
            if config != state.config:
                commands.append(lambda at: ChangeNodeConfig(config, at=at))
        bound: set[str] = set()
        for pod in pods:
            name = accounting_name(pod)
            if name in bound:
                # A VM pod keeps its bare name in every namespace (its agent knows no other),
                # so two can meet under one name: only the first is accounted.
                log.warning(
                    "pod left out of node accounting",
                    pod=f"{pod.namespace}/{pod.name}",
                    reason=f"another pod on node {node.name} is accounted as {name}",
                )
                continue
            bound.add(name)
            if name in state.other_pods:
                continue
            try:
                spec = pod_spec(pod)
            except BadAnnotation as e:
                log.warning("pod left out of node accounting", pod=pod.name, reason=str(e))
                continue
            held = state.vm_pods.get(name)
            if held is not None:
                if isinstance(spec, VmPodSpec):
                    commands.extend(_vm_changes(held, spec))
                continue
            commands.append(
                lambda at, spec=spec: ReservePod(spec, at=at, already_running=True)  # type: ignore[misc]
            )
        # A held pod is a placed workload's reservation, not a pod of the cluster's: only the
        # workload's release frees it.
        accounted = set(state.vm_pods) | {p for p, pod in state.other_pods.items() if not pod.held}
        for gone in sorted(accounted - bound):
            commands.append(lambda at, gone=gone: DeletePod(gone, at=at))  # type: ignore[misc]
        return commands

    def _vm_specs(self, pods: Sequence[Pod], report: SyncReport) -> list[VmPodSpec]:
        specs = []
        for pod in pods:
            try:
                spec = pod_spec(pod)
            except BadAnnotation as e:
                report.skipped.append(str(e))
                continue
            if isinstance(spec, VmPodSpec):
                specs.append(spec)
        return specs

    # -- sending -----------------------------------------------------------------------------

    def _send_each(
        self, work: dict[str, list[Build]], report: SyncReport
    ) -> dict[str, tuple[object, ...]]:
        """Send each node its commands as one submission, many nodes per commit, leaving out
        any command a node refuses (that node's others are sent again); the events each node
        appended, by name.

        An error other than a refusal is raised once every node of its round has its answer.
        """
        sent: dict[str, tuple[object, ...]] = {}
        pending = {name: list(commands) for name, commands in work.items() if commands}
        while pending:
            names = list(pending)
            answers = execute_each(
                [(self._service.stream(name), _plan(pending[name])) for name in names], duty=True
            )
            again: dict[str, list[Build]] = {}
            failure: BaseException | None = None
            for name, answer in zip(names, answers, strict=True):
                if isinstance(answer, CommandRefused):
                    reason = answer.error.reason
                    log.warning("cluster sync command refused", node=name, reason=reason)
                    report.skipped.append(f"node {name}: {reason}")
                    commands = pending[name]
                    del commands[answer.index]
                    if commands:
                        again[name] = commands
                    else:
                        sent[name] = ()
                elif isinstance(answer, BaseException):
                    failure = failure or answer
                else:
                    sent[name] = answer.events
                    _count(answer.events, report)
            if failure is not None:
                if isinstance(failure, Exception):
                    raise _translated(failure) from failure
                raise failure
            pending = again
        return sent


def _plan(commands: Sequence[Build]) -> Plan[NodeCommand]:
    builds = tuple(commands)
    return lambda at: [(build(at), _CAUSE) for build in builds]


def _count(events: Sequence[object], report: SyncReport) -> None:
    for event in events:
        kind = type(event).__name__
        if kind == "NodeJoined":
            report.nodes_joined += 1
        elif kind in ("VmPodReserved", "OtherPodReserved"):
            report.pods_reserved += 1
        elif kind == "PodDeleted":
            report.pods_deleted += 1


def _vm_changes(pod: VmPod, spec: VmPodSpec) -> list[Build]:
    """The commands that bring an accounted VM pod to what the cluster shows of its VM."""
    name = pod.name
    found: list[Build] = []
    if spec.scaling_enabled != pod.scaling_enabled:
        found.append(lambda at: SetVmScaling(name, spec.scaling_enabled, at=at))
    cpu, memory = Limits(spec.cpu.min, spec.cpu.max), Limits(spec.memory.min, spec.memory.max)
    if (cpu, memory) != (Limits(pod.cpu.min, pod.cpu.max), Limits(pod.memory.min, pod.memory.max)):
        found.append(lambda at: ChangeVmLimits(name, cpu, memory, at=at))
    # The use the cluster shows is the agent's business while the VM scales; without scaling
    # it is what the VM holds.
    if not spec.scaling_enabled and (spec.cpu.use, spec.memory.use) != (
        pod.cpu.reserved,
        pod.memory.reserved,
    ):
        found.append(lambda at: UpdateVmUse(name, spec.cpu.use, spec.memory.use, at=at))
    if spec.migration_enabled != pod.migration_enabled:
        found.append(lambda at: SetVmMigration(name, spec.migration_enabled, at=at))
    return found


def _restart(incarnation: int, observed: tuple[VmPodSpec, ...], rule: StartupRule) -> Build:
    return lambda at: RestartController(incarnation, observed=observed, rule=rule, at=at)
