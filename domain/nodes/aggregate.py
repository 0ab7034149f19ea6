"""Node resource accounting: one aggregate per node, holding what its pods may use.

The rules are seed 04's scheduler plugin ("Deep dive into resource management"), per node and per
resource, each resource independently:

* **Reserve** a pod when its reservation fits ``total − system − reserved``; refuse it as
  :class:`Unschedulable` otherwise, changing nothing. VM pods reserve their VM's current use;
  non-VM pods add their raw requests (else limits) to the node's raw sums, which count rounded up
  (CPU to a whole CPU, memory to a slot), so many small pods do not each round up.
* An **agent request** is never refused for lack of room. A decrease (or the same amount) is
  granted and clears the pod's capacity pressure. An increase is granted up to what remains
  (rounded down to whole CPUs for agents that cannot scale fractions); the shortfall becomes the
  pod's capacity pressure and adds to the node's. The permit is the pod's new reserved amount.
  A pod whose migration starts on its own request is granted no increase at all: what it asked
  beyond its reservation is capacity pressure, which the migration accounts for.
  A migrating pod must ask for exactly its reservation (or, first after a restart, its real use
  below it). A request that is not one same whole number of the compute unit *last sent to that
  pod* (the agent cannot know a newer one) for CPU and memory alike is recorded as a
  :class:`ComputeUnitMismatch` warning, not refused; a request with either resource at its VM's
  min or max is exempt as a whole. A VM whose scaling is disabled has no agent to ask
  (:class:`ScalingDisabled`).
* **Pressure**: nothing migrates while every resource is at or below its watermark, whatever the
  capacity pressure. Above it, a resource needs migrations when ``logical + capacity pressure``
  exceeds what started migrations account for plus slack (buffer, and room below the watermark).
  Every decision that can raise pressure then starts migrations from the queue — pods that may
  migrate, with metrics first, then the lowest load, then by name — until the pressure is
  accounted for.
* **Per-VM settings** (seed 04's ``VmConfig``): a VM whose scaling is disabled holds exactly its
  use (no buffer, no pressure), which follows its VM (:class:`UpdateVmUse`); a VM's bounds may
  change while it runs (:class:`ChangeVmLimits`); a VM may be kept from migrating
  (:class:`SetVmMigration`).
* **Config changes** apply at once; ``reserved`` may then exceed ``total − system`` and every
  difference saturates at zero.
* **Startup uncertainty**: agents keep scaling within their last permit while no controller
  answers. The seed, not knowing that permit, holds every VM pod at its max. The log knows it: on
  :class:`RestartController` a VM pod holds ``min(max, last logged permit)`` (never below the use
  the cluster shows) with ``buffer = reserved − last known use``; a pod the log never saw falls
  back to its max, and a VM that does not scale holds its use. The pod's first request then sets
  its real use and zeroes its buffer.

One stream per node (:func:`stream_id`); every command touches only that stream. A migration
started here is carried out by a reactor reading :class:`MigrationStarted`; the target node's
reservation is that node's own :class:`ReservePod`. :class:`ReservePods` reserves several
non-VM pods at once (a placement batch), all or none, as one event. The node has no timers (no
``next_deadline``). The state loads from :func:`snapshot` data plus the events after it;
:func:`dumpstate` shows a fleet of node states as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.nodes.evolve import evolve
from fleetledger.domain.nodes.model import (
    STARTUP_RULES,
    AgentResourcesRequest,
    Bounds,
    ChangeNodeConfig,
    ChangeVmLimits,
    ComputeUnit,
    ComputeUnitMismatch,
    ContainerResources,
    ControllerRestarted,
    DeletePod,
    JoinNode,
    Limits,
    MigratingPodMismatch,
    MigrationStarted,
    NodeCapacityChanged,
    NodeCommand,
    NodeConfig,
    NodeConfigChanged,
    NodeEvent,
    NodeJoined,
    NodeLeft,
    NodeState,
    OtherPodReserved,
    OtherPodSpec,
    OtherPodsReserved,
    PodDeleted,
    PodResource,
    RemoveNode,
    ReservedOtherPod,
    ReservePod,
    ReservePods,
    ResourcesGranted,
    ResourceState,
    RestartController,
    ScalingDisabled,
    SetVmMigration,
    SetVmScaling,
    StartupBound,
    StartupRule,
    UnknownPod,
    Unschedulable,
    UpdateNodeCapacity,
    UpdateVmUse,
    VmLimitsChanged,
    VmMigrationChanged,
    VmPod,
    VmPodReserved,
    VmPodSpec,
    VmScalingChanged,
    VmUseChanged,
)
from fleetledger.domain.nodes.queries import (
    migration_queue,
    needs_migration,
    same_capacity,
)
from fleetledger.domain.units import MILLI_PER_CPU

__all__ = [
    "decide",
    "initial_state",
    "stream_id",
]


def stream_id(node: str) -> str:
    """The one stream holding ``node``'s accounting."""
    return f"node-{node}"


