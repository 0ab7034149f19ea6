"""Where a batch job's application lives: the :class:`Applications` port and a fake.

The real adapter creates and deletes Spark or Flink resources and reads their operator's status;
the fake plays the operator: creating an application creates its executor pods (pending, for the
scheduler — and so the extender — to place), and the simulator decides when it runs and ends.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from fleetledger.adapters.cluster import FakeCluster, PodSpec, UnknownPod
from fleetledger.domain.testbeds import ApplicationPhase

__all__ = ["APPLICATION_LABEL", "Applications", "FakeApplications"]

APPLICATION_LABEL = "fleetledger.io/application"
"""The label every pod of an application carries: the application's name."""


class Applications(Protocol):
    """The application operators, as the job runtime sees them."""

    def create(self, manifest: Mapping[str, object]) -> None:
        """Create the application ``manifest`` describes; a no-op if it exists."""
        ...

    def delete(self, name: str) -> None:
        """Delete the application and its pods; a no-op if it is gone."""
        ...

    def phase(self, name: str) -> ApplicationPhase:
        """Where the application is (``absent`` when there is none)."""
        ...


def _template(manifest: Mapping[str, object]) -> tuple[str, Mapping[str, object], int]:
    metadata = manifest["metadata"]
    spec = manifest["spec"]
    assert isinstance(metadata, Mapping) and isinstance(spec, Mapping)
    if manifest.get("kind") == "SparkApplication":
        pod = spec["executor"]
        assert isinstance(pod, Mapping)
        return str(metadata["name"]), pod, int(pod["instances"])
    pod = spec["taskManager"]
    assert isinstance(pod, Mapping)
    return str(metadata["name"]), pod, int(pod["replicas"])


def _quantity(pod: Mapping[str, object]) -> tuple[int, int]:
    if "coreRequest" in pod:
        cpu, memory = str(pod["coreRequest"]), str(pod["memory"])
    else:
        resources = pod["resources"]
        assert isinstance(resources, Mapping)
        requests = resources["requests"]
        assert isinstance(requests, Mapping)
        cpu, memory = str(requests["cpu"]), str(requests["memory"])
    return int(cpu.removesuffix("m")), int(memory.removesuffix("Mi"))


class FakeApplications:
    """Applications on a :class:`FakeCluster`: one pending pod per replica on creation.

    ``phase`` is ``pending`` until every pod is bound, then ``scheduled``; the simulator calls
    :meth:`start` (``running``) and :meth:`finish` (``completed`` or ``failed``; the pods end).
    """

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._apps: dict[str, tuple[str, ...]] = {}
        self._phases: dict[str, ApplicationPhase] = {}
        self.created: list[str] = []
        """Every application created, in order (tests read it to check idempotence)."""

    def create(self, manifest: Mapping[str, object]) -> None:
        name, pod, replicas = _template(manifest)
        with self._lock:
            if name in self._apps:
                return
            cpu, memory = _quantity(pod)
            annotations = pod.get("annotations", {})
            assert isinstance(annotations, Mapping)
            pods = tuple(f"{name}-exec-{i}" for i in range(1, replicas + 1))
            for pod_name in pods:
                self._cluster.create_pod(
                    PodSpec(
                        pod_name,
                        labels={APPLICATION_LABEL: name},
                        annotations={str(k): str(v) for k, v in annotations.items()},
                        cpu_millis=cpu,
                        memory_mib=memory,
                        owner=f"application/{name}",
                        scheduler_name=str(pod.get("schedulerName", "default-scheduler")),
                        priority=1,
                    )
                )
            self._apps[name] = pods
            self.created.append(name)

    def delete(self, name: str) -> None:
        with self._lock:
            pods = self._apps.pop(name, ())
            self._phases.pop(name, None)
        self._delete_pods(pods)

    def phase(self, name: str) -> ApplicationPhase:
        with self._lock:
            pods = self._apps.get(name)
            explicit = self._phases.get(name)
        if pods is None:
            return "absent"
        if explicit is not None:
            return explicit
        placed = [self._cluster.pod(p) for p in pods]
        if all(p is not None and p.node is not None for p in placed):
            return "scheduled"
        return "pending"

    def pods(self, name: str) -> tuple[str, ...]:
        with self._lock:
            return self._apps.get(name, ())

    def start(self, name: str) -> None:
        """The application's pods all run: the operator reports it running."""
        with self._lock:
            if name in self._apps:
                self._phases[name] = "running"

    def finish(self, name: str, *, failed: bool = False) -> None:
        """The application ended; its executor pods end with it (the resource stays)."""
        with self._lock:
            pods = self._apps.get(name, ())
            if name in self._apps:
                self._phases[name] = "failed" if failed else "completed"
        self._delete_pods(pods)

    def _delete_pods(self, pods: tuple[str, ...]) -> None:
        for pod in pods:
            try:
                self._cluster.delete_pod(pod)
            except UnknownPod:
                continue
