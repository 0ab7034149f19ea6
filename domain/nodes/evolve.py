"""Evolve for node accounting: apply one recorded fact to a node's state.

Events are facts already decided, so nothing here refuses one; each amount saturates at zero so
that even a log written under other rules loads. A fact about a pod the node no longer holds
changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from fleetledger.domain.frozen import positional
from fleetledger.domain.nodes.model import (
    ComputeUnitMismatch,
    ComputeUnitViolated,
    ControllerRestarted,
    MigrationStarted,
    NodeCapacityChanged,
    NodeConfigChanged,
    NodeEvent,
    NodeJoined,
    NodeLeft,
    NodeState,
    OtherPod,
    OtherPodReserved,
    OtherPodsReserved,
    PodDeleted,
    PodResource,
    ResourcesGranted,
    ResourceState,
    VmLimitsChanged,
    VmMigrationChanged,
    VmPod,
    VmPodReserved,
    VmScalingChanged,
    VmUseChanged,
)
from fleetledger.domain.nodes.queries import other_reserved, other_rounded

__all__ = ["evolve"]

# The states the frequent events fold into are built by writing their slots, every field in order
# (see fleetledger.domain.frozen): ``replace`` and the classes' own ``__init__`` cost several
# times more, and a replay folds an event per agent request. The rare events keep ``replace``.
_node = positional(NodeState)
_resource = positional(ResourceState)
_vm_pod = positional(VmPod)
_pod_resource = positional(PodResource)


def _sat(value: int) -> int:
    return value if value > 0 else 0


def _with_reserved(resource: ResourceState, reserved: int) -> ResourceState:
    return _resource(
        resource.total,
        resource.system,
        resource.watermark_fraction,
        reserved,
        resource.buffer,
        resource.capacity_pressure,
        resource.pressure_accounted_for,
    )


def evolve(state: NodeState, event: NodeEvent) -> NodeState:
    """Apply one event. Events are facts: nothing here refuses them, and every amount saturates."""
    if type(event) is ResourcesGranted:
        return _apply_granted(state, event)
    if type(event) is ComputeUnitMismatch or type(event) is ComputeUnitViolated:
        return state
    if type(event) is VmPodReserved:
        return _apply_vm_reserved(state, event)
    if type(event) is OtherPodReserved:
        return _apply_other_reserved(state, event)
    if type(event) is OtherPodsReserved:
        return _apply_others_reserved(state, event)
    if type(event) is PodDeleted:
        return _apply_deleted(state, event)
    if type(event) is MigrationStarted:
        return _apply_migration(state, event)
    if type(event) is NodeConfigChanged:
        return _apply_config(state, event)
    if type(event) is NodeCapacityChanged:
        return _apply_capacity(state, event)
    if type(event) is ControllerRestarted:
        return _apply_restarted(state, event)
    if type(event) is VmLimitsChanged:
        return _apply_limits(state, event)
    if type(event) is VmScalingChanged:
        return _apply_scaling(state, event)
    if type(event) is VmUseChanged:
        return _apply_use(state, event)
    if type(event) is VmMigrationChanged:
        return _apply_migration_switch(state, event)
    if type(event) is NodeJoined:
        return _apply_joined(state, event)
    if type(event) is NodeLeft:
        return NodeState(name=state.name, incarnation=state.incarnation)
    raise TypeError(f"not a node event: {event!r}")


def _apply_joined(state: NodeState, event: NodeJoined) -> NodeState:
    config = event.config
    return _node(
        event.node,
        True,
        config,
        _resource(event.cpu_total_milli, config.cpu_system_milli, config.cpu_watermark, 0, 0, 0, 0),
        _resource(
            event.memory_total_slots,
            config.memory_system_slots,
            config.memory_watermark,
            0,
            0,
            0,
            0,
        ),
        event.gpu_total,
        0,  # gpu_reserved
        {},  # vm_pods
        {},  # other_pods
        0,  # other_raw_cpu_milli
        0,  # other_raw_memory_bytes
        state.incarnation,
    )


def _apply_capacity(state: NodeState, event: NodeCapacityChanged) -> NodeState:
    return replace(
        state,
        cpu=replace(state.cpu, total=event.cpu_total_milli),
        memory=replace(state.memory, total=event.memory_total_slots),
        gpu_total=event.gpu_total,
    )


def _apply_config(state: NodeState, event: NodeConfigChanged) -> NodeState:
    config = event.config
    return replace(
        state,
        config=config,
        cpu=replace(
            state.cpu, system=config.cpu_system_milli, watermark_fraction=config.cpu_watermark
        ),
        memory=replace(
            state.memory,
            system=config.memory_system_slots,
            watermark_fraction=config.memory_watermark,
        ),
    )


def _apply_vm_reserved(state: NodeState, event: VmPodReserved) -> NodeState:
    cpu, memory = event.cpu, event.memory
    pod = _vm_pod(
        event.pod,
        _pod_resource(cpu.min, cpu.use, cpu.max, event.cpu_reserved, 0, 0),
        _pod_resource(memory.min, memory.use, memory.max, event.memory_reserved, 0, 0),
        event.gpu,
        None,  # last_compute_unit
        False,  # migrating
        0,  # cpu_accounted
        0,  # memory_accounted
        None,  # load
        event.scaling_enabled,
        event.migration_enabled,
        False,  # awaiting_contact
    )
    pods = dict(state.vm_pods)
    pods[event.pod] = pod
    return _node(
        state.name,
        state.present,
        state.config,
        _with_reserved(state.cpu, state.cpu.reserved + event.cpu_reserved),
        _with_reserved(state.memory, state.memory.reserved + event.memory_reserved),
        state.gpu_total,
        state.gpu_reserved + event.gpu,
        pods,
        state.other_pods,
        state.other_raw_cpu_milli,
        state.other_raw_memory_bytes,
        state.incarnation,
    )


def _apply_other_reserved(state: NodeState, event: OtherPodReserved) -> NodeState:
    pods = dict(state.other_pods)
    pods[event.pod] = OtherPod(event.pod, event.raw_cpu_milli, event.raw_memory_bytes, event.gpu)
    return _with_others(
        state,
        pods,
        state.other_raw_cpu_milli + event.raw_cpu_milli,
        state.other_raw_memory_bytes + event.raw_memory_bytes,
        state.gpu_reserved + event.gpu,
    )


def _apply_others_reserved(state: NodeState, event: OtherPodsReserved) -> NodeState:
    # One pass for the whole batch: the rounded sums telescope, so rounding once after adding
    # every pod's raw amounts gives the same reserved as rounding after each.
    other_pods = dict(state.other_pods)
    raw_cpu = raw_memory = gpu = 0
    for reserved in event.pods:
        other_pods[reserved.pod] = OtherPod(
            reserved.pod,
            reserved.raw_cpu_milli,
            reserved.raw_memory_bytes,
            reserved.gpu,
            held=True,
        )
        raw_cpu += reserved.raw_cpu_milli
        raw_memory += reserved.raw_memory_bytes
        gpu += reserved.gpu
    return _with_others(
        state,
        other_pods,
        state.other_raw_cpu_milli + raw_cpu,
        state.other_raw_memory_bytes + raw_memory,
        state.gpu_reserved + gpu,
    )


def _with_others(
    state: NodeState,
    other_pods: dict[str, OtherPod],
    raw_cpu_milli: int,
    raw_memory_bytes: int,
    gpu_reserved: int,
) -> NodeState:
    """``state`` with its non-VM pods and their raw sums replaced, and its reserved amounts
    moved by what that changes in the rounded sums."""
    # Only the rounded sums count toward reserved, so a pod changes reserved by the difference
    # its raw amounts make to the rounded totals (possibly nothing).
    cpu_before, memory_before = other_reserved(state)
    cpu_after, memory_after = other_rounded(state.config, raw_cpu_milli, raw_memory_bytes)
    cpu, memory = state.cpu, state.memory
    return _node(
        state.name,
        state.present,
        state.config,
        _with_reserved(cpu, _sat(cpu.reserved + cpu_after - cpu_before)),
        _with_reserved(memory, _sat(memory.reserved + memory_after - memory_before)),
        state.gpu_total,
        gpu_reserved,
        state.vm_pods,
        other_pods,
        raw_cpu_milli,
        raw_memory_bytes,
        state.incarnation,
    )


def _apply_deleted(state: NodeState, event: PodDeleted) -> NodeState:
    other = state.other_pods.get(event.pod)
    if other is not None:
        others = dict(state.other_pods)
        del others[event.pod]
        return _with_others(
            state,
            others,
            _sat(state.other_raw_cpu_milli - other.raw_cpu_milli),
            _sat(state.other_raw_memory_bytes - other.raw_memory_bytes),
            _sat(state.gpu_reserved - other.gpu),
        )
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    pods = dict(state.vm_pods)
    del pods[event.pod]
    return _node(
        state.name,
        state.present,
        state.config,
        _release(state.cpu, pod.cpu, pod.cpu_accounted if pod.migrating else 0),
        _release(state.memory, pod.memory, pod.memory_accounted if pod.migrating else 0),
        state.gpu_total,
        _sat(state.gpu_reserved - pod.gpu),
        pods,
        state.other_pods,
        state.other_raw_cpu_milli,
        state.other_raw_memory_bytes,
        state.incarnation,
    )


def _release(node: ResourceState, pod: PodResource, accounted: int) -> ResourceState:
    return _resource(
        node.total,
        node.system,
        node.watermark_fraction,
        _sat(node.reserved - pod.reserved),
        _sat(node.buffer - pod.buffer),
        _sat(node.capacity_pressure - pod.capacity_pressure),
        _sat(node.pressure_accounted_for - accounted),
    )


def _apply_granted(state: NodeState, event: ResourcesGranted) -> NodeState:
    # The hot path of the agent protocol: built field by field, not with ``replace``, which
    # costs several times more per call and runs once per request (and once more per replay).
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    cpu_node, cpu_pod = _regrant(state.cpu, pod.cpu, event.cpu_milli, event.cpu_pressure)
    memory_node, memory_pod = _regrant(
        state.memory, pod.memory, event.memory_slots, event.memory_pressure
    )
    granted = _vm_pod(
        pod.name,
        cpu_pod,
        memory_pod,
        pod.gpu,
        event.compute_unit,
        pod.migrating,
        pod.cpu_accounted,
        pod.memory_accounted,
        event.load if event.load is not None else pod.load,
        pod.scaling_enabled,
        pod.migration_enabled,
        False,  # its agent spoke: nothing is uncertain about it any more
    )
    pods = dict(state.vm_pods)
    pods[event.pod] = granted
    return _node(
        state.name,
        state.present,
        state.config,
        cpu_node,
        memory_node,
        state.gpu_total,
        state.gpu_reserved,
        pods,
        state.other_pods,
        state.other_raw_cpu_milli,
        state.other_raw_memory_bytes,
        state.incarnation,
    )


def _regrant(
    node: ResourceState, pod: PodResource, permit: int, pressure: int
) -> tuple[ResourceState, PodResource]:
    # The agent uses at most its permit, and its message told us its real use: the buffer goes.
    new_node = _resource(
        node.total,
        node.system,
        node.watermark_fraction,
        _sat(node.reserved - pod.reserved + permit),
        _sat(node.buffer - pod.buffer),
        _sat(node.capacity_pressure - pod.capacity_pressure + pressure),
        node.pressure_accounted_for,
    )
    return new_node, _pod_resource(pod.min, permit, pod.max, permit, 0, pressure)


def _apply_migration(state: NodeState, event: MigrationStarted) -> NodeState:
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    moving = replace(
        pod,
        migrating=True,
        cpu_accounted=event.cpu_accounted,
        memory_accounted=event.memory_accounted,
    )
    cpu, memory = state.cpu, state.memory
    return replace(
        state,
        vm_pods={**state.vm_pods, event.pod: moving},
        cpu=replace(cpu, pressure_accounted_for=cpu.pressure_accounted_for + event.cpu_accounted),
        memory=replace(
            memory,
            pressure_accounted_for=memory.pressure_accounted_for + event.memory_accounted,
        ),
    )


def _apply_restarted(state: NodeState, event: ControllerRestarted) -> NodeState:
    pods = dict(state.vm_pods)
    cpu, memory, gpu = state.cpu, state.memory, state.gpu_reserved
    for bound in event.bounds:
        old = pods.get(bound.pod)
        # Only its agent can tell what a VM uses now; a VM that does not scale has none.
        scaling, migration = bound.scaling_enabled, bound.migration_enabled
        # Capacity pressure is a request still wanted: it survives the restart (unless the VM
        # no longer scales, so nothing can want more).
        cpu_pressure = memory_pressure = 0
        if old is not None and scaling:
            cpu_pressure, memory_pressure = old.cpu.capacity_pressure, old.memory.capacity_pressure
        new_cpu = _pod_resource(
            bound.cpu.min,
            bound.cpu.use,
            bound.cpu.max,
            bound.cpu_reserved,
            bound.cpu_buffer,
            cpu_pressure,
        )
        new_memory = _pod_resource(
            bound.memory.min,
            bound.memory.use,
            bound.memory.max,
            bound.memory_reserved,
            bound.memory_buffer,
            memory_pressure,
        )
        if old is None:
            pods[bound.pod] = _vm_pod(
                bound.pod,
                new_cpu,
                new_memory,
                bound.gpu,
                None,  # last_compute_unit
                False,  # migrating
                0,  # cpu_accounted
                0,  # memory_accounted
                None,  # load
                scaling,
                migration,
                scaling,  # awaiting_contact: only a VM that scales has an agent to hear from
            )
            gpu += bound.gpu
            cpu = _added(cpu, new_cpu)
            memory = _added(memory, new_memory)
            continue
        pods[bound.pod] = _vm_pod(
            old.name,
            new_cpu,
            new_memory,
            old.gpu,
            old.last_compute_unit,
            old.migrating,
            old.cpu_accounted,
            old.memory_accounted,
            old.load,
            scaling,
            migration,
            scaling,  # awaiting_contact
        )
        cpu = _repod(cpu, old.cpu, new_cpu)
        memory = _repod(memory, old.memory, new_memory)
    return _node(
        state.name,
        state.present,
        state.config,
        cpu,
        memory,
        state.gpu_total,
        gpu,
        pods,
        state.other_pods,
        state.other_raw_cpu_milli,
        state.other_raw_memory_bytes,
        event.incarnation,
    )


def _added(node: ResourceState, new: PodResource) -> ResourceState:
    return _resource(
        node.total,
        node.system,
        node.watermark_fraction,
        node.reserved + new.reserved,
        node.buffer + new.buffer,
        node.capacity_pressure,
        node.pressure_accounted_for,
    )


def _repod(node: ResourceState, old: PodResource, new: PodResource) -> ResourceState:
    """The node's figures once one pod's resource goes from ``old`` to ``new``."""
    return _resource(
        node.total,
        node.system,
        node.watermark_fraction,
        _sat(node.reserved - old.reserved + new.reserved),
        _sat(node.buffer - old.buffer + new.buffer),
        _sat(node.capacity_pressure - old.capacity_pressure + new.capacity_pressure),
        node.pressure_accounted_for,
    )


def _with_pod(state: NodeState, old: VmPod, new: VmPod) -> NodeState:
    return replace(
        state,
        vm_pods={**state.vm_pods, new.name: new},
        cpu=_repod(state.cpu, old.cpu, new.cpu),
        memory=_repod(state.memory, old.memory, new.memory),
    )


def _apply_limits(state: NodeState, event: VmLimitsChanged) -> NodeState:
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    cpu = PodResource(
        event.cpu.min,
        pod.cpu.use,
        event.cpu.max,
        event.cpu_reserved,
        event.cpu_buffer,
        event.cpu_pressure,
    )
    memory = PodResource(
        event.memory.min,
        pod.memory.use,
        event.memory.max,
        event.memory_reserved,
        event.memory_buffer,
        event.memory_pressure,
    )
    return _with_pod(state, pod, replace(pod, cpu=cpu, memory=memory))


def _apply_scaling(state: NodeState, event: VmScalingChanged) -> NodeState:
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    if event.enabled:
        cpu = replace(pod.cpu, reserved=event.cpu_reserved)
        memory = replace(pod.memory, reserved=event.memory_reserved)
        changed = replace(pod, cpu=cpu, memory=memory, scaling_enabled=True)
        return _with_pod(state, pod, changed)
    return _with_pod(
        state,
        pod,
        replace(
            pod,
            cpu=_held_at_use(pod.cpu, event.cpu_reserved),
            memory=_held_at_use(pod.memory, event.memory_reserved),
            scaling_enabled=False,
            awaiting_contact=False,
        ),
    )


def _held_at_use(resource: PodResource, use: int) -> PodResource:
    # A VM nobody scales holds exactly what it uses: no buffer, no request left unmet.
    return PodResource(resource.min, use, resource.max, use)


def _apply_use(state: NodeState, event: VmUseChanged) -> NodeState:
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    changed = replace(
        pod,
        cpu=_held_at_use(pod.cpu, event.cpu_milli),
        memory=_held_at_use(pod.memory, event.memory_slots),
    )
    return _with_pod(state, pod, changed)


def _apply_migration_switch(state: NodeState, event: VmMigrationChanged) -> NodeState:
    pod = state.vm_pods.get(event.pod)
    if pod is None:
        return state
    changed = replace(pod, migration_enabled=event.enabled)
    return replace(state, vm_pods={**state.vm_pods, pod.name: changed})
