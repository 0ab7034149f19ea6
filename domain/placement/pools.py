"""Which pools a workload may use, in which order, and why none may (the issue's filters)."""

from __future__ import annotations

from collections.abc import Sequence

from fleetledger.domain.placement.model import ANY_GPU, Pool, WorkloadRequest
from fleetledger.domain.units import MILLI_PER_CPU

__all__ = ["check_request", "eligible", "holds", "never_fits", "pool_order", "worker_room"]


def worker_room(pool: Pool) -> tuple[int, int, int]:
    """What an empty worker of ``pool`` can take in raw requests: cpu and memory rounded down to
    whole CPUs and slots (the node counts its non-VM pods' sums rounded up), and GPUs."""
    slot = max(1, pool.memory_slot_bytes)
    return (
        pool.worker_cpu_milli // MILLI_PER_CPU * MILLI_PER_CPU,
        pool.worker_memory_bytes // slot * slot,
        pool.worker_gpu,
    )


def check_request(request: WorkloadRequest) -> str | None:
    """Why ``request`` is malformed, or ``None``."""
    if not isinstance(request.id, str) or not request.id:
        return "a workload needs a non-empty id"
    for name in ("cpu_milli", "memory_bytes", "gpu", "priority"):
        value = getattr(request, name)
        if type(value) is not int or (name != "priority" and value < 0):
            return f"workload {request.id}: {name} must be a non-negative integer, got {value!r}"
    types = request.gpu_types
    if not isinstance(types, tuple) or not all(isinstance(t, str) and t for t in types):
        return f"workload {request.id}: gpu_types must be a tuple of GPU type names, got {types!r}"
    if request.selector is not None and (not isinstance(request.selector, str)):
        return f"workload {request.id}: selector must be a pool name, got {request.selector!r}"
    if request.gpu_types and request.gpu == 0:
        return f"workload {request.id} lists gpu_types but asks for no GPU; set gpu or drop them"
    return None


def eligible(request: WorkloadRequest, pool: Pool) -> bool:
    """Whether ``request`` may run on ``pool``'s workers at all, whatever they hold now."""
    if pool.status != "available":
        return False
    if request.selector is not None:
        if request.selector != pool.name:
            return False
    elif pool.requires_selector:
        return False
    if request.gpu > 0:
        if pool.gpu_type is None:
            return False
        types = request.gpu_types
        if types and pool.gpu_type not in types and ANY_GPU not in types:
            return False
    elif pool.gpu_type is not None:
        # GPU workers are scarce: a workload without GPUs must not take room on one.
        return False
    return request.preemptible or not pool.preemptible


def holds(pool: Pool, request: WorkloadRequest) -> bool:
    """Whether an empty worker of ``pool`` can hold ``request``."""
    cpu, memory, gpu = worker_room(pool)
    return request.cpu_milli <= cpu and request.memory_bytes <= memory and request.gpu <= gpu


def pool_order(request: WorkloadRequest, pools: Sequence[Pool]) -> tuple[Pool, ...]:
    """The pools ``request`` may use, best first: pool priority, then the earlier GPU type (a
    type not listed ranks where ``"any"`` is), then the pool name (so equal pools are always
    tried in the same order)."""
    types = request.gpu_types
    unlisted = types.index(ANY_GPU) if ANY_GPU in types else 0

    def rank(pool: Pool) -> tuple[int, int, str]:
        preference = types.index(pool.gpu_type) if pool.gpu_type in types else unlisted
        return (-pool.priority, preference, pool.name)

    return tuple(sorted((p for p in pools if eligible(request, p)), key=rank))


def never_fits(request: WorkloadRequest, pools: Sequence[Pool]) -> str | None:
    """Why no worker of any pool could ever hold ``request``, or ``None`` if one could."""
    usable = pool_order(request, pools)
    if not usable:
        return (
            f"workload {request.id}: no available pool accepts it ({_wants(request)}); "
            f"pools: {', '.join(sorted(p.name for p in pools)) or 'none configured'}"
        )
    if any(holds(pool, request) for pool in usable):
        return None
    sizes = "; ".join(
        f"{p.name} workers have {p.worker_cpu_milli} milli-CPU, {p.worker_memory_bytes} bytes, "
        f"{p.worker_gpu} GPU"
        for p in usable
    )
    return (
        f"workload {request.id} asks for {request.cpu_milli} milli-CPU, {request.memory_bytes} "
        f"bytes and {request.gpu} GPU, more than any worker of its pools can hold ({sizes}); "
        "ask for less or add a pool of larger workers"
    )


def _wants(request: WorkloadRequest) -> str:
    parts = [f"selector {_shown(request.selector)}" if request.selector else "no selector"]
    if request.gpu:
        parts.append(f"GPU types {_shown(', '.join(request.gpu_types)) or 'any'}")
    else:
        parts.append("no GPU")
    parts.append("preemptible" if request.preemptible else "not preemptible")
    return ", ".join(parts)


_SHOWN_CHARACTERS = 64
"""How much of a client's text a reason quotes. A rejection is recorded in the log: quoting a
megabyte-long selector whole would make an event the log refuses, and no reader needs more than
its start to recognise it."""


def _shown(text: str) -> str:
    """``text`` as a reason quotes it: as given when short and printable, else its start (with
    control characters escaped) and its length."""
    if len(text) <= _SHOWN_CHARACTERS and text.isprintable():
        return text
    start = repr(text[:_SHOWN_CHARACTERS])
    if len(text) <= _SHOWN_CHARACTERS:
        return start
    return f"{start}... ({len(text)} characters)"
