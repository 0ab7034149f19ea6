"""Questions asked of one node's state: what its non-VM pods hold, and what should migrate."""

from __future__ import annotations

from fleetledger.domain.nodes.model import NodeConfig, NodeState, VmPod
from fleetledger.domain.units import MILLI_PER_CPU

__all__ = [
    "migration_queue",
    "needs_migration",
    "other_reserved",
    "other_rounded",
    "same_capacity",
]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit)


def other_reserved(state: NodeState) -> tuple[int, int]:
    """What the non-VM pods hold: their raw sums rounded up to whole CPUs and to memory slots."""
    return other_rounded(state.config, state.other_raw_cpu_milli, state.other_raw_memory_bytes)


def other_rounded(
    config: NodeConfig | None, raw_cpu_milli: int, raw_memory_bytes: int
) -> tuple[int, int]:
    """:func:`other_reserved` of raw sums not yet in a state (what a fold is about to build)."""
    slot = config.memory_slot_bytes if config is not None else 1
    cpu = _round_up(raw_cpu_milli, MILLI_PER_CPU) * MILLI_PER_CPU
    return cpu, _round_up(raw_memory_bytes, max(1, slot))


def same_capacity(state: NodeState, cpu_milli: int, memory_bytes: int, gpu: int) -> bool:
    """Whether a present node already has this allocatable capacity, as ``UpdateNodeCapacity``
    counts it (memory in whole slots): updating it to that decides nothing."""
    if not state.present or state.config is None:
        return False
    slots = memory_bytes // state.config.memory_slot_bytes
    return (cpu_milli, slots, gpu) == (state.cpu.total, state.memory.total, state.gpu_total)


def needs_migration(state: NodeState) -> bool:
    """Whether the node should pick pods to migrate now.

    Seed 04 ("Pressure and watermarks"): migration targets are picked only while some
    resource's ``reserved > watermark``; at or below every watermark nothing migrates, whatever
    the capacity pressure. Past that gate, a resource needs migrations while its logical plus
    capacity pressure exceeds what started migrations account for plus its slack.
    """
    if not state.present:
        return False
    cpu, memory = state.cpu, state.memory
    if not (cpu.above_watermark or memory.above_watermark):
        return False
    return cpu.needs_migration or memory.needs_migration


def migration_queue(state: NodeState) -> tuple[VmPod, ...]:
    """The pods that may still be chosen to migrate, in the order they would be.

    A pod already migrating, or whose VM may not be migrated, is not in it.
    """
    return tuple(
        sorted(
            (pod for pod in state.vm_pods.values() if pod.migration_enabled and not pod.migrating),
            key=lambda pod: (not pod.has_metrics, pod.load or 0.0, pod.name),
        )
    )
