"""The cluster port: list nodes and pods, create and delete pods.

Exception tree::

    ClusterError            base of everything a cluster adapter raises
     ├── PodExists          a pod of that name already exists (creating is then a no-op for an
     │                      idempotent caller: the earlier attempt landed)
     ├── UnknownPod         no pod of that name (deleting is then a no-op for the same reason)
     └── NoRoom             the node cannot fit the pod's requests (binding in the fake)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal, Protocol

__all__ = [
    "ClusterError",
    "ClusterGateway",
    "NoRoom",
    "Node",
    "Pod",
    "PodExists",
    "PodPhase",
    "PodSpec",
    "UnknownPod",
]

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class ClusterError(Exception):
    """Base class of every error a cluster adapter raises."""


class PodExists(ClusterError):
    """Raised when creating a pod whose name is taken."""


class UnknownPod(ClusterError):
    """Raised when a pod of that name does not exist."""


class NoRoom(ClusterError):
    """Raised when a node cannot fit a pod's resource requests."""


@dataclass(frozen=True, slots=True)
class Node:
    """A node: its labels and what pods may request on it in total."""

    name: str
    _: KW_ONLY
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_millis: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A pod to create. ``node`` binds it at once (a ghost pod is placed by its creator);
    ``None`` leaves it to the scheduler named ``scheduler_name``."""

    name: str
    _: KW_ONLY
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    owner: str | None = None
    scheduler_name: str = "default-scheduler"
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the cluster shows it. ``owner`` names the object that created it (an
    application, a testbed); ``terminating`` once deletion started."""

    name: str
    uid: str
    _: KW_ONLY
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    phase: PodPhase = "Pending"
    owner: str | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    scheduler_name: str = "default-scheduler"
    priority: int = 0
    terminating: bool = False


class ClusterGateway(Protocol):
    """What a controller reads of and does to the cluster."""

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        """The nodes, or only those carrying ``label`` (any value)."""
        ...

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        """The pods, or only those carrying every one of ``labels``."""
        ...

    def create_pod(self, spec: PodSpec) -> Pod:
        """Create a pod; :class:`PodExists` if the name is taken."""
        ...

    def delete_pod(self, name: str) -> None:
        """Delete a pod; :class:`UnknownPod` if there is none of that name."""
        ...
