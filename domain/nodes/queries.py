"""Questions asked of one node's state: what its non-VM pods hold, and what should migrate."""

from __future__ import annotations

from fleetledger.domain.nodes.model import NodeState, VmPod
from fleetledger.domain.units import MILLI_PER_CPU

__all__ = ["migration_queue", "needs_migration", "other_reserved"]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit)


def other_reserved(state: NodeState) -> tuple[int, int]:
    """What the non-VM pods hold: their raw sums rounded up to whole CPUs and to memory slots."""
    slot = state.config.memory_slot_bytes if state.config is not None else 1
    cpu = _round_up(state.other_raw_cpu_milli, MILLI_PER_CPU) * MILLI_PER_CPU
    return cpu, _round_up(state.other_raw_memory_bytes, max(1, slot))


def needs_migration(state: NodeState) -> bool:
    """Whether some resource has pressure that started migrations do not yet account for."""
    return state.present and (state.cpu.needs_migration or state.memory.needs_migration)


def migration_queue(state: NodeState) -> tuple[VmPod, ...]:
    """The pods that may still be chosen to migrate, in the order they would be."""
    return tuple(
        sorted(
            (pod for pod in state.vm_pods.values() if not pod.migrating),
            key=lambda pod: (not pod.has_metrics, pod.load or 0.0, pod.name),
        )
    )
