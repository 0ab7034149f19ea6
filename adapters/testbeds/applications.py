"""Where a batch job's application lives: the :class:`Applications` port and a fake.

The real adapter (:class:`fleetledger.adapters.kubernetes.KubernetesApplications`) creates and
deletes ``SparkApplication``/``FlinkDeployment`` resources and reads their operators' status; the
fake plays the operator: creating an application creates its executor (Spark) or task-manager
(Flink) pods as the operator would — one per replica, sized and annotated from the manifest —
pending, for the scheduler (and so the extender) to place; the simulator decides when it runs and
ends.

Exception tree (under :class:`~fleetledger.adapters.testbeds.TestbedsError`)::

    ApplicationError              base of what an Applications adapter raises
     ├── InvalidApplication       the manifest is not an application its operator accepts (the
     │                            API refused it as malformed); nothing was created
     ├── OperatorMissing          the API does not serve the application's kind: the operator's
     │                            CRD is not installed
     └── ApplicationsUnavailable  the API could not be reached or failed; try again
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Protocol

from kubernetes.utils import parse_quantity

from fleetledger.adapters.cluster import ClusterError, FakeCluster, PodSpec, UnknownPod
from fleetledger.domain.testbeds import ApplicationPhase

from .errors import TestbedsError
from .manifests import (
    APPLICATION_LABEL,
    SPARK_APPLICATION,
    ManifestError,
    resource_of,
)

__all__ = [
    "APPLICATION_LABEL",
    "ApplicationError",
    "Applications",
    "ApplicationsUnavailable",
    "FakeApplications",
    "InvalidApplication",
    "OperatorMissing",
]


class ApplicationError(TestbedsError):
    """Base class of what an :class:`Applications` adapter raises."""


class InvalidApplication(ApplicationError, ValueError):
    """Raised when a manifest is not an application its operator accepts; nothing was created."""


class OperatorMissing(ApplicationError):
    """Raised when the API does not serve the application's kind (its CRD is not installed)."""


class ApplicationsUnavailable(ApplicationError):
    """Raised when the API could not be reached or failed; the call may be repeated."""


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


class FakeApplications:
    """Applications on a :class:`FakeCluster`: one pending pod per replica on creation.

    ``phase`` is ``pending`` until every pod is bound, then ``scheduled``; the simulator calls
    :meth:`start` (``running``) and :meth:`finish` (``completed`` or ``failed``; the pods end).
    When the cluster refuses the pods (their priority class does not exist, say), the
    application fails, as the operator's would once its pods cannot be made: :meth:`message`
    says why.
    """

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._apps: dict[str, tuple[str, ...]] = {}
        self._phases: dict[str, ApplicationPhase] = {}
        self._messages: dict[str, str] = {}
        self.created: list[str] = []
        """Every application created, in order (tests read it to check idempotence)."""

    def create(self, manifest: Mapping[str, object]) -> None:
        try:
            name, pods = _operator_pods(manifest)
        except (ManifestError, KeyError, TypeError, ValueError) as e:
            raise InvalidApplication(f"not an application the operator accepts: {e}") from e
        with self._lock:
            if name in self._apps:
                return
            created: list[str] = []
            for spec in pods:
                try:
                    self._cluster.create_pod(spec)
                except ClusterError as e:
                    self._phases[name] = "failed"
                    self._messages[name] = f"pod {spec.name} refused: {e}"
                    break
                created.append(spec.name)
            self._apps[name] = tuple(created)
            self.created.append(name)

    def delete(self, name: str) -> None:
        with self._lock:
            pods = self._apps.pop(name, ())
            self._phases.pop(name, None)
            self._messages.pop(name, None)
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

    def message(self, name: str) -> str:
        """Why the application failed, when the fake operator knows ("" otherwise)."""
        with self._lock:
            return self._messages.get(name, "")

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


# -- the operators' part ---------------------------------------------------------------------------


def _operator_pods(manifest: Mapping[str, object]) -> tuple[str, list[PodSpec]]:
    """The application's name and the executor / task-manager pods its operator creates."""
    resource = resource_of(manifest)
    metadata = _mapping(manifest["metadata"])
    spec = _mapping(manifest["spec"])
    name = str(metadata["name"])
    # Pod names as the operators make them: Spark's "<prefix>-exec-<id>", Flink's
    # "<cluster>-taskmanager-<attempt>-<index>".
    if resource == SPARK_APPLICATION:
        pod, prefix = _spark_executor(spec, _strings(metadata.get("labels"))), "exec"
        replicas = int(_mapping(spec["executor"]).get("instances", 1))
    else:
        pod, prefix = _flink_task_manager(spec), "taskmanager-1"
        replicas = int(_mapping(spec["taskManager"])["replicas"])
    labels = {**pod["labels"], APPLICATION_LABEL: name}
    return name, [
        PodSpec(
            f"{name}-{prefix}-{i}",
            labels=labels,
            annotations=pod["annotations"],
            cpu_millis=pod["cpu_millis"],
            memory_mib=pod["memory_mib"],
            owner=f"application/{name}",
            scheduler_name=pod["scheduler_name"],
            priority_class_name=pod["priority_class_name"],
        )
        for i in range(1, replicas + 1)
    ]


