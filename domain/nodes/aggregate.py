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
  A migrating pod must ask for exactly its reservation (or, first after a restart, its real use
  below it). An amount that is not a multiple of the compute unit *last sent to that pod* (the
  agent cannot know a newer one) is recorded as a :class:`ComputeUnitViolated` warning, not
  refused; the pod's min and max are exempt.
* **Pressure**: a resource needs migrations when ``logical + capacity pressure`` exceeds what
  started migrations account for plus slack (buffer, and room below the watermark). Every decision
  that can raise pressure then starts migrations from the queue — pods with metrics first, then
  the lowest load, then by name — until the pressure is accounted for.
* **Config changes** apply at once; ``reserved`` may then exceed ``total − system`` and every
  difference saturates at zero.
* **Startup uncertainty**: agents keep scaling within their last permit while no controller
  answers. The seed, not knowing that permit, holds every VM pod at its max. The log knows it: on
  :class:`RestartController` a VM pod holds ``min(max, last logged permit)`` (never below the use
  the cluster shows) with ``buffer = reserved − last known use``; a pod the log never saw falls
  back to its max. The pod's first request then sets its real use and zeroes its buffer.

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
    ComputeUnit,
    ComputeUnitViolated,
    ContainerResources,
    ControllerRestarted,
    DeletePod,
    JoinNode,
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
    Resource,
    ResourcesGranted,
    ResourceState,
    RestartController,
    StartupBound,
    StartupRule,
    UnknownPod,
    Unschedulable,
    UpdateNodeCapacity,
    VmPod,
    VmPodReserved,
    VmPodSpec,
)
from fleetledger.domain.nodes.queries import (
    migration_queue,
    needs_migration,
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
        events = _decide_request(state, command, at)
    elif type(command) is ReservePod:
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
    slots = memory // state.config.memory_slot_bytes
    if (cpu, slots, gpu) == (state.cpu.total, state.memory.total, state.gpu_total):
        return []
    return [NodeCapacityChanged(cpu, slots, gpu, at)]


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


def _check_bounds(bounds: object, pod: str, what: str) -> Bounds:
    if not isinstance(bounds, Bounds) or not all(
        type(v) is int for v in (bounds.min, bounds.use, bounds.max)
    ):
        raise InvalidCommand(f"pod {pod}: {what} must be Bounds of integers, got {bounds!r}")
    if not 0 <= bounds.min <= bounds.use <= bounds.max:
        raise InvalidCommand(
            f"pod {pod}: {what} needs 0 ≤ min ≤ use ≤ max, got min {bounds.min}, "
            f"use {bounds.use}, max {bounds.max}"
        )
    return bounds


def _check_vm_spec(spec: VmPodSpec) -> None:
    if not isinstance(spec.name, str) or not spec.name:
        raise InvalidCommand("a pod needs a non-empty name")
    _check_bounds(spec.cpu, spec.name, "cpu")
    _check_bounds(spec.memory, spec.name, "memory")
    _amount(spec.gpu, f"pod {spec.name}: gpu", "give the GPUs the pod asks for")


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
        _check_vm_spec(spec)
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


def _decide_request(
    state: NodeState, command: AgentResourcesRequest, at: datetime
) -> list[NodeEvent]:
    pod = state.vm_pods.get(command.pod)
    if pod is None:
        where = "a non-VM pod" if command.pod in state.other_pods else "not a pod"
        raise UnknownPod(f"{command.pod} is {where} on node {state.name}; no VM pod by that name")
    cpu = _amount(command.cpu_milli, "cpu_milli", "ask in milli-CPU")
    memory = _amount(command.memory_slots, "memory_slots", "ask in memory slots")
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
    events: list[NodeEvent] = _unit_warnings(pod, cpu, memory, at)
    cpu_permit, cpu_pressure = _transition(
        state.cpu, pod.cpu, cpu, whole=not command.fractional_cpu
    )
    memory_permit, memory_pressure = _transition(state.memory, pod.memory, memory, whole=False)
    assert state.config is not None  # a present node has its config
    events.append(
        ResourcesGranted(
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
    )
    return events


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
    found: list[NodeEvent] = []
    checks: tuple[tuple[Resource, int, int, PodResource], ...] = (
        ("cpu", cpu, unit.cpu_milli, pod.cpu),
        ("memory", memory, unit.memory_slots, pod.memory),
    )
    for resource, amount, step, bounds in checks:
        if amount % step and amount not in (bounds.min, bounds.max):
            found.append(ComputeUnitViolated(pod.name, resource, amount, step, at))
    return found


def _transition(
    node: ResourceState, pod: PodResource, requested: int, *, whole: bool
) -> tuple[int, int]:
    """``(permit, capacity pressure)`` for one resource of one request."""
    if requested <= pod.reserved:
        return requested, 0
    wanted = requested - pod.reserved
    remaining = node.remaining
    if whole:
        remaining -= remaining % MILLI_PER_CPU
    granted = min(wanted, remaining)
    return pod.reserved + granted, wanted - granted


# -- migrations ----------------------------------------------------------------------------------


def _start_migrations(state: NodeState, at: datetime) -> list[NodeEvent]:
    events: list[NodeEvent] = []
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
        _check_vm_spec(spec)
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
    if pod is None:
        assert spec is not None  # every name comes from the log or the listing
        # Never seen by the log: nothing bounds what its agent may have scaled to but its max.
        return StartupBound(
            pod=spec.name,
            cpu=spec.cpu,
            memory=spec.memory,
            gpu=spec.gpu,
            cpu_reserved=spec.cpu.max,
            cpu_buffer=spec.cpu.max - spec.cpu.use,
            memory_reserved=spec.memory.max,
            memory_buffer=spec.memory.max - spec.memory.use,
            known=False,
        )
    cpu = spec.cpu if spec is not None else Bounds(pod.cpu.min, pod.cpu.use, pod.cpu.max)
    memory = (
        spec.memory if spec is not None else Bounds(pod.memory.min, pod.memory.use, pod.memory.max)
    )
    cpu_reserved = _bound(pod.cpu.reserved, cpu, rule)
    memory_reserved = _bound(pod.memory.reserved, memory, rule)
    return StartupBound(
        pod=pod.name,
        cpu=cpu,
        memory=memory,
        gpu=pod.gpu,
        cpu_reserved=cpu_reserved,
        cpu_buffer=_sat(cpu_reserved - cpu.use),
        memory_reserved=memory_reserved,
        memory_buffer=_sat(memory_reserved - memory.use),
        known=True,
    )


def _bound(last_permit: int, bounds: Bounds, rule: StartupRule) -> int:
    if rule == "assume_max":
        return bounds.max
    # A use above the logged permit means the VM was changed by hand: never hold less than what
    # is in use, never more than the VM can reach.
    return min(bounds.max, max(last_permit, bounds.use))
