"""The vocabulary of node resource accounting: configuration, commands, events and state.

Units follow the seed (04, "Basics"): CPU in milli-CPU, memory in *slots* of a per-node slot size,
GPUs as a count. Every amount is a non-negative ``int``; the decider never produces a negative one
(seed 04 wraps the same subtractions in ``SaturatingSub``).

Nothing here validates in ``__post_init__``: these classes are also decoded from stored events,
and a fact already in the log must load whatever today's rules say. ``decide`` checks commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias, get_args

from fleetledger.domain.errors import Rejected

__all__ = [
    "ALL_RESOURCES",
    "STARTUP_RULES",
    "AgentResourcesRequest",
    "Bounds",
    "ComputeUnit",
    "ComputeUnitViolated",
    "ContainerResources",
    "ControllerRestarted",
    "DeletePod",
    "JoinNode",
    "MigratingPodMismatch",
    "MigrationStarted",
    "NodeCapacityChanged",
    "NodeCommand",
    "NodeConfig",
    "NodeConfigChanged",
    "NodeEvent",
    "NodeJoined",
    "NodeLeft",
    "NodeState",
    "OtherPod",
    "OtherPodReserved",
    "OtherPodSpec",
    "OtherPodsReserved",
    "PodDeleted",
    "PodResource",
    "RemoveNode",
    "ReservePod",
    "ReservePods",
    "ReservedOtherPod",
    "Resource",
    "ResourceState",
    "ResourcesGranted",
    "RestartController",
    "StartupBound",
    "StartupRule",
    "UnknownPod",
    "Unschedulable",
    "UpdateNodeCapacity",
    "ChangeNodeConfig",
    "ChangeVmLimits",
    "ComputeUnitMismatch",
    "Limits",
    "ScalingDisabled",
    "SetVmMigration",
    "SetVmScaling",
    "UpdateVmUse",
    "VmLimitsChanged",
    "VmMigrationChanged",
    "VmPod",
    "VmPodReserved",
    "VmPodSpec",
    "VmScalingChanged",
    "VmUseChanged",
]


Resource = Literal["cpu", "memory"]
ALL_RESOURCES: tuple[Resource, ...] = get_args(Resource)

StartupRule = Literal["log_bound", "assume_max"]
"""How a restart bounds a VM pod not yet heard from: the last logged permit, or the VM's max."""
STARTUP_RULES: tuple[StartupRule, ...] = get_args(StartupRule)


# -- refusals the edges map to their own answers -------------------------------------------------


class Unschedulable(Rejected):
    """A pod's reservation does not fit what remains on the node: it is unschedulable there."""


class UnknownPod(Rejected):
    """The node has no pod by that name (the agent endpoint answers 404)."""


class MigratingPodMismatch(Rejected):
    """A migrating pod asked for something other than its reservation (the endpoint answers 409)."""


class ScalingDisabled(Rejected):
    """An agent asked for a VM pod whose scaling is disabled: its reservation is its VM's use."""


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ComputeUnit:
    """The granularity agents must scale in; sent back with every permit."""

    cpu_milli: int
    memory_slots: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Per-node settings that may change at runtime (seed 04, "Config changes").

    Watermarks are fractions of the reservable amount ``total − system``; ``memory_slot_bytes``
    is fixed for the node's life because every memory amount is counted in slots of that size.
    """

    cpu_system_milli: int
    memory_system_slots: int
    cpu_watermark: float
    memory_watermark: float
    compute_unit: ComputeUnit
    memory_slot_bytes: int


# -- value objects on commands and events --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bounds:
    """A VM's ``min ≤ use ≤ max`` for one resource (milli-CPU or memory slots)."""

    min: int
    use: int
    max: int