def _spark_executor(spec: Mapping[str, Any], app_labels: dict[str, str]) -> dict[str, Any]:
    executor = _mapping(spec["executor"])
    template = _mapping(executor.get("template") or {})
    # With a template (Spark 3+), the operator leaves executor pods to Spark and the template;
    # without one its webhook copies the executor's pod fields onto them.
    pod_spec = (
        _mapping(template.get("spec") or {})
        if template and _version(str(spec["sparkVersion"])) >= (3, 0)
        else executor
    )
    template_meta = _mapping(template.get("metadata") or {})
    memory = _jvm_mib(str(executor["memory"]))
    if "memoryOverhead" in executor:
        overhead = _jvm_mib(str(executor["memoryOverhead"]))
    else:
        factor = Fraction(2, 5) if spec.get("type") in ("Python", "R") else Fraction(1, 10)
        overhead = max(int(factor * memory), 384)
    cpu = (
        _milli(executor["coreRequest"])
        if "coreRequest" in executor
        else int(executor.get("cores", 1)) * 1000
    )
    return {
        # The operator copies the application's labels and the executor's onto executor pods.
        "labels": {
            **_strings(template_meta.get("labels")),
            **app_labels,
            **_strings(executor.get("labels")),
        },
        "annotations": {
            **_strings(template_meta.get("annotations")),
            **_strings(executor.get("annotations")),
        },
        "cpu_millis": cpu,
        "memory_mib": memory + overhead,
        "scheduler_name": str(pod_spec.get("schedulerName") or "default-scheduler"),
        "priority_class_name": pod_spec.get("priorityClassName") or None,
    }


def _flink_task_manager(spec: Mapping[str, Any]) -> dict[str, Any]:
    task_manager = _mapping(spec["taskManager"])
    template = _merged(spec.get("podTemplate") or {}, task_manager.get("podTemplate") or {})
    meta = _mapping(template.get("metadata") or {})
    pod_spec = _mapping(template.get("spec") or {})
    resource = _mapping(task_manager["resource"])
    return {
        "labels": _strings(meta.get("labels")),
        "annotations": _strings(meta.get("annotations")),
        "cpu_millis": int(Decimal(str(resource["cpu"])) * 1000),
        "memory_mib": _flink_mib(str(resource["memory"])),
        "scheduler_name": str(pod_spec.get("schedulerName") or "default-scheduler"),
        "priority_class_name": pod_spec.get("priorityClassName") or None,
    }


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    # The Flink operator's merge of the common and the task managers' pod templates: maps merge
    # key by key, the task managers' values win.
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


_parse_quantity: Callable[[object], Decimal] = parse_quantity
_SIZE = re.compile(r"\s*(\d+)\s*([a-zA-Z]*)\s*")
_JVM_UNITS: dict[str, Fraction | int] = {
    "": 1,
    "k": Fraction(1, 1024),
    "m": 1,
    "g": 1024,
    "t": 1024**2,
    "p": 1024**3,
}
_FLINK_UNITS: dict[str, Fraction | int] = {
    "b": Fraction(1, 1024**2),
    "bytes": Fraction(1, 1024**2),
    "": Fraction(1, 1024**2),
    "k": Fraction(1, 1024),
    "kb": Fraction(1, 1024),
    "kibibytes": Fraction(1, 1024),
    "m": 1,
    "mb": 1,
    "mebibytes": 1,
    "g": 1024,
    "gb": 1024,
    "gibibytes": 1024,
    "t": 1024**2,
    "tb": 1024**2,
    "tebibytes": 1024**2,
}


def _jvm_mib(size: str) -> int:
    """A JVM size (Spark's ``"512m"``, ``"2g"``; a bare number is MiB) in MiB."""
    match = _SIZE.fullmatch(size)
    unit = match.group(2).lower().removesuffix("b") if match else None
    if match is None or unit not in _JVM_UNITS:
        raise ValueError(f"not a JVM memory size: {size!r}")
    return int(int(match.group(1)) * _JVM_UNITS[unit])


def _flink_mib(size: str) -> int:
    """A Flink memory size (``"2048m"``; a bare number is bytes) in MiB; the operator also takes
    a Kubernetes quantity (``"2Gi"``) when Flink's own parser refuses it."""
    match = _SIZE.fullmatch(size)
    if match is not None and match.group(2).lower() in _FLINK_UNITS:
        return int(int(match.group(1)) * _FLINK_UNITS[match.group(2).lower()])
    return int(_quantity(size) / (1 << 20))


def _milli(quantity: object) -> int:
    return int(_quantity(quantity) * 1000)


def _quantity(quantity: object) -> Decimal:
    try:
        return _parse_quantity(quantity)
    except (ValueError, InvalidOperation) as e:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}") from e


def _version(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version)[:2]
    return tuple(int(p) for p in parts)


def _mapping(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {value!r}")
    return value


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value or {}).items()}
