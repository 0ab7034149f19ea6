"""Snapshots of a node's state: JSON-ready data and back, exactly.

A node's stream grows by an event per agent request (an agent asks every few seconds), so the
host loads it from a snapshot plus the events after it. ``state_from_snapshot(snapshot(s)) == s``
for every state; a change to this shape needs a new ``SNAPSHOT_SCHEMA_VERSION`` so older snapshots
are ignored and the stream folded from its start instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetledger.domain.nodes.model import (
    ComputeUnit,
    NodeConfig,
    NodeState,
    OtherPod,
    PodResource,
    ResourceState,
    VmPod,
)

__all__ = ["SNAPSHOT_SCHEMA_VERSION", "snapshot", "state_from_snapshot"]

SNAPSHOT_SCHEMA_VERSION = 3

Data = dict[str, Any]


def snapshot(state: NodeState) -> Data:
    """``state`` as JSON-ready data (pods sorted by name)."""
    config = state.config
    return {
        "name": state.name,
        "present": state.present,
        "incarnation": state.incarnation,
        "config": None if config is None else _config(config),
        "cpu": _resource(state.cpu),
        "memory": _resource(state.memory),
        "gpu_total": state.gpu_total,
        "gpu_reserved": state.gpu_reserved,
        "other_raw_cpu_milli": state.other_raw_cpu_milli,
        "other_raw_memory_bytes": state.other_raw_memory_bytes,
        "vm_pods": [_vm_pod(state.vm_pods[name]) for name in sorted(state.vm_pods)],
        "other_pods": [
            [pod.name, pod.raw_cpu_milli, pod.raw_memory_bytes, pod.gpu, pod.held]
            for pod in (state.other_pods[name] for name in sorted(state.other_pods))
        ],
    }


def state_from_snapshot(data: Mapping[str, Any]) -> NodeState:
    """The state :func:`snapshot` saved."""
    config = data["config"]
    vm_pods = {pod["name"]: _vm_pod_from(pod) for pod in data["vm_pods"]}
    other_pods = {
        name: OtherPod(name, cpu, memory, gpu, held)
        for name, cpu, memory, gpu, held in data["other_pods"]
    }
    return NodeState(
        name=data["name"],
        present=data["present"],
        config=None if config is None else _config_from(config),
        cpu=_resource_from(data["cpu"]),
        memory=_resource_from(data["memory"]),
        gpu_total=data["gpu_total"],
        gpu_reserved=data["gpu_reserved"],
        vm_pods=vm_pods,
        other_pods=other_pods,
        other_raw_cpu_milli=data["other_raw_cpu_milli"],
        other_raw_memory_bytes=data["other_raw_memory_bytes"],
        incarnation=data["incarnation"],
    )


def _config(config: NodeConfig) -> Data:
    return {
        "cpu_system_milli": config.cpu_system_milli,
        "memory_system_slots": config.memory_system_slots,
        "cpu_watermark": config.cpu_watermark,
        "memory_watermark": config.memory_watermark,
        "compute_unit": [config.compute_unit.cpu_milli, config.compute_unit.memory_slots],
        "memory_slot_bytes": config.memory_slot_bytes,
    }


def _config_from(data: Mapping[str, Any]) -> NodeConfig:
    return NodeConfig(
        cpu_system_milli=data["cpu_system_milli"],
        memory_system_slots=data["memory_system_slots"],
        cpu_watermark=float(data["cpu_watermark"]),
        memory_watermark=float(data["memory_watermark"]),
        compute_unit=ComputeUnit(*data["compute_unit"]),
        memory_slot_bytes=data["memory_slot_bytes"],
    )


def _resource(resource: ResourceState) -> list[Any]:
    return [
        resource.total,
        resource.system,
        resource.watermark_fraction,
        resource.reserved,
        resource.buffer,
        resource.capacity_pressure,
        resource.pressure_accounted_for,
    ]


def _resource_from(data: list[Any]) -> ResourceState:
    total, system, fraction, reserved, buffer, pressure, accounted = data
    return ResourceState(total, system, float(fraction), reserved, buffer, pressure, accounted)


def _pod_resource(resource: PodResource) -> list[int]:
    return [
        resource.min,
        resource.use,
        resource.max,
        resource.reserved,
        resource.buffer,
        resource.capacity_pressure,
    ]


def _vm_pod(pod: VmPod) -> Data:
    unit = pod.last_compute_unit
    return {
        "name": pod.name,
        "cpu": _pod_resource(pod.cpu),
        "memory": _pod_resource(pod.memory),
        "gpu": pod.gpu,
        "last_compute_unit": None if unit is None else [unit.cpu_milli, unit.memory_slots],
        "migrating": pod.migrating,
        "accounted": [pod.cpu_accounted, pod.memory_accounted],
        "load": pod.load,
        "settings": [pod.scaling_enabled, pod.migration_enabled, pod.awaiting_contact],
    }


def _vm_pod_from(data: Mapping[str, Any]) -> VmPod:
    unit = data["last_compute_unit"]
    load = data["load"]
    cpu_accounted, memory_accounted = data["accounted"]
    scaling, migration, awaiting = data["settings"]
    return VmPod(
        data["name"],
        PodResource(*data["cpu"]),
        PodResource(*data["memory"]),
        data["gpu"],
        None if unit is None else ComputeUnit(*unit),
        data["migrating"],
        cpu_accounted,
        memory_accounted,
        None if load is None else float(load),
        scaling,
        migration,
        awaiting,
    )