@dataclass(frozen=True, slots=True)
class Limits:
    """A VM's ``min ≤ max`` for one resource, without its use (a change of bounds at run time)."""

    min: int
    max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class VmPodSpec:
    """A VM pod as the cluster shows it: its VM's bounds per resource, its GPUs and settings.

    ``scaling_enabled`` is false for a VM no agent scales: it holds exactly its use.
    ``migration_enabled`` is false for a VM the node must never pick to migrate away.
    """

    name: str
    cpu: Bounds
    memory: Bounds
    gpu: int = 0
    scaling_enabled: bool = True
    migration_enabled: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerResources:
    """One container's ``resources``: requests, else limits, are what counts (seed 04)."""

    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_request_bytes: int | None = None
    memory_limit_bytes: int | None = None
    gpu: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherPodSpec:
    """A non-VM pod: its containers' raw resources."""

    name: str
    containers: tuple[ContainerResources, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StartupBound:
    """What a restart holds for one VM pod until its agent speaks: reserved and buffer.

    ``known`` is false for a pod the log never saw (reserved at its max, like the seed).
    """

    pod: str
    cpu: Bounds
    memory: Bounds
    gpu: int
    cpu_reserved: int
    cpu_buffer: int
    memory_reserved: int
    memory_buffer: int
    known: bool
    scaling_enabled: bool = True
    migration_enabled: bool = True


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinNode:
    """The cluster shows a node: its allocatable resources and its settings."""

    node: str
    cpu_milli: int
    memory_bytes: int
    gpu: int
    config: NodeConfig
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class UpdateNodeCapacity:
    """The node's allocatable resources changed (a resize, a kubelet reservation change)."""

    cpu_milli: int
    memory_bytes: int
    gpu: int
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class RemoveNode:
    """The node left the cluster; its pods go with it."""

    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ChangeNodeConfig:
    """New settings for the node, effective at once (no restart)."""

    config: NodeConfig
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReservePod:
    """Set a pod's resources aside on the node (the scheduler's Reserve).

    ``already_running`` records a pod that is bound to the node whatever we decide (found at
    start-up, or placed by another scheduler): it is counted even if it does not fit.
    """

    spec: VmPodSpec | OtherPodSpec
    _: KW_ONLY
    at: datetime
    already_running: bool = False


@dataclass(frozen=True, slots=True)
class ReservePods:
    """Set several non-VM pods aside on the node at once: all of them or none.

    The pods are checked in order, each on the room the ones before it leave, exactly as the same
    :class:`ReservePod` commands one after the other would be; the first that does not fit
    refuses the whole command. A pod the node already holds is skipped (a retried batch).
    """

    specs: tuple[OtherPodSpec, ...]
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class DeletePod:
    """The pod is gone from the node (deleted, or its migration finished)."""

    pod: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class AgentResourcesRequest:
    """An autoscaler agent asks for new amounts for its VM pod (the agent protocol).

    ``fractional_cpu`` is false for agents on protocol versions that only scale whole CPUs; their
    grants are rounded down to whole CPUs. ``load`` is the pod's load metric, if it sent one.
    """

    pod: str
    cpu_milli: int
    memory_slots: int
    _: KW_ONLY
    at: datetime
    fractional_cpu: bool = True
    load: float | None = None


@dataclass(frozen=True, slots=True)
class RestartController:
    """A new controller incarnation took over this node (sent once per node on start).

    ``observed`` is the cluster's current list of the node's VM pods. Known pods are bounded by
    ``rule``; pods the log never saw are held at their max. ``assume_max`` is the seed's rule,
    kept for a log known to miss recent permits (restored from an old backup) and for comparison.
    """

    incarnation: int
    observed: tuple[VmPodSpec, ...] = ()
    rule: StartupRule = "log_bound"
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ChangeVmLimits:
    """The VM's bounds changed while it runs (seed 04's limits update): its new min and max."""

    pod: str
    cpu: Limits
    memory: Limits
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class SetVmScaling:
    """Scaling was enabled or disabled for the VM (seed 04's ``VmConfig.ScalingEnabled``)."""

    pod: str
    enabled: bool
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class UpdateVmUse:
    """A VM whose scaling is disabled now uses these amounts (it was resized by hand)."""

    pod: str
    cpu_milli: int
    memory_slots: int
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class SetVmMigration:
    """The node may (or may no longer) pick the VM to migrate away (seed 04's
    ``VmConfig.AutoMigrationEnabled``)."""

    pod: str
    enabled: bool
    _: KW_ONLY
    at: datetime


NodeCommand: TypeAlias = (
    JoinNode
    | UpdateNodeCapacity
    | RemoveNode
    | ChangeNodeConfig
    | ReservePod
    | ReservePods
    | DeletePod
    | AgentResourcesRequest
    | RestartController
    | ChangeVmLimits
    | SetVmScaling
    | UpdateVmUse
    | SetVmMigration
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node is accounted for, with its totals (memory already in slots) and settings."""

    node: str
    cpu_total_milli: int
    memory_total_slots: int
    gpu_total: int
    config: NodeConfig
    at: datetime


@dataclass(frozen=True, slots=True)
class NodeCapacityChanged:
    """The node's totals changed."""

    cpu_total_milli: int
    memory_total_slots: int
    gpu_total: int
    at: datetime


@dataclass(frozen=True, slots=True)
class NodeLeft:
    """The node left; nothing is accounted on it any more."""

    at: datetime


@dataclass(frozen=True, slots=True)
class NodeConfigChanged:
    """The node's settings changed."""

    config: NodeConfig
    at: datetime


@dataclass(frozen=True, slots=True)
class VmPodReserved:
    """A VM pod holds ``cpu_reserved``/``memory_reserved`` (its use) on the node.

    The settings came later than the first stored events: those load with both enabled.
    """

    pod: str
    cpu: Bounds
    memory: Bounds
    gpu: int
    cpu_reserved: int
    memory_reserved: int
    already_running: bool
    at: datetime
    scaling_enabled: bool = True
    migration_enabled: bool = True


@dataclass(frozen=True, slots=True)
class OtherPodReserved:
    """A non-VM pod's raw sums (requests, else limits) count toward the node."""

    pod: str
    raw_cpu_milli: int
    raw_memory_bytes: int
    gpu: int
    already_running: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class ReservedOtherPod:
    """One non-VM pod of an :class:`OtherPodsReserved`: its raw sums (requests, else limits)."""

    pod: str
    raw_cpu_milli: int
    raw_memory_bytes: int
    gpu: int


@dataclass(frozen=True, slots=True)
class OtherPodsReserved:
    """Non-VM pods reserved together, in order; the same as one :class:`OtherPodReserved` each."""

    pods: tuple[ReservedOtherPod, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class PodDeleted:
    """A pod left the node; what it held is released."""

    pod: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ResourcesGranted:
    """An agent's request was answered: the permit is the pod's new reserved amount.

    ``*_pressure`` is the shortfall the node could not grant (the pod's capacity pressure);
    ``compute_unit`` is the unit sent back with the permit.
    """

    pod: str
    cpu_requested_milli: int
    memory_requested_slots: int
    cpu_milli: int
    memory_slots: int
    cpu_pressure: int
    memory_pressure: int
    compute_unit: ComputeUnit
    load: float | None
    at: datetime


@dataclass(frozen=True, slots=True)
class ComputeUnitViolated:
    """A warning, checked per resource: an amount that is not a multiple of the unit sent.

    No longer decided (:class:`ComputeUnitMismatch` checks the request as a whole); logs keep it.
    """

    pod: str
    resource: Resource
    amount: int
    compute_unit: int
    at: datetime


@dataclass(frozen=True, slots=True)
class ComputeUnitMismatch:
    """A warning: an agent asked for amounts that are not one same whole number of the compute
    unit it was last sent, for CPU and memory alike, while neither sits at its VM's min or max."""

    pod: str
    cpu_milli: int
    memory_slots: int
    compute_unit: ComputeUnit
    at: datetime


@dataclass(frozen=True, slots=True)
class VmLimitsChanged:
    """The VM's new min and max, and what the pod holds under them.

    ``*_reserved``/``*_buffer`` change only for a pod not yet heard from since a restart;
    ``*_pressure`` loses any part of an unmet request above the new max.
    """

    pod: str
    cpu: Limits
    memory: Limits
    cpu_reserved: int
    cpu_buffer: int
    cpu_pressure: int
    memory_reserved: int
    memory_buffer: int
    memory_pressure: int
    at: datetime


@dataclass(frozen=True, slots=True)
class VmScalingChanged:
    """Scaling was switched for the VM; the pod now holds ``*_reserved``.

    Disabled, that is its use: its buffer and capacity pressure are gone.
    """

    pod: str
    enabled: bool
    cpu_reserved: int
    memory_reserved: int
    at: datetime


@dataclass(frozen=True, slots=True)
class VmUseChanged:
    """A VM whose scaling is disabled uses (and so holds) these amounts now."""

    pod: str
    cpu_milli: int
    memory_slots: int
    at: datetime


@dataclass(frozen=True, slots=True)
class VmMigrationChanged:
    """The node may (``enabled``) or may not pick the VM to migrate away from now on."""

    pod: str
    enabled: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class MigrationStarted:
    """A pod was chosen to migrate away; these amounts now count as accounted-for pressure."""

    pod: str
    cpu_accounted: int
    memory_accounted: int
    at: datetime


@dataclass(frozen=True, slots=True)
class ControllerRestarted:
    """A new controller incarnation holds each listed VM pod at its startup bound."""

    incarnation: int
    rule: StartupRule
    bounds: tuple[StartupBound, ...]
    at: datetime


NodeEvent: TypeAlias = (
    NodeJoined
    | NodeCapacityChanged
    | NodeLeft
    | NodeConfigChanged
    | VmPodReserved
    | OtherPodReserved
    | OtherPodsReserved
    | PodDeleted
    | ResourcesGranted
    | ComputeUnitViolated
    | MigrationStarted
    | ControllerRestarted
    | ComputeUnitMismatch
    | VmLimitsChanged
    | VmScalingChanged
    | VmUseChanged
    | VmMigrationChanged
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceState:
    """One resource of a node (seed 04's ``nodeResourceState``), plus its watermark fraction.

    ``reserved`` includes every pod's reservation and buffer; it may exceed ``total − system``
    after a config change or a restart, never through a grant.
    """

    total: int = 0
    system: int = 0
    watermark_fraction: float = 1.0
    reserved: int = 0
    buffer: int = 0
    capacity_pressure: int = 0
    pressure_accounted_for: int = 0

    @property
    def reservable(self) -> int:
        """``total − system``, saturating."""
        return max(0, self.total - self.system)

    @property
    def remaining(self) -> int:
        """What a grant may still hand out: ``total − system − reserved``, saturating."""
        return max(0, self.total - self.system - self.reserved)

    @property
    def watermark(self) -> int:
        """The reserved amount above which migrations start."""
        return int(self.watermark_fraction * self.reservable)

    @property
    def above_watermark(self) -> bool:
        """``reserved > watermark``: only then may the node pick pods to migrate (seed 04)."""
        return self.reserved > self.watermark

    @property
    def logical_pressure(self) -> int:
        """``reserved − watermark``, saturating."""
        return max(0, self.reserved - self.watermark)

    @property
    def slack(self) -> int:
        """Pressure that will resolve by itself: the buffer, plus room left below the watermark."""
        return self.buffer + max(0, self.watermark - self.reserved)

    @property
    def needs_migration(self) -> bool:
        """More pressure than migrations already started account for.

        This resource's own sum; whether the node looks for migrations at all depends on its
        watermarks too (:func:`~fleetledger.domain.nodes.needs_migration`).
        """
        wanted = self.logical_pressure + self.capacity_pressure
        return wanted > self.pressure_accounted_for + self.slack


@dataclass(frozen=True, slots=True)
class PodResource:
    """One resource of a VM pod: its VM bounds, what it holds, and what it could not get."""

    min: int
    use: int
    max: int
    reserved: int
    buffer: int = 0
    capacity_pressure: int = 0


@dataclass(frozen=True, slots=True)
class VmPod:
    """A VM pod on the node.

    ``awaiting_contact``: held at a startup bound since a restart, its agent not heard from yet
    (seed 04's ``receivedContact``, negated); a VM that does not scale has no agent to wait for.
    """

    name: str
    cpu: PodResource
    memory: PodResource
    gpu: int = 0
    last_compute_unit: ComputeUnit | None = None
    migrating: bool = False
    cpu_accounted: int = 0
    memory_accounted: int = 0
    load: float | None = None
    scaling_enabled: bool = True
    migration_enabled: bool = True
    awaiting_contact: bool = False

    @property
    def has_metrics(self) -> bool:
        """Whether its agent has reported a load (such pods migrate first)."""
        return self.load is not None


@dataclass(frozen=True, slots=True)
class OtherPod:
    """A non-VM pod: its raw requests (else limits), summed over its containers.

    ``held`` marks a reservation made for a workload placed in a batch (:class:`ReservePods`):
    capacity set aside before, or without, any pod the cluster shows. The cluster's view cannot
    release it — only deleting it (the workload's release) does.
    """

    name: str
    raw_cpu_milli: int
    raw_memory_bytes: int
    gpu: int = 0
    held: bool = False


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's accounting. ``other_*`` are the raw sums of its non-VM pods (seed 04)."""

    name: str = ""
    present: bool = False
    config: NodeConfig | None = None
    cpu: ResourceState = field(default_factory=ResourceState)
    memory: ResourceState = field(default_factory=ResourceState)
    gpu_total: int = 0
    gpu_reserved: int = 0
    vm_pods: Mapping[str, VmPod] = field(default_factory=dict)
    other_pods: Mapping[str, OtherPod] = field(default_factory=dict)
    other_raw_cpu_milli: int = 0
    other_raw_memory_bytes: int = 0
    incarnation: int = 0
