"""The cluster port: list nodes and pods, create and delete pods, ensure priority classes.

A pod's priority comes from its PriorityClass only, as on a real cluster: the priority admission
plugin resolves ``priorityClassName`` to the class's value and refuses a pod that names a class
that does not exist, or that sets ``spec.priority`` to anything else. So :class:`PodSpec` names a
class (:meth:`ClusterGateway.ensure_priority_class` makes sure it exists) and :class:`Pod` shows
the priority the cluster resolved.

Pods are namespaced: a pod is known by its namespace and name (the same name in two namespaces
is two pods), and by its uid where identity matters. A gateway serves one default namespace, used
wherever a caller names none.

Deleting by name alone can hit a newer pod that took the name after the one the caller saw, or
the pod after it changed: :meth:`ClusterGateway.delete_pod` takes the uid and resource version
the caller saw as preconditions (the API server's ``DeleteOptions.preconditions``) and refuses
(:class:`StalePod`) to delete a pod that no longer matches them. The caller then reads the
cluster again and decides afresh; it never repeats the same delete blindly.

A gateway that serves reads from caches (informers) reports how fresh they are through
:class:`ClusterHealth`, so a readiness check can refuse traffic while they are stale.

Exception tree::

    ClusterError                 base of everything a cluster adapter raises
     ├── PodExists               a pod of that name already exists (creating is then a no-op for
     │                           an idempotent caller: the earlier attempt landed)
     ├── UnknownPod              no pod of that name (deleting is then a no-op for the same reason)
     ├── StalePod                the pod of that name no longer matches the delete's preconditions
     │                           (another uid: a newer pod; another resource version: it changed
     │                           since it was read): left alone, its current state attached
     ├── UnknownPriorityClass    admission refused the pod: its priority class does not exist
     ├── PriorityClassConflict   a priority class of that name exists with another value (a
     │                           class's value cannot change: delete it or choose another name)
     └── NoRoom                  the node cannot fit the pod's requests (binding in the fake)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "ClusterError",
    "ClusterGateway",
    "ClusterHealth",
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

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class ClusterError(Exception):
    """Base class of every error a cluster adapter raises."""


class PodExists(ClusterError):
    """Raised when creating a pod whose name is taken."""


class UnknownPod(ClusterError):
    """Raised when a pod of that name does not exist."""


class StalePod(ClusterError):
    """Raised when a delete's preconditions (uid, resource version) do not match the pod of
    that name. ``current`` is the pod as the cluster shows it now, when the adapter could read it
    (``None``: gone meanwhile, or unreadable); the cluster's caches already show it."""

    def __init__(self, message: str, *, current: Pod | None = None) -> None:
        super().__init__(message)
        self.current = current


class UnknownPriorityClass(ClusterError):
    """Raised when a pod names a priority class the cluster does not have; nothing was created."""


class PriorityClassConflict(ClusterError):
    """Raised when a priority class exists under the name with another value."""


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
    ``None`` leaves it to the scheduler named ``scheduler_name``. ``priority_class_name`` names
    the pod's PriorityClass (``None``: the cluster's default priority)."""

    name: str
    _: KW_ONLY
    namespace: str | None = None
    """``None``: the gateway's default namespace."""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    owner: str | None = None
    scheduler_name: str = "default-scheduler"
    priority_class_name: str | None = None


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the cluster shows it. ``owner`` names the object that created it (an
    application, a testbed); ``priority`` is what admission resolved from the pod's class;
    ``reason`` is the kubelet's word on an ended pod (``"Evicted"``); ``terminating`` once
    deletion started. ``resource_version`` changes with every write to the pod (opaque: only
    ever compared for equality, or handed back as a precondition)."""

    name: str
    uid: str
    _: KW_ONLY
    namespace: str = "default"
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    phase: PodPhase = "Pending"
    owner: str | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    scheduler_name: str = "default-scheduler"
    priority_class_name: str | None = None
    priority: int = 0
    reason: str = ""
    terminating: bool = False


class ClusterGateway(Protocol):
    """What a controller reads of and does to the cluster."""

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        """The nodes, or only those carrying ``label`` (any value)."""
        ...

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        """The pods of every namespace, or only those carrying every one of ``labels``."""
        ...

    def create_pod(self, spec: PodSpec) -> Pod:
        """Create a pod; :class:`PodExists` if the name is taken in its namespace."""
        ...

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Delete the pod ``name`` of ``namespace`` (``None``: the default one);
        :class:`UnknownPod` if there is none. With ``uid``, only the pod of that uid; with
        ``resource_version``, only if it has not changed since: else :class:`StalePod`."""
        ...

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        """Make sure the PriorityClass ``name`` exists with ``value`` (created if absent, never
        the cluster's default); :class:`PriorityClassConflict` if it exists with another value."""
        ...


@runtime_checkable
class ClusterHealth(Protocol):
    """How fresh a gateway's cached view of the cluster is (a gateway without caches need not
    offer it: its reads are the cluster's answer)."""

    def staleness_seconds(self) -> Mapping[str, float]:
        """Seconds since each cache (by kind: ``"Node"``, ``"Pod"``) last heard from the API
        server: an event, a bookmark, a list or a watch the server ended."""
        ...

    def problems(self) -> Sequence[str]:
        """What makes the cached view unfit to act on, one sentence each: a cache never filled,
        or stale past the gateway's limit. Empty when all is well."""
        ...
