"""An in-memory cluster for tests and the simulator.

Beyond the port it plays the parts Kubernetes plays for itself: :meth:`FakeCluster.bind` is the
scheduler placing a pod (refused with :class:`NoRoom` when the node's allocatable resources are
taken), :meth:`FakeCluster.set_phase` and :meth:`FakeCluster.evict` the kubelet reporting a pod
ended, and creating a pod goes through the priority admission plugin: the pod's priority is its
class's value, and a pod naming a class that does not exist is refused
(:class:`UnknownPriorityClass`). The two classes every cluster has (``system-cluster-critical``,
``system-node-critical``) exist from the start; a pod without a class gets priority 0 (no class
here is the global default). A pod that ended (``Succeeded``/``Failed``) stays listed but no
longer takes room on its node, as the scheduler counts it. Deletion is immediate (no grace
period).

Pods live in namespaces (the same name in two is two pods; a spec without one goes to the
cluster's default namespace). Every write to a pod gives it a new resource version from one
counter, as etcd's revision does, and a delete checks its preconditions as the API server does:
the uid first, then the resource version, by equality (:class:`StalePod`, with the pod as it is
now). Pod UIDs are deterministic (``uid-<n>`` in creation order) so a seeded run gives the same
answers twice.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .port import (
    ClusterError,
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

__all__ = ["FakeCluster"]

# The classes the API server creates itself, and the highest value a user's class may take
# (scheduling.k8s.io: larger values and the "system-" prefix are reserved).
_SYSTEM_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
_HIGHEST_USER_PRIORITY = 1_000_000_000
_ENDED: frozenset[PodPhase] = frozenset({"Succeeded", "Failed"})


class FakeCluster:
    """Nodes and pods in memory; thread-safe."""

    def __init__(
        self,
        nodes: Sequence[Node] = (),
        *,
        priority_classes: Mapping[str, int] | None = None,
        namespace: str = "default",
    ) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {n.name: n for n in nodes}
        self._pods: dict[tuple[str, str], Pod] = {}
        self._classes: dict[str, int] = {**_SYSTEM_CLASSES, **(priority_classes or {})}
        self._namespace = namespace
        self._created = 0
        self._version = 0
        self.creations = 0
        """How many pods were created (tests read it to check idempotence)."""
        self.deletions = 0
        self.class_creations = 0
        """How many priority classes :meth:`ensure_priority_class` created."""

    # -- the port --------------------------------------------------------------------------------

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        with self._lock:
            nodes = sorted(self._nodes.values(), key=lambda n: n.name)
        return [n for n in nodes if label is None or label in n.labels]

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        with self._lock:
            pods = [self._pods[key] for key in sorted(self._pods)]
        wanted = dict(labels or {})
        return [p for p in pods if all(p.labels.get(k) == v for k, v in wanted.items())]

    def create_pod(self, spec: PodSpec) -> Pod:
        namespace = spec.namespace or self._namespace
        with self._lock:
            if (namespace, spec.name) in self._pods:
                raise PodExists(f"pod {spec.name} already exists in namespace {namespace}")
            priority = 0
            if spec.priority_class_name is not None:
                if spec.priority_class_name not in self._classes:
                    raise UnknownPriorityClass(
                        f'pods "{spec.name}" is forbidden: no PriorityClass with name '
                        f"{spec.priority_class_name} was found"
                    )
                priority = self._classes[spec.priority_class_name]
            if spec.node is not None:
                self._check_room(spec.node, spec.cpu_millis, spec.memory_mib)
            self._created += 1
            pod = Pod(
                spec.name,
                f"uid-{self._created}",
                namespace=namespace,
                labels=dict(spec.labels),
                annotations=dict(spec.annotations),
                node=spec.node,
                phase="Running" if spec.node is not None else "Pending",
                owner=spec.owner,
                cpu_millis=spec.cpu_millis,
                memory_mib=spec.memory_mib,
                scheduler_name=spec.scheduler_name,
                priority_class_name=spec.priority_class_name,
                priority=priority,
            )
            self.creations += 1
            return self._store(pod)

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        key = (namespace or self._namespace, name)
        with self._lock:
            pod = self._pods.get(key)
            if pod is None:
                raise UnknownPod(f"no pod named {name} in namespace {key[0]}")
            if uid is not None and pod.uid != uid:
                raise StalePod(f"pod {name} is {pod.uid} now, not {uid}; left alone", current=pod)
            if resource_version is not None and pod.resource_version != resource_version:
                raise StalePod(
                    f"pod {name} changed since version {resource_version} (now "
                    f"{pod.resource_version}); left alone",
                    current=pod,
                )
            del self._pods[key]
            self.deletions += 1

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        with self._lock:
            existing = self._classes.get(name)
            if existing == value:
                return
            if existing is not None:
                raise PriorityClassConflict(
                    f"priority class {name} exists with value {existing}, not {value}"
                )
            if name.startswith("system-") or value > _HIGHEST_USER_PRIORITY:
                raise ClusterError(
                    f"priority class {name} ({value}): the system- prefix and values above "
                    f"{_HIGHEST_USER_PRIORITY} are reserved"
                )
            self._classes[name] = value
            self.class_creations += 1

    # -- what Kubernetes does by itself ------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        """A node joins (or changes its labels or size)."""
        with self._lock:
            self._nodes[node.name] = node

    def remove_node(self, name: str) -> None:
        """A node leaves; its pods go with it."""
        with self._lock:
            self._nodes.pop(name, None)
            self._pods = {k: p for k, p in self._pods.items() if p.node != name}

    def pod(self, name: str, *, namespace: str | None = None) -> Pod | None:
        with self._lock:
            return self._pods.get((namespace or self._namespace, name))

    def bind(self, name: str, node: str, *, namespace: str | None = None) -> Pod:
        """The scheduler places a pending pod on ``node`` (it starts running there)."""
        with self._lock:
            pod = self._existing(name, namespace)
            self._check_room(node, pod.cpu_millis, pod.memory_mib)
            return self._store(replace(pod, node=node, phase="Running"))

    def set_phase(
        self, name: str, phase: PodPhase, *, reason: str = "", namespace: str | None = None
    ) -> None:
        with self._lock:
            pod = self._existing(name, namespace)
            self._store(replace(pod, phase=phase, reason=reason))

    def evict(self, name: str, *, namespace: str | None = None) -> None:
        """The kubelet evicts the pod (node pressure): it fails with reason ``Evicted`` and
        stays listed, bound, until someone deletes it."""
        self.set_phase(name, "Failed", reason="Evicted", namespace=namespace)

    def _existing(self, name: str, namespace: str | None) -> Pod:
        pod = self._pods.get((namespace or self._namespace, name))
        if pod is None:
            raise UnknownPod(f"no pod named {name} in namespace {namespace or self._namespace}")
        return pod

    def _store(self, pod: Pod) -> Pod:
        """Keep ``pod`` under a new resource version (every write gets one)."""
        self._version += 1
        stored = replace(pod, resource_version=str(self._version))
        self._pods[(stored.namespace, stored.name)] = stored
        return stored

    def delete_priority_class(self, name: str) -> None:
        """An administrator deletes a priority class (pods that name it keep their priority)."""
        with self._lock:
            self._classes.pop(name, None)

    def priority_classes(self) -> dict[str, int]:
        """The priority classes by name, with their values."""
        with self._lock:
            return dict(self._classes)

    def free_on(self, node: str) -> tuple[int, int]:
        """CPU millis and memory MiB still requestable on ``node``."""
        with self._lock:
            return self._free(node)

    def _free(self, node: str) -> tuple[int, int]:
        spec = self._nodes.get(node)
        if spec is None:
            return 0, 0
        placed = [p for p in self._pods.values() if p.node == node and p.phase not in _ENDED]
        return (
            spec.cpu_millis - sum(p.cpu_millis for p in placed),
            spec.memory_mib - sum(p.memory_mib for p in placed),
        )

    def _check_room(self, node: str, cpu: int, memory: int) -> None:
        if node not in self._nodes:
            raise NoRoom(f"node {node} does not exist")
        free_cpu, free_memory = self._free(node)
        if cpu > free_cpu or memory > free_memory:
            raise NoRoom(
                f"node {node} has {free_cpu}m CPU and {free_memory}Mi free; the pod requests "
                f"{cpu}m and {memory}Mi"
            )
