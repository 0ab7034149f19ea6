"""How the cluster's generic nodes and pods read as node-accounting specs.

The :class:`~fleetledger.adapters.cluster.ClusterGateway` port shows pods with their summed
requests and their annotations; a VM pod is one whose annotations carry its VM's bounds (the
seed's NeonVM ``VirtualMachine`` ``min/use/max`` per resource), written by whoever creates VM
pods::

    fleetledger.io/vm-cpu-milli:   "250,500,4000"   # min,use,max milli-CPU
    fleetledger.io/vm-memory-slots: "1,2,16"         # min,use,max memory slots
    fleetledger.io/gpu:            "1"              # optional
    fleetledger.io/scaling-enabled: "false"         # optional: no agent scales the VM
    fleetledger.io/migration-enabled: "false"       # optional: never migrate the VM away

Any other pod is a non-VM pod counted by its requests (seed 04, "Non-VM pods").
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetledger.adapters.cluster import Node, Pod
from fleetledger.domain.nodes import (
    Bounds,
    ComputeUnit,
    ContainerResources,
    NodeConfig,
    OtherPodSpec,
    VmPodSpec,
)

__all__ = [
    "accounting_name",
    "CPU_ANNOTATION",
    "DEFAULT_NODE_CONFIG",
    "GPU_ANNOTATION",
    "MEMORY_ANNOTATION",
    "MIB",
    "MIGRATION_ANNOTATION",
    "SCALING_ANNOTATION",
    "BadAnnotation",
    "NodeCapacity",
    "node_capacity",
    "pod_spec",
    "vm_annotations",
]

CPU_ANNOTATION = "fleetledger.io/vm-cpu-milli"
MEMORY_ANNOTATION = "fleetledger.io/vm-memory-slots"
GPU_ANNOTATION = "fleetledger.io/gpu"
SCALING_ANNOTATION = "fleetledger.io/scaling-enabled"
MIGRATION_ANNOTATION = "fleetledger.io/migration-enabled"
MIB = 1 << 20

DEFAULT_NODE_CONFIG = NodeConfig(
    cpu_system_milli=0,
    memory_system_slots=0,
    cpu_watermark=0.9,
    memory_watermark=0.9,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=1 << 30,
)
"""Settings for nodes when the runtime is given none: 1 GiB slots, 90 % watermarks."""


class BadAnnotation(ValueError):
    """A pod's VM annotations cannot be read; the pod is left out until they are fixed."""


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """A node's allocatable resources in the units ``JoinNode`` takes."""

    cpu_milli: int
    memory_bytes: int
    gpu: int


def node_capacity(node: Node) -> NodeCapacity:
    """``node``'s allocatable resources (its GPUs from the ``fleetledger.io/gpu`` label)."""
    gpu = node.labels.get(GPU_ANNOTATION, "0")
    return NodeCapacity(node.cpu_millis, node.memory_mib * MIB, int(gpu) if gpu.isdigit() else 0)


def vm_annotations(
    cpu: Bounds, memory: Bounds, *, gpu: int = 0, scaling: bool = True, migration: bool = True
) -> dict[str, str]:
    """The annotations that mark a pod as a VM pod with these bounds and settings."""
    found = {
        CPU_ANNOTATION: f"{cpu.min},{cpu.use},{cpu.max}",
        MEMORY_ANNOTATION: f"{memory.min},{memory.use},{memory.max}",
    }
    if gpu:
        found[GPU_ANNOTATION] = str(gpu)
    if not scaling:
        found[SCALING_ANNOTATION] = "false"
    if not migration:
        found[MIGRATION_ANNOTATION] = "false"
    return found


def accounting_name(pod: Pod) -> str:
    """The name a node accounts ``pod`` under. A pod of the default namespace keeps its bare
    name (the logs written before namespaces were told apart hold those), another pod is
    ``namespace/name`` so two namespaces' same-named pods on one node stay two. A VM pod keeps
    its bare name wherever it lives: its agent asks for resources by that name alone."""
    is_vm = CPU_ANNOTATION in pod.annotations or MEMORY_ANNOTATION in pod.annotations
    if is_vm or pod.namespace == "default":
        return pod.name
    return f"{pod.namespace}/{pod.name}"


def pod_spec(pod: Pod) -> VmPodSpec | OtherPodSpec:
    """The spec ``ReservePod`` takes for ``pod``; :class:`BadAnnotation` for unreadable bounds."""
    cpu = pod.annotations.get(CPU_ANNOTATION)
    memory = pod.annotations.get(MEMORY_ANNOTATION)
    if cpu is None and memory is None:
        return OtherPodSpec(
            name=accounting_name(pod),
            containers=(
                ContainerResources(
                    cpu_request_milli=pod.cpu_millis, memory_request_bytes=pod.memory_mib * MIB
                ),
            ),
        )
    if cpu is None or memory is None:
        raise BadAnnotation(
            f"pod {pod.name} has only one of {CPU_ANNOTATION} and {MEMORY_ANNOTATION}; a VM pod "
            "needs both"
        )
    gpu = pod.annotations.get(GPU_ANNOTATION, "0")
    if not gpu.isdigit():
        raise BadAnnotation(f"pod {pod.name}: {GPU_ANNOTATION} must be a count, got {gpu!r}")
    return VmPodSpec(
        name=pod.name,
        cpu=_bounds(pod.name, CPU_ANNOTATION, cpu),
        memory=_bounds(pod.name, MEMORY_ANNOTATION, memory),
        gpu=int(gpu),
        scaling_enabled=_switch(pod, SCALING_ANNOTATION),
        migration_enabled=_switch(pod, MIGRATION_ANNOTATION),
    )


def _switch(pod: Pod, key: str) -> bool:
    text = pod.annotations.get(key, "true").strip().lower()
    if text not in ("true", "false"):
        raise BadAnnotation(f"pod {pod.name}: {key} must read 'true' or 'false', got {text!r}")
    return text == "true"


def _bounds(pod: str, key: str, text: str) -> Bounds:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise BadAnnotation(f"pod {pod}: {key} must read 'min,use,max' in integers, got {text!r}")
    low, use, high = (int(p) for p in parts)
    return Bounds(low, use, high)
