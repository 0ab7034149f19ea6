"""The cluster a controller places pods on: the :class:`ClusterGateway` port and its in-memory
adapter :class:`FakeCluster`.

The port is deliberately generic — nodes with labels and allocatable resources, pods with
labels, annotations, node, phase, owner and priority class — so every capability that counts or
places pods (testbed ghost pods, node accounting) speaks to Kubernetes through the same calls.
"""

from __future__ import annotations

from .fake import FakeCluster
from .port import (
    ClusterError,
    ClusterGateway,
    ClusterHealth,
    Node,
    NoRoom,
    Pod,
    PodExists,
    PodPhase,
    PodSpec,
    PriorityClassConflict,
    StalePod,
    UnknownPod,
    UnknownPriorityClass,
)

__all__ = [
    "ClusterError",
    "ClusterGateway",
    "ClusterHealth",
    "FakeCluster",
    "NoRoom",
    "Node",
    "Pod",
    "PodExists",
    "PodPhase",
    "PodSpec",
    "PriorityClassConflict",
    "StalePod",
    "UnknownPod",
    "UnknownPriorityClass",
]
