"""Dumpstate: the whole node accounting as JSON-ready dicts (seed 04's ``dumpstate.go``).

Pure functions of states and a log position, so a live dump and a dump replayed to the same
position are equal. Keys come in a fixed order and nodes and pods sorted by name, so the JSON text
is byte-identical too whatever order the caller's mapping or the pods arrived in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from fleetledger.domain.nodes.model import (
    NodeConfig,
    NodeState,
    OtherPod,
    PodResource,
    ResourceState,
    VmPod,
)
from fleetledger.domain.nodes.queries import (
    migration_queue,
    needs_migration,
    other_reserved,
)

__all__ = ["dump_node", "dumpstate", "fleet_migration_queue"]

Json = dict[str, object]


def dumpstate(
    nodes: Iterable[NodeState],
    *,
    position: int,
    settings: Mapping[str, object] | None = None,
    dump: Callable[[NodeState], Json] | None = None,
) -> Json:
    """The fleet as of log ``position``: ``position``, ``config``, ``nodes``, ``migration_queue``.

    ``config`` holds the controller-wide ``settings`` the caller passes (sorted by key) and each
    node's own settings; each entry of ``nodes`` holds that node's resources and pods.

    ``dump``: what :func:`dump_node` (the default) gives for a state, which a caller may have
    kept from an earlier dump (states are immutable values); its dicts are read, not changed,
    so the result shares them: treat it as read-only.
    """
    ordered = sorted(nodes, key=lambda state: state.name)
    dump_one = dump_node if dump is None else dump
    dumped = {state.name: dump_one(state) for state in ordered}
    return {
        "position": position,
        "config": {
            "controller": {key: (settings or {})[key] for key in sorted(settings or {})},
            "nodes": {name: node["config"] for name, node in dumped.items()},
        },
        "nodes": {
            name: {key: value for key, value in node.items() if key != "config"}
            for name, node in dumped.items()
        },
        "migration_queue": fleet_migration_queue(ordered),
    }


def dump_node(state: NodeState) -> Json:
    """One node: its settings, resources (with derived figures) and pods."""
    other_cpu, other_memory = other_reserved(state)
    return {
        "name": state.name,
        "present": state.present,
        "incarnation": state.incarnation,
        "config": _config(state.config),
        "resources": {
            "cpu": _resource(state.cpu),
            "memory": _resource(state.memory),
            "gpu": {"total": state.gpu_total, "reserved": state.gpu_reserved},
        },
        "other_pods_total": {
            "raw_cpu_milli": state.other_raw_cpu_milli,
            "raw_memory_bytes": state.other_raw_memory_bytes,
            "reserved_cpu_milli": other_cpu,
            "reserved_memory_slots": other_memory,
        },
        "needs_migration": needs_migration(state),
        "pods": {
            "vm": {name: _vm_pod(state.vm_pods[name]) for name in sorted(state.vm_pods)},
            "other": {
                name: _other_pod(state.other_pods[name]) for name in sorted(state.other_pods)
            },
        },
    }


def fleet_migration_queue(nodes: Iterable[NodeState]) -> list[Json]:
    """Every pod that may still migrate, fleet-wide, in queue order (metrics first, lowest load);
    pods whose VM may not be migrated are left out."""
    entries = [(pod, state) for state in nodes for pod in migration_queue(state)]
    entries.sort(key=lambda e: (not e[0].has_metrics, e[0].load or 0.0, e[1].name, e[0].name))
    return [
        {
            "node": state.name,
            "pod": pod.name,
            "has_metrics": pod.has_metrics,
            "load": pod.load,
            "node_needs_migration": needs_migration(state),
        }
        for pod, state in entries
    ]


def _config(config: NodeConfig | None) -> Json | None:
    if config is None:
        return None
    return {
        "cpu_system_milli": config.cpu_system_milli,
        "memory_system_slots": config.memory_system_slots,
        "cpu_watermark": config.cpu_watermark,
        "memory_watermark": config.memory_watermark,
        "compute_unit": {
            "cpu_milli": config.compute_unit.cpu_milli,
            "memory_slots": config.compute_unit.memory_slots,
        },
        "memory_slot_bytes": config.memory_slot_bytes,
    }


def _resource(resource: ResourceState) -> Json:
    return {
        "total": resource.total,
        "system": resource.system,
        "reserved": resource.reserved,
        "buffer": resource.buffer,
        "watermark": resource.watermark,
        "watermark_fraction": resource.watermark_fraction,
        "remaining": resource.remaining,
        "logical_pressure": resource.logical_pressure,
        "capacity_pressure": resource.capacity_pressure,
        "pressure_accounted_for": resource.pressure_accounted_for,
    }


def _pod_resource(resource: PodResource) -> Json:
    return {
        "min": resource.min,
        "use": resource.use,
        "max": resource.max,
        "reserved": resource.reserved,
        "buffer": resource.buffer,
        "capacity_pressure": resource.capacity_pressure,
    }


def _vm_pod(pod: VmPod) -> Json:
    unit = pod.last_compute_unit
    return {
        "cpu": _pod_resource(pod.cpu),
        "memory": _pod_resource(pod.memory),
        "gpu": pod.gpu,
        "last_compute_unit": None
        if unit is None
        else {"cpu_milli": unit.cpu_milli, "memory_slots": unit.memory_slots},
        "migrating": pod.migrating,
        "accounted": {"cpu": pod.cpu_accounted, "memory": pod.memory_accounted},
        "has_metrics": pod.has_metrics,
        "load": pod.load,
        "scaling_enabled": pod.scaling_enabled,
        "migration_enabled": pod.migration_enabled,
        "awaiting_contact": pod.awaiting_contact,
    }


def _other_pod(pod: OtherPod) -> Json:
    return {
        "raw_cpu_milli": pod.raw_cpu_milli,
        "raw_memory_bytes": pod.raw_memory_bytes,
        "gpu": pod.gpu,
        "held": pod.held,
    }