def initial_state() -> NodeState:
    """A node the log has not seen join."""
    return NodeState()


def _sat(value: int) -> int:
    return value if value > 0 else 0


# -- decide --------------------------------------------------------------------------------------


def decide(state: NodeState, command: NodeCommand) -> list[NodeEvent]:
    """The events ``command`` leads to; :class:`Rejected` (or a subclass) says why not."""
    at = _utc(getattr(command, "at", None))
    if type(command) is JoinNode:
        return _decide_join(state, command, at)
    if not state.present:
        raise Rejected(
            f"node {state.name or '?'} is not accounted for; it must join (JoinNode) first"
        )
    events: list[NodeEvent]
    if type(command) is AgentResourcesRequest:
        return _decide_request(state, command, at)  # starts its own migrations
    if type(command) is ReservePod:
        events = _decide_reserve(state, command, at)
    elif type(command) is ReservePods:
        events = _decide_reserve_many(state, command, at)
        if not state.vm_pods:
            return events  # only VM pods migrate: without any, there is nothing to start
    elif type(command) is DeletePod:
        events = [PodDeleted(command.pod, at)] if _knows(state, command.pod) else []
    elif type(command) is ChangeNodeConfig:
        events = _decide_config(state, command, at)
    elif type(command) is UpdateNodeCapacity:
        events = _decide_capacity(state, command, at)
    elif type(command) is RestartController:
        events = _decide_restart(state, command, at)
    elif type(command) is ChangeVmLimits:
        events = _decide_limits(state, command, at)
    elif type(command) is SetVmScaling:
        events = _decide_scaling(state, command, at)
    elif type(command) is UpdateVmUse:
        events = _decide_use(state, command, at)
    elif type(command) is SetVmMigration:
        events = _decide_migration_switch(state, command, at)
    elif type(command) is RemoveNode:
        return [NodeLeft(at)]
    else:
        raise InvalidCommand(f"node accounting does not handle {type(command).__name__}")
    if events:
        events.extend(_start_migrations(_fold(state, events), at))
    return events


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC) if at.utcoffset() else at


def _fold(state: NodeState, events: Iterable[NodeEvent]) -> NodeState:
    for event in events:
        state = evolve(state, event)
    return state


def _knows(state: NodeState, pod: str) -> bool:
    return pod in state.vm_pods or pod in state.other_pods


