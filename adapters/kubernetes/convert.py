"""Kubernetes objects as the cluster port's :class:`Node` and :class:`Pod`.

Allocatable resources and requests are Kubernetes quantities (``"3800m"``, ``"15Gi"``); the port
counts CPU in milli-CPU and memory in MiB, rounding down (a node never shows more than it has).
A pod's requests are the sum over its containers, a missing request counting as its limit (the
scheduler plugin's rule, seed 04), else zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, cast

from kubernetes.utils import parse_quantity

from fleetledger.adapters.cluster import Node, Pod, PodPhase

__all__ = ["node_from", "pod_from"]

_MIB = 1 << 20
_parse: Callable[[object], Decimal] = parse_quantity
_PHASES: tuple[PodPhase, ...] = ("Pending", "Running", "Succeeded", "Failed")


def node_from(raw: Mapping[str, Any]) -> Node:
    """A node object (as the API's JSON) as the port's :class:`Node`."""
    metadata = raw.get("metadata") or {}
    allocatable = (raw.get("status") or {}).get("allocatable") or {}
    return Node(
        metadata["name"],
        labels=dict(metadata.get("labels") or {}),
        cpu_millis=_milli(allocatable.get("cpu", "0")),
        memory_mib=_mib(allocatable.get("memory", "0")),
    )


def pod_from(raw: Mapping[str, Any]) -> Pod:
    """A pod object (as the API's JSON) as the port's :class:`Pod`."""
    metadata = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    cpu = memory = 0
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        cpu += _milli(requests.get("cpu", limits.get("cpu", "0")))
        memory += _mib(requests.get("memory", limits.get("memory", "0")))
    owners = metadata.get("ownerReferences") or ()
    phase = status.get("phase", "Pending")
    return Pod(
        metadata["name"],
        metadata.get("uid", ""),
        namespace=metadata.get("namespace") or "default",
        resource_version=str(metadata.get("resourceVersion") or ""),
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        node=spec.get("nodeName") or None,
        phase=cast(PodPhase, phase) if phase in _PHASES else "Pending",
        owner=owners[0].get("name") if owners else None,
        cpu_millis=cpu,
        memory_mib=memory,
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        priority_class_name=spec.get("priorityClassName") or None,
        priority=int(spec.get("priority") or 0),
        reason=status.get("reason") or "",
        terminating=metadata.get("deletionTimestamp") is not None,
    )


def _milli(quantity: object) -> int:
    return int(_parse(quantity) * 1000)


def _mib(quantity: object) -> int:
    return int(_parse(quantity) / _MIB)
