"""An in-memory cluster for tests and the simulator.

Beyond the port it plays the parts Kubernetes plays for itself: :meth:`FakeCluster.bind` is the
scheduler placing a pod (refused with :class:`NoRoom` when the node's allocatable resources are
taken), :meth:`FakeCluster.set_phase` the kubelet reporting a pod's phase. Deletion is immediate
(no grace period). Pod UIDs are deterministic (``uid-<n>`` in creation order) so a seeded run
gives the same answers twice.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .port import Node, NoRoom, Pod, PodExists, PodPhase, PodSpec, UnknownPod

__all__ = ["FakeCluster"]


class FakeCluster:
    """Nodes and pods in memory; thread-safe."""

    def __init__(self, nodes: Sequence[Node] = ()) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {n.name: n for n in nodes}
        self._pods: dict[str, Pod] = {}
        self._created = 0
        self.creations = 0
        """How many pods were created (tests read it to check idempotence)."""
        self.deletions = 0

    # -- the port --------------------------------------------------------------------------------

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        with self._lock:
            nodes = sorted(self._nodes.values(), key=lambda n: n.name)
        return [n for n in nodes if label is None or label in n.labels]

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        with self._lock:
            pods = sorted(self._pods.values(), key=lambda p: p.name)
        wanted = dict(labels or {})
        return [p for p in pods if all(p.labels.get(k) == v for k, v in wanted.items())]

    def create_pod(self, spec: PodSpec) -> Pod:
        with self._lock:
            if spec.name in self._pods:
                raise PodExists(f"pod {spec.name} already exists")
            if spec.node is not None:
                self._check_room(spec.node, spec.cpu_millis, spec.memory_mib)
            self._created += 1
            pod = Pod(
                spec.name,
                f"uid-{self._created}",
                labels=dict(spec.labels),
                annotations=dict(spec.annotations),
                node=spec.node,
                phase="Running" if spec.node is not None else "Pending",
                owner=spec.owner,
                cpu_millis=spec.cpu_millis,
                memory_mib=spec.memory_mib,
                scheduler_name=spec.scheduler_name,
                priority=spec.priority,
            )
            self._pods[pod.name] = pod
            self.creations += 1
            return pod

    def delete_pod(self, name: str) -> None:
        with self._lock:
            if self._pods.pop(name, None) is None:
                raise UnknownPod(f"no pod named {name}")
            self.deletions += 1

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

    def pod(self, name: str) -> Pod | None:
        with self._lock:
            return self._pods.get(name)

    def bind(self, name: str, node: str) -> Pod:
        """The scheduler places a pending pod on ``node`` (it starts running there)."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None:
                raise UnknownPod(f"no pod named {name}")
            self._check_room(node, pod.cpu_millis, pod.memory_mib)
            bound = replace(pod, node=node, phase="Running")
            self._pods[name] = bound
            return bound

    def set_phase(self, name: str, phase: PodPhase) -> None:
        with self._lock:
            pod = self._pods.get(name)
            if pod is None:
                raise UnknownPod(f"no pod named {name}")
            self._pods[name] = replace(pod, phase=phase)

    def free_on(self, node: str) -> tuple[int, int]:
        """CPU millis and memory MiB still requestable on ``node``."""
        with self._lock:
            return self._free(node)

    def _free(self, node: str) -> tuple[int, int]:
        spec = self._nodes.get(node)
        if spec is None:
            return 0, 0
        placed = [p for p in self._pods.values() if p.node == node]
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