def _amount(value: object, what: str, fix: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidCommand(f"{what} must be a non-negative integer, got {value!r}; {fix}")
    return value


def _check_config(config: object) -> NodeConfig:
    if not isinstance(config, NodeConfig):
        raise InvalidCommand(f"config must be a NodeConfig, got {config!r}")
    _amount(config.cpu_system_milli, "cpu_system_milli", "give the CPU kept for the system")
    _amount(config.memory_system_slots, "memory_system_slots", "give the slots kept for the system")
    for name in ("cpu_watermark", "memory_watermark"):
        fraction = getattr(config, name)
        if not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
            raise InvalidCommand(
                f"{name} is a fraction of the reservable amount between 0 and 1 "
                f"(0.9 is typical), got {fraction!r}"
            )
    unit = config.compute_unit
    if not isinstance(unit, ComputeUnit) or type(unit.cpu_milli) is not int:
        raise InvalidCommand(f"compute_unit must be a ComputeUnit, got {unit!r}")
    if unit.cpu_milli < 1 or type(unit.memory_slots) is not int or unit.memory_slots < 1:
        raise InvalidCommand(
            f"compute_unit amounts must be positive (e.g. 250 milli-CPU and 1 slot), got {unit!r}"
        )
    if type(config.memory_slot_bytes) is not int or config.memory_slot_bytes < 1:
        raise InvalidCommand(
            f"memory_slot_bytes must be a positive number of bytes (e.g. 1 GiB), "
            f"got {config.memory_slot_bytes!r}"
        )
    return config


def _decide_join(state: NodeState, command: JoinNode, at: datetime) -> list[NodeEvent]:
    if not isinstance(command.node, str) or not command.node:
        raise InvalidCommand("node must be a non-empty node name")
    config = _check_config(command.config)
    cpu = _amount(command.cpu_milli, "cpu_milli", "give the node's allocatable milli-CPU")
    memory = _amount(command.memory_bytes, "memory_bytes", "give the node's allocatable bytes")
    gpu = _amount(command.gpu, "gpu", "give the node's GPU count")
    slots = memory // config.memory_slot_bytes
    if state.present:
        if (state.name, state.cpu.total, state.memory.total, state.gpu_total, state.config) == (
            command.node,
            cpu,
            slots,
            gpu,
            config,
        ):
            return []
        raise Rejected(
            f"node {state.name} has already joined; send UpdateNodeCapacity or ChangeNodeConfig "
            "to change it"
        )
    if state.name and state.name != command.node:
        raise InvalidCommand(f"this stream is node {state.name}'s, not {command.node}'s")
    return [NodeJoined(command.node, cpu, slots, gpu, config, at)]


def _decide_capacity(
    state: NodeState, command: UpdateNodeCapacity, at: datetime
) -> list[NodeEvent]:
    assert state.config is not None  # a present node has its config
    cpu = _amount(command.cpu_milli, "cpu_milli", "give the node's allocatable milli-CPU")
    memory = _amount(command.memory_bytes, "memory_bytes", "give the node's allocatable bytes")
    gpu = _amount(command.gpu, "gpu", "give the node's GPU count")
    if same_capacity(state, cpu, memory, gpu):
        return []
    return [NodeCapacityChanged(cpu, memory // state.config.memory_slot_bytes, gpu, at)]


def _decide_config(state: NodeState, command: ChangeNodeConfig, at: datetime) -> list[NodeEvent]:
    config = _check_config(command.config)
    assert state.config is not None  # a present node has its config
    if config.memory_slot_bytes != state.config.memory_slot_bytes:
        raise InvalidCommand(
            f"memory_slot_bytes is fixed for a node's life ({state.config.memory_slot_bytes}); "
            "every memory amount on the node is counted in those slots"
        )
    return [] if config == state.config else [NodeConfigChanged(config, at)]


# -- reserving pods ------------------------------------------------------------------------------


def _check_bounds(bounds: object, pod: str, what: str, *, running: bool) -> Bounds:
    if not isinstance(bounds, Bounds) or not all(
        type(v) is int for v in (bounds.min, bounds.use, bounds.max)
    ):
        raise InvalidCommand(f"pod {pod}: {what} must be Bounds of integers, got {bounds!r}")
    # A VM already running may use more than a max just lowered (or less than a min just
    # raised) until its agent follows: that use is a fact to count, not a bad spec.
    inside = running or bounds.min <= bounds.use <= bounds.max
    if not (0 <= bounds.min <= bounds.max and bounds.use >= 0 and inside):
        raise InvalidCommand(
            f"pod {pod}: {what} needs 0 ≤ min ≤ use ≤ max, got min {bounds.min}, "
            f"use {bounds.use}, max {bounds.max}"
        )
    return bounds


def _check_vm_spec(spec: VmPodSpec, *, running: bool) -> None:
    if not isinstance(spec.name, str) or not spec.name:
        raise InvalidCommand("a pod needs a non-empty name")
    _check_bounds(spec.cpu, spec.name, "cpu", running=running)
    _check_bounds(spec.memory, spec.name, "memory", running=running)
    _amount(spec.gpu, f"pod {spec.name}: gpu", "give the GPUs the pod asks for")
    _switch(spec.scaling_enabled, f"pod {spec.name}: scaling_enabled")
    _switch(spec.migration_enabled, f"pod {spec.name}: migration_enabled")


def _switch(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise InvalidCommand(f"{what} must be true or false, got {value!r}")
    return value


def _raw_sums(spec: OtherPodSpec) -> tuple[int, int, int]:
    """Requests, else limits, summed over containers; a container missing both is refused."""
    if not isinstance(spec.name, str) or not spec.name:
        raise InvalidCommand("a pod needs a non-empty name")
    if not spec.containers:
        raise InvalidCommand(f"pod {spec.name} lists no containers")
    cpu = memory = gpu = 0
    for index, container in enumerate(spec.containers, start=1):
        if not isinstance(container, ContainerResources):
            raise InvalidCommand(f"pod {spec.name}: container {index} is not ContainerResources")
        where = f"pod {spec.name}, container {index}"
        cpu += _request_or_limit(
            container.cpu_request_milli, container.cpu_limit_milli, where, "cpu"
        )
        memory += _request_or_limit(
            container.memory_request_bytes, container.memory_limit_bytes, where, "memory"
        )
        gpu += _amount(container.gpu, f"{where}: gpu", "give the GPUs the container asks for")
    return cpu, memory, gpu


def _request_or_limit(request: int | None, limit: int | None, where: str, name: str) -> int:
    # Seed 04, "Non-VM pods": without a value the scheduler cannot account for the pod at all.
    value = request if request is not None else limit
    if value is None:
        raise InvalidCommand(
            f"{where} has neither a {name} request nor a {name} limit; set "
            f"resources.requests.{name} so the pod can be accounted for"
        )
    return _amount(value, f"{where}: {name}", f"set a non-negative {name} amount")


def _decide_reserve(state: NodeState, command: ReservePod, at: datetime) -> list[NodeEvent]:
    spec = command.spec
    if isinstance(spec, VmPodSpec):
        _check_vm_spec(spec, running=command.already_running)
        if spec.name in state.other_pods:
            raise Rejected(f"pod {spec.name} is already reserved on {state.name} as a non-VM pod")
        if spec.name in state.vm_pods:
            return []  # a retried Reserve: the pod already holds its resources
        needs = (spec.cpu.use, spec.memory.use, spec.gpu)
        event: NodeEvent = VmPodReserved(
            spec.name,
            spec.cpu,
            spec.memory,
            spec.gpu,
            spec.cpu.use,
            spec.memory.use,
            command.already_running,
            at,
            spec.scaling_enabled,
            spec.migration_enabled,
        )
    elif isinstance(spec, OtherPodSpec):
        cpu, memory, gpu = _raw_sums(spec)
        if spec.name in state.vm_pods:
            raise Rejected(f"pod {spec.name} is already reserved on {state.name} as a VM pod")
        if spec.name in state.other_pods:
            return []
        event = OtherPodReserved(spec.name, cpu, memory, gpu, command.already_running, at)
        after = evolve(state, event)
        needs = (
            after.cpu.reserved - state.cpu.reserved,
            after.memory.reserved - state.memory.reserved,
            gpu,
        )
    else:
        raise InvalidCommand(f"spec must be a VmPodSpec or an OtherPodSpec, got {spec!r}")
    if not command.already_running:
        _check_fits(state, spec.name, needs)
    return [event]


def _check_fits(state: NodeState, pod: str, needs: tuple[int, int, int]) -> None:
    frees = (
        state.cpu.remaining,
        state.memory.remaining,
        _sat(state.gpu_total - state.gpu_reserved),
    )
    _check_room(state.name, pod, needs, frees)


def _check_room(
    node: str, pod: str, needs: tuple[int, int, int], frees: tuple[int, int, int]
) -> None:
    short = [
        f"{what} needs {need}{unit}, {free}{unit} remain"
        for what, need, free, unit in zip(
            ("cpu", "memory", "gpu"), needs, frees, (" milli-CPU", " slots", ""), strict=True
        )
        if need > free
    ]
    if short:
        raise Unschedulable(
            f"pod {pod} is unschedulable on node {node}: {'; '.join(short)}; "
            "place it on another node"
        )


def _decide_reserve_many(state: NodeState, command: ReservePods, at: datetime) -> list[NodeEvent]:
    if not isinstance(command.specs, tuple) or not command.specs:
        raise InvalidCommand("specs must be a non-empty tuple of OtherPodSpec; list the pods")
    assert state.config is not None  # a present node has its config
    slot = max(1, state.config.memory_slot_bytes)
    # Each pod is checked on the room the pods before it leave, as ReservePod one by one would
    # be; the rounded sums are kept as running totals so the check costs no state per pod.
    raw_cpu, raw_memory = state.other_raw_cpu_milli, state.other_raw_memory_bytes
    held_cpu, held_memory = -(-raw_cpu // MILLI_PER_CPU) * MILLI_PER_CPU, -(-raw_memory // slot)
    cpu_reserved, memory_reserved, gpu_reserved = (
        state.cpu.reserved,
        state.memory.reserved,
        state.gpu_reserved,
    )
    cpu_room = state.cpu.total - state.cpu.system
    memory_room = state.memory.total - state.memory.system
    seen: set[str] = set()
    pods: list[ReservedOtherPod] = []
    for spec in command.specs:
        if not isinstance(spec, OtherPodSpec):
            raise InvalidCommand(
                f"specs lists non-VM pods as OtherPodSpec, got {spec!r}; reserve a VM pod "
                "with ReservePod"
            )
        cpu, memory, gpu = _raw_sums(spec)
        if spec.name in seen:
            raise InvalidCommand(f"specs lists pod {spec.name} twice")
        seen.add(spec.name)
        if spec.name in state.vm_pods:
            raise Rejected(f"pod {spec.name} is already reserved on {state.name} as a VM pod")
        if spec.name in state.other_pods:
            continue  # a retried batch: the pod already holds its resources
        raw_cpu += cpu
        raw_memory += memory
        now_cpu = -(-raw_cpu // MILLI_PER_CPU) * MILLI_PER_CPU
        now_memory = -(-raw_memory // slot)
        needs = (now_cpu - held_cpu, now_memory - held_memory, gpu)
        frees = (
            _sat(cpu_room - cpu_reserved),
            _sat(memory_room - memory_reserved),
            _sat(state.gpu_total - gpu_reserved),
        )
        _check_room(state.name, spec.name, needs, frees)
        cpu_reserved += needs[0]
        memory_reserved += needs[1]
        gpu_reserved += gpu
        held_cpu, held_memory = now_cpu, now_memory
        pods.append(ReservedOtherPod(spec.name, cpu, memory, gpu))
    return [OtherPodsReserved(tuple(pods), at)] if pods else []


# -- the agent protocol --------------------------------------------------------------------------


def _vm_pod(state: NodeState, name: str) -> VmPod:
    pod = state.vm_pods.get(name)
    if pod is None:
        where = "a non-VM pod" if name in state.other_pods else "not a pod"
        raise UnknownPod(f"{name} is {where} on node {state.name}; no VM pod by that name")
    return pod


def _decide_request(
    state: NodeState, command: AgentResourcesRequest, at: datetime
) -> list[NodeEvent]:
    pod = _vm_pod(state, command.pod)
    cpu = _amount(command.cpu_milli, "cpu_milli", "ask in milli-CPU")
    memory = _amount(command.memory_slots, "memory_slots", "ask in memory slots")
    if not pod.scaling_enabled:
        raise ScalingDisabled(
            f"pod {pod.name}'s scaling is disabled: it holds its VM's use "
            f"({pod.cpu.reserved} milli-CPU, {pod.memory.reserved} slots) and takes no permits; "
            "enable scaling for the VM first"
        )
    if not command.fractional_cpu and cpu % MILLI_PER_CPU:
        raise InvalidCommand(
            f"pod {pod.name} asked for {cpu} milli-CPU on a protocol version without fractional "
            "CPU; ask in whole CPUs or upgrade the agent"
        )
    for what, amount, bounds in (("cpu", cpu, pod.cpu), ("memory", memory, pod.memory)):
        if not bounds.min <= amount <= bounds.max:
            raise InvalidCommand(
                f"pod {pod.name} asked for {amount} {what}, outside its VM's bounds "
                f"[{bounds.min}, {bounds.max}]"
            )
    if command.load is not None and not isinstance(command.load, int | float):
        raise InvalidCommand(f"load must be a number, got {command.load!r}")
    if pod.migrating and not _fits_migration(pod, cpu, memory):
        raise MigratingPodMismatch(
            f"pod {pod.name} is migrating and must ask for exactly its reservation "
            f"({pod.cpu.reserved} milli-CPU, {pod.memory.reserved} slots), not "
            f"({cpu}, {memory}) until the migration ends"
        )
    warnings = _unit_warnings(pod, cpu, memory, at)
    grant = _grant(state, pod, command, cpu, memory, at=at, hold=False)
    after = evolve(state, grant)
    if not needs_migration(after):
        return [*warnings, grant]  # nearly every request: no pressure to account for
    started = _start_migrations(after, at)
    mine = next((i for i, e in enumerate(started) if e.pod == pod.name), None)
    increased = grant.cpu_milli > pod.cpu.reserved or grant.memory_slots > pod.memory.reserved
    if mine is None or not increased:
        return [*warnings, grant, *started]
    # Seed 04 (trans.go, ``handleRequested`` while ``startingMigration``): a pod is granted no
    # increase on the request that starts its own migration. What it asked beyond its
    # reservation becomes capacity pressure, which the migration accounts for, so the target
    # node is asked for it instead of this one.
    held = _grant(state, pod, command, cpu, memory, at=at, hold=True)
    held_started = _start_migrations(evolve(state, held), at)
    if any(e.pod == pod.name for e in held_started):
        return [*warnings, held, *held_started]
    # Held back, the node would be at or below its watermarks: it is this very increase that
    # takes it over. The seed decides on the node as the request finds it, so the increase is
    # granted; the pod's own migration waits for the node's next decision (its next request at
    # the latest), and only the pods ahead of it in the queue start now.
    return [*warnings, grant, *started[:mine]]


def _grant(
    state: NodeState,
    pod: VmPod,
    command: AgentResourcesRequest,
    cpu: int,
    memory: int,
    *,
    at: datetime,
    hold: bool,
) -> ResourcesGranted:
    assert state.config is not None  # a present node has its config
    cpu_permit, cpu_pressure = _transition(
        state.cpu, pod.cpu, cpu, whole=not command.fractional_cpu, hold=hold
    )
    memory_permit, memory_pressure = _transition(
        state.memory, pod.memory, memory, whole=False, hold=hold
    )
    return ResourcesGranted(
        pod.name,
        cpu,
        memory,
        cpu_permit,
        memory_permit,
        cpu_pressure,
        memory_pressure,
        state.config.compute_unit,
        None if command.load is None else float(command.load),
        at,
    )


def _fits_migration(pod: VmPod, cpu: int, memory: int) -> bool:
    """A migrating pod asks for exactly its reservation, since the migration was sized by it.

    Except for its first message after a restart: the reservation is then only a bound the agent
    was never told, so the agent may report its real use below it (which releases the buffer).
    """
    if (cpu, memory) == (pod.cpu.reserved, pod.memory.reserved):
        return True
    uncertain = pod.cpu.buffer > 0 or pod.memory.buffer > 0
    return uncertain and cpu <= pod.cpu.reserved and memory <= pod.memory.reserved


def _unit_warnings(pod: VmPod, cpu: int, memory: int, at: datetime) -> list[NodeEvent]:
    # Seed 04, "Changing ComputeUnit": check against the unit the agent was last told, since it
    # cannot know a newer one; before any answer it was told none, so there is nothing to check.
    unit = pod.last_compute_unit
    if unit is None:
        return []
    # Agents scale in compute units: the same whole number of units of CPU and of memory. A VM's
    # bounds need be neither multiples of the unit nor in its ratio, so a request with either
    # resource at its min or max is exempt as a whole (the original's ``atMin || atMax``).
    if cpu in (pod.cpu.min, pod.cpu.max) or memory in (pod.memory.min, pod.memory.max):
        return []
    cpu_units, cpu_rest = divmod(cpu, unit.cpu_milli)
    memory_units, memory_rest = divmod(memory, unit.memory_slots)
    if cpu_rest == memory_rest == 0 and cpu_units == memory_units:
        return []
    return [ComputeUnitMismatch(pod.name, cpu, memory, unit, at)]


def _transition(
    node: ResourceState, pod: PodResource, requested: int, *, whole: bool, hold: bool
) -> tuple[int, int]:
    """``(permit, capacity pressure)`` for one resource of one request; ``hold`` grants no
    increase at all."""
    if requested <= pod.reserved:
        return requested, 0
    wanted = requested - pod.reserved
    if hold:
        return pod.reserved, wanted
    remaining = node.remaining
    if whole:
        remaining -= remaining % MILLI_PER_CPU
    granted = min(wanted, remaining)
    return pod.reserved + granted, wanted - granted


# -- migrations ----------------------------------------------------------------------------------


def _start_migrations(state: NodeState, at: datetime) -> list[MigrationStarted]:
    events: list[MigrationStarted] = []
    if not needs_migration(state):
        return events
    queue = iter(migration_queue(state))
    while needs_migration(state):
        pod = next(queue, None)
        if pod is None:
            break
        event = MigrationStarted(
            pod.name,
            pod.cpu.reserved + pod.cpu.capacity_pressure,
            pod.memory.reserved + pod.memory.capacity_pressure,
            at,
        )
        events.append(event)
        state = evolve(state, event)
    return events


# -- per-VM settings -----------------------------------------------------------------------------


def _check_limits(limits: object, pod: str, what: str) -> Limits:
    if not isinstance(limits, Limits) or not all(type(v) is int for v in (limits.min, limits.max)):
        raise InvalidCommand(f"pod {pod}: {what} must be Limits of integers, got {limits!r}")
    if not 0 <= limits.min <= limits.max:
        raise InvalidCommand(
            f"pod {pod}: {what} needs 0 ≤ min ≤ max, got min {limits.min}, max {limits.max}"
        )
    return limits


def _decide_limits(state: NodeState, command: ChangeVmLimits, at: datetime) -> list[NodeEvent]:
    pod = _vm_pod(state, command.pod)
    cpu = _check_limits(command.cpu, pod.name, "cpu")
    memory = _check_limits(command.memory, pod.name, "memory")
    if (cpu, memory) == (
        Limits(pod.cpu.min, pod.cpu.max),
        Limits(pod.memory.min, pod.memory.max),
    ):
        return []
    cpu_held = _relimited(pod.cpu, cpu, uncertain=pod.awaiting_contact)
    memory_held = _relimited(pod.memory, memory, uncertain=pod.awaiting_contact)
    return [VmLimitsChanged(pod.name, cpu, memory, *cpu_held, *memory_held, at)]


def _relimited(resource: PodResource, limits: Limits, *, uncertain: bool) -> tuple[int, int, int]:
    """``(reserved, buffer, capacity pressure)`` of one resource under new limits."""
    reserved, buffer = resource.reserved, resource.buffer
    if uncertain and limits.max != resource.max:
        # Seed 04 (``handleUpdatedLimits``, before the agent's first contact): the pod is held
        # at a bound on what its agent may have scaled to, which a new max moves — but never
        # below the use last known, which the agent may not have scaled down from yet. A bound
        # below the old max was the logged permit, which still binds; one at the old max was
        # that max (assumed, or the permit was above it), so it becomes the new one.
        using = _sat(resource.reserved - resource.buffer)
        bound = limits.max if resource.reserved >= resource.max else min(limits.max, reserved)
        reserved = max(bound, using)
        buffer = reserved - using
    # An unmet request above the new max can never be granted: it is no pressure any more.
    return reserved, buffer, min(resource.capacity_pressure, _sat(limits.max - reserved))


def _decide_scaling(state: NodeState, command: SetVmScaling, at: datetime) -> list[NodeEvent]:
    pod = _vm_pod(state, command.pod)
    enabled = _switch(command.enabled, "enabled")
    if enabled == pod.scaling_enabled:
        return []
    if enabled:
        return [VmScalingChanged(pod.name, True, pod.cpu.reserved, pod.memory.reserved, at)]
    # Seed 04 (``handleAutoscalingDisabled``): a VM nobody scales any more holds its use; its
    # buffer and capacity pressure go.
    return [
        VmScalingChanged(
            pod.name,
            False,
            _sat(pod.cpu.reserved - pod.cpu.buffer),
            _sat(pod.memory.reserved - pod.memory.buffer),
            at,
        )
    ]


def _decide_use(state: NodeState, command: UpdateVmUse, at: datetime) -> list[NodeEvent]:
    pod = _vm_pod(state, command.pod)
    cpu = _amount(command.cpu_milli, "cpu_milli", "give the VM's milli-CPU in use")
    memory = _amount(command.memory_slots, "memory_slots", "give the VM's memory slots in use")
    if pod.scaling_enabled:
        raise Rejected(
            f"pod {pod.name} scales: its agent's requests set what it holds; only a VM whose "
            "scaling is disabled has its use set (SetVmScaling(enabled=False) first)"
        )
    if (cpu, memory) == (pod.cpu.reserved, pod.memory.reserved):
        return []
    # Seed 04 (non-autoscaling usage change): the VM was resized by hand. That is a fact, so it
    # counts even where it does not fit, like a pod already running; migrations may follow.
    return [VmUseChanged(pod.name, cpu, memory, at)]


def _decide_migration_switch(
    state: NodeState, command: SetVmMigration, at: datetime
) -> list[NodeEvent]:
    pod = _vm_pod(state, command.pod)
    enabled = _switch(command.enabled, "enabled")
    if enabled == pod.migration_enabled:
        return []
    # Switched off, the pod leaves the queue; a migration already started is not called back
    # (the seed only takes the VM out of its queue, and the move may be under way).
    return [VmMigrationChanged(pod.name, enabled, at)]


# -- restarts ------------------------------------------------------------------------------------


def _decide_restart(state: NodeState, command: RestartController, at: datetime) -> list[NodeEvent]:
    if type(command.incarnation) is not int or command.incarnation < 1:
        raise InvalidCommand(f"incarnation must be a positive integer, got {command.incarnation!r}")
    if command.rule not in STARTUP_RULES:
        raise InvalidCommand(
            f"rule must be one of {', '.join(STARTUP_RULES)}, got {command.rule!r}"
        )
    if command.incarnation == state.incarnation:
        return []  # this incarnation already took the node over
    if command.incarnation < state.incarnation:
        raise Rejected(
            f"incarnation {command.incarnation} is older than {state.incarnation}, which already "
            f"took node {state.name} over; a deposed controller must stop"
        )
    observed: dict[str, VmPodSpec] = {}
    for spec in command.observed:
        if not isinstance(spec, VmPodSpec):
            raise InvalidCommand(f"observed lists VM pods as VmPodSpec, got {spec!r}")
        _check_vm_spec(spec, running=True)
        if spec.name in observed:
            raise InvalidCommand(f"observed lists pod {spec.name} twice")
        if spec.name in state.other_pods:
            raise Rejected(f"pod {spec.name} is accounted on {state.name} as a non-VM pod")
        observed[spec.name] = spec
    names = sorted(set(observed) | set(state.vm_pods))
    bounds = tuple(
        _startup_bound(state.vm_pods.get(name), observed.get(name), command.rule) for name in names
    )
    return [ControllerRestarted(command.incarnation, command.rule, bounds, at)]


def _startup_bound(pod: VmPod | None, spec: VmPodSpec | None, rule: StartupRule) -> StartupBound:
    # The listing shows the VM's settings now; a known pod missing from it keeps the log's.
    scaling = spec.scaling_enabled if spec is not None else pod is None or pod.scaling_enabled
    migration = spec.migration_enabled if spec is not None else pod is None or pod.migration_enabled
    if pod is None:
        assert spec is not None  # every name comes from the log or the listing
        # Never seen by the log: nothing bounds what its agent may have scaled to but its max.
        cpu_reserved = _bound(None, spec.cpu, rule, scaling=scaling)
        memory_reserved = _bound(None, spec.memory, rule, scaling=scaling)
        return StartupBound(
            pod=spec.name,
            cpu=spec.cpu,
            memory=spec.memory,
            gpu=spec.gpu,
            cpu_reserved=cpu_reserved,
            cpu_buffer=cpu_reserved - spec.cpu.use,
            memory_reserved=memory_reserved,
            memory_buffer=memory_reserved - spec.memory.use,
            known=False,
            scaling_enabled=scaling,
            migration_enabled=migration,
        )
    cpu = spec.cpu if spec is not None else Bounds(pod.cpu.min, pod.cpu.use, pod.cpu.max)
    memory = (
        spec.memory if spec is not None else Bounds(pod.memory.min, pod.memory.use, pod.memory.max)
    )
    cpu_reserved = _bound(pod.cpu.reserved, cpu, rule, scaling=scaling)
    memory_reserved = _bound(pod.memory.reserved, memory, rule, scaling=scaling)
    return StartupBound(
        pod=pod.name,
        cpu=cpu,
        memory=memory,
        gpu=pod.gpu,
        cpu_reserved=cpu_reserved,
        cpu_buffer=cpu_reserved - cpu.use,
        memory_reserved=memory_reserved,
        memory_buffer=memory_reserved - memory.use,
        known=True,
        scaling_enabled=scaling,
        migration_enabled=migration,
    )


def _bound(last_permit: int | None, bounds: Bounds, rule: StartupRule, *, scaling: bool) -> int:
    """What a restart holds for one resource: never less than the use the cluster shows."""
    if not scaling:
        # Seed 04: a VM nobody scales uses exactly what the cluster shows; nothing is uncertain.
        return bounds.use
    if rule == "assume_max" or last_permit is None:
        return max(bounds.max, bounds.use)
    # A use above the logged permit means the VM was changed by hand: never hold less than what
    # is in use, never more than the VM can reach (unless it already uses more, its max having
    # just been lowered).
    return max(bounds.use, min(bounds.max, last_permit))
